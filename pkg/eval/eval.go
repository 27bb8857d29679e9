// Package eval decides, for a connection between two endpoints of a
// snapshot, what policy allows, and why. It is the semantic core that
// `netpol explain`, `netpol table` and the kernel tests agree on.
package eval

import (
	"fmt"
	"iter"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// Evaluator answers policy questions about one snapshot.
type Evaluator struct {
	ix      *index
	model   *policy.Model
	guard   NodeGuard
	domains DomainOracle
}

// DomainOracle says which addresses DNS answers taught the node for each
// domainNames pattern: what a node's domain sets hold (the agent's
// /debug/dns), or offline the lab's zone. Without one, domainNames match
// nothing, as on a node that learned nothing.
type DomainOracle interface {
	// Learned reports whether addr was learned for pattern (canonical)
	// and, if so, how (the name, when), for explain.
	Learned(pattern string, addr netip.Addr) (ok bool, how string)
}

// LearnDomains makes domainNames peers match what o says was learned.
func (e *Evaluator) LearnDomains(o DomainOracle) { e.domains = o }

// NodeGuard is a rule of the nodes' own tables that judges new connections
// to a node's addresses before the pod's egress policy there
// (compiler.AgentPorts, the agent's own ports). It can only deny: what it
// admits goes on to policy.
type NodeGuard interface {
	// Admits says whether a connection from src (srcLocal: one of the
	// node's own addresses) to proto/port on the node may go on, and the
	// deciding rule; decided is false when the guard does not apply.
	Admits(src netip.Addr, srcLocal bool, proto uint8, port uint16) (allowed, decided bool, rule string)
}

// GuardNodes makes every node's address judged by g first, as the nodes'
// tables do (nil: no guard).
func (e *Evaluator) GuardNodes(g NodeGuard) { e.guard = g }

// TierNode is the tier of a NodeGuard's verdict in explain's output.
const TierNode = "Node"

// guardPolicy names the node guard in explain's output.
const guardPolicy = "netpol agent ports (--protect-agent-ports)"

// New resolves every selector of the model against the snapshot once.
func New(snap *cluster.Snapshot, model *policy.Model) *Evaluator {
	return &Evaluator{ix: buildIndex(snap, model), model: model}
}

// NewFromPods is New with the pods given as a sequence, in (namespace,
// name) order (another order costs a map for the lookups by name),
// instead of snap.Pods (not read). The evaluator keeps no
// yielded pod, only strings, label maps and port lists they hold, so a
// caller may make each pod for its step alone and reuse it: the agent
// makes none of its 100,000 thin pods at once. podCount is how many pods
// the sequence yields, about (0: unknown), so that the index is sized once.
func NewFromPods(snap *cluster.Snapshot, model *policy.Model, pods iter.Seq[*corev1.Pod], podCount int) *Evaluator {
	return &Evaluator{ix: buildIndexFrom(snap, model, pods, podCount), model: model}
}

// Verdict is the answer for one connection.
type Verdict struct {
	From     string          `json:"from"`
	To       string          `json:"to"`
	FromIP   string          `json:"fromIP,omitempty"`
	ToIP     string          `json:"toIP,omitempty"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	Allowed  bool            `json:"allowed"`
	// Reason is set when neither direction was evaluated (a pod's traffic
	// to itself).
	Reason  string            `json:"reason,omitempty"`
	Egress  *DirectionVerdict `json:"egress"`
	Ingress *DirectionVerdict `json:"ingress"`
}

// DirectionVerdict is the decision for one direction with its trace.
type DirectionVerdict struct {
	// Subject is the pod whose policies decide this direction (the source
	// for egress, the destination for ingress).
	Subject string `json:"subject"`
	// Applies is false when the subject is not a pod-network pod: no policy
	// polices that side.
	Applies bool `json:"applies"`
	Allowed bool `json:"allowed"`
	// Tier, Policy, Rule and Action name what decided. Tier "Default" with
	// no policy means no tier decided and the default allows.
	Tier      string `json:"tier"`
	Policy    string `json:"policy,omitempty"`
	Rule      string `json:"rule,omitempty"`
	RuleIndex *int   `json:"ruleIndex,omitempty"`
	Action    string `json:"action"`
	Reason    string `json:"reason"`
	// Ambiguous names other policies of the same priority whose rules
	// also match: their relative order is implementation-defined.
	Ambiguous []string `json:"ambiguous,omitempty"`
	// Domain, when the deciding rule matched the peer only through a
	// domainNames pattern, names the pattern and how its address was
	// learned (the DomainOracle's words: name, when, until when).
	Domain string `json:"domain,omitempty"`
	// SelectedBy lists, per tier, the policies that apply to the subject.
	SelectedBy map[string][]string `json:"selectedBy,omitempty"`
	// Skipped lists the rules, in evaluation order, that were considered
	// before the decision and did not decide, each with why.
	Skipped []Step `json:"skipped,omitempty"`

	// brief: only what decided is recorded (Decide), not Skipped,
	// Ambiguous, Domain nor the policies that do not select the subject.
	brief bool
}

// detailed says the trace records everything Explain shows.
func (tr *DirectionVerdict) detailed() bool { return tr != nil && !tr.brief }

// Step is a rule (or policy) that did not decide, and why.
type Step struct {
	Tier   string `json:"tier"`
	Policy string `json:"policy,omitempty"`
	Rule   string `json:"rule,omitempty"`
	Action string `json:"action,omitempty"`
	Why    string `json:"why"`
}

// Reasons a rule did not decide.
const (
	whyPeer        = "peer did not match"
	whyPort        = "port did not match"
	whyNotSelected = "subject not selected"
	whyFailClosed  = "rule fails closed (Accept matches nothing): "
)

// Explain resolves src and dst ("namespace/pod" or an IP address) and
// evaluates the connection with a full trace.
func (e *Evaluator) Explain(src, dst string, probe l4.Port, family ipfamily.Family) (*Verdict, error) {
	dstEp, err := e.resolve(dst, family, netip.Addr{})
	if err != nil {
		return nil, fmt.Errorf("destination: %w", err)
	}
	srcEp, err := e.resolve(src, ipfamily.Of(dstEp.Addr), dstEp.Addr)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	return e.Evaluate(srcEp, dstEp, probe, true), nil
}

// Endpoint resolves "namespace/pod" or an IP address as Explain does: a
// pod's address of family (its primary one by default), or of peer's
// family when peer is valid.
func (e *Evaluator) Endpoint(s string, family ipfamily.Family, peer netip.Addr) (Endpoint, error) {
	if peer.IsValid() {
		family = ipfamily.Of(peer)
	}
	return e.resolve(s, family, peer)
}

func (e *Evaluator) resolve(s string, family ipfamily.Family, peer netip.Addr) (Endpoint, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap() // an IPv4 address written as IPv6 is IPv4 to the kernel, as pod addresses are
		if peer.IsValid() && a.Is4() != peer.Is4() {
			return Endpoint{}, fmt.Errorf("%s and %s are of different address families", s, peer)
		}
		return e.ix.addrEndpoint(a), nil
	}
	if !strings.Contains(s, "/") {
		return Endpoint{}, fmt.Errorf("%q is neither namespace/pod nor an IP address", s)
	}
	i, ok := e.ix.podByName(s)
	if !ok {
		return Endpoint{}, fmt.Errorf("pod %s is not in the snapshot", s)
	}
	ep, ok := e.ix.podEndpoint(i, family)
	if !ok {
		if family == ipfamily.Any {
			return Endpoint{}, fmt.Errorf("pod %s has no IP address (status.podIP)", s)
		}
		return Endpoint{}, fmt.Errorf("pod %s has no %s address", s, family)
	}
	return ep, nil
}

// Name is how an endpoint appears in output: namespace/pod or the address.
func (e *Evaluator) Name(ep Endpoint) string {
	if ep.Pod >= 0 {
		return e.ix.pods[ep.Pod].key
	}
	return ep.Addr.String()
}

// Evaluate decides the connection src -> dst. With trace, each direction
// records which policies selected the subject and why each earlier rule did
// not decide; without, it only computes the verdict (the table's hot path).
func (e *Evaluator) Evaluate(src, dst Endpoint, probe l4.Port, trace bool) *Verdict {
	t := traceNone
	if trace {
		t = traceFull
	}
	return e.evaluate(src, dst, probe, t)
}

// How much of a decision a verdict records.
const (
	traceNone  = iota // the verdict only
	traceBrief        // what decided
	traceFull         // and why each earlier rule did not (Explain)
)

func (e *Evaluator) evaluate(src, dst Endpoint, probe l4.Port, trace int) *Verdict {
	v := &Verdict{From: e.Name(src), To: e.Name(dst), Protocol: probe.Protocol, Port: probe.Port}
	if src.Addr.IsValid() {
		v.FromIP, v.ToIP = src.Addr.String(), dst.Addr.String()
	}
	if src.Pod >= 0 && src.Pod == dst.Pod {
		v.Allowed = true
		v.Reason = "no policy applies to a pod's traffic to itself (also through its own Service)"
		return v
	}
	v.Egress = e.direction(policy.Egress, src, dst, probe, trace)
	v.Ingress = e.direction(policy.Ingress, dst, src, probe, trace)
	v.Allowed = v.Egress.Allowed && v.Ingress.Allowed
	return v
}

// Decide is Evaluate with brief traces: each direction says what decided
// (tier, policy, rule, action, reason, and the policies that select the
// subject), not the rules that did not.
func (e *Evaluator) Decide(src, dst Endpoint, probe l4.Port) *Verdict {
	return e.evaluate(src, dst, probe, traceBrief)
}

// Allowed is Evaluate without a trace or allocations beyond the verdict.
func (e *Evaluator) Allowed(src, dst Endpoint, probe l4.Port) bool {
	if src.Pod >= 0 && src.Pod == dst.Pod {
		return true
	}
	return e.decide(policy.Egress, src, dst, probe, nil) && e.decide(policy.Ingress, dst, src, probe, nil)
}

// AllowedIn is one direction of Allowed: the source's egress, or the
// destination's ingress.
func (e *Evaluator) AllowedIn(d policy.Direction, src, dst Endpoint, probe l4.Port) bool {
	if src.Pod >= 0 && src.Pod == dst.Pod {
		return true
	}
	if d == policy.Egress {
		return e.decide(d, src, dst, probe, nil)
	}
	return e.decide(d, dst, src, probe, nil)
}

// DecisionIn is one direction of Evaluate (full: its trace, as explain's)
// or of Decide (what decided): the source's egress, or the destination's
// ingress.
func (e *Evaluator) DecisionIn(d policy.Direction, src, dst Endpoint, probe l4.Port, full bool) *DirectionVerdict {
	t := traceBrief
	if full {
		t = traceFull
	}
	if d == policy.Egress {
		return e.direction(d, src, dst, probe, t)
	}
	return e.direction(d, dst, src, probe, t)
}

func (e *Evaluator) direction(d policy.Direction, subject, peer Endpoint, probe l4.Port, trace int) *DirectionVerdict {
	dv := &DirectionVerdict{Subject: e.Name(subject), brief: trace == traceBrief}
	if trace == traceNone {
		dv.Allowed = e.decide(d, subject, peer, probe, nil)
		return dv
	}
	dv.Allowed = e.decide(d, subject, peer, probe, dv)
	return dv
}

// decide runs the tiers for one direction. subject is the side whose
// policies apply; peer the other side. tr, when not nil, receives the trace.
func (e *Evaluator) decide(d policy.Direction, subject, peer Endpoint, probe l4.Port, tr *DirectionVerdict) bool {
	ix := e.ix
	if d == policy.Ingress && subject.Node >= 0 && e.guard != nil {
		local := peer.Node == subject.Node
		proto, _ := policy.IPProtocol(probe.Protocol)
		if allowed, decided, rule := e.guard.Admits(peer.Addr, local, proto, uint16(probe.Port)); decided {
			if tr != nil {
				action, verdict := policy.Accept, "admits"
				if !allowed {
					action, verdict = policy.Deny, "drops"
				}
				tr.Tier, tr.Policy, tr.Action = TierNode, guardPolicy, action.String()
				tr.Reason = fmt.Sprintf("node %s's table %s this connection to the agent's port %s (%s)", ix.nodes[subject.Node].node.Name, verdict, probe, rule)
			}
			return allowed // a node is not policed beyond its guard
		}
	}
	if !ix.podNetwork(subject) {
		if tr != nil {
			what := "an address outside the pod network"
			if subject.Pod >= 0 {
				what = "a host-network pod (it acts as its node)"
			}
			tr.decided(policy.TierDefault, "", "", nil, policy.Accept,
				fmt.Sprintf("%s is %s: no %s policy applies to it", e.Name(subject), what, d))
		}
		return true
	}
	if tr != nil {
		tr.Applies = true
		tr.SelectedBy = map[string][]string{}
	}
	// The destination pod resolves named ports.
	dstPod := subject.Pod
	if d == policy.Egress {
		dstPod = peer.Pod
	}
	var dstPorts []corev1.ContainerPort
	if dstPod >= 0 {
		dstPorts = ix.pods[dstPod].ports
	}
	m := matcher{ix: ix, peer: peer, probe: probe, dstPorts: dstPorts, domains: e.domains}
	plan := ix.planOf(subject.Pod, d)

	// 1. Admin tier.
	switch act, decided := e.orderedTier(policy.TierAdmin, plan.Admin, d, subject.Pod, m, tr); {
	case decided && act == policy.Accept:
		return true
	case decided && act == policy.Deny:
		return false
	}
	// 2. NetworkPolicy tier.
	if len(plan.Isolating) > 0 {
		return e.networkPolicyTier(plan, subject, m, tr)
	}
	if tr.detailed() {
		e.notSelected(policy.TierNetworkPolicy, d, subject.Pod, tr)
		tr.Skipped = append(tr.Skipped, Step{Tier: policy.TierNetworkPolicy.String(),
			Why: fmt.Sprintf("no NetworkPolicy isolates %s for %s", e.Name(subject), d)})
	}
	// 3. Baseline tier.
	switch act, decided := e.orderedTier(policy.TierBaseline, plan.Baseline, d, subject.Pod, m, tr); {
	case decided && act == policy.Accept:
		return true
	case decided && act == policy.Deny:
		return false
	}
	// 4. Default.
	if tr != nil {
		tr.decided(policy.TierDefault, "", "", nil, policy.Accept, "no policy decided; the default allows")
	}
	return true
}

// orderedTier runs the first-match algorithm of the Admin or Baseline tier
// over the plan's rules. decided is false when no rule matched or a Pass
// rule matched (the caller goes on to the next tier).
func (e *Evaluator) orderedTier(tier policy.Tier, rules []PlanRule, d policy.Direction, pod int, m matcher, tr *DirectionVerdict) (policy.Action, bool) {
	sel := e.ix.selecting(tier, d, pod)
	if tr != nil {
		for _, pi := range sel {
			tr.SelectedBy[tier.String()] = append(tr.SelectedBy[tier.String()], e.ix.policies[pi].Ref())
		}
	}
	if tr.detailed() {
		e.notSelected(tier, d, pod, tr)
	}
	for _, pr := range rules {
		cp := e.ix.policies[pr.Policy]
		cr := &cp.rules(d)[pr.Rule]
		why := m.match(pr, cr)
		if why != "" {
			if tr.detailed() {
				tr.Skipped = append(tr.Skipped, Step{Tier: tier.String(), Policy: cp.Ref(), Rule: cr.Ref(d), Action: cr.Action.String(), Why: why})
			}
			continue
		}
		if tr != nil {
			e.record(tr, tier, cp, cr, d)
		}
		if tr.detailed() {
			tr.Ambiguous = e.ambiguous(rules, pr, d, m)
			tr.Domain = m.learnedBy(pr, cr)
			if pr.Action == policy.Pass {
				next := policy.TierNetworkPolicy
				if tier == policy.TierBaseline {
					next = policy.TierDefault
				}
				tr.Skipped = append(tr.Skipped, Step{Tier: tier.String(), Policy: cp.Ref(), Rule: cr.Ref(d), Action: cr.Action.String(),
					Why: fmt.Sprintf("matched: Pass skips the rest of the %s tier, on to %s", tier, next)})
			}
		}
		return pr.Action, pr.Action != policy.Pass
	}
	return policy.Pass, false
}

// maxNotSelected bounds the "subject not selected" steps of one tier in a
// trace; a cluster can have thousands of policies that do not apply.
const maxNotSelected = 10

// notSelected records the policies of a tier that have rules for this
// direction (NetworkPolicies: in the subject's namespace) but do not apply
// to the subject.
func (e *Evaluator) notSelected(tier policy.Tier, d policy.Direction, pod int, tr *DirectionVerdict) {
	ns := e.ix.pods[pod].namespace
	count := 0
	for _, cp := range e.ix.policies {
		if cp.Tier != tier || (tier == policy.TierNetworkPolicy && cp.Namespace != ns) {
			continue
		}
		why := whyNotSelected
		switch {
		case cp.isSubject(pod) && tier == policy.TierNetworkPolicy && !cp.Isolates[d]:
			why = fmt.Sprintf("selects the pod but has no %s policyType", d)
		case cp.isSubject(pod) || (tier != policy.TierNetworkPolicy && len(cp.Rules[d]) == 0):
			continue
		}
		count++
		if count <= maxNotSelected {
			tr.Skipped = append(tr.Skipped, Step{Tier: tier.String(), Policy: cp.Ref(), Why: why})
		}
	}
	if count > maxNotSelected {
		tr.Skipped = append(tr.Skipped, Step{Tier: tier.String(), Why: fmt.Sprintf("%d more policies: %s", count-maxNotSelected, whyNotSelected)})
	}
}

// ambiguous lists the policies with the same priority as the deciding
// rule's whose rules also match the connection (the order between them is
// implementation defined; netpol's is by kind, then name).
func (e *Evaluator) ambiguous(rules []PlanRule, decider PlanRule, d policy.Direction, m matcher) []string {
	dp := e.ix.policies[decider.Policy]
	var out []string
	reported := int32(-1)
	for _, pr := range rules {
		cp := e.ix.policies[pr.Policy]
		if pr.Policy == decider.Policy || pr.Policy == reported || cp.Priority != dp.Priority {
			continue
		}
		cr := &cp.rules(d)[pr.Rule]
		if m.match(pr, cr) == "" {
			reported = pr.Policy
			out = append(out, fmt.Sprintf("%s %s (%s) has the same priority %d as %s and also matches",
				cp.Ref(), cr.Ref(d), cr.Action, cp.Priority, dp.Ref()))
		}
	}
	return out
}

func (e *Evaluator) networkPolicyTier(plan *Plan, subject Endpoint, m matcher, tr *DirectionVerdict) bool {
	d := plan.Direction
	tier := policy.TierNetworkPolicy.String()
	if tr != nil {
		for _, pi := range plan.Isolating {
			tr.SelectedBy[tier] = append(tr.SelectedBy[tier], e.ix.policies[pi].Ref())
		}
	}
	if tr.detailed() {
		e.notSelected(policy.TierNetworkPolicy, d, subject.Pod, tr)
	}
	if plan.OwnNodeAllowed && m.peer.Node >= 0 && m.peer.Node == e.ix.pods[subject.Pod].node {
		if tr != nil {
			tr.decided(policy.TierNetworkPolicy, "", "", nil, policy.Accept,
				fmt.Sprintf("ingress from the pod's own node (%s) is always allowed", e.ix.nodes[m.peer.Node].node.Name))
		}
		return true
	}
	for _, pr := range plan.Allow {
		cp := e.ix.policies[pr.Policy]
		cr := &cp.rules(d)[pr.Rule]
		why := m.match(pr, cr)
		if why == "" {
			if tr != nil {
				e.record(tr, policy.TierNetworkPolicy, cp, cr, d)
			}
			return true
		}
		if tr.detailed() {
			tr.Skipped = append(tr.Skipped, Step{Tier: tier, Policy: cp.Ref(), Rule: cr.Ref(d), Action: cr.Action.String(), Why: why})
		}
	}
	if tr != nil {
		isolating := strings.Join(tr.SelectedBy[tier], ", ")
		tr.decided(policy.TierNetworkPolicy, isolating, "", nil, policy.Deny,
			fmt.Sprintf("%s is isolated for %s by %s and no rule allows this connection", e.Name(subject), d, isolating))
	}
	return false
}

func (e *Evaluator) record(tr *DirectionVerdict, tier policy.Tier, cp *compiledPolicy, cr *compiledRule, d policy.Direction) {
	idx := cr.Index
	reason := fmt.Sprintf("%s %s matches", cp.Ref(), cr.Ref(d))
	if cr.FailClosed != "" {
		reason += " (it fails closed and matches everything: " + cr.FailClosed + ")"
	}
	tr.decided(tier, cp.Ref(), cr.Ref(d), &idx, cr.Action, reason)
}

// decided sets what decided the direction, replacing an earlier Pass.
func (tr *DirectionVerdict) decided(tier policy.Tier, pol, rule string, idx *int, action policy.Action, reason string) {
	tr.Tier, tr.Policy, tr.Rule, tr.RuleIndex, tr.Action, tr.Reason = tier.String(), pol, rule, idx, action.String(), reason
}

// matcher tests rules against one connection.
type matcher struct {
	ix       *index
	peer     Endpoint
	probe    l4.Port
	dstPorts []corev1.ContainerPort
	domains  DomainOracle
}

// match returns "" when the rule matches, else why not.
func (m matcher) match(pr PlanRule, cr *compiledRule) string {
	switch pr.Match {
	case MatchNothing:
		return whyFailClosed + cr.FailClosed
	case MatchAll:
		return ""
	}
	if !cr.AllPorts && !m.portMatches(cr) {
		return whyPort
	}
	if !cr.AllPeers && !m.peerMatches(cr) {
		if len(cr.domains) > 0 && m.domains == nil {
			return whyPeer + " (domainNames match only addresses learned from DNS; none are known here)"
		}
		if len(cr.domains) > 0 {
			return whyPeer + " (no domainNames pattern of the rule learned this address)"
		}
		return whyPeer
	}
	return ""
}

func (m matcher) portMatches(cr *compiledRule) bool {
	for _, p := range cr.Ports {
		if p.Matches(m.probe.Protocol, m.probe.Port, m.dstPorts) {
			return true
		}
	}
	return false
}

func (m matcher) peerMatches(cr *compiledRule) bool {
	if m.ix.podNetwork(m.peer) && cr.pods.has(m.peer.Pod) {
		return true
	}
	if m.peer.Node >= 0 && cr.nodes.has(m.peer.Node) {
		return true
	}
	for _, b := range cr.ipBlocks {
		if inBlock(b, m.peer.Addr) {
			return true
		}
	}
	if m.domains != nil && m.peer.Addr.IsValid() {
		for _, pattern := range cr.domains {
			if ok, _ := m.domains.Learned(pattern, m.peer.Addr); ok {
				return true
			}
		}
	}
	return false
}

// learnedBy says which domainNames pattern admitted the peer of a rule
// that matched, when no other peer of the rule did ("" then).
func (m matcher) learnedBy(pr PlanRule, cr *compiledRule) string {
	if pr.Match == MatchAll || cr.AllPeers || len(cr.domains) == 0 || m.domains == nil {
		return ""
	}
	others := *cr
	others.domains = nil
	if (matcher{ix: m.ix, peer: m.peer}).peerMatches(&others) {
		return ""
	}
	for _, pattern := range cr.domains {
		if ok, how := m.domains.Learned(pattern, m.peer.Addr); ok {
			return fmt.Sprintf("domainNames %q: %s", pattern, how)
		}
	}
	return ""
}

func inBlock(b policy.Peer, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, ex := range b.Except {
		if ex.Contains(a) {
			return false
		}
	}
	for _, c := range b.CIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}
