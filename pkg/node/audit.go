package node

import (
	"maps"
	"net/netip"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
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
// the table before it (whose copies may still be on their way).
func (p *Programmer) noteAttributions(table *nft.Table) {
	if p.opts.Audit == nil {
		return
	}
	m := compiler.AuditAttributions(table)
	both := maps.Clone(m)
	maps.Copy(both, p.lastAttr)
	p.attributions.Store(&both)
	p.lastAttr = m
}
