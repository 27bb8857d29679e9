package compiler

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// The NetworkPolicy tier of the address layout: a class's isolating
// policies as one allow-list (networkPolicyRules), the pod addresses in it
// by port profile (podPorts, which addrElements reads), and its rules.

// npTier is the NetworkPolicy tier of one class chain: its rules are the
// last of chain, after prefix (Admin) rules. Tiers with the same allow-list
// (list) share its sets, profiles and rules.
type npTier struct {
	list      string // the allow-list's id: its sets' names start with it
	chain     string
	prefix    int
	direction policy.Direction
	ownNode   bool
	comment   string
	allow     []allowRule
	// profiles holds every port profile the allow-list has used, by id.
	profiles map[string][]portBox
	// allowKey identifies what the allow-list holds: list, and the
	// isolating policies by address (Rebase reuses the sets of an equal
	// one: a policy changed under the same name has another address).
	// isolating holds those policies, so that no address in a key is
	// reused by another policy while the tier lives.
	allowKey  string
	isolating []*policy.Policy
	// seen maps the ports an address was allowed, as found (podSetFor),
	// to the names of their profile's pod sets by family: most addresses
	// of a list repeat a few combinations.
	seen map[string]map[*nft.Family]string
}

// allowRule is one NetworkPolicy rule of a class, as Incremental resolves it on
// one pod.
type allowRule struct {
	subjects []policy.Subject // the rule's pods peers
	allPeers bool
	// ports are allowed to or from the pods the subjects select (for
	// ingress, with the rule's named ports resolved on the class's pod).
	ports []portBox
	// named are egress named ports, resolved on each destination pod the
	// subjects select or that nets (networks, per family) hold.
	named []policy.Port
	nets  map[*nft.Family][]addrRange
}

// allowRules resolves the plan's NetworkPolicy rules for pod's class.
func (c *compiler) allowRules(plan *eval.Plan, pod int) []allowRule {
	d := plan.Direction
	var out []allowRule
	for _, pr := range plan.Allow {
		if pr.Match == eval.MatchNothing {
			continue
		}
		pi, ri, r := int(pr.Policy), pr.Rule, c.rule(pr, d)
		ar := allowRule{allPeers: r.AllPeers}
		if !r.AllPeers {
			ar.subjects = podSubjects(r.Peers)
		}
		if r.AllPorts {
			ar.ports = []portBox{allProtocolsAndPorts}
			out = append(out, ar)
			continue
		}
		numbered, named := splitPorts(r.Ports)
		ar.ports = portBoxes(numbered)
		if len(named) > 0 {
			if d == policy.Ingress {
				ar.ports = append(ar.ports, namedMatches(named, c.r.Pod(pod).Ports)...)
			} else {
				ar.named = named
				if !r.AllPeers {
					ar.nets = map[*nft.Family][]addrRange{}
					for _, f := range nft.Families {
						ar.nets[f] = c.peerRanges(pi, d, ri, f)
					}
				}
			}
		}
		out = append(out, ar)
	}
	return out
}

// podPorts is what the tier allows to or from address a (family f) of
// pod p, whose namespace has nsLabels: the allow-list's pod entry.
func (t *npTier) podPorts(p *PodState, nsLabels labels.Set, a netip.Addr, f *nft.Family) []portBox {
	var out []portBox
	for i := range t.allow {
		r := &t.allow[i]
		in := !p.HostNetwork && selectsAny(r.subjects, p, nsLabels)
		if in {
			out = append(out, r.ports...)
		}
		if len(r.named) > 0 && (in || r.allPeers || containsAddr(r.nets[f], a)) {
			out = append(out, namedMatches(r.named, p.Ports)...)
		}
	}
	return out
}

