package conntrack

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	answerWait  = 2 * time.Second        // a reply that should come
	silenceWait = 300 * time.Millisecond // how long to wait for one that should not
)

// setupFlows makes the namespace's service rules and echo servers, then
// creates, per family, one conntrack entry per name by really sending
// datagrams, and checks each entry's NAT in the kernel's table:
//
//	vip53-a, vip53-b  client -> VIP:53, DNATed to endpoint:5353 (answered)
//	vip54             client -> VIP:54, DNATed to endpoint:5354 (answered)
//	direct            client -> endpoint:5353, not NATed (answered)
//	nodeport          client -> node:30053, DNATed to endpoint:5353 (answered)
//	idle              client -> idle VIP:53, no rule: not NATed, dropped
//
// Names are prefixed with the family ("IPv4/vip54").
func setupFlows(t *testing.T, ns *testNS) map[string]flow {
	t.Helper()
	ns.serviceRules(epPort)
	flows := map[string]flow{}
	wantReplySrc := map[string]netip.AddrPort{}
	for _, f := range families {
		ns.startEcho(f, f.endpoint, epPort, "ep")
		ns.startEcho(f, f.endpoint, altPort, "alt")
		ep := netip.AddrPortFrom(f.endpoint, epPort)
		for _, c := range []struct {
			name   string
			dst    netip.AddrPort
			answer string
			reply  netip.AddrPort // expected reply-tuple source: the DNAT target
		}{
			{"vip53-a", netip.AddrPortFrom(f.vip, 53), "ep:ping", ep},
			{"vip53-b", netip.AddrPortFrom(f.vip, 53), "ep:ping", ep},
			{"vip54", netip.AddrPortFrom(f.vip, 54), "alt:ping", netip.AddrPortFrom(f.endpoint, altPort)},
			{"direct", ep, "ep:ping", ep},
			{"nodeport", netip.AddrPortFrom(f.node, nodePort), "ep:ping", ep},
			{"idle", netip.AddrPortFrom(f.idle, 53), "", netip.AddrPortFrom(f.idle, 53)},
		} {
			cl := ns.newClient(f)
			wait := answerWait
			if c.answer == "" {
				wait = 50 * time.Millisecond // the entry check below is what matters
			}
			if got := cl.exchange(c.dst, wait); got != c.answer {
				t.Fatalf("%s %s: answer %q, want %q", f.name, c.name, got, c.answer)
			}
			name := f.name + "/" + c.name
			flows[name] = flow{cl.addr, c.dst}
			wantReplySrc[name] = c.reply
		}
	}
	table := ns.table()
	for name, fl := range flows {
		got, ok := table[fl]
		if !ok {
			t.Fatalf("setup: no conntrack entry for %s (%v); table: %v", name, fl, table)
		}
		if got != wantReplySrc[name] {
			t.Fatalf("setup: %s (%v) has reply source %v, want %v", name, fl, got, wantReplySrc[name])
		}
	}
	return flows
}

