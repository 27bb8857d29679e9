package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// handedOut holds the addresses freeAddr gave: the kernel hands a port
// just closed out again, and two listeners of a test must not get it.
var handedOut sync.Map

// freeAddr returns a loopback address with a free port, not given before.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		if _, given := handedOut.LoadOrStore(addr, true); !given {
			return addr
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestListeners: health, metrics and debug are three listeners, each
// serving only its own paths; health says nothing about the cluster;
// unknown paths are 404, other methods 405, bodies 413, oversized headers
// 431, and a client that does not finish its headers is cut off.
func TestListeners(t *testing.T) {
	readHeaderTimeout = 300 * time.Millisecond
	t.Cleanup(func() { readHeaderTimeout = readHeaderTimeoutDefault })
	health, metrics, debug := freeAddr(t), freeAddr(t), freeAddr(t)
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, HealthAddr: health, MetricsAddr: metrics, DebugAddr: debug})
	h.run()
	h.waitFor("ready", 5*time.Second, func() bool { return h.agent.ready.Load() })
	tests := []struct {
		addr, path string
		code       int
		contains   string
	}{
		{health, "/healthz", 200, "ok"},
		{health, "/readyz", 200, "ok"},
		{health, "/debug/model", 404, ""},
		{health, "/metrics", 404, ""},
		{metrics, "/metrics", 200, "netpol_syncs_total"},
		{metrics, "/debug/model", 404, ""},
		{metrics, "/healthz", 404, ""},
		{debug, "/debug/model", 200, `"chains"`},
		{debug, "/metrics", 404, ""},
		{debug, "/debug/pprof/", 404, ""},
		{debug, "/", 404, ""},
	}
	for _, tt := range tests {
		code, body := get(t, "http://"+tt.addr+tt.path)
		if code != tt.code || !strings.Contains(body, tt.contains) {
			t.Errorf("GET %s%s: %d %q, want %d with %q", tt.addr, tt.path, code, trim(body), tt.code, tt.contains)
		}
	}
	if code, body := get(t, "http://"+health+"/healthz"); strings.Contains(body, "10.") || len(body) > 8 {
		t.Errorf("/healthz reveals more than ok: %d %q", code, body)
	}
	resp, err := http.Post("http://"+debug+"/debug/model", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /debug/model: %d, want 405", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+debug+"/debug/model", strings.NewReader(strings.Repeat("x", 1<<20)))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("GET with a 1 MiB body: %d, want 413", resp.StatusCode)
		}
	}
	req, _ = http.NewRequest(http.MethodGet, "http://"+debug+"/debug/model", nil)
	req.Header.Set("X-Big", strings.Repeat("x", 64<<10))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Errorf("GET with 64 KiB of headers: %d, want 431", resp.StatusCode)
		}
	}
	// Slow headers: the server hangs up after readHeaderTimeout.
	c, err := net.Dial("tcp", debug)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /debug/model HTTP/1.1\r\nHost: x\r\n")
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, c)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("a client that never ends its headers kept the connection %v", took)
	}
}