// podSetFor returns the name of the pod set, in family f, of the
// profile of boxes (in any order, with repeats), registered.
func (t *npTier) podSetFor(boxes []portBox, f *nft.Family) string {
	key := make([]byte, 0, 6*len(boxes))
	for _, b := range boxes {
		key = append(key, b.protoLo, b.protoHi, byte(b.portLo>>8), byte(b.portLo), byte(b.portHi>>8), byte(b.portHi))
	}
	names, ok := t.seen[string(key)]
	if !ok {
		id := t.profile(canonicalPorts(boxes))
		names = map[*nft.Family]string{}
		for _, f := range nft.Families {
			names[f] = allowSetName(t.list, "pods", id, f)
		}
		if t.seen == nil {
			t.seen = map[string]map[*nft.Family]string{}
		}
		t.seen[string(key)] = names
	}
	return names[f]
}

// profile returns the id of a (canonical) port profile.
func (t *npTier) profile(ports []portBox) string {
	id := contentID(fmt.Sprint(ports))
	if _, ok := t.profiles[id]; !ok {
		t.profiles[id] = ports
	}
	return id
}

func allowSetName(list, kind, id string, f *nft.Family) string {
	return fmt.Sprintf("%s.%s.%s.%s", list, kind, id, f.Suffix)
}

// podSet is the (empty) hash set of the pod addresses allowed profile id.
func (t *npTier) podSet(id string, f *nft.Family) *nft.Set {
	return &nft.Set{Name: allowSetName(t.list, "pods", id, f), Fields: []nft.FieldType{f.Field}}
}

// rules are the tier's rules for the allow-list sets tab holds: per
// profile (in id order), kind and family with elements, a lookup of the
// peer and, unless the profile is every port, of the port in the
// profile's port set (added to tab when missing); then drop.
func (t *npTier) rules(tab *nft.Table) []*nft.Rule {
	var out []*nft.Rule
	if t.ownNode {
		// Every address of the node, not only the Node's: the kubelet's
		// probes leave from the CNI's host-side address (a ptp or bridge
		// gateway), which no Node object names.
		own := nft.NewRule().FibSaddrLocal().Verdict(verdictReturn)
		own.Comment = "NetworkPolicy tier: ingress from the pod's own node is always allowed"
		out = append(out, own)
	}
	for _, id := range slices.Sorted(maps.Keys(t.profiles)) {
		ports, portSet := t.profiles[id], ""
		for _, kind := range []string{"pods", "nets"} {
			for _, f := range nft.Families {
				name := allowSetName(t.list, kind, id, f)
				if s := tab.Sets[name]; s == nil || len(s.Elements) == 0 {
					continue
				}
				if portSet == "" && !(len(ports) == 1 && ports[0] == allProtocolsAndPorts) {
					portSet = npPortSet(id)
					if tab.Sets[portSet] == nil {
						tab.AddSet(&nft.Set{Name: portSet, Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true,
							Elements: portElements(ports)})
					}
				}
				b := nft.NewRule().AddrInSet(f, peerSide(t.direction), name)
				if portSet != "" {
					b.L4ProtoPortInSet(portSet)
				}
				r := b.Verdict(verdictReturn)
				r.Comment = t.comment
				out = append(out, r)
			}
		}
	}
	deny := nft.NewRule().Verdict(verdictDrop)
	deny.Comment = fmt.Sprintf("isolated for %s: nothing else is allowed", t.direction)
	return append(out, deny)
}

// rebuildChain writes the tier's rules for the allow-list sets t holds
// into a new chain (chains are never changed in place).
func (tier *npTier) rebuildChain(t *nft.Table) {
	ch := t.Chains[tier.chain]
	t.Chains[tier.chain] = &nft.Chain{Name: ch.Name, Base: ch.Base, Rules: append(slices.Clone(ch.Rules[:tier.prefix]), tier.rules(t)...)}
}

func npPortSet(id string) string { return "np-ports." + id }

