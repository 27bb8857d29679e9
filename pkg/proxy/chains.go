package proxy

import (
	"fmt"
	"slices"

	"github.com/netpol/netpol/pkg/nft"
)

// familyChains writes family f's services and cluster chains. A rule
// whose match needs an element of a set that is empty is left out (as the
// DNAT rules follow the count sets the table has): a new connection pays a
// lookup only for the kinds of frontend the cluster has (a cluster of
// ClusterIPs alone pays for no NodePort, affinity or traffic-policy rule).
// The DNAT rules are one per distinct endpoint count, largest first (the
// Services scaled out the most, likely the busiest, pay the fewest
// lookups).
func familyChains(t *nft.Table, f *nft.Family) {
	name := func(base string) string { return base + "." + f.Suffix }
	frontend := []nft.Value{nft.AddrOf(f, nft.Dst), nft.L4Proto(), nft.DstPort()}
	in := func(set string) *nft.Builder { return nft.NewRule().In(f, name(set), frontend...) }
	comment := func(r *nft.Rule, text string) *nft.Rule { r.Comment = text; return r }
	has := func(set string) bool { return hasElements(t, name(set)) }
	haveCIDRs := has(setClusterCIDRs)
	cluster := t.AddChain(&nft.Chain{Name: name("cluster")})
	toCluster := nft.Verdict{Kind: nft.Goto, Chain: cluster.Name}

	services := t.AddChain(&nft.Chain{Name: name("services")})
	add := func(when bool, r *nft.Rule, text string) {
		if when {
			services.Rules = append(services.Rules, comment(r, text))
		}
	}
	// The source first: a pod's connection (most of them) stops at it.
	add(haveCIDRs && has(setClusterIPs),
		nft.NewRule().NotIn(f, name(setClusterCIDRs), nft.AddrOf(f, nft.Src)).In(f, name(setClusterIPs), nft.AddrOf(f, nft.Dst)).
			CtMarkSet(MasqueradeMark).Done(),
		"clients outside the pod network reach ClusterIPs masqueraded")
	add(has(setMasqExternal), in(setMasqExternal).CtMarkSet(MasqueradeMark).Done(),
		"externalTrafficPolicy Cluster: external frontends are masqueraded")
	add(haveCIDRs && has(setLocalExternal), in(setLocalExternal).In(f, name(setClusterCIDRs), nft.AddrOf(f, nft.Src)).Verdict(toCluster),
		"externalTrafficPolicy Local: pods use the cluster endpoints")
	add(has(setLocalExternal), in(setLocalExternal).FibSaddrLocal().CtMarkSet(MasqueradeMark).Verdict(toCluster),
		"externalTrafficPolicy Local: the node itself uses the cluster endpoints, masqueraded")
	add(has(setAffinity), nft.NewRule().VmapKey(f, name(setAffinity), frontend...), "ClientIP session affinity")
	services.Rules = append(services.Rules, countRules(t, f, prefixCount, name(setBackends), frontend)...)
	add(has(setNoLocal), in(setNoLocal).Verdict(nft.Verdict{Kind: nft.Drop}), "no endpoint usable from this node (traffic policy Local)")

	if has(setClusterAff) {
		cluster.Rules = append(cluster.Rules, nft.NewRule().VmapKey(f, name(setClusterAff), frontend...))
	}
	cluster.Rules = append(cluster.Rules, countRules(t, f, prefixClusterCnt, name(setClusterBackend), frontend)...)
}

// hasElements reports whether the table's set name holds an element.
func hasElements(t *nft.Table, name string) bool {
	s := t.Sets[name]
	return s != nil && len(s.Elements) > 0
}

// countRules are the DNAT rules of the table's prefix<N>.F sets.
func countRules(t *nft.Table, f *nft.Family, prefix, backends string, frontend []nft.Value) []*nft.Rule {
	var ns []int
	for name := range t.Sets {
		if n, ok := countOf(name); ok && name == fmt.Sprintf("%s%d.%s", prefix, n, f.Suffix) {
			ns = append(ns, n)
		}
	}
	slices.Sort(ns)
	slices.Reverse(ns)
	var rules []*nft.Rule
	for _, n := range ns {
		key := append(slices.Clone(frontend), nft.Numgen(uint32(n)))
		r := nft.NewRule().In(f, fmt.Sprintf("%s%d.%s", prefix, n, f.Suffix), frontend...).DNATMap(f, backends, key...)
		r.Comment = fmt.Sprintf("frontends with %d endpoint(s)", n)
		rules = append(rules, r)
	}
	return rules
}

