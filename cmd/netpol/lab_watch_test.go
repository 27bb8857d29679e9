package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/lab"
)

// TestLabUpWatch: `lab status -o json` names each pod's network namespace
// and addresses while `lab up --watch` runs; a connection opened from a
// pod's namespace by that name is ended by strict mode when an edit of
// the files isolates its destination; a broken edit is not synced (the
// isolation stays); the edit undone opens it again.
func TestLabUpWatch(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	const prefix = "netpol-cliwatch"
	dir := t.TempDir()
	for _, f := range []string{"cluster.yaml", "policies.yaml", "services.yaml"} {
		data, err := os.ReadFile(filepath.Join("../../examples/demo", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { lab.DownAll(prefix + "-") })
	ctx, cancel := context.WithCancel(context.Background())
	cmd := newRootCommand()
	out, errOut := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SetArgs([]string{"lab", "up", "-f", dir, "--watch", "--prefix", prefix + "-"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("lab up: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("lab up still runs 30 s after Ctrl-C")
		}
		if st, ok, _ := lab.ReadStatus(prefix); ok {
			t.Errorf("lab up left its status behind: %+v", st)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s\nstdout:\n%s\nstderr:\n%s", what, out, errOut)
			}
		}
	}
	waitFor("lab up watching", func() bool { return strings.Contains(out.String(), "watching") })

	stdout, stderr, err := run(t, "", "lab", "status", "-o", "json", "--prefix", prefix)
	if err != nil {
		t.Fatalf("lab status: %v\n%s", err, stderr)
	}
	var status struct {
		Labs []struct {
			Prefix     string   `json:"prefix"`
			Running    bool     `json:"running"`
			Namespaces []string `json:"namespaces"`
			Files      []string `json:"files"`
			Nodes      []struct {
				Name, NetNS string
				Addresses   []netip.Addr
			} `json:"nodes"`
			Pods []struct {
				Name      string       `json:"name"`
				Node      string       `json:"node"`
				NetNS     string       `json:"netns"`
				Addresses []netip.Addr `json:"addresses"`
				Serves    []string     `json:"serves"`
			} `json:"pods"`
		} `json:"labs"`
	}
	if err := json.Unmarshal([]byte(stdout), &status); err != nil {
		t.Fatalf("lab status -o json: %v\n%s", err, stdout)
	}
	if len(status.Labs) != 1 || status.Labs[0].Prefix != prefix || !status.Labs[0].Running ||
		len(status.Labs[0].Nodes) != 2 || len(status.Labs[0].Pods) != 4 || len(status.Labs[0].Namespaces) != 7 {
		t.Fatalf("lab status -o json:\n%s", stdout)
	}
	if got := status.Labs[0].Files; len(got) != 1 || got[0] != dir {
		t.Errorf("files %v, want [%s]", got, dir)
	}
	pods := map[string]struct {
		netns string
		addr  netip.Addr
	}{}
	for _, p := range status.Labs[0].Pods {
		if p.NetNS == "" || len(p.Addresses) == 0 {
			t.Fatalf("pod %s without a netns or address:\n%s", p.Name, stdout)
		}
		pods[p.Name] = struct {
			netns string
			addr  netip.Addr
		}{p.NetNS, p.Addresses[0]}
	}
	if got := status.Labs[0].Pods[0].Serves; len(got) == 0 {
		t.Errorf("pod %s serves nothing:\n%s", status.Labs[0].Pods[0].Name, stdout)
	}

	// A connection from web/frontend to an echo server of the test's on
	// sandbox/toolbox, both opened in the namespaces lab status named.
	handle := func(name string) netns.NsHandle {
		h, err := netns.GetFromName(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	from, to := pods["web/frontend"], pods["sandbox/toolbox"]
	labtest.Echo(t, handle(to.netns), to.addr, 9000)
	fromNS := handle(from.netns)
	dial := func() (net.Conn, error) {
		var c net.Conn
		err := nsexec.In(fromNS, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: time.Second}).Dial("tcp", netip.AddrPortFrom(to.addr, 9000).String())
			return err
		})
		return c, err
	}
	echoes := func(c net.Conn) bool {
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return false
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return err == nil && line == "ping\n"
	}
	conn, err := dial()
	if err != nil {
		t.Fatalf("frontend -> toolbox:9000 before the edit: %v", err)
	}
	defer conn.Close()
	if !echoes(conn) {
		t.Fatal("no echo before the edit")
	}

	isolate := []byte(`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: toolbox-isolated, namespace: sandbox}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`)
	extra := filepath.Join(dir, "extra.yaml")
	if err := os.WriteFile(extra, isolate, 0o644); err != nil {
		t.Fatal(err)
	}
	ended := "strict mode ended TCP " + from.addr.String()
	waitFor("the isolation synced and the connection ended", func() bool { return strings.Contains(out.String(), ended) })
	if echoes(conn) {
		t.Error("the open connection is still answered after the isolation")
	}
	if c, err := dial(); err == nil {
		c.Close()
		t.Error("a new connection got through the isolation")
	}

	// A broken edit is not synced: the isolation stays.
	if err := os.WriteFile(extra, append(isolate, []byte("\n  podSelector: [oops\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("the broken edit refused", func() bool { return strings.Contains(errOut.String(), "not re-synced") })
	if c, err := dial(); err == nil {
		c.Close()
		t.Error("a broken edit loosened the lab: a new connection got through")
	}

	// Undone: the next connection is answered.
	if err := os.Remove(extra); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", out, errOut)
		}
	}()
	waitFor("the edit undone", func() bool {
		c, err := dial()
		if err != nil {
			return false
		}
		defer c.Close()
		return echoes(c)
	})
}
