package conntrack

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestFlowOf: what EndFlows offers of each entry: the destination after
// DNAT with the Service address beside it, open connections of the three
// port protocols of the dumped family only.
func TestFlowOf(t *testing.T) {
	ip := func(s string) net.IP { return netip.MustParseAddr(s).AsSlice() }
	ap := netip.MustParseAddrPort
	entry := func(proto uint8, family uint8, src, origDst, replySrc string) *netlink.ConntrackFlow {
		s, o, r := ap(src), ap(origDst), ap(replySrc)
		return &netlink.ConntrackFlow{FamilyType: family,
			Forward: netlink.IPTuple{Protocol: proto, SrcIP: s.Addr().AsSlice(), SrcPort: s.Port(), DstIP: o.Addr().AsSlice(), DstPort: o.Port()},
			Reverse: netlink.IPTuple{Protocol: proto, SrcIP: r.Addr().AsSlice(), SrcPort: r.Port(), DstIP: s.Addr().AsSlice(), DstPort: s.Port()}}
	}
	withTCP := func(e *netlink.ConntrackFlow, state uint8) *netlink.ConntrackFlow {
		e.ProtoInfo = &netlink.ProtoInfoTCP{State: state}
		return e
	}
	icmp := entry(unix.IPPROTO_ICMP, unix.AF_INET, "10.0.0.1:0", "10.0.1.2:0", "10.0.1.2:0")
	noAddr := entry(unix.IPPROTO_UDP, unix.AF_INET, "10.0.0.1:5000", "10.0.1.2:53", "10.0.1.2:53")
	noAddr.Reverse.SrcIP = ip("10.0.1.2")[:2] // unparsable
	tests := []struct {
		name   string
		e      *netlink.ConntrackFlow
		family uint8
		want   Flow
		ok     bool
	}{
		{"TCP established, direct", withTCP(entry(unix.IPPROTO_TCP, unix.AF_INET, "10.0.0.1:40000", "10.0.1.2:80", "10.0.1.2:80"), 3), unix.AF_INET,
			Flow{Protocol: unix.IPPROTO_TCP, Src: ap("10.0.0.1:40000"), Dst: ap("10.0.1.2:80")}, true},
		{"UDP through a Service", entry(unix.IPPROTO_UDP, unix.AF_INET, "10.0.0.1:5000", "10.96.0.10:53", "10.0.1.2:5353"), unix.AF_INET,
			Flow{Protocol: unix.IPPROTO_UDP, Src: ap("10.0.0.1:5000"), Dst: ap("10.0.1.2:5353"), Service: ap("10.96.0.10:53")}, true},
		{"SCTP, IPv6", entry(unix.IPPROTO_SCTP, unix.AF_INET6, "[fd00::1]:7000", "[fd00::2]:9000", "[fd00::2]:9000"), unix.AF_INET6,
			Flow{Protocol: unix.IPPROTO_SCTP, Src: ap("[fd00::1]:7000"), Dst: ap("[fd00::2]:9000")}, true},
		{"TCP in TIME_WAIT: over", withTCP(entry(unix.IPPROTO_TCP, unix.AF_INET, "10.0.0.1:40000", "10.0.1.2:80", "10.0.1.2:80"), 7), unix.AF_INET, Flow{}, false},
		{"TCP closed: over", withTCP(entry(unix.IPPROTO_TCP, unix.AF_INET, "10.0.0.1:40000", "10.0.1.2:80", "10.0.1.2:80"), 8), unix.AF_INET, Flow{}, false},
		{"ICMP: no port", icmp, unix.AF_INET, Flow{}, false},
		{"another family than the dump's", entry(unix.IPPROTO_UDP, unix.AF_INET6, "[fd00::1]:7000", "[fd00::2]:53", "[fd00::2]:53"), unix.AF_INET, Flow{}, false},
		{"an address that does not parse", noAddr, unix.AF_INET, Flow{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := flowOf(tc.e, tc.family)
			if ok != tc.ok || got != tc.want {
				t.Errorf("flowOf = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
	// The filter offers each flow to end and keeps those it ends.
	f := &flowFilter{family: unix.AF_INET, end: func(fl Flow) bool { return fl.Dst.Port() == 80 }}
	for _, e := range []*netlink.ConntrackFlow{
		withTCP(entry(unix.IPPROTO_TCP, unix.AF_INET, "10.0.0.1:40000", "10.0.1.2:80", "10.0.1.2:80"), 3),
		entry(unix.IPPROTO_UDP, unix.AF_INET, "10.0.0.1:5000", "10.0.1.2:53", "10.0.1.2:53"),
		icmp,
	} {
		if got, want := f.MatchConntrackFlow(e), e.Forward.DstPort == 80; got != want {
			t.Errorf("%v: match %v, want %v", e, got, want)
		}
	}
	if len(f.ended) != 1 || f.ended[0].Dst != ap("10.0.1.2:80") {
		t.Errorf("ended %v", f.ended)
	}
}
