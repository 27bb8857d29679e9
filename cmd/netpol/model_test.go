package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netpol/netpol/pkg/agent"
)

// model watch sends the kubeconfig's token to an https agent only, follows
// the watch stream, and stops on 403 instead of retrying.
func TestModelWatchCredentials(t *testing.T) {
	var auth atomic.Value
	auth.Store("")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth.Store(r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "forbidden: user nobody", http.StatusForbidden)
			return
		}
		if r.URL.Path != "/debug/model" || r.URL.Query().Get("watch") != "true" {
			http.NotFound(w, r)
			return
		}
		enc := json.NewEncoder(w)
		enc.Encode(agent.ModelView{Node: "n1", Generation: 1, Chains: map[string][]string{"input": {"ct state established,related accept"}}})
		w.(http.Flusher).Flush()
		w.Write([]byte("\n"))
		enc.Encode(agent.ModelView{Node: "n1", Generation: 2, Chains: map[string][]string{"input": {"ct state established,related accept", "drop"}}})
	})
	tlsSrv := httptest.NewTLSServer(handler)
	defer tlsSrv.Close()
	plain := httptest.NewServer(handler)
	defer plain.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443"}}]
users: [{name: u, user: {token: s3cret}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)

	// https: the token goes along; the stream's two models are printed.
	u, _ := agent.ModelURL(tlsSrv.URL, false)
	client, err := modelClient(u, kc, "", true, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var out, stderr bytes.Buffer
	watchModel(ctx, client, u, 50*time.Millisecond, &out, &stderr)
	if got := auth.Load().(string); got != "Bearer s3cret" {
		t.Errorf("https agent got Authorization %q", got)
	}
	if !strings.Contains(out.String(), "+ chain input [0] ct state established,related accept") || !strings.Contains(out.String(), "+ chain input [1] drop") {
		t.Errorf("output:\n%s", out.String())
	}

	// http: no token, and the 403 ends the watch at once.
	u, _ = agent.ModelURL(strings.TrimPrefix(plain.URL, "http://"), false)
	client, err = modelClient(u, kc, "", false, "")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = watchModel(context.Background(), client, u, 50*time.Millisecond, &out, &stderr)
	if err == nil || !strings.Contains(err.Error(), "403") || time.Since(start) > 2*time.Second {
		t.Errorf("plain agent answering 403: %v after %v, want a 403 error at once", err, time.Since(start))
	}
	if got := auth.Load().(string); got != "" {
		t.Errorf("plain-http agent got Authorization %q: credentials over http", got)
	}
}
