package eval

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

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

// plans makes the pods' plans on first use, one per identity and
// direction (host-network pods have none: never a subject, each acts as
// its node): a node's compile asks for its own pods' only, and at 100,000
// pods making every plan up front cost more than the rest of the compile.
// Equal plans are shared. Safe for concurrent use.
type plans struct {
	byIdent [2][]atomic.Pointer[Plan]
	mu      sync.Mutex
	shared  map[string]*Plan // by Key
	// bySelecting finds a plan by the policies that select the pod
	// (their indexes): most identities share theirs, and the key of a
	// new plan costs a string per policy.
	bySelecting map[string]*Plan
}

func (ix *index) initPlans() {
	for d := range ix.plans.byIdent {
		ix.plans.byIdent[d] = make([]atomic.Pointer[Plan], len(ix.idents))
	}
	ix.plans.shared, ix.plans.bySelecting = map[string]*Plan{}, map[string]*Plan{}
}

// planOf is pod's plan for direction d; nil for a host-network pod.
func (ix *index) planOf(pod int, d policy.Direction) *Plan {
	id := ix.identOf[pod]
	if id < 0 {
		return nil
	}
	slot := &ix.plans.byIdent[d][id]
	if p := slot.Load(); p != nil {
		return p
	}
	ix.plans.mu.Lock()
	defer ix.plans.mu.Unlock()
	if p := slot.Load(); p != nil {
		return p
	}
	sig := []byte{byte(d)}
	for t := range ix.bySelecting {
		for _, pi := range ix.selecting(policy.Tier(t), d, pod) {
			sig = binary.LittleEndian.AppendUint32(sig, uint32(pi))
		}
		sig = append(sig, 0xff, 0xff, 0xff, 0xff) // tier boundary: no index is that
	}
	p, ok := ix.plans.bySelecting[string(sig)]
	if !ok {
		p = ix.plan(pod, d)
		if old, ok := ix.plans.shared[p.Key]; ok {
			p = old
		} else {
			ix.plans.shared[p.Key] = p
		}
		ix.plans.bySelecting[string(sig)] = p
	}
	slot.Store(p)
	return p
}

func (ix *index) plan(pod int, d policy.Direction) *Plan {
	p := &Plan{Direction: d}
	var key strings.Builder
	fmt.Fprintf(&key, "%s|", d)
	ordered := func(tier policy.Tier) []PlanRule {
		var out []PlanRule
		for _, pi := range ix.selecting(tier, d, pod) {
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
	p.Isolating = ix.selecting(policy.TierNetworkPolicy, d, pod)
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
func (r *Resolved) Plan(pod int, d policy.Direction) *Plan { return r.ix.planOf(pod, d) }
