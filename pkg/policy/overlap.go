package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Overlap is two policies of one tier with the same priority whose rules
// can match the same connection: the API leaves their order undefined
// (netpol's is by kind, then name: First before Second), so which of them
// decides such a connection is netpol's choice, not the author's.
type Overlap struct {
	First, Second *Policy
	// Rules are the first pair of rules found that overlap, one of each
	// (by Ref), and their direction.
	FirstRule, SecondRule string
	Direction             Direction
}

func (o Overlap) String() string {
	return fmt.Sprintf("%s and %s have the same priority %d in the %s tier and both can match the same connections (%s %s, %s %s): "+
		"the API leaves their order undefined; netpol applies %s first",
		o.First.Ref(), o.Second.Ref(), o.First.Priority, o.First.Tier, o.First.Ref(), o.FirstRule, o.Second.Ref(), o.SecondRule, o.First.Ref())
}

// SamePriorityOverlaps lists the pairs of Admin or Baseline policies of
// the model with the same priority whose subjects and rules can meet,
// decided from the policies alone (any cluster): two label selectors
// meet when some label set satisfies both; pod, node and domain peers are
// compared with peers of their own kind, networks by prefix (their
// exceptions left aside); a named port meets the same name only. A pair
// is listed once, in the model's order.
func SamePriorityOverlaps(m *Model) []Overlap {
	type level struct {
		tier     Tier
		priority int32
	}
	var levels []level
	byLevel := map[level][]*Policy{}
	for _, p := range m.Policies {
		if p.Tier == TierNetworkPolicy {
			continue
		}
		l := level{p.Tier, p.Priority}
		if _, ok := byLevel[l]; !ok {
			levels = append(levels, l)
		}
		byLevel[l] = append(byLevel[l], p)
	}
	var out []Overlap
	for _, l := range levels {
		pols := byLevel[l]
		for i, p := range pols {
			for _, q := range pols[i+1:] {
				if !subjectsMeet(p.Subject, q.Subject) {
					continue
				}
				if o, ok := rulesMeet(p, q); ok {
					out = append(out, o)
				}
			}
		}
	}
	return out
}

func rulesMeet(p, q *Policy) (Overlap, bool) {
	for _, d := range Directions {
		for i := range p.Rules[d] {
			for j := range q.Rules[d] {
				a, b := &p.Rules[d][i], &q.Rules[d][j]
				if peersMeet(a, b) && portsMeet(a, b) {
					return Overlap{First: p, Second: q, FirstRule: a.Ref(d), SecondRule: b.Ref(d), Direction: d}, true
				}
			}
		}
	}
	return Overlap{}, false
}

func subjectsMeet(a, b Subject) bool {
	if a.Namespace != "" && b.Namespace != "" && a.Namespace != b.Namespace {
		return false
	}
	return SelectorsMeet(a.Namespaces, b.Namespaces) && SelectorsMeet(a.Pods, b.Pods)
}

func peersMeet(a, b *Rule) bool {
	// A rule that fails closed matches nothing (Accept) or everything.
	if a.FailClosed != "" && a.Action == Accept || b.FailClosed != "" && b.Action == Accept {
		return false
	}
	if a.FailClosed != "" || b.FailClosed != "" || a.AllPeers || b.AllPeers {
		return true
	}
	for _, x := range a.Peers {
		for _, y := range b.Peers {
			if peerMeets(x, y) {
				return true
			}
		}
	}
	return false
}

func peerMeets(x, y Peer) bool {
	if x.Kind != y.Kind {
		return false // pods and nodes against networks: their addresses are the cluster's
	}
	switch x.Kind {
	case PeerPods:
		if x.Namespace != "" && y.Namespace != "" && x.Namespace != y.Namespace {
			return false
		}
		return SelectorsMeet(x.Namespaces, y.Namespaces) && SelectorsMeet(x.Pods, y.Pods)
	case PeerNodes:
		return SelectorsMeet(x.Nodes, y.Nodes)
	case PeerDomainNames:
		for _, n := range x.DomainNames {
			for _, m := range y.DomainNames {
				if domainsMeet(n, m) {
					return true
				}
			}
		}
		return false
	}
	for _, n := range x.CIDRs {
		for _, m := range y.CIDRs {
			if n.Overlaps(m) {
				return true
			}
		}
	}
	return false
}

// domainsMeet reports whether two domainNames patterns (an exact name or
// "*." and a suffix, which matches names one label or more below it) can
// match the same name.
func domainsMeet(a, b string) bool {
	a, b = strings.ToLower(strings.TrimSuffix(a, ".")), strings.ToLower(strings.TrimSuffix(b, "."))
	sa, wa := strings.CutPrefix(a, "*.")
	sb, wb := strings.CutPrefix(b, "*.")
	switch {
	case wa && wb:
		return sa == sb || strings.HasSuffix(sa, "."+sb) || strings.HasSuffix(sb, "."+sa)
	case wa:
		return strings.HasSuffix(b, "."+sa)
	case wb:
		return strings.HasSuffix(a, "."+sb)
	}
	return a == b
}

func portsMeet(a, b *Rule) bool {
	if a.AllPorts || b.AllPorts || a.FailClosed != "" || b.FailClosed != "" {
		return true
	}
	for _, x := range a.Ports {
		for _, y := range b.Ports {
			if portMeets(x, y) {
				return true
			}
		}
	}
	return false
}

func portMeets(x, y Port) bool {
	if x.Name != "" || y.Name != "" {
		return x.Name == y.Name && (x.Protocol == "" || y.Protocol == "" || x.Protocol == y.Protocol)
	}
	if x.Protocol != y.Protocol {
		return false
	}
	if x.Start == 0 || y.Start == 0 {
		return true
	}
	return x.Start <= max(y.End, y.Start) && y.Start <= max(x.End, x.Start)
}

// SelectorsMeet reports whether some label set satisfies both selectors.
// Each key's requirements are tried on the values they name, a value
// none names, the integers next to their bounds, and the key's absence.
func SelectorsMeet(a, b labels.Selector) bool {
	ra, okA := a.Requirements()
	rb, okB := b.Requirements()
	if !okA || !okB {
		return false // labels.Nothing
	}
	byKey := map[string][]labels.Requirement{}
	for _, r := range append(slices.Clip(ra), rb...) {
		byKey[r.Key()] = append(byKey[r.Key()], r)
	}
	for key, reqs := range byKey {
		if !satisfiable(key, reqs) {
			return false
		}
	}
	return true
}

func satisfiable(key string, reqs []labels.Requirement) bool {
	return slices.ContainsFunc(candidates(key, reqs), func(c labels.Set) bool { return matchesAll(reqs, c) })
}

// candidates are label sets with one value of key (or none) that stand
// for every value as reqs see it: the values they name, a value none
// names, the integers next to their bounds, and the key's absence.
func candidates(key string, reqs []labels.Requirement) []labels.Set {
	out := []labels.Set{{}, {key: "netpol-none-of-the-named-values"}}
	for _, r := range reqs {
		for v := range r.Values() {
			out = append(out, labels.Set{key: v})
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				out = append(out, labels.Set{key: strconv.FormatInt(n+1, 10)}, labels.Set{key: strconv.FormatInt(n-1, 10)})
			}
		}
	}
	return out
}
