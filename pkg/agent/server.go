package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netns"
	"golang.org/x/net/netutil"

	"github.com/netpol/netpol/pkg/nft"
)

// What the agent serves, and where (see docs/architecture.md, "What the
// agent serves"):
//
//   - health (HealthAddr, plain HTTP, every address by default): /healthz
//     and /readyz, what the kubelet probes. They say ok or why not, and
//     nothing about the cluster.
//   - metrics (MetricsAddr, plain HTTP, 127.0.0.1 by default): /metrics.
//   - debug (DebugAddr, plain HTTP, 127.0.0.1 by default): /debug/model and
//     its watch stream (/debug/model?watch=true), and /debug/dns (what the
//     node learned for domainNames rules).
//   - secure (Serving.SecurePort, HTTPS): /metrics and /debug/* for callers
//     the API server authenticates (TokenReview) and authorizes
//     (SubjectAccessReview on the non-resource URL) — as kube-scheduler and
//     kube-controller-manager serve them — plus /healthz and /readyz
//     without authentication.
//
// Every listener bounds what a client can hold: header size and read
// time, a response's write time, the number of open connections, and (for
// the watch stream) the number of watchers and the time one write may
// block. A watcher gets the latest model when it can take it; the sync
// loop only closes a channel and never waits for a reader or a render.
// The health listener, open to the pods, keeps idle connections briefly
// and never makes a new one wait for a free slot (connLimit): a pod
// holding connections cannot starve the kubelet's probes.

// Limits of the HTTP listeners.
const (
	readHeaderTimeoutDefault = 5 * time.Second
	readTimeout              = 10 * time.Second
	writeTimeout             = 30 * time.Second
	idleTimeout              = 60 * time.Second
	maxHeaderBytes           = 16 << 10
	// watchWriteTimeout is how long one write to a watcher may block
	// before the agent hangs up on it (a reader that stopped reading).
	watchWriteTimeout = 10 * time.Second
	// watchKeepalive is how often an idle watch stream gets a blank line,
	// so that dead peers are noticed and proxies keep it open.
	watchKeepalive = 30 * time.Second
	// watchCounters is how often a watch stream gets the per-rule
	// counters that changed.
	watchCounters = 2 * time.Second
	// DefaultMaxWatchers bounds the concurrent /debug/model watch streams.
	DefaultMaxWatchers = 128
	// connsBeyondWatchers is how many connections a listener accepts
	// besides the watchers.
	connsBeyondWatchers = 64
	// healthTimeout bounds a health request (read and write) and how long
	// the health listener keeps an idle connection: a probe is one small
	// request, and the kubelet does not reuse connections.
	healthTimeout = 5 * time.Second
	// healthMaxConns is how many connections the health listener keeps
	// open; beyond it a new connection closes the oldest one not in a
	// request (connLimit).
	healthMaxConns = 64
)

// readHeaderTimeout is how long a client may take to send its request
// line and headers (a variable: tests shorten it).
var readHeaderTimeout = readHeaderTimeoutDefault

