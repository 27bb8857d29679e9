// Package conntrack deletes conntrack entries by tuple: the stale UDP
// entries after a service-proxy sync, the way kube-proxy's
// pkg/proxy/conntrack does (below), and for strict mode the open flows a
// policy change denies (EndFlows, flows.go).
//
// The proxy's DNAT rules only ever see the first packet of a flow: later
// packets follow the conntrack entry that packet created. UDP has no
// connection teardown, so a client that keeps sending (a DNS resolver
// reusing its source port, say) keeps the entry alive forever and with it
// a stale decision:
//
//   - an entry NATed to an endpoint that has since been removed keeps
//     steering datagrams to it (a black hole, or a pod that is going away);
//   - an entry made while a service had no endpoints (never NATed, just
//     dropped or rejected) keeps the traffic un-NATed after endpoints appear.
//
// Deleting those entries makes the next datagram a NEW flow that goes
// through the current rules again. Deletion is targeted: only UDP entries
// naming a given frontend or endpoint go, never the whole table.
package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Frontend names UDP entries by their original destination: the address
// clients sent to (ClusterIP:port, external or load-balancer IP:port, or a
// node address:NodePort). Delete it when the service goes from no endpoints
// to some, so that traffic that was being dropped or rejected is NATed from
// the next datagram on.
type Frontend struct {
	// Addr is the original destination address. The zero (invalid) Addr
	// means any address, in both families: a NodePort answers on every node
	// address, and the proxy need not list them.
	Addr netip.Addr
	// Port is the original destination port (never 0).
	Port uint16
}

// Endpoint names UDP entries by their DNAT target, i.e. the reply tuple's
// source. Delete it when the endpoint is removed from a service, so that
// the flows it was serving pick a current endpoint.
//
// Only entries that were actually NATed to it match (reply source differs
// from original destination): traffic sent straight to the pod is not the
// proxy's business, and deleting it could make its replies look like new
// flows to network policy rules.
type Endpoint struct {
	Addr netip.Addr // required
	Port uint16     // required (never 0)
}

// Targets is everything one Delete call removes: an entry goes if it
// matches any frontend or any endpoint. All entries are UDP.
type Targets struct {
	// Frontends: delete entries whose ORIGINAL destination is one of these.
	Frontends []Frontend
	// Endpoints: delete entries whose REPLY source is one of these, i.e.
	// entries NATed to the endpoint.
	Endpoints []Endpoint
}

// Cleaner deletes conntrack entries in one network namespace over one
// netfilter netlink socket, kept open between calls so that every sync does
// not pay for a socket (and, for another namespace, a setns round trip).
// It is safe for concurrent use; calls are serialised.
type Cleaner struct {
	mu sync.Mutex
	h  *netlink.Handle // nil once closed
}

// NewCleaner opens a Cleaner on network namespace ns. A zero or closed
// (netns.None()) handle means the calling thread's namespace, i.e. the
// host's for an agent that never switches: file descriptor 0 is never a
// namespace handle, and netlink.NewHandleAt would try setns on it.
//
// The socket stays bound to ns for its whole life, whatever thread later
// uses it; ns itself may be closed once NewCleaner returns.
func NewCleaner(ns netns.NsHandle) (*Cleaner, error) {
	if ns <= 0 {
		ns = netns.None()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack: opening netfilter netlink socket: %w", err)
	}
	return &Cleaner{h: h}, nil
}

// Close releases the netlink socket. Later Delete calls fail: they never
// fall back to a socket in whatever namespace the caller is in.
func (c *Cleaner) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h != nil {
		c.h.Close()
		c.h = nil
	}
	return nil
}

// errClosed is returned by Delete after Close.
var errClosed = errors.New("conntrack: cleaner is closed")

// Delete removes the UDP entries that t names and returns how many went.
//
// The kernel cannot delete by a partial tuple (only by an exact one, or a
// flush narrowed by coarse keys such as family or mark), and the netlink
// library only filters after dumping: Delete therefore dumps the table once per IP
// family that t needs (the kernel filters by family; everything else is
// matched here), matches every entry against all targets in one pass with
// map lookups, and deletes each match by its exact tuple and conntrack ID,
// so an entry that was replaced in between is left alone. An empty t sends
// nothing at all. The count includes matched entries that vanished, or
// were replaced by a new entry with the same tuple, between the dump and
// the delete (the library counts the kernel's ENOENT as done).
//
// Invalid targets fail the whole call before anything is sent. Errors from
// one family do not stop the other; an error wrapping
// netlink.ErrDumpInterrupted means the table changed during the dump and
// some matches may have been missed: call again (the next sync will).
func (c *Cleaner) Delete(t Targets) (deleted int, err error) {
	ms, err := compile(t)
	if err != nil {
		return 0, err
	}
	if len(ms) == 0 {
		return 0, nil
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil {
		return 0, errClosed
	}
	var errs []error
	for _, m := range ms {
		n, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(m.family), m)
		deleted += int(n)
		if err != nil {
			errs = append(errs, fmt.Errorf("conntrack: deleting %s UDP entries: %w", familyName(m.family), err))
		}
	}
	return deleted, errors.Join(errs...)
}

