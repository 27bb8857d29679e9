package compiler

import (
	"errors"
	"fmt"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// Per-rule counters (Options.RuleCounters): every rule of the identity
// layout that decides for a policy rule (an Admin or Baseline rule's
// Accept, Deny or Pass; a NetworkPolicy's allow; a NetworkPolicy tier's
// isolation, once for each isolating policy) counts into a named counter
// object of that policy rule. The name is a hash of the policy, rule,
// action and direction, not of the rule's content: a rule rewritten,
// moved to another chain or copied into several (a NetworkPolicy rule in
// every tier chain of the policies isolating a class) counts into one
// counter that no sync starts again while the policy rule exists. Only a
// connection's first packet reaches a deciding rule (each base chain
// accepts established traffic first): the packets are decisions.

// errCountersLayout: the address layout has no per-rule counters.
var errCountersLayout = errors.New("per-rule counters (--rule-counters) need the identity layout (--layout identities, the default)")

// IsolationRule is the rule label of a NetworkPolicy tier's isolation
// (no rule allowed; the policy isolates the pod) in the counters.
const IsolationRule = "isolation"

// ruleCounter is the counter of policy p's rule (IsolationRule: its
// isolation) deciding action in direction d (nil when counters are off).
// The table holds it once a rule counts into it (decider.counted).
func (c *idCompiler) ruleCounter(p *policy.Policy, rule string, action policy.Action, d policy.Direction) *nft.Counter {
	if !c.counters {
		return nil
	}
	of := nft.CounterOf{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name, Rule: rule, Action: action.String(), Direction: d.String()}
	name := "rule." + contentID(fmt.Sprintf("%s|%s|%s|%s|%s|%s", of.Kind, of.Namespace, of.Name, of.Rule, of.Action, of.Direction))
	return &nft.Counter{Name: name, Of: of}
}

// decider is how a match that decides is written: the verdict log's copy
// (log; nil: none) and the counters it counts into, which it declares in
// table t as it writes a rule that counts into them: a policy rule that
// makes no kernel rule (it matches nothing) has no counter.
type decider struct {
	log      *auditLog
	counters []*nft.Counter
	t        *nft.Table
	// stage, in the shadow evaluation, is the connection mark's field
	// that names the staged policy's rule deciding (shadow.go; 0: none).
	stage uint32
}

// decider is a decider of c's table with the counters that are on.
func (c *idCompiler) decider(log *auditLog, counters ...*nft.Counter) decider {
	dc := decider{log: log, t: c.t}
	for _, k := range counters {
		if k != nil {
			dc.counters = append(dc.counters, k)
		}
	}
	return dc
}

// counted is match with the counters.
func (dc decider) counted(match func() *nft.Builder) func() *nft.Builder {
	if len(dc.counters) == 0 && dc.stage == 0 {
		return match
	}
	return func() *nft.Builder {
		b := match()
		if dc.stage != 0 {
			b.CtMarkSetField(shadowAttributionMask, dc.stage)
		}
		for _, k := range dc.counters {
			dc.t.AddCounter(k)
			b.CountInto(k.Name)
		}
		return b
	}
}

// decide is the rules of a match that decides with verdict v: with a log,
// one that copies the packet to the log within the rate (and does nothing
// else), then the one that decides and counts its decisions (copied or
// not: AuditDecisions) into an anonymous counter as well as its own.
func (dc decider) decide(match func() *nft.Builder, v nft.Verdict) []*nft.Rule {
	counted := dc.counted(match)
	l := dc.log
	if l == nil {
		return []*nft.Rule{counted().Verdict(v)}
	}
	at := l.at
	copyRule := match().LimitRate(l.rate, uint32(2*l.rate)).Log(l.group, l.prefix()).Done()
	decision := counted().Counter().Verdict(v)
	copyRule.Attribution, decision.Attribution = &at, &at
	return []*nft.Rule{copyRule, decision}
}

// adoptCounters adds to the table the counters a chain taken from the
// last compile counts into.
func (c *idCompiler) adoptCounters(ch *nft.Chain, last *nft.Table) {
	for _, r := range ch.Rules {
		for _, name := range r.CounterNames() {
			if k := last.Counters[name]; k != nil {
				c.t.AddCounter(k)
			}
		}
	}
}

// dropUnusedCounters deletes from t the counters of old, a chain built
// again, that no chain counts into now.
func dropUnusedCounters(t *nft.Table, old *nft.Chain) {
	var gone []string
	for _, r := range old.Rules {
		gone = append(gone, r.CounterNames()...)
	}
	if len(gone) == 0 {
		return
	}
	used := map[string]bool{}
	for _, ch := range t.Chains {
		for _, r := range ch.Rules {
			for _, name := range r.CounterNames() {
				used[name] = true
			}
		}
	}
	for _, name := range gone {
		if !used[name] {
			delete(t.Counters, name)
		}
	}
}
