package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy/healthcheck"
)

const servicesFixture = "testdata/services.yaml"

// serviceLab brings up the Service lab (testdata/services.yaml) and
// programs both nodes (policy and NAT tables).
func serviceLab(t *testing.T) (*cluster.Snapshot, *lab.Lab, *conformance.Enforcer, *conformance.SyncReport) {
	t.Helper()
	requireRoot(t)
	snap, report := cluster.LoadPaths([]string{servicesFixture}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	l := labtest.Up(t, snap, lab.Options{})
	enf := conformance.NewEnforcer(l)
	t.Cleanup(enf.Close)
	rep, err := enf.Sync(snap)
	if err != nil {
		t.Fatal(err)
	}
	for node, m := range rep.Services {
		if len(m.Errors) > 0 {
			t.Fatalf("node %s: service model errors: %v", node, m.Errors)
		}
	}
	return snap, l, enf, rep
}

// answers dials n times and returns the results and the set of pods that
// answered. A first attempt that is not answered is tried once more (a
// lost first packet is not a verdict) when ok is expected.
func answers(t *testing.T, l *lab.Lab, from string, to netip.AddrPort, proto corev1.Protocol, n int, wantOK bool) (results []string, endpoints []string) {
	t.Helper()
	seen := map[string]bool{}
	for range n {
		o := l.Dial(context.Background(), from, to, proto, lab.DialOptions{Timeout: time.Second})
		if wantOK && o.Result != lab.ResultOK {
			o = l.Dial(context.Background(), from, to, proto, lab.DialOptions{Timeout: 2 * time.Second})
		}
		if strings.HasPrefix(o.Result, "error") {
			t.Fatalf("%s -> %s %s: %s", from, to, proto, o.Result)
		}
		results = append(results, o.Result)
		if o.Reply != "" {
			seen[o.Reply] = true
		}
	}
	for e := range seen {
		endpoints = append(endpoints, e)
	}
	sort.Strings(endpoints)
	return results, endpoints
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// TestServicesInKernel checks every kind of Service path with real TCP and
// UDP connections and asserts which endpoint answered: for load-balanced
// cases, every answer comes from an allowed endpoint and, over 24 tries,
// every allowed endpoint answers.
func TestServicesInKernel(t *testing.T) {
	snap, l, _, rep := serviceLab(t)
	ext := l.External()
	if len(ext.Addrs) < 2 {
		t.Fatalf("the lab's outside has addresses %v, want one per family", ext.Addrs)
	}
	const all = "app/web-1,app/web-2,app/web-3"
	cases := []struct {
		name, from string
		to         netip.AddrPort
		proto      corev1.Protocol
		want       string // lab result
		endpoints  string // comma-separated: exactly the pods that must answer
	}{
		{"ClusterIP TCP from a pod", "client/a", ap("10.96.0.10:80"), "TCP", lab.ResultOK, all},
		{"ClusterIP UDP from a pod", "client/a", ap("10.96.0.10:53"), "UDP", lab.ResultOK, all},
		{"ClusterIP IPv6", "client/b", ap("[fd00:96::10]:80"), "TCP", lab.ResultOK, all},
		{"ClusterIP IPv6 UDP", "client/a", ap("[fd00:96::10]:53"), "UDP", lab.ResultOK, all},
		{"ClusterIP from the node itself", "node/node-1", ap("10.96.0.10:80"), "TCP", lab.ResultOK, all},
		{"NodePort from a pod on another node", "client/b", ap("172.18.0.2:30080"), "TCP", lab.ResultOK, all},
		{"NodePort from outside", "external", ap("172.18.0.3:30080"), "TCP", lab.ResultOK, all},
		{"NodePort UDP from outside", "external", ap("172.18.0.2:30053"), "UDP", lab.ResultOK, all},
		{"NodePort IPv6 from outside", "external", ap("[fd00:172:18::2]:30080"), "TCP", lab.ResultOK, all},
		{"load-balancer IP from outside", "external", ap("192.0.2.20:80"), "TCP", lab.ResultOK, all},
		{"external IP from outside", "external", ap("198.51.100.20:80"), "TCP", lab.ResultOK, all},
		{"load-balancer IP from a pod", "client/b", ap("192.0.2.20:80"), "TCP", lab.ResultOK, all},
		{"eTP Local: node without local endpoints drops", "external", ap("172.18.0.2:30081"), "TCP", lab.ResultTimeout, ""},
		{"eTP Local: only the node's endpoints", "external", ap("172.18.0.3:30081"), "TCP", lab.ResultOK, "app/web-2,app/web-3"},
		{"eTP Local: pods use the cluster endpoints", "client/a", ap("172.18.0.2:30081"), "TCP", lab.ResultOK, "app/web-2,app/web-3"},
		{"source ranges leave the outside out", "external", ap("192.0.2.30:80"), "TCP", lab.ResultTimeout, ""},
		{"source ranges let the outside in", "external", ap("192.0.2.31:80"), "TCP", lab.ResultOK, all},
		{"iTP Local: no local endpoint drops", "client/a", ap("10.96.0.15:80"), "TCP", lab.ResultTimeout, ""},
		{"iTP Local: the node's endpoints", "client/b", ap("10.96.0.15:80"), "TCP", lab.ResultOK, "app/web-2,app/web-3"},
		{"terminating endpoint serves when no other", "client/b", ap("10.96.0.16:80"), "TCP", lab.ResultOK, "app/web-1"},
		{"topology hints: zone z1", "client/a", ap("10.96.0.17:80"), "TCP", lab.ResultOK, "app/web-1"},
		{"topology hints: zone z2", "client/b", ap("10.96.0.17:80"), "TCP", lab.ResultOK, "app/web-2,app/web-3"},
		{"no endpoints: refused", "client/a", ap("10.96.0.18:80"), "TCP", lab.ResultRefused, ""},
		{"no endpoints: UDP refused", "client/a", ap("10.96.0.18:80"), "UDP", lab.ResultRefused, ""},
		{"ClusterIP port no Service serves: refused", "client/a", ap("10.96.0.10:81"), "TCP", lab.ResultRefused, ""},
		{"hairpin: a pod reaches itself", "app/web-1", ap("10.96.0.19:80"), "TCP", lab.ResultOK, "app/web-1"},
		{"policy after DNAT: allowed client", "client/c", ap("10.96.0.20:5432"), "TCP", lab.ResultOK, "app/db"},
		{"policy after DNAT: denied client", "client/a", ap("10.96.0.20:5432"), "TCP", lab.ResultTimeout, ""},
		{"hairpin under policy: a pod may always reach itself", "app/db", ap("10.96.0.20:5432"), "TCP", lab.ResultOK, "app/db"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := 1
			if strings.Contains(c.endpoints, ",") {
				n = 24
			}
			start := time.Now()
			results, endpoints := answers(t, l, c.from, c.to, c.proto, n, c.want == lab.ResultOK)
			for _, r := range results {
				if r != c.want {
					t.Fatalf("%s -> %s %s: results %v, want %s", c.from, c.to, c.proto, results, c.want)
				}
			}
			if c.want == lab.ResultRefused && time.Since(start) > 300*time.Millisecond {
				t.Errorf("refusal took %v: want it quick (ICMP port unreachable), not a timeout", time.Since(start))
			}
			if got := strings.Join(endpoints, ","); got != c.endpoints {
				t.Errorf("%s -> %s %s: answered by %q, want %q", c.from, c.to, c.proto, got, c.endpoints)
			}
		})
	}

	// The evaluator agrees with the kernel on the pods behind the db
	// Service: policy judges the endpoint, not the Service address.
	ev := eval.New(snap, policy.Build(snap))
	for _, c := range []struct {
		from string
		want bool
	}{{"client/c", true}, {"client/a", false}} {
		v, err := ev.Explain(c.from, "app/db", l4.Port{Protocol: "TCP", Port: 5432}, ipfamily.IPv4)
		if err != nil || v.Allowed != c.want {
			t.Errorf("evaluator: %s -> app/db tcp/5432: allowed=%v (%v), want %v", c.from, v.Allowed, err, c.want)
		}
	}

	t.Run("ClientIP affinity keeps a client on one endpoint", func(t *testing.T) {
		for _, from := range []string{"client/a", "client/b", "external"} {
			to := ap("10.96.0.14:80")
			if from == "external" {
				continue // ClusterIPs are not routed from outside
			}
			_, endpoints := answers(t, l, from, to, "TCP", 12, true)
			if len(endpoints) != 1 {
				t.Errorf("%s -> %s: answered by %v, want one endpoint for every connection", from, to, endpoints)
			}
		}
	})

	t.Run("eTP Local keeps the client's address; Cluster masquerades", func(t *testing.T) {
		node2 := l.Node("node-2")
		for _, c := range []struct {
			to       netip.AddrPort
			preserve bool
		}{{ap("172.18.0.3:30081"), true}, {ap("172.18.0.3:30080"), false}} {
			o := l.Dial(context.Background(), "external", c.to, "TCP", lab.DialOptions{Timeout: 2 * time.Second})
			if o.Result != lab.ResultOK {
				t.Fatalf("external -> %s: %s", c.to, o.Result)
			}
			replyDst, err := conntrackReplyDst(node2.Handle, o.FromAddr, o.FromPort, c.to)
			if err != nil {
				t.Fatal(err)
			}
			if preserved := replyDst == o.FromAddr; preserved != c.preserve {
				t.Errorf("external %s:%d -> %s: the endpoint replies to %s; source preserved=%v, want %v",
					o.FromAddr, o.FromPort, c.to, replyDst, preserved, c.preserve)
			}
		}
	})

	t.Run("eTP Local health-check node port", func(t *testing.T) {
		for _, c := range []struct {
			node       string
			addr       string
			status     int
			localCount int
		}{{"node-1", "172.18.0.2", http.StatusServiceUnavailable, 0}, {"node-2", "172.18.0.3", http.StatusOK, 2}} {
			srv := healthcheck.NewServer(healthcheck.Options{NetNS: l.Node(c.node).Handle,
				Addresses: []netip.Addr{netip.MustParseAddr(c.addr)}})
			defer srv.Close()
			if err := srv.Sync(rep.Services[c.node].HealthChecks); err != nil {
				t.Fatal(err)
			}
			status, body, err := httpGetIn(ext.Handle, fmt.Sprintf("http://%s:32001/", c.addr))
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				LocalEndpoints int `json:"localEndpoints"`
			}
			if err := json.Unmarshal([]byte(body), &doc); err != nil {
				t.Fatalf("%s: body %q: %v", c.node, body, err)
			}
			if status != c.status || doc.LocalEndpoints != c.localCount {
				t.Errorf("%s health check: %d with %d local endpoints, want %d with %d", c.node, status, doc.LocalEndpoints, c.status, c.localCount)
			}
		}
	})
}

