// Package healthcheck serves the health-check node ports of Services with
// externalTrafficPolicy: Local, as kube-proxy's pkg/proxy/healthcheck
// (service_health.go) does.
//
// For every proxy.HealthCheck an HTTP server listens on the Service's
// health-check node port. Any request (any method, any path) is answered
// with status 200 when the Service has local endpoints on this node and the
// proxy itself is healthy, 503 otherwise (telling load balancers not to send
// traffic to this node); with the headers Content-Type: application/json,
// X-Content-Type-Options: nosniff and X-Load-Balancing-Endpoint-Weight:
// <local endpoints>; and with the JSON body kube-proxy writes, byte for byte
// (tab-indented, no trailing newline):
//
//	{
//		"service": {
//			"namespace": "ns",
//			"name": "svc"
//		},
//		"localEndpoints": 2,
//		"serviceProxyHealthy": true
//	}
//
// Server.Sync makes the listeners match a list of health checks: it opens
// new ports, closes removed ones (and reopens a Service whose port changed),
// and updates the endpoint counts of the others in place, without touching
// their sockets or connections.
package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/pkg/proxy"
)

// HTTP server limits. kube-proxy sets none; these only bound what a slow or
// idle client can hold.
const (
	readHeaderTimeout = 10 * time.Second
	writeTimeout      = 10 * time.Second
	idleTimeout       = 90 * time.Second
	maxHeaderBytes    = 16 << 10
	// shutdownGrace bounds how long a removed listener's in-flight
	// requests may take to finish before their connections are closed.
	shutdownGrace = 5 * time.Second
)

// ErrClosed is returned by Sync after Close.
var ErrClosed = errors.New("health check server closed")

// Options configure a Server.
type Options struct {
	// Addresses are the node addresses to listen on. Nil or empty means
	// all addresses: 0.0.0.0 and, when the kernel supports IPv6, :: (an
	// IPv6-only socket, so both families are served by separate sockets).
	Addresses []netip.Addr
	// NetNS, when valid (> 0), is the network namespace the listening
	// sockets are opened in. The zero value and netns.None() mean the
	// caller's namespace.
	NetNS netns.NsHandle
	// Healthy reports the proxy's own health, answered as
	// serviceProxyHealthy; when it is false every check answers 503. Nil
	// means always healthy.
	Healthy func() bool
	// Logger receives listener start/stop messages and server errors. Nil
	// discards them.
	Logger *slog.Logger
}

// Server runs the health-check node port listeners. Its methods are safe for
// concurrent use.
type Server struct {
	addresses []netip.Addr // as given, copied
	handle    netns.NsHandle
	healthy   func() bool
	log       *slog.Logger

	mu       sync.Mutex
	closed   bool
	services map[serviceKey]*instance

	drains   sync.WaitGroup // Shutdowns still draining connections
	errMu    sync.Mutex
	drainErr []error // from drains, reported by Close
}

// serviceKey names a Service.
type serviceKey struct{ namespace, name string }

func (k serviceKey) String() string { return k.namespace + "/" + k.name }

// instance is the listener set of one Service's health-check port.
type instance struct {
	key       serviceKey
	port      uint16
	endpoints atomic.Int64
	srv       *http.Server
	listeners []net.Listener
	// shutdownStarted is closed once srv.Shutdown has closed the
	// listeners it tracks and marked the server as shutting down.
	shutdownStarted chan struct{}
}

