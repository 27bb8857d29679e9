package conntrack

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Flow is a tracked connection as network policy saw its first packet:
// after DNAT (a Service's endpoint, not its address), before any source
// NAT (policy runs in the filter hooks, between the two).
type Flow struct {
	// Protocol is unix.IPPROTO_TCP, IPPROTO_UDP or IPPROTO_SCTP.
	Protocol uint8
	// Src is the original source; Dst the destination after DNAT (the
	// reply's source).
	Src, Dst netip.AddrPort
	// Service is the original destination when the flow was DNATed (the
	// Service address the client sent to); invalid otherwise.
	Service netip.AddrPort
}

func (f Flow) String() string {
	s := fmt.Sprintf("%s %s -> %s", protocolName(f.Protocol), f.Src, f.Dst)
	if f.Service.IsValid() {
		s += " (via " + f.Service.String() + ")"
	}
	return s
}

func protocolName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "TCP"
	case unix.IPPROTO_UDP:
		return "UDP"
	case unix.IPPROTO_SCTP:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// EndFlows deletes the entries of the open TCP, UDP and SCTP connections
// for which end returns true, by their exact tuple (never a flush), and
// returns them. A TCP entry already closing (TIME_WAIT, CLOSE) is not
// offered: its connection is over. The next packet of an ended flow is
// a new connection to the filter hooks, which policy decides again.
//
// end runs during the dump, once per entry; it must not call the
// Cleaner. Errors are as Delete's: one family's does not stop the other's.
func (c *Cleaner) EndFlows(end func(Flow) bool) ([]Flow, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil {
		return nil, errClosed
	}
	var ended []Flow
	var errs []error
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		f := &flowFilter{family: family, end: end}
		_, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(family), f)
		ended = append(ended, f.ended...)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: ending %s flows: %w", familyName(family), err))
		}
	}
	return ended, errors.Join(errs...)
}

// flowFilter offers each open flow of one family to end, and keeps those
// it ends. It implements netlink.CustomConntrackFilter.
type flowFilter struct {
	family uint8
	end    func(Flow) bool
	ended  []Flow
}

func (f *flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	fl, ok := flowOf(flow, f.family)
	if !ok || !f.end(fl) {
		return false
	}
	f.ended = append(f.ended, fl)
	return true
}

// flowOf is what policy saw of entry e of family, if it is an open TCP,
// UDP or SCTP connection.
func flowOf(e *netlink.ConntrackFlow, family uint8) (Flow, bool) {
	proto := e.Forward.Protocol
	if e.FamilyType != family || proto != unix.IPPROTO_TCP && proto != unix.IPPROTO_UDP && proto != unix.IPPROTO_SCTP {
		return Flow{}, false
	}
	if tcp, ok := e.ProtoInfo.(*netlink.ProtoInfoTCP); ok && closing(tcp.State) {
		return Flow{}, false
	}
	fl := Flow{Protocol: proto, Src: addrPort(e.Forward.SrcIP, e.Forward.SrcPort), Dst: addrPort(e.Reverse.SrcIP, e.Reverse.SrcPort)}
	if orig := addrPort(e.Forward.DstIP, e.Forward.DstPort); orig != fl.Dst {
		fl.Service = orig
	}
	if !fl.Src.IsValid() || !fl.Dst.IsValid() {
		return Flow{}, false
	}
	return fl, true
}

// closing says a TCP conntrack state is past the connection's end.
func closing(state uint8) bool {
	const timeWait, closed = 7, 8 // TCP_CONNTRACK_TIME_WAIT, TCP_CONNTRACK_CLOSE
	return state == timeWait || state == closed
}
