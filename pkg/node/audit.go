package node

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

// AuditOptions turn the verdict log on: the node's policy table logs the
// decisions Mode asks for (and each policy's netpol.io/audit) to the NFLOG
// Group, and the Programmer reads them into Logger, one line each.
type AuditOptions struct {
	compiler.Audit
	// Logger writes the lines (one may serve several nodes).
	Logger *audit.Logger
	// Name names an address (namespace/pod, node/NAME; "" for the
	// address itself). It may be called while a sync runs.
	Name func(netip.Addr) string
}

// startAudit reads the verdict log's group in the node's namespace.
func (p *Programmer) startAudit(netnsFd int) error {
	a := p.opts.Audit
	p.auditNS = -1
	if netnsFd >= 0 {
		fd, err := unix.Dup(netnsFd)
		if err != nil {
			return fmt.Errorf("the verdict log: %w", err)
		}
		p.auditNS = fd
	}
	r, err := audit.Open(audit.ReaderConfig{NetNS: netnsFd, Group: a.Group, Node: p.opts.Node, Name: a.Name,
		Attribution: func(prefix string) (nft.Attribution, bool) {
			m := p.attributions.Load()
			if m == nil {
				return nft.Attribution{}, false
			}
			at, ok := (*m)[prefix]
			return at, ok
		}}, a.Logger)
	if err != nil {
		if p.auditNS >= 0 {
			unix.Close(p.auditNS)
		}
		return err
	}
	p.audit = r
	return nil
}

// AuditErr is why the verdict log is not read (nil: it is, or was not
// asked for).
func (p *Programmer) AuditErr() error { return p.auditErr }

// compilerAudit is the compiler's view of the verdict log; nil when off.
func (p *Programmer) compilerAudit() *compiler.Audit {
	if p.opts.Audit == nil {
		return nil
	}
	a := p.opts.Audit.Audit
	return &a
}

// noteAttributions names the lines of table, about to be applied, and of
// the table before it (whose copies may still be on their way), and
// notes the chains of its deciding rules (AuditDecisions). A full compile
// and a rebase call it; an update changes elements, and chains it builds
// again are made from the same policies, with the same attributions.
func (p *Programmer) noteAttributions(table *nft.Table) {
	if p.opts.Audit == nil {
		return
	}
	var chains []string
	for name, ch := range table.Chains {
		if slices.ContainsFunc(ch.Rules, func(r *nft.Rule) bool { return r.Attribution != nil }) {
			chains = append(chains, name)
		}
	}
	p.decisions.mu.Lock()
	p.decisions.chains = chains
	p.decisions.mu.Unlock()
	m := compiler.AuditAttributions(table)
	both := maps.Clone(m)
	maps.Copy(both, p.lastAttr)
	p.attributions.Store(&both)
	p.lastAttr = m
}

// decisionCounts is the count of the verdict log's decisions, kept
// across chain rewrites (which start a chain's counters again).
type decisionCounts struct {
	mu     sync.Mutex
	chains []string          // the chains of the deciding rules, as applied
	last   map[string]uint64 // each chain's count when last read
	base   map[string]uint64 // what its counters held before they restarted
}

// AuditDecisions is how many decisions the rules of the verdict log made
// since the Programmer started (each such rule counts them, logged or
// not: a copy past the rule's rate is counted here only). It reads the
// kernel; it may run while a sync does.
func (p *Programmer) AuditDecisions() (uint64, error) {
	if p.audit == nil {
		return 0, nil
	}
	d := &p.decisions
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil {
		d.last, d.base = map[string]uint64{}, map[string]uint64{}
	}
	var errs []error
	for _, chain := range d.chains {
		n, err := kernel.RuleCounters(p.auditNS, p.opts.Table, chain)
		if err != nil {
			errs = append(errs, err) // a chain gone since: its count stays
			continue
		}
		if n < d.last[chain] {
			d.base[chain] += d.last[chain]
		}
		d.last[chain] = n
	}
	var total uint64
	for chain, n := range d.last {
		total += d.base[chain] + n
	}
	return total, errors.Join(errs...)
}
