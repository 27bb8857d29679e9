package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/kerneltest"

	"github.com/netpol/netpol/pkg/proxy"
)

var (
	lo4 = netip.MustParseAddr("127.0.0.1")
	lo6 = netip.MustParseAddr("::1")
)

// newNetNS makes a fresh, unnamed network namespace with lo up, closed at
// the end of the test (the kernel frees it once no socket uses it).
func newNetNS(t *testing.T) netns.NsHandle {
	t.Helper()
	return kerneltest.NetNS(t, "it creates network namespaces")
}

// hasIPv6Loopback tells whether ::1 can be listened on inside h.
func hasIPv6Loopback(h netns.NsHandle) bool {
	err := inNetNS(h, func() error {
		ln, err := net.Listen("tcp6", "[::1]:0")
		if err == nil {
			ln.Close()
		}
		return err
	})
	return err == nil
}

// client makes HTTP requests from inside namespace h: every connection's
// socket is created on a thread that entered h. Keep-alive is on; dials
// counts the connections made.
type client struct {
	http  *http.Client
	dials atomic.Int32
}

func newClient(t *testing.T, h netns.NsHandle) *client {
	c := &client{}
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	tr := &http.Transport{
		Proxy: nil, // never an environment proxy
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c.dials.Add(1)
			var conn net.Conn
			err := inNetNS(h, func() error {
				var err error
				conn, err = dialer.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
		MaxIdleConnsPerHost: 1,
	}
	t.Cleanup(tr.CloseIdleConnections)
	c.http = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	return c
}

// reply is one health-check answer.
type reply struct {
	code   int
	header http.Header
	body   string
	reused bool // the request went over a kept-alive connection
}

func (c *client) get(addr netip.Addr, port int32, path string) (reply, error) {
	var r reply
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { r.reused = i.Reused }}
	url := fmt.Sprintf("http://%s%s", netip.AddrPortFrom(addr, uint16(port)), path)
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
	if err != nil {
		return r, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, err
	}
	r.code, r.header, r.body = resp.StatusCode, resp.Header, string(b)
	return r, nil
}

// wantBody is kube-proxy's body for a check.
func wantBody(ns, name string, n int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		ns, name, n, healthy)
}

// expectServes checks one answer: status, headers and body (as bytes and
// as parsed JSON).
func expectServes(t *testing.T, c *client, addr netip.Addr, hc proxy.HealthCheck, healthy bool, path string) reply {
	t.Helper()
	r, err := c.get(addr, hc.NodePort, path)
	if err != nil {
		t.Fatalf("GET %s port %d (%s/%s): %v", addr, hc.NodePort, hc.Namespace, hc.Name, err)
	}
	wantCode := http.StatusServiceUnavailable
	if hc.LocalEndpoints > 0 && healthy {
		wantCode = http.StatusOK
	}
	where := fmt.Sprintf("%s/%s at %s", hc.Namespace, hc.Name, netip.AddrPortFrom(addr, uint16(hc.NodePort)))
	if r.code != wantCode {
		t.Errorf("%s: status %d, want %d", where, r.code, wantCode)
	}
	for h, want := range map[string]string{
		"Content-Type":                     "application/json",
		"X-Content-Type-Options":           "nosniff",
		"X-Load-Balancing-Endpoint-Weight": fmt.Sprint(hc.LocalEndpoints),
	} {
		if got := r.header.Get(h); got != want {
			t.Errorf("%s: header %s = %q, want %q", where, h, got, want)
		}
	}
	if want := wantBody(hc.Namespace, hc.Name, hc.LocalEndpoints, healthy); r.body != want {
		t.Errorf("%s: body\n%s\nwant\n%s", where, r.body, want)
	}
	var parsed struct {
		Service             struct{ Namespace, Name string }
		LocalEndpoints      int
		ServiceProxyHealthy bool
	}
	if err := json.Unmarshal([]byte(r.body), &parsed); err != nil {
		t.Errorf("%s: body is not JSON: %v", where, err)
	} else if parsed.Service.Namespace != hc.Namespace || parsed.Service.Name != hc.Name ||
		parsed.LocalEndpoints != hc.LocalEndpoints || parsed.ServiceProxyHealthy != healthy {
		t.Errorf("%s: parsed body %+v", where, parsed)
	}
	return r
}

