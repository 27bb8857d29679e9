package policy

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Containment, decided from the policies alone (any cluster), as
// SelectorsMeet decides overlap: what one rule or subject matches is all
// of what another does. Each answer is exact or errs towards false (a
// network's exceptions, a selector's keys the other does not name), so
// that what is said to cover, covers.

// SelectorContains reports whether every label set that b selects, a
// selects too. Requirements on different keys are independent, so a key
// at a time: each value (or absence) that b's requirements on the key
// allow must satisfy a's, tried on the values either names, a value
// neither names, the integers next to their bounds, and absence.
func SelectorContains(a, b labels.Selector) bool {
	rb, okB := b.Requirements()
	if !okB || !SelectorsMeet(b, labels.Everything()) {
		return true // b selects nothing
	}
	ra, okA := a.Requirements()
	if !okA {
		return false
	}
	byKey := func(rs []labels.Requirement) map[string][]labels.Requirement {
		m := map[string][]labels.Requirement{}
		for _, r := range rs {
			m[r.Key()] = append(m[r.Key()], r)
		}
		return m
	}
	of, bOf := byKey(ra), byKey(rb)
	for key, reqsA := range of {
		reqsB := bOf[key]
		for _, c := range candidates(key, append(slices.Clip(reqsA), reqsB...)) {
			if matchesAll(reqsB, c) && !matchesAll(reqsA, c) {
				return false
			}
		}
	}
	return true
}

func matchesAll(reqs []labels.Requirement, s labels.Set) bool {
	return !slices.ContainsFunc(reqs, func(r labels.Requirement) bool { return !r.Matches(s) })
}

// namespaceNamed selects namespace name by the label every namespace has.
func namespaceNamed(name string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{corev1.LabelMetadataName: name})
}

// SubjectContains reports whether a selects every pod b selects.
func SubjectContains(a, b Subject) bool {
	if a.Namespace != "" && a.Namespace != b.Namespace &&
		(b.Namespace != "" || !SelectorContains(namespaceNamed(a.Namespace), b.Namespaces)) {
		return false // b reaches namespaces other than a's one
	}
	// a's namespace selector holds b's namespaces: all b's selector
	// allows, or b's one namespace (which has its name label and any
	// others).
	ns := SelectorContains(a.Namespaces, b.Namespaces) ||
		b.Namespace != "" && SelectorContains(a.Namespaces, namespaceNamed(b.Namespace))
	return ns && SelectorContains(a.Pods, b.Pods)
}

// RuleCovers reports whether rule a matches every connection rule b
// matches (its peers and ports; the subjects are the caller's). A rule
// that fails closed covers nothing and is covered by nothing.
func RuleCovers(a, b *Rule) bool {
	if a.FailClosed != "" || b.FailClosed != "" {
		return false
	}
	peers := a.AllPeers || !b.AllPeers && !slices.ContainsFunc(b.Peers, func(y Peer) bool {
		return !slices.ContainsFunc(a.Peers, func(x Peer) bool { return PeerContains(x, y) })
	})
	ports := a.AllPorts || !b.AllPorts && !slices.ContainsFunc(b.Ports, func(q Port) bool {
		return !slices.ContainsFunc(a.Ports, func(p Port) bool { return PortContains(p, q) })
	})
	return peers && ports
}

// PeerContains reports whether peer x matches every address peer y does.
// Peers of different kinds never contain each other (a network holding
// every pod address is the cluster's business, not the policy's).
func PeerContains(x, y Peer) bool {
	if x.Kind != y.Kind {
		return false
	}
	switch x.Kind {
	case PeerPods:
		return SubjectContains(x.PodSubject(), y.PodSubject())
	case PeerNodes:
		return SelectorContains(x.Nodes, y.Nodes)
	case PeerDomainNames:
		return !slices.ContainsFunc(y.DomainNames, func(m string) bool {
			return !slices.ContainsFunc(x.DomainNames, func(n string) bool { return domainCovers(n, m) })
		})
	}
	// Networks: each of y's inside one of x's, and none of x's exceptions
	// reaching into y's but inside y's own exceptions.
	for _, m := range y.CIDRs {
		if !slices.ContainsFunc(x.CIDRs, func(n netip.Prefix) bool { return prefixContains(n, m) }) {
			return false
		}
		for _, e := range x.Except {
			if e.Overlaps(m) && !slices.ContainsFunc(y.Except, func(ye netip.Prefix) bool { return prefixContains(ye, e) }) {
				return false
			}
		}
	}
	return true
}

func prefixContains(n, m netip.Prefix) bool {
	return n.Bits() <= m.Bits() && n.Contains(m.Addr())
}

// domainCovers reports whether domainNames pattern a matches every name
// pattern b does: equal, or a wildcard over b's name or suffix.
func domainCovers(a, b string) bool {
	a, b = strings.ToLower(strings.TrimSuffix(a, ".")), strings.ToLower(strings.TrimSuffix(b, "."))
	if a == b {
		return true
	}
	sa, wa := strings.CutPrefix(a, "*.")
	if !wa {
		return false
	}
	sb, _ := strings.CutPrefix(b, "*.")
	return strings.HasSuffix(sb, "."+sa)
}

// PortContains reports whether port entry p matches every connection q
// does: the same protocol and a range around q's, or the same name.
func PortContains(p, q Port) bool {
	if q.Name != "" || p.Name != "" {
		return p.Name == q.Name && (p.Protocol == "" || p.Protocol == q.Protocol)
	}
	if DefaultProtocol(p.Protocol) != DefaultProtocol(q.Protocol) {
		return false
	}
	if p.Start == 0 {
		return true
	}
	return q.Start != 0 && p.Start <= q.Start && max(q.End, q.Start) <= max(p.End, p.Start)
}

// RulesOverlap reports whether two rules can match the same connection
// (their peers and ports meet), as SamePriorityOverlaps decides it.
func RulesOverlap(a, b *Rule) bool { return peersMeet(a, b) && portsMeet(a, b) }
