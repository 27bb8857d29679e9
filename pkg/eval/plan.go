package eval

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/netpol/netpol/pkg/policy"
)

// Plan is how one pod's traffic in one direction is decided: the tiers in
// order, each with the rules that can decide it. It is the one statement
// of the tier semantics: the evaluator walks it for each connection, and
// the compiler emits it as the pod's class chains (pods with equal plans
// share one Plan and one chain).
//
//  1. Admin: the first rule whose Match holds decides: Accept allows, Deny
//     denies, Pass goes to step 2.
//  2. NetworkPolicy: when Isolating is not empty the pod is isolated: for
//     ingress its own node is allowed (OwnNodeAllowed), then any rule of
//     Allow that holds allows; nothing else is allowed. Final.
//  3. Baseline: as Admin; Pass goes to step 4.
//  4. Default: allow.
type Plan struct {
	Direction policy.Direction
	Admin     []PlanRule
	// Isolating are the NetworkPolicies that isolate the pod in this
	// direction (indexes into Policies).
	Isolating []int32
	// OwnNodeAllowed: ingress from the pod's own node is always allowed
	// when the NetworkPolicy tier decides.
	OwnNodeAllowed bool
	// Allow are the rules of the isolating policies, in order.
	Allow    []PlanRule
	Baseline []PlanRule
	// Key identifies the plan's content (and, with the pod's named-port
	// resolution, the compiler's class chain).
	Key string
}

// Empty reports whether no policy applies (the default allows
// everything).
func (p *Plan) Empty() bool {
	return len(p.Admin) == 0 && len(p.Isolating) == 0 && len(p.Baseline) == 0
}

// RuleMatch is what a rule matches.
type RuleMatch int

const (
	// MatchPeersPorts: the rule's peers and ports say.
	MatchPeersPorts RuleMatch = iota
	// MatchAll: a Deny or Pass rule with an entry netpol cannot
	// understand fails closed by matching everything.
	MatchAll
	// MatchNothing: an Accept rule with such an entry fails closed by
	// matching nothing.
	MatchNothing
)

// PlanRule is one rule of a policy in the plan.
type PlanRule struct {
	Policy int32 // index into Policies
	Rule   int   // index into the policy's rules for the plan's direction
	Action policy.Action
	Match  RuleMatch
}

func planRule(pi int32, ri int, r *policy.Rule) PlanRule {
	pr := PlanRule{Policy: pi, Rule: ri, Action: r.Action}
	if r.FailClosed != "" {
		pr.Match = MatchAll
		if r.Action == policy.Accept {
			pr.Match = MatchNothing
		}
	}
	return pr
}

// buildPlans makes every pod-network pod's plan per direction, sharing
// equal plans.
func (ix *index) buildPlans() {
	shared := map[string]*Plan{}
	// bySelecting finds a plan by the policies that select the pod (their
	// indexes): most pods share theirs, and the key of a new plan costs a
	// string per policy.
	bySelecting := map[string]*Plan{}
	var sig []byte
	for d := range ix.plans {
		ix.plans[d] = make([]*Plan, len(ix.pods))
	}
	// The pods of an identity have the same selecting policies, so one
	// plan each; host-network pods have none (never a subject: each acts
	// as its node).
	for _, id := range ix.idents {
		pod := id.pods[0]
		for _, d := range policy.Directions {
			sig = append(sig[:0], byte(d))
			for t := range ix.selecting {
				for _, pi := range ix.selecting[t][d][pod] {
					sig = binary.LittleEndian.AppendUint32(sig, uint32(pi))
				}
				sig = append(sig, 0xff, 0xff, 0xff, 0xff) // tier boundary: no index is that
			}
			p, ok := bySelecting[string(sig)]
			if !ok {
				p = ix.plan(pod, d)
				if old, ok := shared[p.Key]; ok {
					p = old
				} else {
					shared[p.Key] = p
				}
				bySelecting[string(sig)] = p
			}
			for _, member := range id.pods {
				ix.plans[d][member] = p
			}
		}
	}
}

func (ix *index) plan(pod int, d policy.Direction) *Plan {
	p := &Plan{Direction: d}
	var key strings.Builder
	fmt.Fprintf(&key, "%s|", d)
	ordered := func(tier policy.Tier) []PlanRule {
		var out []PlanRule
		for _, pi := range ix.selecting[tier][d][pod] {
			cp := ix.policies[pi]
			for ri := range cp.Rules[d] {
				out = append(out, planRule(pi, ri, &cp.Rules[d][ri]))
			}
			if len(cp.Rules[d]) > 0 {
				fmt.Fprintf(&key, "%s;", cp.Ref())
			}
		}
		key.WriteString("|")
		return out
	}
	p.Admin = ordered(policy.TierAdmin)
	p.Isolating = ix.selecting[policy.TierNetworkPolicy][d][pod]
	for _, pi := range p.Isolating {
		cp := ix.policies[pi]
		for ri := range cp.Rules[d] {
			p.Allow = append(p.Allow, planRule(pi, ri, &cp.Rules[d][ri]))
		}
		fmt.Fprintf(&key, "%s;", cp.Ref())
	}
	key.WriteString("|")
	p.OwnNodeAllowed = d == policy.Ingress && len(p.Isolating) > 0
	p.Baseline = ordered(policy.TierBaseline)
	p.Key = key.String()
	return p
}

// Plan returns pod's plan for direction d; nil for a host-network pod
// (never a subject).
func (r *Resolved) Plan(pod int, d policy.Direction) *Plan { return r.ix.plans[d][pod] }