// NewServer makes a Server with no listeners; Sync opens them.
func NewServer(opts Options) *Server {
	s := &Server{
		addresses: slices.Clone(opts.Addresses),
		handle:    opts.NetNS,
		healthy:   opts.Healthy,
		log:       opts.Logger,
		services:  map[serviceKey]*instance{},
	}
	if s.healthy == nil {
		s.healthy = func() bool { return true }
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

// Sync makes the listeners match checks. A Service that is no longer listed,
// or whose port changed, has its listeners closed first (so that another
// Service may take its port in the same Sync); a new Service (or new port)
// gets listeners on every address; a Service that is kept only has its
// endpoint count updated, its listeners and connections are untouched.
//
// Problems (an invalid port, a Service listed twice, a port already in use,
// ...) are returned joined, each naming the Service and port; they do not
// stop the other checks. A Service that failed to start has no listener
// left open and is retried by the next Sync.
func (s *Server) Sync(checks []proxy.HealthCheck) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}

	var errs []error
	want := make(map[serviceKey]proxy.HealthCheck, len(checks))
	order := make([]serviceKey, 0, len(checks))
	for _, hc := range checks {
		k := serviceKey{hc.Namespace, hc.Name}
		if hc.NodePort <= 0 || hc.NodePort > 65535 {
			errs = append(errs, fmt.Errorf("health check %s: invalid node port %d", k, hc.NodePort))
			continue
		}
		if prev, dup := want[k]; dup {
			errs = append(errs, fmt.Errorf("health check %s: listed twice (ports %d and %d), keeping port %d",
				k, prev.NodePort, hc.NodePort, prev.NodePort))
			continue
		}
		want[k] = hc
		order = append(order, k)
	}

	for k, inst := range s.services {
		if hc, ok := want[k]; !ok || int32(inst.port) != hc.NodePort {
			s.log.Info("closing health check", "service", k.String(), "port", inst.port)
			s.stop(inst)
			delete(s.services, k)
		}
	}

	for _, k := range order {
		hc := want[k]
		if inst := s.services[k]; inst != nil {
			if old := inst.endpoints.Swap(int64(hc.LocalEndpoints)); old != int64(hc.LocalEndpoints) {
				s.log.Debug("health check endpoints", "service", k.String(), "port", inst.port, "localEndpoints", hc.LocalEndpoints)
			}
			continue
		}
		inst := &instance{key: k, port: uint16(hc.NodePort), shutdownStarted: make(chan struct{})}
		inst.endpoints.Store(int64(hc.LocalEndpoints))
		if err := s.start(inst); err != nil {
			errs = append(errs, fmt.Errorf("health check %s on port %d: %w", k, hc.NodePort, err))
			s.log.Warn("failed to start health check", "service", k.String(), "port", hc.NodePort, "err", err)
			continue
		}
		s.log.Info("opened health check", "service", k.String(), "port", inst.port, "localEndpoints", hc.LocalEndpoints)
		s.services[k] = inst
	}
	return errors.Join(errs...)
}

// Close stops every listener, lets in-flight requests finish (up to a few
// seconds) and returns once all connections are closed. Later calls to Sync
// return ErrClosed; Close may be called more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for k, inst := range s.services {
			s.stop(inst)
			delete(s.services, k)
		}
	}
	s.mu.Unlock()
	s.drains.Wait()
	s.errMu.Lock()
	defer s.errMu.Unlock()
	err := errors.Join(s.drainErr...)
	s.drainErr = nil
	return err
}

// endpoint is one socket to listen on.
type endpoint struct {
	network string // tcp4 or tcp6
	addr    netip.AddrPort
	// optional: skipped when the kernel does not support its family.
	optional bool
}

// endpoints lists the sockets for port.
func (s *Server) endpoints(port uint16) []endpoint {
	if len(s.addresses) == 0 {
		return []endpoint{
			{"tcp4", netip.AddrPortFrom(netip.IPv4Unspecified(), port), true},
			{"tcp6", netip.AddrPortFrom(netip.IPv6Unspecified(), port), true},
		}
	}
	var eps []endpoint
	seen := map[netip.Addr]bool{}
	for _, a := range s.addresses {
		a = a.Unmap()
		if seen[a] {
			continue
		}
		seen[a] = true
		network := "tcp6"
		if a.Is4() {
			network = "tcp4"
		}
		eps = append(eps, endpoint{network, netip.AddrPortFrom(a, port), false})
	}
	return eps
}