// TestServiceProbesAgreeWithEvaluator probes every Service's ClusterIP from
// every pod (`netpol lab probe --services`), in both families, and checks
// each probe with conformance.CompareServices: policy judges the endpoint
// after DNAT, as the evaluator does.
func TestServiceProbesAgreeWithEvaluator(t *testing.T) {
	snap, l, _, _ := serviceLab(t)
	ev := eval.New(snap, policy.Build(snap))
	for _, family := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
		rows, notes, err := l.ProbeServices(context.Background(), lab.ServiceProbeOptions{Family: family})
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range notes {
			t.Log("note:", n)
		}
		diffs, compared, err := conformance.CompareServices(snap, ev, rows)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			t.Error(d)
		}
		t.Logf("%s: %d ClusterIP probes compared with the evaluator, %d differences", family, compared, len(diffs))
		if compared == 0 {
			t.Fatalf("%s: no ClusterIP probes", family)
		}
	}
}

// conntrackReplyDst finds, in a node's conntrack table, the connection
// from src:sport to dst and returns where its replies go (the reply
// tuple's destination: the client, or the masquerade address).
func conntrackReplyDst(ns netns.NsHandle, src netip.Addr, sport uint16, dst netip.AddrPort) (netip.Addr, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return netip.Addr{}, err
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, f := range flows {
		fs, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		fd, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if fs.Unmap() == src && f.Forward.SrcPort == sport && fd.Unmap() == dst.Addr() && f.Forward.DstPort == dst.Port() {
			rd, _ := netip.AddrFromSlice(f.Reverse.DstIP)
			return rd.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no conntrack entry %s:%d -> %s among %d", src, sport, dst, len(flows))
}

// httpGetIn makes an HTTP GET from inside a network namespace.
func httpGetIn(ns netns.NsHandle, url string) (int, string, error) {
	dial := func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = nsexec.In(ns, func() error {
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// TestUDPSessionSurvivesEndpointReplacement: a UDP client that keeps its
// source port (a "session") keeps being answered after the Service's
// endpoint is replaced, because the sync deletes the conntrack entries
// NATed to the removed endpoint. With that cleanup off, the same session
// stays on the old endpoint: the check can fail.
func TestUDPSessionSurvivesEndpointReplacement(t *testing.T) {
	snap, l, enf, _ := serviceLab(t)
	const sourcePort = 41053
	vip := ap("10.96.0.21:53")
	session := func() lab.Observation {
		t.Helper()
		o := l.Dial(context.Background(), "client/a", vip, "UDP", lab.DialOptions{Timeout: time.Second, SourcePort: sourcePort})
		if o.Result != lab.ResultOK {
			t.Fatalf("client/a:%d -> %s udp: %s", sourcePort, vip, o.Result)
		}
		return o
	}
	moveTo := func(pod string, cleanup bool) {
		t.Helper()
		next := *snap
		next.EndpointSlices = slices.Clone(snap.EndpointSlices)
		i := slices.IndexFunc(next.EndpointSlices, func(es *discoveryv1.EndpointSlice) bool { return es.Name == "udp-ipv4-1" })
		es := next.EndpointSlices[i].DeepCopy()
		es.Endpoints[0].Addresses = []string{map[string]string{"web-2": "10.244.2.12", "web-3": "10.244.2.13"}[pod]}
		es.Endpoints[0].TargetRef.Name = pod
		next.EndpointSlices[i] = es
		if err := l.Update(context.Background(), &next); err != nil {
			t.Fatal(err)
		}
		enf.NoConntrackCleanup = !cleanup
		if _, err := enf.Sync(&next); err != nil {
			t.Fatal(err)
		}
		snap = &next
	}
	if o := session(); o.Reply != "app/web-1" {
		t.Fatalf("before: answered by %s, want app/web-1", o.Reply)
	}
	moveTo("web-2", true)
	if o := session(); o.Reply != "app/web-2" {
		t.Errorf("after replacing web-1 by web-2 (conntrack cleanup on): the session is answered by %q, want app/web-2", o.Reply)
	}
	moveTo("web-3", false)
	if o := session(); o.Reply != "app/web-2" {
		t.Errorf("after replacing web-2 by web-3 with conntrack cleanup off: answered by %q; want the stale app/web-2 (this control shows what the cleanup does)", o.Reply)
	}
}