// TestProfiling: --profiling serves Go's profiles on the debug address
// (TestListeners: nothing there without it).
func TestProfiling(t *testing.T) {
	debug := freeAddr(t)
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, DebugAddr: debug, Profiling: true})
	h.run()
	h.waitFor("ready", 5*time.Second, func() bool { return h.agent.ready.Load() })
	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/heap?debug=1": "heap profile",
		"/debug/model": `"chains"`} {
		if code, body := get(t, "http://"+debug+path); code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %q, want 200 with %q", path, code, trim(body), want)
		}
	}
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// TestModelWatchStream: a watcher gets the model, then each new
// generation; watchers beyond the limit are refused (503); a watcher that
// stops reading does not hold up syncs, and is dropped.
func TestModelWatchStream(t *testing.T) {
	debug := freeAddr(t)
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, DebugAddr: debug, Serving: ServingOptions{MaxWatchers: 3}})
	h.run()
	h.waitFor("ready", 5*time.Second, func() bool { return h.agent.ready.Load() })
	url := "http://" + debug + "/debug/model?watch=true"
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "application/x-ndjson" {
		t.Fatalf("watch: %d %s", resp.StatusCode, ct)
	}
	dec := json.NewDecoder(resp.Body)
	var first ModelView
	if err := dec.Decode(&first); err != nil {
		t.Fatal(err)
	}
	if first.Node != "node-1" || len(first.Chains) == 0 {
		t.Fatalf("first model: %+v", first)
	}
	// A slow reader: it asks for the stream and never reads it.
	slow, err := net.Dial("tcp", debug)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.(*net.TCPConn).SetReadBuffer(4096)
	fmt.Fprintf(slow, "GET /debug/model?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
	h.waitFor("two watchers", 2*time.Second, func() bool { return h.agent.models.watchers() == 2 })
	third, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Body.Close()
	fourth, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	fourth.Body.Close()
	if fourth.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("the 4th watcher with --max-model-watchers 3: %d, want 503", fourth.StatusCode)
	}
	// Changes: each is programmed while the slow reader is stuck, and the
	// watcher sees the new generation.
	for i, pod := range [][2]string{{"x", "b"}, {"y", "a"}, {"y", "c"}} { // pods on node-1
		want := h.create(isolate(pod[0], pod[1]))
		took := h.waitFor("change programmed", 5*time.Second, func() bool { return holds(h.pol, want) })
		var m ModelView
		for m.Generation <= first.Generation+int64(i) {
			if err := dec.Decode(&m); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("change %d programmed in %v; the watcher got generation %d", i, took, m.Generation)
	}
	if got := h.agent.models.watchers(); got != 3 {
		t.Errorf("%d watchers, want 3", got)
	}
	// Stopping the agent ends every stream.
	h.cancel()
	<-h.done
	h.done <- nil
	r := bufio.NewReader(resp.Body)
	if _, err := io.Copy(io.Discard, r); err != nil && !strings.Contains(err.Error(), "closed") {
		t.Logf("stream end: %v", err)
	}
}

type fakeAuthn map[string]string // token -> user

func (f fakeAuthn) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if name, ok := f[tok]; ok && tok != "" {
		return &authenticator.Response{User: &user.DefaultInfo{Name: name}}, true, nil
	}
	return nil, false, nil
}

type fakeAuthz map[string]string // user -> path prefix allowed

func (f fakeAuthz) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if p, ok := f[a.GetUser().GetName()]; ok && a.GetVerb() == "get" && !a.IsResourceRequest() && strings.HasPrefix(a.GetPath(), p) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "no RBAC rule", nil
}

// TestWithAuth: the secure port's filter: 401 without a known token, 403
// when the authorizer does not allow the path, the handler otherwise;
// /healthz and /readyz need nothing; the token is not passed on.
func TestWithAuth(t *testing.T) {
	var sawToken bool
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawToken = r.Header.Get("Authorization") != ""
		fmt.Fprint(w, "inner")
	})
	h := withAuth(inner, fakeAuthn{"t-reader": "reader", "t-other": "other"}, fakeAuthz{"reader": "/debug/"}, func(string, ...any) {})
	tests := []struct {
		path, token string
		code        int
	}{
		{"/debug/model", "", 401},
		{"/debug/model", "wrong", 401},
		{"/debug/model", "t-other", 403},
		{"/metrics", "t-reader", 403},
		{"/debug/model", "t-reader", 200},
		{"/healthz", "", 200},
		{"/readyz", "", 200},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest(http.MethodGet, "https://agent"+tt.path, nil)
		if tt.token != "" {
			r.Header.Set("Authorization", "Bearer "+tt.token)
		}
		w := &recorder{header: http.Header{}}
		h.ServeHTTP(w, r)
		if w.code == 0 {
			w.code = 200
		}
		if w.code != tt.code {
			t.Errorf("%s with token %q: %d, want %d", tt.path, tt.token, w.code, tt.code)
		}
		if w.code == 200 && sawToken {
			t.Errorf("%s: the handler saw the caller's token", tt.path)
		}
	}
}

type recorder struct {
	header http.Header
	code   int
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return len(b), nil
}
func (r *recorder) WriteHeader(c int) { r.code = c }

// TestAgentPortsFromOptions: the protected ports are the metrics, debug
// and secure ports that listen beyond loopback; the health port never.
func TestAgentPortsFromOptions(t *testing.T) {
	o := Options{ProtectAgentPorts: true, HealthAddr: ":9754", MetricsAddr: "127.0.0.1:9753", DebugAddr: ":9755",
		Serving: ServingOptions{SecurePort: 10253, BindAddress: "0.0.0.0"}}
	p := o.agentPorts()
	if p == nil || fmt.Sprint(p.Ports) != "[9755 10253]" {
		t.Errorf("ports %v, want [9755 10253]", p)
	}
	o.ProtectAgentPorts = false
	if o.agentPorts() != nil {
		t.Error("protection without --protect-agent-ports")
	}
}