// TestDelete creates real entries in a fresh namespace and checks that
// each Targets deletes exactly the entries it names, reports their number,
// and leaves every other entry alone. Each case gets its own namespace.
func TestDelete(t *testing.T) {
	requireRoot(t)
	v4, v6 := ipv4, ipv6
	tests := []struct {
		name    string
		targets Targets
		want    []string // entries that must go; every other one must stay
	}{
		{
			name:    "empty targets",
			targets: Targets{},
		},
		{
			name:    "IPv4 removed endpoint",
			targets: Targets{Endpoints: []Endpoint{{v4.endpoint, epPort}}},
			// NATed via the ClusterIP and the NodePort; the direct flow to
			// the pod was never NATed and stays.
			want: []string{"IPv4/vip53-a", "IPv4/vip53-b", "IPv4/nodeport"},
		},
		{
			name:    "IPv6 removed endpoint",
			targets: Targets{Endpoints: []Endpoint{{v6.endpoint, epPort}}},
			want:    []string{"IPv6/vip53-a", "IPv6/vip53-b", "IPv6/nodeport"},
		},
		{
			name:    "IPv4-mapped endpoint address is IPv4",
			targets: Targets{Endpoints: []Endpoint{{netip.AddrFrom16(v4.endpoint.As16()), epPort}}},
			want:    []string{"IPv4/vip53-a", "IPv4/vip53-b", "IPv4/nodeport"},
		},
		{
			name:    "IPv4 other endpoint port",
			targets: Targets{Endpoints: []Endpoint{{v4.endpoint, altPort}}},
			want:    []string{"IPv4/vip54"},
		},
		{
			name:    "IPv4 ClusterIP frontend",
			targets: Targets{Frontends: []Frontend{{v4.vip, 53}}},
			want:    []string{"IPv4/vip53-a", "IPv4/vip53-b"},
		},
		{
			name:    "IPv6 ClusterIP frontend",
			targets: Targets{Frontends: []Frontend{{v6.vip, 53}}},
			want:    []string{"IPv6/vip53-a", "IPv6/vip53-b"},
		},
		{
			name:    "IPv4 frontend that had no endpoints",
			targets: Targets{Frontends: []Frontend{{v4.idle, 53}}},
			want:    []string{"IPv4/idle"},
		},
		{
			name:    "IPv6 frontend that had no endpoints",
			targets: Targets{Frontends: []Frontend{{v6.idle, 53}}},
			want:    []string{"IPv6/idle"},
		},
		{
			name:    "NodePort on any address, both families",
			targets: Targets{Frontends: []Frontend{{Port: nodePort}}},
			want:    []string{"IPv4/nodeport", "IPv6/nodeport"},
		},
		{
			name:    "IPv4 NodePort on one node address",
			targets: Targets{Frontends: []Frontend{{v4.node, nodePort}}},
			want:    []string{"IPv4/nodeport"},
		},
		{
			name: "many targets, both families, one call",
			targets: Targets{
				Frontends: []Frontend{{v4.idle, 53}, {v6.idle, 53}, {v6.vip, 54}},
				Endpoints: []Endpoint{{v4.endpoint, altPort}, {v6.endpoint, epPort}, {v6.endpoint, epPort}},
			},
			want: []string{
				"IPv4/idle", "IPv4/vip54",
				"IPv6/idle", "IPv6/vip54", "IPv6/vip53-a", "IPv6/vip53-b", "IPv6/nodeport",
			},
		},
		{
			name: "targets that match nothing",
			targets: Targets{
				Frontends: []Frontend{{v4.vip, 55}, {v6.node, 53}, {Port: 9}},
				Endpoints: []Endpoint{{v4.endpoint, 9999}, {v4.vip, 53}, {v6.client, epPort}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := newTestNS(t)
			flows := setupFlows(t, ns)
			for _, name := range tc.want {
				if _, ok := flows[name]; !ok {
					t.Fatalf("bad test: unknown flow %q", name)
				}
			}
			c := ns.openCleaner()

			n, err := c.Delete(tc.targets)
			if err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if n != len(tc.want) {
				t.Errorf("Delete returned %d, want %d", n, len(tc.want))
			}
			table := ns.table()
			var gone, kept []string
			for name, fl := range flows {
				if _, ok := table[fl]; ok {
					kept = append(kept, name)
				} else {
					gone = append(gone, name)
				}
			}
			sort.Strings(gone)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(gone, want) {
				sort.Strings(kept)
				t.Errorf("deleted %v, want %v (kept %v)", gone, want, kept)
			}

			// A second call finds nothing left to delete.
			if n, err := c.Delete(tc.targets); err != nil || n != 0 {
				t.Errorf("second Delete = %d, %v; want 0, nil", n, err)
			}
		})
	}
}

// TestDeleteRestoresService shows the bug this package exists for, end to
// end: a client keeps one socket (so one conntrack entry) while the
// service's rules change under it. Until Delete, its datagrams follow the
// stale entry; right after, the next datagram is NATed by the new rules.
func TestDeleteRestoresService(t *testing.T) {
	requireRoot(t)
	for _, f := range families {
		t.Run(f.name+"/endpoint removed", func(t *testing.T) {
			ns := newTestNS(t)
			ns.serviceRules(epPort)
			ns.startEcho(f, f.endpoint, epPort, "old")
			ns.startEcho(f, f.endpoint, altPort, "new")
			c := ns.openCleaner()
			vip := netip.AddrPortFrom(f.vip, 53)
			cl := ns.newClient(f)
			if got := cl.exchange(vip, answerWait); got != "old:ping" {
				t.Fatalf("before the change: answer %q, want old:ping", got)
			}

			// The old endpoint leaves the service (it may still be
			// running, e.g. terminating): VIP:53 now DNATs to altPort.
			ns.serviceRules(altPort)
			if got := cl.exchange(vip, answerWait); got != "old:ping" {
				t.Fatalf("after the rule change, before Delete: answer %q, want old:ping (the stale entry)", got)
			}

			n, err := c.Delete(Targets{Endpoints: []Endpoint{{f.endpoint, epPort}}})
			if err != nil || n != 1 {
				t.Fatalf("Delete = %d, %v; want 1, nil", n, err)
			}
			if got := cl.exchange(vip, answerWait); got != "new:ping" {
				t.Fatalf("after Delete: answer %q, want new:ping", got)
			}
		})

		t.Run(f.name+"/endpoints appear", func(t *testing.T) {
			ns := newTestNS(t)
			ns.serviceRules(epPort)
			ns.startEcho(f, f.endpoint, epPort, "ep")
			c := ns.openCleaner()
			idle := netip.AddrPortFrom(f.idle, 53)
			cl := ns.newClient(f)
			if got := cl.exchange(idle, silenceWait); got != "" {
				t.Fatalf("no endpoints yet: got answer %q", got)
			}

			ns.addIdleEndpoint()
			if got := cl.exchange(idle, silenceWait); got != "" {
				t.Fatalf("endpoint added, before Delete: got answer %q, want none (the stale un-NATed entry)", got)
			}
			if rs := ns.table()[flow{cl.addr, idle}]; rs != idle {
				t.Fatalf("stale entry's reply source = %v, want %v (not NATed)", rs, idle)
			}

			n, err := c.Delete(Targets{Frontends: []Frontend{{f.idle, 53}}})
			if err != nil || n != 1 {
				t.Fatalf("Delete = %d, %v; want 1, nil", n, err)
			}
			if got := cl.exchange(idle, answerWait); got != "ep:ping" {
				t.Fatalf("after Delete: answer %q, want ep:ping", got)
			}
		})
	}
}

// TestNewCleanerCurrentNamespace checks that a zero or closed handle means
// the calling thread's namespace (the host's for the agent): a Cleaner
// opened that way on a thread inside the test namespace deletes there, even
// when Delete runs on another thread.
func TestNewCleanerCurrentNamespace(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		h    netns.NsHandle
	}{
		{"zero handle", 0},
		{"netns.None()", netns.None()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newTestNS(t)
			flows := setupFlows(t, ns)
			var c *Cleaner
			ns.in(func() (err error) {
				c, err = NewCleaner(tc.h)
				return err
			})
			defer c.Close()
			n, err := c.Delete(Targets{Frontends: []Frontend{{ipv4.idle, 53}}})
			if err != nil || n != 1 {
				t.Fatalf("Delete = %d, %v; want 1, nil", n, err)
			}
			if _, ok := ns.table()[flows["IPv4/idle"]]; ok {
				t.Errorf("entry still in the test namespace")
			}
		})
	}
}

