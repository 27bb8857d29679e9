package compiler

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// This file is Incremental's answer to what Update refuses: a policy change
// that applies to pods of the node, the labels of a namespace with pods
// here, a pod of the node unlike any compiled. Only the node's classes
// depend on those, so Rebase compiles the node's own pods alone (a few
// hundred against the whole cluster) and takes every pod-dependent set
// the old table already holds, kept current pod by pod: sets are named by
// what defines them, and an allow-list is reused from an old class with
// the same isolating policies (the same *policy.Policy values: the
// policy.Cache keeps an unchanged object's). Only sets no old class had
// are filled from every pod, and only from the pods their selectors can
// match. The tests compare the result with a full compile.

// Rebase applies ch (as Update, but without its limits), compiles the
// node's classes for model again and returns the table. nodes are every
// Node (node peers and the node itself). On a NeedsFullError nothing is
// changed; after another error (none is known) only a full compile may
// follow.
func (l *Incremental) Rebase(ch Changes, model *policy.Model, nodes []*corev1.Node) (*nft.Table, error) {
	if !slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Name == l.node }) {
		return nil, &NeedsFullError{Reason: "node " + l.node + " is not among the nodes"}
	}
	l.applyPods(ch, l.newNamespaceLabels(ch))
	opts := l.opts
	if opts.DNS != nil {
		dns := *opts.DNS
		dns.Servers = l.dnsServers // SetDNSServers may have changed them
		opts.DNS = &dns
	}
	c, err := compile(eval.New(l.localSnapshot(nodes), model).Resolved(), opts)
	if err != nil {
		return nil, err
	}
	old := l.table
	t := c.t
	moved := map[string]bool{} // sets taken over as they are, by name
	take := func(name string) bool {
		s := old.Sets[name]
		if s == nil {
			return false
		}
		t.Sets[name] = s
		moved[name] = true
		return true
	}
	fill := &recipe{podSets: map[string][]policy.Subject{}, namedSets: map[string][]policy.Port{}}
	for prefix, subjects := range c.live.podSets {
		if !l.takeFamilies(prefix, take) {
			fill.podSets[prefix] = subjects
		}
	}
	for prefix, named := range c.live.namedSets {
		if !l.takeFamilies(prefix, take) {
			fill.namedSets[prefix] = named
		}
	}
	oldTiers := map[string]*npTier{}
	for _, tier := range l.recipe.npTiers {
		oldTiers[tier.allowKey] = tier
	}
	for _, tier := range c.live.npTiers {
		from := oldTiers[tier.allowKey]
		if from == nil {
			// An address's entry depends on every pod that holds it
			// (the union of their ports is its profile): the entries of
			// the node's pods are made again with the rest.
			for _, name := range tierSetNames(tier, "pods") {
				delete(t.Sets, name)
			}
			fill.npTiers = append(fill.npTiers, tier)
			continue
		}
		// An old tier allowed the same: its allow-list's sets (of the
		// same names), which Incremental kept current, replace the ones compiled
		// from the node's pods.
		maps.Copy(tier.profiles, from.profiles)
		for _, name := range tierSetNames(from, "pods", "nets") {
			if !take(name) {
				delete(t.Sets, name)
			}
		}
	}
	l.fillSets(t, fill)
	l.recipe, l.table = c.live, t
	for _, tier := range l.recipe.npTiers {
		tier.rebuildChain(t)
	}
	l.dropUnusedPortSets(t)
	for name, s := range t.Sets {
		if !moved[name] {
			s.Revision, s.Changes = revisions.Add(1), nil
		}
	}
	for name := range l.pos {
		if !moved[name] || t.Sets[name] == nil {
			delete(l.pos, name)
		}
	}
	l.classUsers = map[string]int{}
	for ns, n := range l.local {
		for _, p := range l.byNamespace[ns] {
			if n > 0 && l.dispatched(p) {
				l.countUsers(l.classUsers, p, +1)
			}
		}
	}
	return t, nil
}

// takeFamilies takes a set prefix's sets of every family from the old
// table, when it holds them all.
func (l *Incremental) takeFamilies(prefix string, take func(string) bool) bool {
	for _, f := range nft.Families {
		if l.table.Sets[prefix+f.Suffix] == nil {
			return false
		}
	}
	for _, f := range nft.Families {
		take(prefix + f.Suffix)
	}
	return true
}

// tierSetNames are the names a tier's allow-list sets of kinds may have.
func tierSetNames(tier *npTier, kinds ...string) []string {
	var out []string
	for id := range tier.profiles {
		for _, kind := range kinds {
			for _, f := range nft.Families {
				out = append(out, allowSetName(tier.list, kind, id, f))
			}
		}
	}
	return out
}

// localSnapshot is the node's pod-network pods, their namespaces and
// nodes: all a compile of the node's classes reads besides the policies.
func (l *Incremental) localSnapshot(nodes []*corev1.Node) *cluster.Snapshot {
	var pods []*PodState
	for _, ns := range slices.Sorted(maps.Keys(l.local)) {
		if l.local[ns] == 0 {
			continue
		}
		for _, p := range l.byNamespace[ns] {
			if l.isLocal(p) {
				pods = append(pods, p)
			}
		}
	}
	return podsSnapshot(nodes, pods, func(ns string) labels.Set { return l.nsLabels[ns] })
}

