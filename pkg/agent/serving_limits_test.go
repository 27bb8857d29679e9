package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netpol/netpol/pkg/nft"
)

// TestModelPublishDuringRender: while /debug/model is being rendered,
// publish (what the sync loop calls after each sync) returns, wakes the
// watchers, and watchers can still come and go; each generation is
// rendered once however many readers ask for it.
func TestModelPublishDuringRender(t *testing.T) {
	var hub modelHub
	var programmed atomic.Pointer[programmedTable]
	table := &nft.Table{Name: "netpol"}
	programmed.Store(&programmedTable{generation: 1, table: table})
	var mu sync.Mutex
	renders := map[int64]int{}
	rendering, release := make(chan struct{}), make(chan struct{})
	hub.beforeRender = func(gen int64) {
		mu.Lock()
		renders[gen]++
		mu.Unlock()
		if gen == 1 { // a huge model: the rendering takes until release
			close(rendering)
			<-release
		}
	}
	watcher := hub.changed()
	first := make(chan *renderedModel, 1)
	go func() { first <- hub.render("node-1", &programmed) }()
	<-rendering

	// The sync loop's part of a sync, and a watcher's, while generation 1
	// is still being rendered.
	synced := make(chan struct{})
	go func() {
		defer close(synced)
		programmed.Store(&programmedTable{generation: 2, table: table})
		hub.publish()
		release, ok := hub.acquire()
		if !ok {
			t.Error("no watcher slot")
			return
		}
		hub.changed()
		release()
	}()
	select {
	case <-synced:
	case <-first:
		t.Fatal("the rendering ended before it was released")
	case <-time.After(10 * time.Second): // only so that a regression fails instead of hanging
		t.Fatal("publish waited for a rendering of the model")
	}
	select {
	case <-watcher:
	default:
		t.Fatal("publish did not wake the watchers")
	}

	close(release)
	if r := <-first; r.gen != 1 {
		t.Errorf("the first rendering is of generation %d, want 1", r.gen)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			r := hub.render("node-1", &programmed)
			var m ModelView
			if err := json.Unmarshal(r.compact, &m); err != nil || m.Generation != 2 || m.Node != "node-1" || r.gen != 2 {
				t.Errorf("rendering of generation 2: %q (%v)", r.compact, err)
			}
			if !strings.Contains(string(r.indent), "\n  \"generation\": 2,\n") {
				t.Errorf("indented rendering: %q", r.indent)
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if renders[1] != 1 || renders[2] != 1 || len(renders) != 2 {
		t.Errorf("renderings per generation %v, want one of each", renders)
	}
}

// TestHealthProbeBeyondIdleConns: a pod holds the health listener's whole
// connection limit (half idle after a request, half that never send
// one); the kubelet's probes (a new connection each) still get through at
// once, and the oldest held connections are closed to make room.
func TestHealthProbeBeyondIdleConns(t *testing.T) {
	health := freeAddr(t)
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, HealthAddr: health})
	h.run()
	h.waitFor("ready", 5*time.Second, func() bool { return h.agent.ready.Load() })
	held := make([]net.Conn, healthMaxConns)
	for i := range held {
		c, err := net.Dial("tcp", health)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		held[i] = c
		if i >= len(held)/2 {
			continue // silent
		}
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("held connection %d: %d, closed %v", i, resp.StatusCode, resp.Close)
		}
	}
	// The kernel may hand the listener connections out of order across
	// CPUs; the probe must come after every held one.
	h.waitFor("every held connection accepted", 5*time.Second, func() bool { return h.agent.healthConns.open() == len(held) })
	// As the kubelet probes: a new connection per probe, and a probe's
	// default timeout (timeoutSeconds: 1). Before, the probe waited for a
	// free slot: the first silent connection's ReadHeaderTimeout (5 s), or
	// the idle ones' IdleTimeout (60 s).
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	const probes = 3
	for i := range probes {
		resp, err := probe.Get("http://" + health + "/healthz")
		if err != nil {
			t.Fatalf("probe %d with %d connections held: %v", i, len(held), err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ok\n" {
			t.Fatalf("probe %d: %d %q", i, resp.StatusCode, b)
		}
	}
	// The first probe's connection closed the oldest held one (idle) on
	// arrival, before it was served: it is closed already. (The later
	// probes found room: the first one's connection had closed.)
	held[0].SetReadDeadline(time.Now().Add(time.Second))
	if _, err := held[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("the oldest held connection: read %v, want EOF (closed for the probe)", err)
	}
}

// TestConnLimitSparesRequests: connections in a request are never closed
// to make room; a new connection is refused (closed) when the limit is
// all requests in flight.
func TestConnLimitSparesRequests(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	in, release := make(chan struct{}, 2), make(chan struct{})
	srv := &http.Server{ConnState: (&connLimit{max: 2}).connState,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			in <- struct{}{}
			<-release
			fmt.Fprint(w, "ok")
		})}
	go srv.Serve(l)
	defer srv.Close()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	results := make(chan error, 2)
	for range 2 {
		go func() {
			resp, err := client.Get("http://" + l.Addr().String() + "/")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != "ok" {
					err = fmt.Errorf("%d %q", resp.StatusCode, b)
				}
			}
			results <- err
		}()
	}
	<-in
	<-in // both connections are in a request
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		close(release)
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a third connection with two requests in flight (limit 2): read %v, want it closed", err)
	}
	close(release)
	for range 2 {
		if err := <-results; err != nil {
			t.Errorf("a request in flight: %v", err)
		}
	}
}