// start opens inst's listeners and serves them. On error nothing is left
// open.
func (s *Server) start(inst *instance) error {
	inst.srv = &http.Server{
		Handler:           &handler{inst: inst, healthy: s.healthy},
		ReadHeaderTimeout: readHeaderTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog: slog.NewLogLogger(s.log.With("service", inst.key.String(), "port", inst.port).Handler(),
			slog.LevelWarn),
	}
	inst.srv.RegisterOnShutdown(func() { close(inst.shutdownStarted) })

	closeAll := func() {
		for _, ln := range inst.listeners {
			ln.Close()
		}
		inst.listeners = nil
	}
	for _, ep := range s.endpoints(inst.port) {
		if !ep.addr.Addr().IsValid() {
			closeAll()
			return errors.New("invalid listen address")
		}
		ln, err := s.listen(ep)
		if err != nil {
			if ep.optional && familyUnsupported(err) {
				s.log.Debug("address family unavailable for health check", "address", ep.addr.String(), "err", err)
				continue
			}
			closeAll()
			return err
		}
		inst.listeners = append(inst.listeners, ln)
	}
	if len(inst.listeners) == 0 {
		return errors.New("no IPv4 or IPv6 socket could be opened")
	}
	for _, ln := range inst.listeners {
		go func() {
			if err := inst.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("health check server stopped", "service", inst.key.String(), "address", ln.Addr().String(), "err", err)
			}
		}()
	}
	return nil
}

// listen opens one listening socket in the server's network namespace.
func (s *Server) listen(ep endpoint) (net.Listener, error) {
	var ln net.Listener
	err := inNetNS(s.handle, func() error {
		// The socket is made by this goroutine, on the thread that
		// entered the namespace; it stays there.
		var err error
		ln, err = (&net.ListenConfig{}).Listen(context.Background(), ep.network, ep.addr.String())
		return err
	})
	return ln, err
}

// familyUnsupported tells whether err means the kernel cannot make a socket
// of that address family (IPv6 disabled) rather than a real failure such as
// a port in use.
func familyUnsupported(err error) bool {
	return errors.Is(err, syscall.EAFNOSUPPORT) || errors.Is(err, syscall.EPROTONOSUPPORT) ||
		errors.Is(err, syscall.EADDRNOTAVAIL)
}

// stop closes inst's listeners before returning (the port is free and new
// connections are refused) and lets its connections drain in the
// background: in-flight requests get up to shutdownGrace, idle keep-alive
// connections are closed at once.
func (s *Server) stop(inst *instance) {
	s.drains.Add(1)
	go func() {
		defer s.drains.Done()
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := inst.srv.Shutdown(ctx); err != nil && errors.Is(err, context.DeadlineExceeded) {
			if cerr := inst.srv.Close(); cerr != nil {
				s.errMu.Lock()
				s.drainErr = append(s.drainErr, fmt.Errorf("health check %s on port %d: %w", inst.key, inst.port, cerr))
				s.errMu.Unlock()
			}
		}
	}()
	// Shutdown marks the server as shutting down, then closes the
	// listeners that Serve has registered. A Serve goroutine that has not
	// registered its listener yet would close it on its own, later: close
	// them all here so the port is free when stop returns.
	<-inst.shutdownStarted
	for _, ln := range inst.listeners {
		ln.Close() // "use of closed network connection" when Shutdown did it
	}
}

// handler answers the health check of one Service.
type handler struct {
	inst    *instance
	healthy func() bool
}

// status is the JSON body, field order as kube-proxy's.
type status struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int64 `json:"localEndpoints"`
	ServiceProxyHealthy bool  `json:"serviceProxyHealthy"`
}

func (h *handler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	var st status
	st.Service.Namespace = h.inst.key.namespace
	st.Service.Name = h.inst.key.name
	st.LocalEndpoints = h.inst.endpoints.Load()
	st.ServiceProxyHealthy = h.healthy()
	// kube-proxy's body is this indentation, without a final newline.
	body, err := json.MarshalIndent(st, "", "\t")
	if err != nil { // cannot happen: strings, an integer and a bool
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Load-Balancing-Endpoint-Weight", strconv.FormatInt(st.LocalEndpoints, 10))
	if st.LocalEndpoints > 0 && st.ServiceProxyHealthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	w.Write(body)
}
