package compiler

import (
	"fmt"
	"slices"
	"strings"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// The NetworkPolicy tier of the identity layout: a class's isolating
// policies as one allow-list over identities and networks, in a chain of
// its own that classes with the same policies share.

// networkPolicyTier is the chain of a NetworkPolicy allow-list: allowed iff
// some rule of an isolating policy matches (or, for ingress, the peer is
// the pod's own node), else dropped. The rules' identity ranges and
// networks are flattened to disjoint pieces with the ports each is allowed;
// per port profile one rule looks the peer's identity up in an interval
// set, and one per family its address in the networks.
func (c *idCompiler) networkPolicyTier(plan *eval.Plan, pod int, named string) string {
	refs := make([]string, len(plan.Isolating))
	for i, pi := range plan.Isolating {
		refs[i] = c.pols[pi].Ref()
	}
	list := c.named(directionPrefix(plan.Direction) + ".np." + contentID(strings.Join(refs, "\x00")+"\x00"+named))
	if _, ok := c.tiers[list]; ok {
		return list
	}
	c.tiers[list] = list
	rc := npRecipe{plan: plan, pod: pod, refs: refs}
	c.npRecipes[list] = rc
	if !c.reuse(list, plan.Isolating, plan.Allow, plan.Direction) {
		c.fill(c.t.AddChain(&nft.Chain{Name: list}), func(ch *nft.Chain) { c.fillNetworkPolicyTier(ch, rc) })
	}
	return list
}

// npRecipe is what a NetworkPolicy tier chain is built from: the plan,
// a pod it is the plan of (its named ports resolve ingress named ports)
// and the isolating policies' names.
type npRecipe struct {
	plan *eval.Plan
	pod  int
	refs []string
}

func (c *idCompiler) fillNetworkPolicyTier(ch *nft.Chain, rc npRecipe) {
	plan, pod, refs := rc.plan, rc.pod, rc.refs
	d := plan.Direction
	comment := "NetworkPolicy tier: every rule of " + strings.Join(refs, ", ") + ", by port profile"
	// The verdict log: as much as any isolating policy asks.
	mode := policy.AuditOff
	if c.audit != nil {
		isolating := make([]*policy.Policy, len(plan.Isolating))
		for i, pi := range plan.Isolating {
			isolating[i] = c.pols[pi]
		}
		mode = c.audit.npModeOf(isolating)
	}
	logOf := func(verdict, pol, rule string, action policy.Action) *auditLog {
		return c.audit.logFor(mode, nft.Attribution{Verdict: verdict, Direction: d.String(), Tier: policy.TierNetworkPolicy.String(),
			Policy: pol, Rule: rule, Action: action.String()})
	}
	if plan.OwnNodeAllowed {
		ownNode := c.decider(logOf("allow", "", "", policy.Accept))
		for _, own := range ownNode.decide(func() *nft.Builder { return nft.NewRule().FibSaddrLocal() }, c.accept()) {
			own.Comment = "NetworkPolicy tier: ingress from the pod's own node is always allowed"
			ch.Rules = append(ch.Rules, own)
		}
	}
	if c.counters || c.audit != nil && logs(mode, true) || c.shadow != nil && c.stagedIn(plan) {
		// A rule at a time, in the evaluator's order: the first that
		// matches is the one logged and counted, as explain names it
		// (and, in the shadow evaluation, marked when it is staged).
		for i, pr := range plan.Allow {
			one := *plan
			one.Allow = []eval.PlanRule{pr}
			p, r := c.pols[pr.Policy], c.rules.rule(pr, d)
			dc := c.decider(logOf("allow", p.Ref(), r.Ref(d), policy.Accept), c.ruleCounter(p, r.Ref(d), policy.Accept, d))
			dc.stage = c.shadow.mark(p, nft.Attribution{Direction: d.String(), Tier: policy.TierNetworkPolicy.String(), Policy: p.Ref(), Rule: r.Ref(d),
				Action: policy.Accept.String()})
			c.allowRules(ch, &one, pod, fmt.Sprintf("r%d", i), "NetworkPolicy tier: "+p.Ref()+" "+r.Ref(d), dc)
		}
	} else {
		c.allowRules(ch, plan, pod, "", comment, c.decider(nil))
	}
	isolation := make([]*nft.Counter, len(plan.Isolating))
	for i, pi := range plan.Isolating {
		isolation[i] = c.ruleCounter(c.pols[pi], IsolationRule, policy.Deny, d)
	}
	deny := c.decider(logOf("deny", strings.Join(refs, ", "), "", policy.Deny), isolation...)
	deny.stage = c.stagedIsolation(plan)
	for _, deny := range deny.decide(nft.NewRule, c.drop()) {
		deny.Comment = "NetworkPolicy tier: isolated, and no rule allows"
		ch.Rules = append(ch.Rules, deny)
	}
}

// allowRules appends to ch the rules that allow what plan's rules allow:
// their identity ranges and networks flattened to disjoint pieces with the
// ports each is allowed, per port profile one rule that looks the peer's
// identity up in an interval set, and one per family its address in the
// networks (named with tag). Each is written by dc.
func (c *idCompiler) allowRules(ch *nft.Chain, plan *eval.Plan, pod int, tag, comment string, dc decider) {
	list, d := ch.Name, plan.Direction
	idItems, netItems := c.allowItems(plan, pod)
	profiles := map[string][]portBox{}
	profileOf := func(ports []portBox) string {
		id := contentID(fmt.Sprint(ports))
		profiles[id] = ports
		return id
	}
	idSets := map[string][]addrRange{}
	for _, p := range flatten(idItems, nft.IPv4) {
		id := profileOf(p.ports)
		idSets[id] = append(idSets[id], addrRange{p.lo, p.hi})
	}
	netSets := map[string]map[*nft.Family][]addrRange{}
	for _, f := range nft.Families {
		for _, p := range flatten(netItems[f], f) {
			id := profileOf(p.ports)
			if netSets[id] == nil {
				netSets[id] = map[*nft.Family][]addrRange{}
			}
			netSets[id][f] = append(netSets[id][f], addrRange{p.lo, p.hi})
		}
	}
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range profiles {
			if !yield(id) {
				return
			}
		}
	}) {
		ports := profiles[id]
		withPorts := func(b *nft.Builder) *nft.Builder {
			if len(ports) == 1 && ports[0] == allProtocolsAndPorts {
				return b
			}
			set := npPortSet(id)
			if c.t.Sets[set] == nil {
				c.t.AddSet(&nft.Set{Name: set, Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true, Elements: portElements(ports)})
			}
			c.use(set)
			return b.L4ProtoPortInSet(set)
		}
		if rs := idSets[id]; len(rs) > 0 {
			for _, r := range dc.decide(func() *nft.Builder { return withPorts(nft.NewRule().In(nil, c.idSetOf(rs), nft.MarkKey())) }, c.allowed(d)) {
				r.Comment = comment
				ch.Rules = append(ch.Rules, r)
			}
		}
		for _, f := range nft.Families {
			rs := netSets[id][f]
			if len(rs) == 0 {
				continue
			}
			name := allowSetName(list, "nets"+tag, id, f)
			c.t.AddSet(&nft.Set{Name: name, Fields: []nft.FieldType{f.Field}, Interval: true, Elements: rangeElements(rs, f)})
			c.use(name)
			for _, r := range dc.decide(func() *nft.Builder { return withPorts(nft.NewRule().AddrInSet(f, peerSide(d), name)) }, c.allowed(d)) {
				r.Comment = comment
				ch.Rules = append(ch.Rules, r)
			}
		}
	}
}

