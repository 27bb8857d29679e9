package compiler

import (
	"errors"
	"fmt"
	"strings"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// Staged policies (Options.Staged; docs/architecture.md, "Staged
// policies"): a policy annotated netpol.io/staged is not enforced, but the
// node's table evaluates it beside the enforced ones, in the kernel, and
// logs the new connections whose verdict it would change.
//
//   - The shadow evaluation is a second identity layout of the enforced
//     and the staged policies together, in base chains of their own that
//     run just before the enforced ones (shadowPriority) and never drop:
//     its chains, dispatch and pass maps are named with stagedPrefix, and
//     it shares the pod-ids maps and every set of the same content with
//     the enforced layout. Its verdict is a bit of the connection's mark
//     (shadowAllowBit), and each rule of a staged policy that decides on
//     its path (an Accept, Deny or Pass; a NetworkPolicy's allow; an
//     isolation only staged policies make) writes its number in the bits
//     above (shadowAttributionMask). A verdict differs from the enforced
//     one only where a staged rule decided on the shadow's path: with
//     none, the shadow met the enforced rules in the same order.
//   - The enforced evaluation sends each final verdict through one chain
//     per verdict (staged-accept, staged-deny) that looks the mark up in
//     a verdict map of the staged rules whose would-be verdict is the
//     other (staged-closes, staged-opens): a hit jumps to the staged
//     rule's chain, which copies the packet to the verdict log (its
//     attribution: nft.Attribution.Staged) and counts it into the staged
//     policy's counter of that verdict; then the enforced verdict stands.
//
// Staging changes no enforced verdict: the enforced chains decide as
// before, through one more lookup. The verdict compared is the node's:
// where a connection's two sides are decided on two nodes, each node
// compares its own side.

const (
	// stagedPrefix names the shadow evaluation's objects, and the
	// enforced evaluation's chains and maps that compare with it.
	stagedPrefix = "staged-"
	// shadowPriority runs the shadow base chains before the enforced
	// ones (priority 0) of the same hooks, after the DNS chains.
	shadowPriority = -1
	// The connection mark's bits the shadow evaluation writes (the
	// Service NAT's masquerade bit is 0x4000).
	shadowAllowBit         = 1 << 16
	shadowAttributionShift = 17
	shadowAttributionMask  = 0xfffe0000
	shadowMask             = shadowAllowBit | shadowAttributionMask
	maxStagedRules         = shadowAttributionMask >> shadowAttributionShift
	// The chains and maps of the comparison.
	chainWouldAllow     = stagedPrefix + "would-allow" // the shadow's allow
	chainEnforcedAccept = stagedPrefix + "accept"      // the enforced accept, compared
	chainEnforcedDeny   = stagedPrefix + "deny"        // the enforced drop, compared
	mapStagedOpens      = stagedPrefix + "opens"       // staged rules that would allow
	mapStagedCloses     = stagedPrefix + "closes"      // staged rules that would deny
)

// errStagedIncremental: a compile from the last one (a rebase) does not
// build the shadow evaluation; IdentityIncremental asks for a full compile.
var errStagedIncremental = errors.New("staged policies: the shadow evaluation is compiled in full")

// shadow is the shadow compile's numbering of the staged rules that decide.
type shadow struct {
	index map[string]uint32
	rules []stagedRule // by number - 1
}

// stagedRule is a staged policy's rule that decides on some shadow path.
type stagedRule struct {
	pol *policy.Policy
	at  nft.Attribution // without Verdict and Enforced
}

// mark is the connection mark's field that names p's rule at (0 when p is
// not staged, or outside a shadow compile).
func (s *shadow) mark(p *policy.Policy, at nft.Attribution) uint32 {
	if s == nil || !p.Staged {
		return 0
	}
	key := fmt.Sprintf("%s|%s|%s|%s|%s", at.Direction, at.Tier, at.Policy, at.Rule, at.Action)
	n, ok := s.index[key]
	if !ok {
		if len(s.rules) == maxStagedRules {
			return 0 // past the numbers the mark holds: not logged
		}
		s.rules = append(s.rules, stagedRule{pol: p, at: at})
		n = uint32(len(s.rules))
		s.index[key] = n
	}
	return n << shadowAttributionShift
}

// named is name as the compile calls it: in the shadow compile, with
// stagedPrefix.
func (c *idCompiler) named(name string) string {
	if c.shadow != nil {
		return stagedPrefix + name
	}
	return name
}

// accept is the verdict of a connection allowed for good: the shadow's
// marks it (and lets it on), the enforced one beside a shadow compares it.
func (c *idCompiler) accept() nft.Verdict {
	switch {
	case c.shadow != nil:
		return nft.Verdict{Kind: nft.Goto, Chain: chainWouldAllow}
	case c.funnel:
		return nft.Verdict{Kind: nft.Goto, Chain: chainEnforcedAccept}
	}
	return verdictAccept
}

// drop is the verdict of a connection denied: the shadow's lets it on
// (the allow bit stays clear), the enforced one beside a shadow compares
// it.
func (c *idCompiler) drop() nft.Verdict {
	switch {
	case c.shadow != nil:
		return verdictAccept
	case c.funnel:
		return nft.Verdict{Kind: nft.Goto, Chain: chainEnforcedDeny}
	}
	return verdictDrop
}

// stagedIn reports whether a staged policy isolates or allows in plan's
// NetworkPolicy tier.
func (c *idCompiler) stagedIn(plan *eval.Plan) bool {
	for _, pi := range plan.Isolating {
		if c.pols[pi].Staged {
			return true
		}
	}
	for _, pr := range plan.Allow {
		if c.pols[pr.Policy].Staged {
			return true
		}
	}
	return false
}

// stagedIsolation is the mark of plan's isolation when only staged
// policies isolate, else 0: with an enforced one isolating too, the
// enforced evaluation denies alike. It is named as explain names an
// isolation: by the isolating policies, with no rule (the first one's
// counter counts it).
func (c *idCompiler) stagedIsolation(plan *eval.Plan) uint32 {
	if c.shadow == nil || len(plan.Isolating) == 0 {
		return 0
	}
	refs := make([]string, len(plan.Isolating))
	for i, pi := range plan.Isolating {
		if !c.pols[pi].Staged {
			return 0
		}
		refs[i] = c.pols[pi].Ref()
	}
	return c.shadow.mark(c.pols[plan.Isolating[0]], nft.Attribution{Direction: plan.Direction.String(), Tier: policy.TierNetworkPolicy.String(),
		Policy: strings.Join(refs, ", "), Action: policy.Deny.String()})
}

// compileShadow adds to c's table (the enforced compile, c.funnel) the
// shadow evaluation of c's policies and the staged ones, and the
// comparison of its verdicts with c's.
func (c *idCompiler) compileShadow(opts Options) {
	pols := policy.Promoted(&policy.Model{Policies: c.pols, Staged: opts.Staged}).Policies
	s := newIDCompiler(c.r.WithPolicies(pols), c.node, c.t, c.ids, c.relevant)
	s.shadow = &shadow{index: map[string]uint32{}}
	s.fixedObjects()
	would := nft.NewRule().CtMarkSet(shadowAllowBit).Verdict(verdictAccept)
	would.Comment = "the staged policies' evaluation allows: marked, for the enforced evaluation to compare"
	c.t.AddChain(&nft.Chain{Name: chainWouldAllow, Rules: []*nft.Rule{would}})
	claimed := map[addrClaim]bool{}
	for i := 0; i < s.r.NumPods(); i++ {
		p := s.r.Pod(i)
		if p.HostNetwork || p.Node != s.node || s.ids.of[i] == 0 {
			continue
		}
		var classes [2]idClass
		for _, d := range policy.Directions {
			classes[d] = s.class(i, d)
		}
		elems := podElements(s.ids.of[i], p.Addrs, true, classes, false, stagedPrefix)
		for _, e := range elems {
			if !claimed[e.claim] {
				set := c.t.Sets[e.set]
				set.Elements = append(set.Elements, e.Element)
			}
		}
		for _, e := range elems {
			claimed[e.claim] = true
		}
	}
	c.compareShadow(s.shadow, opts.Audit)
}

// wouldVerdicts are the verdicts a staged rule with action can be
// the last staged rule on the path to: an Accept (or a NetworkPolicy
// allow) only allows, a Deny (or an isolation) only denies, and after a
// Pass the next tier decides.
func wouldVerdicts(action string) []string {
	switch action {
	case policy.Accept.String():
		return []string{"allow"}
	case policy.Deny.String():
		return []string{"deny"}
	}
	return []string{"allow", "deny"}
}

// compareShadow adds the enforced verdicts' comparison with the shadow's
// (staged-accept, staged-deny) and, for each staged rule, its chain of
// each would-be verdict: a copy to the verdict log's group within the
// verdict log's rate, and a count into its policy's counter.
func (c *idCompiler) compareShadow(s *shadow, audit *Audit) {
	group, rate := uint16(DefaultAuditGroup), uint64(DefaultAuditRate)
	if audit != nil {
		group = audit.Group
		if audit.Rate != 0 {
			rate = audit.Rate
		}
	}
	opens := c.t.AddSet(&nft.Set{Name: mapStagedOpens, Fields: []nft.FieldType{nft.FieldInteger}, Verdict: true, Typeof: "ct mark : verdict"})
	closes := c.t.AddSet(&nft.Set{Name: mapStagedCloses, Fields: []nft.FieldType{nft.FieldInteger}, Verdict: true, Typeof: "ct mark : verdict"})
	for i, sr := range s.rules {
		field := uint32(i+1) << shadowAttributionShift
		for _, would := range wouldVerdicts(sr.at.Action) {
			at := sr.at
			at.Verdict, at.Staged, at.Enforced = would, true, "deny"
			if would == "deny" {
				at.Enforced = "allow"
			}
			log := &auditLog{group: group, rate: rate, at: at}
			name := "staged." + contentID(log.prefix()) + "." + would
			of := nft.CounterOf{Kind: sr.pol.Kind, Namespace: sr.pol.Namespace, Name: sr.pol.Name, Staged: true, Verdict: would}
			counter := c.t.AddCounter(&nft.Counter{Name: "staged." + contentID(fmt.Sprintf("%s|%s|%s|%s", of.Kind, of.Namespace, of.Name, would)), Of: of})
			copyRule := nft.NewRule().LimitRate(rate, uint32(2*rate)).Log(group, log.prefix()).Done()
			count := nft.NewRule().CountInto(counter.Name).Done()
			copyRule.Attribution, count.Attribution = &at, &at
			copyRule.Comment = strings.TrimSpace(fmt.Sprintf("staged %s %s", sr.at.Policy, sr.at.Rule)) + fmt.Sprintf(": would %s, enforced %s", would, at.Enforced)
			c.t.AddChain(&nft.Chain{Name: name, Rules: []*nft.Rule{copyRule, count}})
			m, key := opens, field|shadowAllowBit
			if would == "deny" {
				m, key = closes, field
			}
			m.Elements = append(m.Elements, nft.Element{Key: nft.IntegerBytes(key), Verdict: &nft.Verdict{Kind: nft.Jump, Chain: name}})
		}
	}
	deny := nft.NewRule().VmapKey(nil, mapStagedOpens, nft.CtMarkBits(shadowMask))
	deny.Comment = "denied: a staged rule that would allow is logged"
	accept := nft.NewRule().VmapKey(nil, mapStagedCloses, nft.CtMarkBits(shadowMask))
	accept.Comment = "allowed: a staged rule that would deny is logged"
	clear := nft.NewRule().CtMarkClear(shadowMask).Verdict(verdictAccept)
	clear.Comment = "the staged policies' marks are not kept on the connection"
	c.t.AddChain(&nft.Chain{Name: chainEnforcedDeny, Rules: []*nft.Rule{deny, nft.NewRule().Verdict(verdictDrop)}})
	c.t.AddChain(&nft.Chain{Name: chainEnforcedAccept, Rules: []*nft.Rule{accept, clear}})
}