// matcher matches one family's UDP entries against all targets of a
// Delete call. It implements netlink.CustomConntrackFilter.
type matcher struct {
	family    uint8                       // unix.AF_INET or unix.AF_INET6
	frontends map[netip.AddrPort]struct{} // original destination
	anyAddr   map[uint16]struct{}         // original destination port, any address
	endpoints map[netip.AddrPort]struct{} // reply source, NATed entries only
}

var _ netlink.CustomConntrackFilter = (*matcher)(nil)

func newMatcher(family uint8) *matcher {
	return &matcher{
		family:    family,
		frontends: map[netip.AddrPort]struct{}{},
		anyAddr:   map[uint16]struct{}{},
		endpoints: map[netip.AddrPort]struct{}{},
	}
}

func (m *matcher) empty() bool {
	return len(m.frontends) == 0 && len(m.anyAddr) == 0 && len(m.endpoints) == 0
}

// MatchConntrackFlow reports whether flow is a UDP entry of m's family
// that a target names.
func (m *matcher) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	// The family check guards against a kernel that ignores the dump's
	// family: a port-only frontend would otherwise match across families.
	if flow.FamilyType != m.family || flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	if _, ok := m.anyAddr[flow.Forward.DstPort]; ok {
		return true
	}
	origDst := addrPort(flow.Forward.DstIP, flow.Forward.DstPort)
	if _, ok := m.frontends[origDst]; ok {
		return true
	}
	if len(m.endpoints) > 0 {
		replySrc := addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort)
		if replySrc != origDst { // DNATed
			if _, ok := m.endpoints[replySrc]; ok {
				return true
			}
		}
	}
	return false
}

// addrPort converts a parsed tuple half; an unparsable address yields the
// zero AddrPort, which no target equals.
func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.Unmap(), port)
}

// compile validates t and returns one matcher per IP family that has
// targets, IPv4 first. No matcher means nothing to send.
func compile(t Targets) ([]*matcher, error) {
	v4, v6 := newMatcher(unix.AF_INET), newMatcher(unix.AF_INET6)
	pick := func(a netip.Addr) *matcher {
		if a.Is4() {
			return v4
		}
		return v6
	}
	for i, f := range t.Frontends {
		if f.Port == 0 {
			return nil, fmt.Errorf("conntrack: frontend %d (%v): port 0", i, f.Addr)
		}
		if !f.Addr.IsValid() {
			v4.anyAddr[f.Port] = struct{}{}
			v6.anyAddr[f.Port] = struct{}{}
			continue
		}
		a := normalize(f.Addr)
		pick(a).frontends[netip.AddrPortFrom(a, f.Port)] = struct{}{}
	}
	for i, e := range t.Endpoints {
		if !e.Addr.IsValid() || e.Port == 0 {
			return nil, fmt.Errorf("conntrack: endpoint %d (%v port %d): needs an address and a port", i, e.Addr, e.Port)
		}
		a := normalize(e.Addr)
		pick(a).endpoints[netip.AddrPortFrom(a, e.Port)] = struct{}{}
	}
	var ms []*matcher
	for _, m := range []*matcher{v4, v6} {
		if !m.empty() {
			ms = append(ms, m)
		}
	}
	return ms, nil
}

// normalize makes an address comparable with the kernel's: IPv4-mapped
// IPv6 addresses are IPv4 entries there, and tuples carry no zone.
func normalize(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

func familyName(f uint8) string {
	if f == unix.AF_INET {
		return "IPv4"
	}
	return "IPv6"
}

// TargetsOf names the entries of these original destinations (frontends)
// and DNAT targets (endpoints), as proxy.StaleUDP lists them.
func TargetsOf(frontends, endpoints []netip.AddrPort) Targets {
	var t Targets
	for _, fe := range frontends {
		t.Frontends = append(t.Frontends, Frontend{Addr: fe.Addr(), Port: fe.Port()})
	}
	for _, ep := range endpoints {
		t.Endpoints = append(t.Endpoints, Endpoint{Addr: ep.Addr(), Port: ep.Port()})
	}
	return t
}