// podsSnapshot is a snapshot of nodes, pods and their namespaces (with
// the labels nsLabels gives).
func podsSnapshot(nodes []*corev1.Node, pods []*PodState, nsLabels func(ns string) labels.Set) *cluster.Snapshot {
	snap := cluster.New()
	snap.Nodes = nodes
	seen := map[string]bool{}
	for _, p := range pods {
		if !seen[p.Namespace] {
			seen[p.Namespace] = true
			snap.Namespaces = append(snap.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace, Labels: nsLabels(p.Namespace)}})
		}
		_, name, _ := strings.Cut(p.Key, "/")
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: name, Labels: p.Labels},
			Spec:   corev1.PodSpec{NodeName: p.Node, HostNetwork: p.HostNetwork, Containers: []corev1.Container{{Ports: p.Ports}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		for _, a := range p.Addrs {
			pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: a.String()})
		}
		snap.Pods = append(snap.Pods, pod)
	}
	return snap
}

// fillSets adds to t the elements every pod gives the sets of rec, which
// compile made without them (a full compile: every such set; a rebase:
// those it could not take from the old table). Each set is filled from
// the pods of the namespaces its selectors select, by addrElements, the
// code Update patches elements with.
func (l *Incremental) fillSets(t *nft.Table, rec *recipe) {
	// The keys of each set that held elements before. addrElements
	// yields an element once per address, and each fill below fills other
	// sets than the others: a set empty at first needs no check.
	type target struct {
		set  *nft.Set
		keys map[string]bool
	}
	targets := map[string]*target{}
	var last *target // elements mostly come set after set
	// An address's elements in every set share one key (keys are never
	// changed in place): a million elements were a million small copies.
	var lastKey string
	var keyBytes []byte
	put := func(e elementRef) {
		if last == nil || last.set.Name != e.set {
			last = targets[e.set]
			if last == nil {
				s := t.Sets[e.set]
				if s == nil {
					s = t.AddSet(&nft.Set{Name: e.set, Fields: []nft.FieldType{e.f.Field}})
				}
				last = &target{set: s}
				if len(s.Elements) > 0 {
					last.keys = make(map[string]bool, len(s.Elements))
					for _, el := range s.Elements {
						last.keys[string(el.Key)] = true
					}
				}
				targets[e.set] = last
			}
		}
		if last.keys != nil {
			if last.keys[e.key] {
				return
			}
			last.keys[e.key] = true
		}
		if e.key != lastKey || keyBytes == nil {
			lastKey, keyBytes = e.key, []byte(e.key)
		}
		last.set.Elements = append(last.set.Elements, e.elementWith(keyBytes))
	}
	fill := func(rec *recipe, subjects []policy.Subject, withPorts bool) {
		sets := rec.sets()
		l.eachCandidate(subjects, withPorts, func(a netip.Addr, pods []*PodState) { l.addrElements(sets, a, pods, false, put) })
	}
	for prefix, subjects := range rec.podSets {
		fill(&recipe{podSets: map[string][]policy.Subject{prefix: subjects}}, subjects, false)
	}
	if len(rec.namedSets) > 0 {
		fill(&recipe{namedSets: rec.namedSets}, nil, true)
	}
	lists := map[string]bool{}
	for _, tier := range rec.npTiers {
		if lists[tier.list] {
			continue
		}
		lists[tier.list] = true
		var subjects []policy.Subject
		named := false
		for _, r := range tier.allow {
			subjects = append(subjects, r.subjects...)
			// Egress named ports resolve on any destination the rule's
			// networks hold.
			named = named || len(r.named) > 0
		}
		fill(&recipe{npTiers: []*npTier{tier}}, subjects, named)
	}
}

// eachCandidate calls each with every address of the pods in the
// namespaces that subjects select, and with withPorts of every pod that
// has container ports, once, with the pods that hold it: the addresses
// whose elements in the sets of subjects fillSets asks addrElements for
// (which matches the pods' labels, once).
func (l *Incremental) eachCandidate(subjects []policy.Subject, withPorts bool, each func(netip.Addr, []*PodState)) {
	selected := map[string]bool{}
	for ns := range l.byNamespace {
		nsLabels := l.nsLabels[ns]
		selected[ns] = slices.ContainsFunc(subjects, func(s policy.Subject) bool { return s.SelectsNamespace(ns, nsLabels) })
	}
	candidate := func(p *PodState) bool {
		return (withPorts && len(p.Ports) > 0) || (selected[p.Namespace] && !p.HostNetwork)
	}
	var buf [2]*PodState
	for ns, pods := range l.byNamespace {
		if !selected[ns] && !withPorts {
			continue
		}
		for _, p := range pods {
			if !candidate(p) {
				continue
			}
			for _, a := range p.Addrs {
				// An address once, from the first candidate that holds it
				// (host-network pods share their node's).
				holders := l.byAddr.at(a, buf[:0])
				if i := slices.IndexFunc(holders, candidate); i >= 0 && holders[i] == p {
					each(a, holders)
				}
			}
		}
	}
}