// TestClose checks that a closed Cleaner refuses to work instead of
// falling back to a socket in whatever namespace the caller is in, and
// that Close is idempotent.
func TestClose(t *testing.T) {
	requireRoot(t)
	ns := newTestNS(t)
	flows := setupFlows(t, ns)
	c, err := NewCleaner(ns.h)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Delete(Targets{Frontends: []Frontend{{ipv4.idle, 53}}}); !errors.Is(err, errClosed) {
		t.Fatalf("Delete after Close: err = %v, want %v", err, errClosed)
	}
	if n, err := c.Delete(Targets{}); n != 0 || err != nil {
		t.Fatalf("empty Delete after Close = %d, %v; want 0, nil (nothing to send)", n, err)
	}
	if _, ok := ns.table()[flows["IPv4/idle"]]; !ok {
		t.Errorf("entry deleted by a closed Cleaner")
	}
}

// TestDeleteRejectsBadTargets needs no root: invalid targets fail before
// anything is sent, and nothing is half done.
func TestDeleteRejectsBadTargets(t *testing.T) {
	c, err := NewCleaner(netns.None())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, tg := range map[string]Targets{
		"endpoint without address": {Endpoints: []Endpoint{{Port: 53}}},
		"endpoint without port":    {Endpoints: []Endpoint{{Addr: ipv4.endpoint}}},
		"frontend without port":    {Frontends: []Frontend{{Addr: ipv4.vip}}},
		"valid and invalid mixed": {
			Frontends: []Frontend{{ipv4.vip, 53}},
			Endpoints: []Endpoint{{Addr: ipv6.endpoint}},
		},
	} {
		if n, err := c.Delete(tg); err == nil || n != 0 {
			t.Errorf("%s: Delete = %d, %v; want 0 and an error", name, n, err)
		}
	}
}