// networkPolicyRules is the NetworkPolicy tier of a class: allowed iff
// some rule of some isolating policy matches, or, for ingress, the peer is
// the pod's own node. Every rule of those policies is merged into one
// allow-list, grouped by port profile (the exact ports allowed to or from
// an address): per profile and family, one rule looks the peer up in a
// hash set of pod addresses and one in an interval set of networks, then
// the port in the profile's set. Per packet that is a handful of lookups
// (one per distinct port set of the class), whatever the number of pods;
// a pod coming or going changes one hash set element per class that
// allows it. (Verdict maps would make it one lookup, but at 10,000 pods a
// jump/goto element cost ~6 ms in the kernel against ~1 ms for a hash set
// element: docs/nft-notes.md section 7.) The tier is recorded for Incremental,
// which keeps its pod sets and rules up to date pod by pod.
func (c *compiler) networkPolicyRules(plan *eval.Plan, pod int, named string) *npTier {
	d := plan.Direction
	refs := make([]string, len(plan.Isolating))
	for i, pi := range plan.Isolating {
		refs[i] = c.pols[pi].Ref()
	}
	// The allow-list depends on the isolating policies, the direction
	// and, for ingress, how the pod resolves named ports (named): not on
	// the Admin and Baseline tiers, so classes that differ only there
	// share it (and an admin policy that changes a class leaves it alone).
	tier := &npTier{list: directionPrefix(d) + ".np." + contentID(strings.Join(refs, "\x00")+"\x00"+named), direction: d, ownNode: plan.OwnNodeAllowed,
		comment: "NetworkPolicy tier: every rule of " + strings.Join(refs, ", ") + ", by port profile"}
	tier.allowKey = tier.list
	for _, pi := range plan.Isolating {
		tier.isolating = append(tier.isolating, c.pols[pi])
		tier.allowKey += fmt.Sprintf("|%p", c.pols[pi])
	}
	if shared := c.lists[tier.list]; shared != nil {
		tier.profiles, tier.allow = shared.profiles, shared.allow
		return tier
	}
	c.lists[tier.list] = tier
	tier.profiles = map[string][]portBox{}
	// The networks here; the pod addresses are Incremental's (fillSets,
	// podPorts), as they change pod by pod.
	for _, f := range nft.Families {
		for _, p := range flatten(c.allowItems(plan, pod, f), f) {
			name := allowSetName(tier.list, "nets", tier.profile(p.ports), f)
			s := c.t.AddSet(&nft.Set{Name: name, Fields: []nft.FieldType{f.Field}, Interval: true})
			s.Elements = append(s.Elements, intervalElement(f.AddrBytes(p.lo), f.AddrBytes(p.hi)))
		}
	}
	tier.allow = c.allowRules(plan, pod)
	return tier
}

// allowItems lists the networks the plan's NetworkPolicy rules allow for
// pod in family f (ipBlocks, nodes, or every address for a rule without
// peers), with their ports.
func (c *compiler) allowItems(plan *eval.Plan, pod int, f *nft.Family) []allowItem {
	d := plan.Direction
	var items []allowItem
	for _, pr := range plan.Allow {
		pi, ri, r := int(pr.Policy), pr.Rule, c.rule(pr, d)
		if pr.Match == eval.MatchNothing {
			continue // an Accept that cannot be understood allows nothing
		}
		nets := []addrRange{fullRange(f)}
		if !r.AllPeers {
			nets = c.peerRanges(pi, d, ri, f)
		}
		if len(nets) == 0 {
			continue
		}
		add := func(ports []portBox) {
			if len(ports) > 0 {
				items = append(items, allowItem{addrs: nets, ports: ports})
			}
		}
		if r.AllPorts {
			add([]portBox{allProtocolsAndPorts})
			continue
		}
		numbered, named := splitPorts(r.Ports)
		add(portBoxes(numbered))
		if len(named) > 0 && d == policy.Ingress {
			// The destination is the pod itself. Egress named ports
			// resolve on each destination pod: pod entries (podPorts).
			add(namedMatches(named, c.r.Pod(pod).Ports))
		}
	}
	return items
}
