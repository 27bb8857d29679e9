package compiler_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/nft/trace"
	"github.com/netpol/netpol/pkg/policy"
)

// TestAgentPorts traces packets to the node's own address through the
// compiled input chain: the agent's ports are reachable from the node
// itself and from the allowed networks only; other ports (health) are
// not affected; compiler.AgentPorts.Admits agrees with the traced table
// on every packet; without the option the table is unchanged.
func TestAgentPorts(t *testing.T) {
	snap, report := cluster.LoadPaths([]string{"../../examples/demo"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	r := eval.New(snap, policy.Build(snap)).Resolved()
	const node = "node-1"
	ni := r.NodeIndex(node)
	var nodeAddr, podAddr netip.Addr
	for _, a := range r.NodeAddrs(ni) {
		if a.Is4() {
			nodeAddr = a
		}
	}
	for i := 0; i < r.NumPods(); i++ {
		if p := r.Pod(i); p.Node == ni && !p.HostNetwork && len(p.Addrs) > 0 && p.Addrs[0].Is4() {
			podAddr = p.Addrs[0]
			break
		}
	}
	if !nodeAddr.IsValid() || !podAddr.IsValid() {
		t.Fatalf("the demo has no IPv4 node address (%v) or local pod (%v) on %s", nodeAddr, podAddr, node)
	}
	prom := netip.MustParseAddr("192.0.2.77")
	ap := &compiler.AgentPorts{Ports: []uint16{9753, 10253}, Allowed: []netip.Prefix{netip.MustParsePrefix("192.0.2.64/27"), netip.MustParsePrefix("2001:db8::/64")}}
	plain, err := compiler.Compile(r, compiler.Options{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	table, err := compiler.Compile(r, compiler.Options{Node: node, AgentPorts: ap})
	if err != nil {
		t.Fatal(err)
	}
	if d := kernel.Diff(plain, table); d.Empty() {
		t.Fatal("the protection added nothing to the table")
	}
	if _, err := compiler.Compile(r, compiler.Options{Node: node, AgentPorts: &compiler.AgentPorts{}}); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := table.Render(&b); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, want := range []string{
		"meta l4proto . th dport @agent-ports jump agent-ports",
		"fib saddr type local return",
		"ip saddr @agent-clients4 return",
		"# the netpol agent's own ports: nobody else",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the rendered table lacks %q:\n%s", want, text)
		}
	}
	tr, err := trace.NewTracer(table)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		src      netip.Addr
		local    bool
		proto    uint8
		port     uint16
		accepted bool
	}{
		{"local pod to the metrics port", podAddr, false, 6, 9753, false},
		{"local pod to the secure port", podAddr, false, 6, 10253, false},
		{"remote host to the secure port", netip.MustParseAddr("198.51.100.9"), false, 6, 10253, false},
		{"node itself to the secure port", nodeAddr, true, 6, 10253, true},
		{"loopback to the metrics port", netip.MustParseAddr("127.0.0.1"), true, 6, 9753, true},
		{"allowed network to the secure port", prom, false, 6, 10253, true},
		{"local pod to the health port", podAddr, false, 6, 9754, true},
		{"local pod to UDP 9753", podAddr, false, 17, 9753, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := tr.Trace(nft.HookInput, trace.Packet{Family: nft.IPv4, Src: c.src, Dst: nodeAddr, L4Proto: c.proto,
				SrcPort: 40000, DstPort: c.port, SrcLocal: c.local})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 {
				t.Fatalf("%d results", len(res))
			}
			got := res[0].Verdict == trace.Accept
			if got != c.accepted {
				t.Errorf("traced %s, want accepted=%v; steps:\n%v", res[0].Verdict, c.accepted, res[0].Steps)
			}
			allowed, decided, rule := ap.Admits(c.src, c.local, c.proto, c.port)
			if allowed != got {
				t.Errorf("Admits says %v (%s), the traced table %s", allowed, rule, res[0].Verdict)
			}
			// The deciding step of the agent-ports chain carries the rule's
			// comment.
			if decided {
				var comment string
				for _, s := range res[0].Steps {
					if s.Matched && s.Chain == "agent-ports" && s.Verdict != "" {
						comment = s.Comment
					}
				}
				if comment != rule {
					t.Errorf("deciding rule's comment %q, Admits names %q", comment, rule)
				}
			}
		})
	}
}
