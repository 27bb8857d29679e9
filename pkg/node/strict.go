package node

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/trace"
)

// Strict mode (Options.Strict): a policy table decides a connection's
// first packet only; later packets follow its conntrack entry (the
// table's first rule accepts established traffic). So after each change
// the kernel takes, the Programmer offers every open flow's first packet
// to the new table, exactly as the kernel would run it (pkg/nft/trace over
// the table just applied), and deletes the conntrack entries of the flows
// it drops. The flow's next packet is then new to the filter hooks, which
// drop it. Flows the table still accepts are never touched.
//
// Domain sets are filled by DNS learning, not by the table: a flow is
// ended only if no learned address could admit it (they are traced as
// holding every address), so a connection to a name whose record expired
// since is left open.

// StrictResult is what strict mode did after a policy sync.
type StrictResult struct {
	// Checked is how many open flows were traced.
	Checked int
	// Ended are the flows whose conntrack entries were deleted.
	Ended []conntrack.Flow
	// Err is a failure after the commit: the table is applied, but some
	// denied flows may still be open (the next change tries again).
	Err error
}

// strictMode holds strict mode's netlink sockets, opened in the
// namespace when the Programmer is made (the caller's handle may be
// closed afterwards).
type strictMode struct {
	cleaner *conntrack.Cleaner
	route   *netlink.Handle
}

func openStrictMode(ns netns.NsHandle) (*strictMode, error) {
	c, err := conntrack.NewCleaner(ns)
	if err != nil {
		return nil, fmt.Errorf("strict mode: %w", err)
	}
	if ns <= 0 {
		ns = netns.None()
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("strict mode: opening a route netlink socket: %w", err)
	}
	return &strictMode{cleaner: c, route: h}, nil
}

func (s *strictMode) close() {
	if s == nil {
		return
	}
	s.cleaner.Close()
	s.route.Close()
}

// localAddrs are the namespace's own addresses: a flow from one leaves
// through the output hook, a flow to one arrives through input.
func (s *strictMode) localAddrs() (map[netip.Addr]bool, error) {
	addrs, err := s.route.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("strict mode: listing the node's addresses: %w", err)
	}
	local := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			local[ip.Unmap()] = true
		}
	}
	return local, nil
}

// StrictDue says when the next strict check is due (the zero time: none
// is pending) and whether it is due at now.
func (p *Programmer) StrictDue(now time.Time) (time.Time, bool) {
	if !p.strictPending {
		return time.Time{}, false
	}
	at := p.strictLast.Add(p.opts.StrictInterval)
	return at, !now.Before(at)
}

// EndDeniedFlows runs the pending strict check (StrictDue): it ends the
// open flows the table the kernel holds denies. Nothing is done when no
// check is pending, or while the last transaction failed (the kernel then
// holds an older table: the next change is checked).
func (p *Programmer) EndDeniedFlows() StrictResult {
	if !p.strictPending || p.live == nil || !p.applied {
		return StrictResult{}
	}
	p.strictPending, p.strictLast = false, time.Now()
	return p.endDenied(p.live.Table())
}

// endDenied ends the open flows that table, the kernel's, denies.
func (p *Programmer) endDenied(table *nft.Table) StrictResult {
	s := p.strict
	local, err := s.localAddrs()
	if err != nil {
		return StrictResult{Err: err}
	}
	// The tracer is built on the first flow offered: a node with no
	// open flows pays nothing for it.
	var tr *trace.Tracer
	var traceErr error
	checked := 0
	denied := func(fl conntrack.Flow) bool {
		checked++
		if tr == nil && traceErr == nil {
			tr, traceErr = trace.NewTracerWith(trace.Options{DynamicSetsHoldAll: true}, table)
		}
		if traceErr != nil {
			return false
		}
		d, err := deniedFlow(tr, local, fl)
		if err != nil {
			traceErr = fmt.Errorf("flow %s: %w", fl, err)
		}
		return d && err == nil
	}
	ended, err := s.cleaner.EndFlows(denied)
	if traceErr != nil {
		err = errors.Join(err, fmt.Errorf("strict mode: tracing the table: %w", traceErr))
	}
	for _, fl := range ended {
		p.opts.Logger.Debug("strict mode: ended a flow the new policy denies", "flow", fl.String())
	}
	return StrictResult{Checked: checked, Ended: ended, Err: err}
}

// deniedFlow says whether tr drops the first packet of fl: through the
// output hook when it comes from the node, input when it goes to the
// node, forward otherwise (both, for the node to itself). A flow that
// was DNATed carries its Service address as the original destination,
// as the kernel's conntrack does.
func deniedFlow(tr *trace.Tracer, local map[netip.Addr]bool, fl conntrack.Flow) (bool, error) {
	pkt := trace.Packet{Family: nft.FamilyOf(fl.Dst.Addr()), Src: fl.Src.Addr(), Dst: fl.Dst.Addr(), L4Proto: fl.Protocol,
		SrcPort: fl.Src.Port(), DstPort: fl.Dst.Port(), SrcLocal: local[fl.Src.Addr()]}
	if fl.Service.IsValid() {
		pkt.CtStatus |= nft.IPSDstNAT
		pkt.OrigSrc, pkt.OrigDst, pkt.OrigDstPort = fl.Src.Addr(), fl.Service.Addr(), fl.Service.Port()
	}
	var hooks []string
	if local[fl.Src.Addr()] {
		hooks = append(hooks, nft.HookOutput)
	}
	if local[fl.Dst.Addr()] {
		hooks = append(hooks, nft.HookInput)
	}
	if len(hooks) == 0 {
		hooks = []string{nft.HookForward}
	}
	for _, hook := range hooks {
		dropped := false
		err := tr.Verdicts(hook, pkt, func(r trace.Result) bool {
			dropped = r.Verdict != trace.Accept
			return !dropped
		})
		if err != nil || dropped {
			return dropped, err
		}
	}
	return false, nil
}