// serve starts the health, metrics, debug and secure listeners (each may
// be off) and returns a function that stops them.
func (a *Agent) serve() (func(), error) {
	var servers []*http.Server
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, s := range servers {
			s.Shutdown(ctx)
		}
		a.models.closeAll()
	}
	start := func(name, addr string, h http.Handler, tlsConfig *tls.Config) error {
		if addr == "" {
			return nil
		}
		l, err := a.listen(addr)
		if err != nil {
			return fmt.Errorf("%s: listening on %s: %w", name, addr, err)
		}
		srv := &http.Server{Handler: limitRequests(h), ReadHeaderTimeout: readHeaderTimeout, ReadTimeout: readTimeout,
			WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes, TLSConfig: tlsConfig}
		if name == "health" {
			// The kubelet's probes share this listener with every pod of
			// the node (it is never protected: docs/architecture.md).
			// netutil.LimitListener stops accepting at its limit, and a
			// probe would then queue behind connections a pod holds open
			// (idle ones for IdleTimeout, silent ones for
			// ReadHeaderTimeout). Here connections are kept briefly and
			// a new one is always accepted: at the limit it closes the
			// oldest connection that is not in a request.
			srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout = healthTimeout, healthTimeout, healthTimeout
			srv.ReadHeaderTimeout = min(readHeaderTimeout, healthTimeout)
			a.healthConns.max = healthMaxConns
			srv.ConnState = a.healthConns.connState
		} else {
			l = netutil.LimitListener(l, a.opts.Serving.maxWatchers()+connsBeyondWatchers)
		}
		servers = append(servers, srv)
		a.log.Info("serving", "listener", name, "addr", l.Addr().String(), "tls", tlsConfig != nil)
		go func() {
			var err error
			if tlsConfig != nil {
				err = srv.ServeTLS(l, "", "")
			} else {
				err = srv.Serve(l)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("http server", "listener", name, "addr", addr, "err", err)
			}
		}()
		return nil
	}
	a.models.max = a.opts.Serving.maxWatchers()
	if err := start("health", a.opts.HealthAddr, a.healthMux(), nil); err != nil {
		stop()
		return nil, err
	}
	if err := start("metrics", a.opts.MetricsAddr, a.metricsMux(), nil); err != nil {
		stop()
		return nil, err
	}
	if err := start("debug", a.opts.DebugAddr, a.debugMux(), nil); err != nil {
		stop()
		return nil, err
	}
	if s := a.opts.Serving; s.SecurePort > 0 {
		h, tlsConfig, err := a.secureHandler()
		if err != nil {
			stop()
			return nil, err
		}
		if err := start("secure", net.JoinHostPort(s.BindAddress, strconv.Itoa(s.SecurePort)), h, tlsConfig); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

// listen opens a TCP listener; with ListenInNetNS, inside the network
// namespace the agent programs (the lab: the agent's ports on the lab
// node's addresses, as a host-network pod's would be). A socket stays in
// the namespace it was made in.
func (a *Agent) listen(addr string) (net.Listener, error) {
	if !a.opts.ListenInNetNS || a.opts.NetNS == "" {
		return net.Listen("tcp", addr)
	}
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread is left locked: it ends with the goroutine instead of
		// going back to the pool in another namespace.
		runtime.LockOSThread()
		target, err := netns.GetFromPath(netnsPath(a.opts.NetNS))
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			ch <- result{nil, err}
			return
		}
		l, err := net.Listen("tcp", addr)
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// limitRequests answers only GET and HEAD without a body; everything
// else is refused before any handler runs.
func limitRequests(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.ContentLength > 0 {
			http.Error(w, "a request body is not accepted", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 0)
		h.ServeHTTP(w, r)
	})
}

func (a *Agent) healthMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.health(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "the initial sync is not done", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

func (a *Agent) metricsMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.registry, promhttp.HandlerOpts{
		MaxRequestsInFlight: 8, Timeout: 10 * time.Second}))
	return mux
}

func (a *Agent) debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/model", a.serveModel)
	mux.HandleFunc("/debug/dns", a.serveDNS)
	if a.opts.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// serveDNS serves what the node learned from DNS answers (node.DNSStatus:
