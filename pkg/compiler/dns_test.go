package compiler_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/trace"
	"github.com/netpol/netpol/pkg/policy"
)

// TestDNSAnswersQueued traces answers through the DNS chains of both
// queue kinds: only an established UDP or TCP packet from a DNS server's
// address and port to a pod whose egress has domainNames is queued, and
// every packet goes on to the policy chains.
func TestDNSAnswersQueued(t *testing.T) {
	snap := goldenSnapshot(t, "netpol", "domain-names-nothing-learned")
	const (
		server = "10.244.1.53"
		client = "10.244.2.10" // x/a: egress to domainNames
		other  = "10.244.2.12" // x/c, on the same node: no domainNames
	)
	established := uint32(expr.CtStateBitESTABLISHED)
	cases := []struct {
		name   string
		hook   string
		pkt    trace.Packet
		queued bool
	}{
		{"udp answer", nft.HookForward, trace.Packet{Src: netip.MustParseAddr(server), Dst: netip.MustParseAddr(client), L4Proto: 17, SrcPort: 53, DstPort: 40000, CtState: established}, true},
		{"tcp answer", nft.HookForward, trace.Packet{Src: netip.MustParseAddr(server), Dst: netip.MustParseAddr(client), L4Proto: 6, SrcPort: 53, DstPort: 40000, CtState: established}, true},
		{"answer from the node (output)", nft.HookOutput, trace.Packet{Src: netip.MustParseAddr(server), Dst: netip.MustParseAddr(client), L4Proto: 17, SrcPort: 53, DstPort: 40000, CtState: established}, true},
		{"ipv6 answer", nft.HookForward, trace.Packet{Src: netip.MustParseAddr("fd00:10:244:1::53"), Dst: netip.MustParseAddr("fd00:10:244:2::10"), L4Proto: 17, SrcPort: 53, DstPort: 40000, CtState: established}, true},
		{"a new packet (not an answer)", nft.HookForward, trace.Packet{Src: netip.MustParseAddr(server), Dst: netip.MustParseAddr(client), L4Proto: 17, SrcPort: 53, DstPort: 40000}, false},
		{"another source port", nft.HookForward, trace.Packet{Src: netip.MustParseAddr(server), Dst: netip.MustParseAddr(client), L4Proto: 17, SrcPort: 5353, DstPort: 40000, CtState: established}, false},
		{"not a DNS server", nft.HookForward, trace.Packet{Src: netip.MustParseAddr("10.244.1.54"), Dst: netip.MustParseAddr(client), L4Proto: 17, SrcPort: 53, DstPort: 40000, CtState: established}, false},
		{"a pod without domainNames", nft.HookForward, trace.Packet{Src: netip.MustParseAddr(server), Dst: netip.MustParseAddr(other), L4Proto: 17, SrcPort: 53, DstPort: 40000, CtState: established}, false},
	}
	for _, kind := range []nft.QueueKind{nft.QueueNative, nft.QueueXtables} {
		dns := &compiler.DNS{Queue: kind, QueueNum: 7, Servers: []netip.AddrPort{
			netip.AddrPortFrom(netip.MustParseAddr(server), 53), netip.MustParseAddrPort("[fd00:10:244:1::53]:53")}}
		table, err := compiler.Compile(eval.New(snap, policy.Build(snap)).Resolved(), compiler.Options{Node: "node-2", DNS: dns})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := trace.NewTracer(table)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		for _, c := range cases {
			c.pkt.Family = nft.FamilyOf(c.pkt.Src)
			res, err := tr.Trace(c.hook, c.pkt)
			if err != nil {
				t.Fatalf("%s, %s: %v", kind, c.name, err)
			}
			if len(res) != 1 || res[0].Verdict != trace.Accept {
				t.Fatalf("%s, %s: %+v, want one accept", kind, c.name, res)
			}
			queued, policyChain := false, false
			for _, s := range res[0].Steps {
				if strings.HasPrefix(s.Chain, "dns-") && s.Matched {
					queued = strings.HasPrefix(s.Verdict, "queue to 7")
				}
				policyChain = policyChain || s.Chain == c.hook
			}
			if queued != c.queued {
				t.Errorf("%s, %s: queued %v, want %v (%+v)", kind, c.name, queued, c.queued, res[0].Steps)
			}
			if !policyChain {
				t.Errorf("%s, %s: the policy chain %s did not run after the DNS chain", kind, c.name, c.hook)
			}
		}
	}
}
