package node

import (
	"cmp"
	"slices"

	"github.com/netpol/netpol/pkg/nft"
)

// RuleCount is what one policy rule decided on this node: the packets
// and bytes its deciding rules counted (Options.RuleCounters).
type RuleCount struct {
	// Counter is the kernel's counter object (rules name it: `counter
	// name "..."`).
	Counter string `json:"counter"`
	nft.CounterOf
	nft.CounterValue
}

// CountsRules says the table has per-rule counters (Options.RuleCounters).
func (p *Programmer) CountsRules() bool { return p.opts.RuleCounters }

// noteCounters notes the per-rule counters of table, about to be applied,
// and the staged policies' counters (compiler.Options.Staged).
// A full compile and a rebase call it; an update builds chains again from
// the same policies, with the same counters.
func (p *Programmer) noteCounters(table *nft.Table) {
	m := make(map[string]nft.CounterOf, len(table.Counters))
	for name, c := range table.Counters {
		m[name] = c.Of
	}
	p.counterOf.Store(&m)
}

// RuleCounts reads the per-rule counters from the kernel, ordered by
// policy, rule, action and direction; nil when counters are off. Only
// counters of the table last compiled are reported (one the kernel does not
// hold yet is left out). It may run while a sync does.
func (p *Programmer) RuleCounts() ([]RuleCount, error) {
	if !p.opts.RuleCounters {
		return nil, nil
	}
	return p.counts(false)
}

// StagedCounts reads the staged policies' counters from the kernel: for
// each staged policy and would-be verdict, the new connections whose
// verdict the policy would change on this node were it enforced
// (CounterOf.Staged; Verdict is the would-be verdict). Ordered as
// RuleCounts.
func (p *Programmer) StagedCounts() ([]RuleCount, error) { return p.counts(true) }

// counts reads the counters of the table last compiled, the staged
// policies' or the others.
func (p *Programmer) counts(staged bool) ([]RuleCount, error) {
	of := p.counterOf.Load()
	if of == nil {
		return nil, nil
	}
	found := false
	for _, c := range *of {
		if c.Staged == staged {
			found = true
			break
		}
	}
	if !found {
		return nil, nil // no kernel read for nothing
	}
	values, err := p.policy.Counters()
	if err != nil {
		return nil, err
	}
	out := make([]RuleCount, 0, len(*of))
	for name, c := range *of {
		if v, ok := values[name]; ok && c.Staged == staged {
			out = append(out, RuleCount{name, c, v})
		}
	}
	slices.SortFunc(out, func(a, b RuleCount) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Action, b.Action), cmp.Compare(a.Verdict, b.Verdict))
	})
	return out, nil
}