// allowItems lists what the plan's NetworkPolicy rules allow: identity
// ranges (as 4-byte addresses) and, per family, networks, each with ports.
func (c *idCompiler) allowItems(plan *eval.Plan, pod int) ([]allowItem, map[*nft.Family][]allowItem) {
	d := plan.Direction
	var ids []allowItem
	nets := map[*nft.Family][]allowItem{}
	for _, pr := range plan.Allow {
		if pr.Match == eval.MatchNothing {
			continue // an Accept that cannot be understood allows nothing
		}
		pi, ri, r := int(pr.Policy), pr.Rule, c.rules.rule(pr, d)
		var peerIDs []addrRange
		peerNets := map[*nft.Family][]addrRange{}
		for _, f := range nft.Families {
			if r.AllPeers {
				peerNets[f] = []addrRange{fullRange(f)}
			} else {
				peerNets[f] = c.rules.peerRanges(pi, d, ri, f)
			}
		}
		if !r.AllPeers {
			peerIDs = c.peerIDs(pi, d, ri)
		}
		add := func(ports []portBox) {
			if len(ports) == 0 {
				return
			}
			if len(peerIDs) > 0 {
				ids = append(ids, allowItem{addrs: peerIDs, ports: ports})
			}
			for f, rs := range peerNets {
				if len(rs) > 0 {
					nets[f] = append(nets[f], allowItem{addrs: rs, ports: ports})
				}
			}
		}
		if r.AllPorts {
			add([]portBox{allProtocolsAndPorts})
			continue
		}
		numbered, namedPorts := splitPorts(r.Ports)
		add(portBoxes(numbered))
		if len(namedPorts) == 0 {
			continue
		}
		if d == policy.Ingress {
			add(namedMatches(namedPorts, c.r.Pod(pod).Ports)) // the destination is the pod itself
			continue
		}
		if !r.AllPeers {
			for f, rs := range peerNets {
				c.namedNets[f] = append(c.namedNets[f], rs...)
			}
		}
		c.egressNamedAllow = true
		if c.from != nil {
			c.from.lacks(c.pols[pi].Ref() + " names egress ports, which every destination resolves")
			continue
		}
		// Egress: each destination resolves the names on its own ports:
		// a pod-network pod by its identity, a host-network one by its
		// address.
		for j := 0; j < c.r.NumPods(); j++ {
			dst := c.r.Pod(j)
			boxes := namedMatches(namedPorts, dst.Ports)
			if len(boxes) == 0 {
				continue
			}
			if id := c.ids.of[j]; id != 0 && (r.AllPeers || c.r.PeerPods(pi, d, ri, j)) {
				// Every pod of the identity is a peer alike.
				ids = append(ids, allowItem{addrs: []addrRange{singleAddr(idAddr(id))}, ports: boxes})
				continue
			}
			// A host-network pod, or a pod the rule's networks hold but
			// not its pod peers: by address (its identity's other pods
			// may be elsewhere).
			for _, a := range dst.Addrs {
				f := nft.FamilyOf(a)
				if containsAddr(peerNets[f], a) {
					nets[f] = append(nets[f], allowItem{addrs: []addrRange{singleAddr(a)}, ports: boxes})
				}
			}
		}
	}
	return ids, nets
}