// the queue, the cluster DNS servers, the patterns, counts and every
// learned address with its name, learn and expiry times) as JSON.
func (a *Agent) serveDNS(w http.ResponseWriter, r *http.Request) {
	st := a.prog.DNS(true)
	if st == nil {
		http.Error(w, "domainNames learning is off (--no-dns)", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(st)
}

// serveModel serves the node's compiled model as JSON; with ?watch=true,
// a stream of it: one JSON object per line, the current model first, then
// the model of each later generation (generations that come faster than
// the reader takes them are skipped: a watcher always gets the latest).
func (a *Agent) serveModel(w http.ResponseWriter, r *http.Request) {
	watch, _ := strconv.ParseBool(r.URL.Query().Get("watch"))
	if !watch {
		m := a.models.render(a.opts.NodeName, &a.programmed)
		if m == nil {
			http.Error(w, "no model yet: the initial sync is not done", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(m.indent)
		return
	}
	release, ok := a.models.acquire()
	if !ok {
		w.Header().Set("Retry-After", "10")
		http.Error(w, fmt.Sprintf("too many model watchers (%d)", a.models.max), http.StatusServiceUnavailable)
		return
	}
	defer release()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	write := func(b []byte) bool {
		rc.SetWriteDeadline(time.Now().Add(watchWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	// The stream outlives the listener's read and write timeouts: each
	// write has its own deadline instead.
	rc.SetReadDeadline(time.Time{})
	var sent int64 = -1
	if !write(nil) { // headers now: the client knows the stream is open
		return
	}
	keepalive := time.NewTicker(watchKeepalive)
	defer keepalive.Stop()
	// The per-rule counters: every one after the first model, then those
	// that changed, at most every watchCounters.
	var counters <-chan time.Time
	sentCounters := map[string]nft.CounterValue{}
	if a.prog != nil && a.prog.CountsRules() {
		tick := time.NewTicker(watchCounters)
		defer tick.Stop()
		counters = tick.C
	}
	writeCounters := func() bool {
		now, err := a.ruleCounts.read(a.prog.RuleCounts)
		if err != nil || sent < 0 {
			return true // the next tick tries again
		}
		if line := countersLine(a.opts.NodeName, sent, now, sentCounters); line != nil {
			return write(line)
		}
		return true
	}
	for {
		changed := a.models.changed()
		if m := a.models.render(a.opts.NodeName, &a.programmed); m != nil && m.gen > sent {
			if !write(m.compact) {
				return
			}
			sent = m.gen
			if counters != nil && !writeCounters() {
				return
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-a.models.closed():
			return
		case <-keepalive.C:
			if !write([]byte("\n")) {
				return
			}
		case <-counters:
			if !writeCounters() {
				return
			}
		case <-changed:
		}
	}
}

// modelHub tells the model's watchers about new generations, bounds their
// number, and renders each generation once for all of them. The zero
// value is ready to use.
//
// mu guards the channels and the watcher count and is only ever held for
// a few instructions; a rendering (two JSON encodings of the whole model)
// holds renderMu instead, so publish, which the sync loop calls after each
// sync, never waits for one.
type modelHub struct {
	mu     sync.Mutex
	ch     chan struct{} // closed at the next publish
	done   chan struct{} // closed when the agent stops serving
	max    int
	active int

	renderMu sync.Mutex                    // one rendering at a time
	rendered atomic.Pointer[renderedModel] // the latest rendering
	// beforeRender, if set (tests), runs at the start of each rendering,
	// with renderMu held.
	beforeRender func(generation int64)
}

// renderedModel is one generation's model as JSON: compact (one line, for
// the stream) and indented (for a plain GET). Never changed once made.
type renderedModel struct {
	gen     int64
	compact []byte
	indent  []byte
}

// publish wakes every watcher: one channel close, whatever their number
// and however slow they are, and whatever is being rendered.
func (h *modelHub) publish() {
	h.mu.Lock()
	if h.ch != nil {
		close(h.ch)
		h.ch = nil
	}
	h.mu.Unlock()
}

// changed returns a channel closed at the next publish.
func (h *modelHub) changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ch == nil {
		h.ch = make(chan struct{})
	}
	return h.ch
}

func (h *modelHub) closed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		h.done = make(chan struct{})
	}
	return h.done
}

func (h *modelHub) closeAll() {
	h.closed()
	h.mu.Lock()
	select {
	case <-h.done:
	default:
		close(h.done)
	}
	h.mu.Unlock()
}

// acquire takes a watcher slot.
func (h *modelHub) acquire() (func(), bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	max := h.max
	if max <= 0 {
		max = DefaultMaxWatchers
	}
	if h.active >= max {
		return nil, false
	}
	h.active++
	return func() {
		h.mu.Lock()
		h.active--
		h.mu.Unlock()
	}, true
}

// watchers is the number of open watch streams.
func (h *modelHub) watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.active
}

// render returns the latest programmed model as JSON (nil before the
// first sync), rendered once per generation: the first caller that finds
// the rendering older than the programmed table renders the table
// programmed then, under renderMu; the others wait for it and take it. A
// rendering never holds mu.
func (h *modelHub) render(node string, programmed *atomic.Pointer[programmedTable]) *renderedModel {
	fresh := func() (*renderedModel, *programmedTable) {
		r, p := h.rendered.Load(), programmed.Load()
		if p == nil || r != nil && r.gen >= p.generation {
			return r, nil
		}
		return r, p
	}
	if r, p := fresh(); p == nil {
		return r
	}
	h.renderMu.Lock()
	defer h.renderMu.Unlock()
	r, p := fresh() // rendered while this caller waited?
	if p == nil {
		return r
	}
	if h.beforeRender != nil {
		h.beforeRender(p.generation)
	}
	table, gen := p.read()
	if table == nil {
		return r
	}
	m := newModelView(node, gen, table)
	r = &renderedModel{gen: gen}
	r.compact, _ = json.Marshal(m)
	r.compact = append(r.compact, '\n')
	r.indent, _ = json.MarshalIndent(m, "", "  ")
	r.indent = append(r.indent, '\n')
	h.rendered.Store(r)
	return r
}

// connLimit bounds a listener's open connections (its ConnState hook)
// without ever making a new connection wait: at the limit, a new
// connection closes the oldest one that is not in a request (idle between
// requests, or not done sending its first request's headers), and is
// closed itself only when all the others are in a request. A client that
// merely holds connections therefore cannot keep a new one out.
type connLimit struct {
	max   int
	mu    sync.Mutex
	conns []trackedConn // open connections, oldest first
}

type trackedConn struct {
	c     net.Conn
	state http.ConnState
}

func (l *connLimit) connState(c net.Conn, state http.ConnState) {
	var evict net.Conn
	l.mu.Lock()
	i := -1
	if state != http.StateNew {
		i = slices.IndexFunc(l.conns, func(t trackedConn) bool { return t.c == c })
	}
	switch state {
	case http.StateNew:
		if len(l.conns) >= l.max {
			evict = c
			if j := slices.IndexFunc(l.conns, func(t trackedConn) bool {
				return t.state == http.StateNew || t.state == http.StateIdle
			}); j >= 0 {
				evict = l.conns[j].c
				l.conns = slices.Delete(l.conns, j, j+1)
			}
		}
		if evict != c {
			l.conns = append(l.conns, trackedConn{c, state})
		}
	case http.StateActive, http.StateIdle:
		if i >= 0 { // else evicted already
			l.conns[i].state = state
		}
	case http.StateClosed, http.StateHijacked:
		if i >= 0 {
			l.conns = slices.Delete(l.conns, i, i+1)
		}
	}
	l.mu.Unlock()
	if evict != nil {
		// A connection that turned active meanwhile loses its request;
		// only under overload, and it was the oldest.
		evict.Close()
	}
}

// open is how many connections the limit tracks.
func (l *connLimit) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// ModelURL is the /debug/model URL of an agent address: host:port (plain
// HTTP) or a URL (https:// for the secure port).
func ModelURL(agent string, watch bool) (string, error) {
	if !hasScheme(agent) {
		agent = "http://" + agent
	}
	u, err := url.Parse(agent)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("%s: the agent is reached over http or https", agent)
	}
	u.Path = "/debug/model"
	if watch {
		u.RawQuery = "watch=true"
	}
	return u.String(), nil
}

func hasScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return i+2 < len(s) && s[i+1] == '/' && s[i+2] == '/'
		}
	}
	return false
}