// baseChains hooks the per-family chains in.
func baseChains(t *nft.Table) {
	hook := func(name, typ, hook string, prio int) *nft.Chain {
		return t.AddChain(&nft.Chain{Name: name, Base: &nft.Hook{Type: typ, Hook: hook, Priority: prio, Policy: "accept"}})
	}
	natPre := hook("nat-prerouting", "nat", "prerouting", -100)
	natOut := hook("nat-output", "nat", "output", -100)
	natPost := hook("nat-postrouting", "nat", "postrouting", 100)
	// A packet conntrack finds invalid (a TCP segment out of its window)
	// is not translated back: it would reach the client from the
	// endpoint's own address and draw a reset that ends the connection.
	// Dropped, as kube-proxy's KUBE-FORWARD does (upstream e2e: "the
	// invalid conntrack state bug", kubernetes#74839).
	filterFwd := hook("filter-forward", "filter", "forward", -110)
	invalid := nft.NewRule().CtStateInvalid().Verdict(nft.Verdict{Kind: nft.Drop})
	invalid.Comment = "out of conntrack's window: never un-NATed"
	filterFwd.Rules = []*nft.Rule{invalid}
	// Before DNAT (dstnat - 10), where the destination is still the frontend.
	filterPre := hook("filter-prerouting", "filter", "prerouting", -110)
	filterOut := hook("filter-output", "filter", "output", -110)
	checks := t.AddChain(&nft.Chain{Name: "service-checks"})
	// Refused at once: TCP with a reset (ICMP errors are rate limited
	// per destination), the rest with ICMP port unreachable; one chain,
	// so that a refusal costs its match's lookups once.
	refuse := t.AddChain(&nft.Chain{Name: "refuse"})
	refuse.Rules = []*nft.Rule{nft.NewRule().L4ProtoIs(6).RejectTCPReset(), nft.NewRule().Reject()}
	toRefuse := nft.Verdict{Kind: nft.Goto, Chain: refuse.Name}
	filterPre.Rules = []*nft.Rule{nft.NewRule().CtStateNew().Verdict(nft.Verdict{Kind: nft.Jump, Chain: checks.Name})}
	filterOut.Rules = []*nft.Rule{nft.NewRule().CtStateNew().Verdict(nft.Verdict{Kind: nft.Jump, Chain: checks.Name})}
	for _, f := range nft.Families {
		name := func(base string) string { return base + "." + f.Suffix }
		has := func(set string) bool { return hasElements(t, name(set)) }
		frontend := []nft.Value{nft.AddrOf(f, nft.Dst), nft.L4Proto(), nft.DstPort()}
		jump := nft.NewRule().MatchFamily(f).Verdict(nft.Verdict{Kind: nft.Jump, Chain: name("services")})
		natPre.Rules = append(natPre.Rules, jump)
		natOut.Rules = append(natOut.Rules, jump)
		if has(setHairpin) {
			hairpin := nft.NewRule().CtStatusDNAT().In(f, name(setHairpin), nft.AddrOf(f, nft.Src), nft.AddrOf(f, nft.Dst)).Masquerade()
			hairpin.Comment = "a pod reaching itself through its Service"
			natPost.Rules = append(natPost.Rules, hairpin)
		}
		check := func(when bool, r *nft.Rule, why string) {
			if when {
				r.Comment = why
				checks.Rules = append(checks.Rules, r)
			}
		}
		check(has(setFirewall), nft.NewRule().In(f, name(setFirewall), frontend...).
			NotIn(f, name(setFirewallAllow), append(slices.Clone(frontend), nft.AddrOf(f, nft.Src))...).Verdict(nft.Verdict{Kind: nft.Drop}),
			"loadBalancerSourceRanges")
		check(has(setNoEndpoints), nft.NewRule().In(f, name(setNoEndpoints), frontend...).Verdict(toRefuse),
			"Services without endpoints refuse connections")
		check(has(setClusterIPs), nft.NewRule().In(f, name(setClusterIPs), nft.AddrOf(f, nft.Dst)).NotIn(f, name(setFrontends), frontend...).Verdict(toRefuse),
			"ClusterIP ports that no Service serves")
		unallocated := nft.NewRule().In(f, name(setServiceCIDRs), nft.AddrOf(f, nft.Dst))
		if has(setClusterIPs) {
			unallocated = unallocated.NotIn(f, name(setClusterIPs), nft.AddrOf(f, nft.Dst))
		}
		check(has(setServiceCIDRs), unallocated.Verdict(nft.Verdict{Kind: nft.Drop}),
			"addresses of the Service ranges that no Service holds: dropped, not routed on")
	}
	masq := nft.NewRule().CtMarkHas(MasqueradeMark).CtMarkClear(MasqueradeMark).Masquerade()
	masq.Comment = "connections marked in services.4/6"
	natPost.Rules = append(natPost.Rules, masq)
}