// expectRefused checks that nothing listens on addr:port (a fresh
// connection is refused).
func expectRefused(t *testing.T, h netns.NsHandle, addr netip.Addr, port int32) {
	t.Helper()
	_, err := newClient(t, h).get(addr, port, "/healthz")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET %s: %v, want connection refused", netip.AddrPortFrom(addr, uint16(port)), err)
	}
}

// TestLifecycle follows two Services through Sync calls on several address
// configurations: serve, update counts in place, remove one, close.
func TestLifecycle(t *testing.T) {
	cases := []struct {
		name      string
		addresses []netip.Addr
		serveOn   []netip.Addr // where the checks must answer
		refuseOn  []netip.Addr // where nothing may listen
		ipv6      bool         // needs ::1
	}{
		{name: "all addresses IPv4", serveOn: []netip.Addr{lo4}},
		{name: "all addresses dual-stack", serveOn: []netip.Addr{lo4, lo6}, ipv6: true},
		{name: "IPv4 only", addresses: []netip.Addr{lo4}, serveOn: []netip.Addr{lo4}, refuseOn: []netip.Addr{lo6}, ipv6: true},
		{name: "IPv4-mapped address", addresses: []netip.Addr{netip.MustParseAddr("::ffff:127.0.0.1")}, serveOn: []netip.Addr{lo4}},
		{name: "IPv6 only", addresses: []netip.Addr{lo6}, serveOn: []netip.Addr{lo6}, refuseOn: []netip.Addr{lo4}, ipv6: true},
		{name: "IPv4 and IPv6", addresses: []netip.Addr{lo4, lo6}, serveOn: []netip.Addr{lo4, lo6}, ipv6: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newNetNS(t)
			if tc.ipv6 && !hasIPv6Loopback(h) {
				t.Skip("skipping: no IPv6 loopback (::1) in a new network namespace")
			}
			s := NewServer(Options{Addresses: tc.addresses, NetNS: h})
			t.Cleanup(func() { s.Close() })

			web := proxy.HealthCheck{Namespace: "shop", Name: "web", NodePort: 32001, LocalEndpoints: 2}
			db := proxy.HealthCheck{Namespace: "shop", Name: "db", NodePort: 32002, LocalEndpoints: 0}
			if err := s.Sync([]proxy.HealthCheck{db, web}); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			clients := map[netip.Addr]*client{}
			for _, a := range tc.serveOn {
				clients[a] = newClient(t, h)
				expectServes(t, clients[a], a, web, true, "/healthz")
				expectServes(t, clients[a], a, db, true, "/any/path?x=1")
			}
			for _, a := range tc.refuseOn {
				expectRefused(t, h, a, web.NodePort)
				expectRefused(t, h, a, db.NodePort)
			}

			// Counts change: same listeners, kept-alive connections
			// still answer with the new counts.
			srvBefore := s.services[serviceKey{"shop", "db"}].srv
			web.LocalEndpoints, db.LocalEndpoints = 0, 1
			if err := s.Sync([]proxy.HealthCheck{db, web}); err != nil {
				t.Fatalf("Sync with new counts: %v", err)
			}
			if s.services[serviceKey{"shop", "db"}].srv != srvBefore {
				t.Errorf("the db listener was replaced on a count change")
			}
			for _, a := range tc.serveOn {
				c := clients[a]
				dials := c.dials.Load()
				if r := expectServes(t, c, a, db, true, "/"); !r.reused {
					t.Errorf("%s: the kept-alive connection to db was not reused after a count change", a)
				}
				if r := expectServes(t, c, a, web, true, "/"); !r.reused {
					t.Errorf("%s: the kept-alive connection to web was not reused after a count change", a)
				}
				if n := c.dials.Load(); n != dials {
					t.Errorf("%s: %d new connections after a count change, want 0", a, n-dials)
				}
			}

			// web goes away: its port refuses, db still serves.
			if err := s.Sync([]proxy.HealthCheck{db}); err != nil {
				t.Fatalf("Sync removing web: %v", err)
			}
			for _, a := range tc.serveOn {
				expectRefused(t, h, a, web.NodePort)
				expectServes(t, clients[a], a, db, true, "/")
			}

			// Close: everything refuses; Sync is refused; Close again is fine.
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			for _, a := range append(tc.serveOn, tc.refuseOn...) {
				expectRefused(t, h, a, web.NodePort)
				expectRefused(t, h, a, db.NodePort)
			}
			if err := s.Sync([]proxy.HealthCheck{db}); !errors.Is(err, ErrClosed) {
				t.Errorf("Sync after Close: %v, want ErrClosed", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// TestStatus checks the answer for each combination of local endpoints and
// proxy health, on one listener whose count and health change between
// requests.
func TestStatus(t *testing.T) {
	h := newNetNS(t)
	var healthy atomic.Bool
	s := NewServer(Options{Addresses: []netip.Addr{lo4}, NetNS: h, Healthy: healthy.Load})
	t.Cleanup(func() { s.Close() })
	c := newClient(t, h)
	cases := []struct {
		name      string
		endpoints int
		healthy   bool
		wantCode  int
	}{
		{"endpoints, proxy healthy", 3, true, http.StatusOK},
		{"one endpoint", 1, true, http.StatusOK},
		{"no endpoints", 0, true, http.StatusServiceUnavailable},
		{"endpoints, proxy unhealthy", 3, false, http.StatusServiceUnavailable},
		{"no endpoints, proxy unhealthy", 0, false, http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hc := proxy.HealthCheck{Namespace: "ns", Name: "svc", NodePort: 30100, LocalEndpoints: tc.endpoints}
			healthy.Store(tc.healthy)
			if err := s.Sync([]proxy.HealthCheck{hc}); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			if r := expectServes(t, c, lo4, hc, tc.healthy, "/"); r.code != tc.wantCode {
				t.Errorf("status %d, want %d", r.code, tc.wantCode)
			}
		})
	}
}

// TestDefaultHealthy: without a Healthy func the proxy counts as healthy.
func TestDefaultHealthy(t *testing.T) {
	h := newNetNS(t)
	s := NewServer(Options{NetNS: h})
	t.Cleanup(func() { s.Close() })
	hc := proxy.HealthCheck{Namespace: "ns", Name: "svc", NodePort: 30101, LocalEndpoints: 1}
	if err := s.Sync([]proxy.HealthCheck{hc}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	expectServes(t, newClient(t, h), lo4, hc, true, "/")
}

// TestSyncErrors: a port in use (by another socket or another Service) or
// an invalid entry is reported naming the Service and port, and the other
// checks still serve; a failed check is retried by the next Sync.
func TestSyncErrors(t *testing.T) {
	cases := []struct {
		name      string
		addresses []netip.Addr
		occupy    string // address taken by another socket before Sync
		ipv6      bool
	}{
		{name: "all addresses, IPv4 port taken", occupy: "tcp4/0.0.0.0"},
		{name: "all addresses, IPv6 port taken", occupy: "tcp6/[::]", ipv6: true},
		{name: "one address, port taken on it", addresses: []netip.Addr{lo4}, occupy: "tcp4/127.0.0.1"},
		{name: "one address, port taken on all", addresses: []netip.Addr{lo4}, occupy: "tcp4/0.0.0.0"},
		{name: "two addresses, port taken on the second", addresses: []netip.Addr{lo4, lo6}, occupy: "tcp6/[::1]", ipv6: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newNetNS(t)
			if tc.ipv6 && !hasIPv6Loopback(h) {
				t.Skip("skipping: no IPv6 loopback (::1) in a new network namespace")
			}
			const busyPort = 31000
			network, host, _ := strings.Cut(tc.occupy, "/")
			var squatter net.Listener
			if err := inNetNS(h, func() error {
				var err error
				squatter, err = net.Listen(network, fmt.Sprintf("%s:%d", host, busyPort))
				return err
			}); err != nil {
				t.Fatalf("occupying the port: %v", err)
			}
			defer squatter.Close()

			s := NewServer(Options{Addresses: tc.addresses, NetNS: h})
			t.Cleanup(func() { s.Close() })
			busy := proxy.HealthCheck{Namespace: "team-a", Name: "busy", NodePort: busyPort, LocalEndpoints: 1}
			ok := proxy.HealthCheck{Namespace: "team-b", Name: "fine", NodePort: 31001, LocalEndpoints: 1}
			err := s.Sync([]proxy.HealthCheck{busy, ok})
			if err == nil {
				t.Fatalf("Sync with a port in use: no error")
			}
			if !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("error %q is not EADDRINUSE", err)
			}
			for _, want := range []string{"team-a/busy", "31000"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "team-b/fine") {
				t.Errorf("error %q names the check that worked", err)
			}
			c := newClient(t, h)
			expectServes(t, c, lo4, ok, true, "/")
			// Nothing of the failed check was left listening: freeing
			// the port and syncing again starts it.
			squatter.Close()
			if err := s.Sync([]proxy.HealthCheck{busy, ok}); err != nil {
				t.Fatalf("Sync after freeing the port: %v", err)
			}
			expectServes(t, c, lo4, busy, true, "/")
			expectServes(t, c, lo4, ok, true, "/")
		})
	}
}

// TestInvalidChecks: bad ports and duplicate Services are errors that name
// the Service; valid checks in the same list still serve.
func TestInvalidChecks(t *testing.T) {
	h := newNetNS(t)
	s := NewServer(Options{Addresses: []netip.Addr{lo4}, NetNS: h})
	t.Cleanup(func() { s.Close() })
	good := proxy.HealthCheck{Namespace: "ns", Name: "good", NodePort: 30200, LocalEndpoints: 1}
	err := s.Sync([]proxy.HealthCheck{
		{Namespace: "ns", Name: "zero", NodePort: 0},
		{Namespace: "ns", Name: "big", NodePort: 70000},
		good,
		{Namespace: "ns", Name: "good", NodePort: 30201, LocalEndpoints: 5},
	})
	for _, want := range []string{"ns/zero: invalid node port 0", "ns/big: invalid node port 70000", "ns/good: listed twice"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Sync error %v, want it to contain %q", err, want)
		}
	}
	c := newClient(t, h)
	expectServes(t, c, lo4, good, true, "/")
	expectRefused(t, h, lo4, 30201)
}

// TestPortChange: a Service whose port changes moves to the new port, and
// another Service may take the freed port in the same Sync.
func TestPortChange(t *testing.T) {
	h := newNetNS(t)
	s := NewServer(Options{NetNS: h})
	t.Cleanup(func() { s.Close() })
	a := proxy.HealthCheck{Namespace: "ns", Name: "a", NodePort: 30300, LocalEndpoints: 1}
	b := proxy.HealthCheck{Namespace: "ns", Name: "b", NodePort: 30301, LocalEndpoints: 0}
	if err := s.Sync([]proxy.HealthCheck{a, b}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	// Swap the ports (b is listed first, so its new port is still held by
	// a until a's old listener is closed).
	a.NodePort, b.NodePort = 30301, 30300
	if err := s.Sync([]proxy.HealthCheck{b, a}); err != nil {
		t.Fatalf("Sync swapping ports: %v", err)
	}
	c := newClient(t, h)
	expectServes(t, c, lo4, a, true, "/")
	expectServes(t, c, lo4, b, true, "/")
	// Move a to a new port: the old one is freed.
	a.NodePort = 30302
	if err := s.Sync([]proxy.HealthCheck{b, a}); err != nil {
		t.Fatalf("Sync moving a: %v", err)
	}
	expectServes(t, c, lo4, a, true, "/")
	expectRefused(t, h, lo4, 30301)
}