// TestCompile checks which families a Delete dumps: none for empty
// Targets (nothing is sent), only the families that have targets
// otherwise, one dump each however many targets.
func TestCompile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		targets Targets
		want    []uint8
	}{
		{"empty", Targets{}, nil},
		{"empty slices", Targets{Frontends: []Frontend{}, Endpoints: []Endpoint{}}, nil},
		{"IPv4 only", Targets{
			Frontends: []Frontend{{ipv4.vip, 53}, {ipv4.idle, 53}},
			Endpoints: []Endpoint{{ipv4.endpoint, 1}},
		}, []uint8{unix.AF_INET}},
		{"IPv4-mapped is IPv4", Targets{Endpoints: []Endpoint{{netip.MustParseAddr("::ffff:10.0.0.2"), 1}}}, []uint8{unix.AF_INET}},
		{"IPv6 only", Targets{Frontends: []Frontend{{ipv6.vip, 53}}}, []uint8{unix.AF_INET6}},
		{"any address", Targets{Frontends: []Frontend{{Port: nodePort}}}, []uint8{unix.AF_INET, unix.AF_INET6}},
		{"both", Targets{
			Frontends: []Frontend{{ipv6.vip, 53}},
			Endpoints: []Endpoint{{ipv4.endpoint, 1}},
		}, []uint8{unix.AF_INET, unix.AF_INET6}},
	} {
		ms, err := compile(tc.targets)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []uint8
		for _, m := range ms {
			got = append(got, m.family)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: families %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestMatcher covers what the kernel tests cannot easily produce: other
// protocols and families with the same addresses and ports.
func TestMatcher(t *testing.T) {
	ms, err := compile(Targets{
		Frontends: []Frontend{{ipv4.vip, 53}},
		Endpoints: []Endpoint{{ipv4.endpoint, epPort}},
	})
	if err != nil || len(ms) != 1 {
		t.Fatalf("compile = %v, %v", ms, err)
	}
	m := ms[0]
	ip := func(a netip.Addr) net.IP { return a.AsSlice() }
	natted := func(proto uint8, fam uint8) *netlink.ConntrackFlow {
		return &netlink.ConntrackFlow{
			FamilyType: fam,
			Forward:    netlink.IPTuple{Protocol: proto, SrcIP: ip(ipv4.client), SrcPort: 40000, DstIP: ip(ipv4.vip), DstPort: 53},
			Reverse:    netlink.IPTuple{Protocol: proto, SrcIP: ip(ipv4.endpoint), SrcPort: epPort, DstIP: ip(ipv4.client), DstPort: 40000},
		}
	}
	direct := &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: ip(ipv4.client), SrcPort: 40000, DstIP: ip(ipv4.endpoint), DstPort: epPort},
		Reverse:    netlink.IPTuple{Protocol: unix.IPPROTO_UDP, SrcIP: ip(ipv4.endpoint), SrcPort: epPort, DstIP: ip(ipv4.client), DstPort: 40000},
	}
	mapped := natted(unix.IPPROTO_UDP, unix.AF_INET)
	mapped.Forward.DstIP = net.IP(netip.AddrFrom16(ipv4.vip.As16()).AsSlice()) // 16-byte form
	for name, tc := range map[string]struct {
		flow *netlink.ConntrackFlow
		want bool
	}{
		"UDP NATed":                  {natted(unix.IPPROTO_UDP, unix.AF_INET), true},
		"16-byte IPv4 address":       {mapped, true},
		"TCP same tuple":             {natted(unix.IPPROTO_TCP, unix.AF_INET), false},
		"other family":               {natted(unix.IPPROTO_UDP, unix.AF_INET6), false},
		"not NATed, to the endpoint": {direct, false},
	} {
		if got := m.MatchConntrackFlow(tc.flow); got != tc.want {
			t.Errorf("%s: match = %v, want %v", name, got, tc.want)
		}
	}
}
