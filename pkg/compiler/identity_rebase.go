package compiler

import (
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// This file is IdentityIncremental's answer to a policy change that applies to
// pods of the node, which Update refuses. In the identity layout only the
// node's classes and the chains they jump to depend on the policies; what
// depends on the cluster's pods is the pod-ids maps, which identities each
// pod peer holds and the egress named-port sets, and the policies change
// none of them while they read the same pod labels (identities are made of
// those). So Rebase resolves the node's own pods alone (about a hundredth
// of the cluster's) and takes the rest from the last compile, kept current
// by Update: the maps and named-port sets as they are, a peer's identity
// ranges by how it is written, and a peer no compile had is selected
// among the identities, not the pods. The numbering is kept. The tests
// compare the result with a full compile.

// Rebase applies ch (as Update does) and compiles the node's classes for
// model again, and returns the table. nodes are every Node (node peers
// and the node itself). A NeedsFullError means only a full compile can
// follow the change: the policies read other pod labels than the
// identities are made of, or need what only the cluster's pods say (a
// NetworkPolicy of the node with egress named ports, before or after). After
// any error the state may hold ch: only a full compile may follow.
func (l *IdentityIncremental) Rebase(ch Changes, model *policy.Model, nodes []*corev1.Node) (*nft.Table, error) {
	if !slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Name == l.opts.Node }) {
		return nil, &NeedsFullError{Reason: "node " + l.opts.Node + " is not among the nodes"}
	}
	if len(l.opts.Staged) > 0 || len(model.Staged) > 0 {
		return nil, &NeedsFullError{Reason: errStagedIncremental.Error()}
	}
	if l.c.egressNamedAllow {
		// Such a rule allows some pods by address, which only the
		// cluster's pods say (and a reused chain would not record).
		return nil, &NeedsFullError{Reason: "a NetworkPolicy of this node resolves egress named ports on every destination"}
	}
	if len(ch.Pods) > 0 || len(ch.Namespaces) > 0 {
		if _, err := l.Update(ch); err != nil {
			return nil, err
		}
	}
	local := slices.SortedFunc(maps.Values(l.local), func(a, b *PodState) int { return strings.Compare(a.Key, b.Key) })
	for _, p := range local {
		for _, a := range p.Addrs {
			if l.claims[a] > 1 {
				return nil, &NeedsFullError{Reason: "address " + a.String() + " of pod " + p.Key + " is held by two pods"}
			}
		}
	}
	nsLabels := func(ns string) labels.Set { return l.ns[ns] }
	mine := l.policiesHere(model.Policies, local)
	relevant := selectedLabelKeys(mine)
	if !slices.Equal(relevant, l.relevant) {
		return nil, &NeedsFullError{Reason: "the policies that apply here read other pod labels than the identities are made of"}
	}
	opts := l.opts
	if opts.DNS != nil {
		dns := *opts.DNS
		dns.Servers = l.dnsServers // SetDNSServers may have changed them
		opts.DNS = &dns
	}
	// The evaluator is given the policies that apply here only: they are
	// all the node's plans read, and pod peers resolve on the identities.
	r := eval.New(podsSnapshot(nodes, local, nsLabels), &policy.Model{Policies: mine}).Resolved()
	l.identityLabels() // made from the last compile's evaluator, which goes
	last := l.c
	ids := &identities{of: make([]uint32, r.NumPods()), namespaces: last.ids.namespaces, base: last.ids.base, nsOf: last.ids.nsOf}
	for i := range ids.of {
		ids.of[i] = l.pods[r.Pod(i).Key].id
	}
	from := newFromLast(last, l.table, l.selectIDs)
	c, classes, err := withClasses(r, opts, l.subjectKeysOf(model.Policies), func(pod podClasses) (*idCompiler, error) {
		return buildIdentitiesFrom(r, opts, r.NodeIndex(opts.Node), relevant, ids, from, pod)
	})
	if err != nil {
		return nil, err
	}
	if from.missing != "" {
		return nil, &NeedsFullError{Reason: "the node's pods alone do not give the " + from.missing}
	}
	t := c.t
	for _, f := range nft.Families {
		t.Sets[mapPodIDs+f.Suffix] = l.table.Sets[mapPodIDs+f.Suffix]
	}
	for name, s := range t.Sets {
		if l.table.Sets[name] != s {
			s.Revision, s.Changes = revisions.Add(1), nil
		}
	}
	for name := range l.pos {
		if s := t.Sets[name]; s == nil || s != l.table.Sets[name] {
			delete(l.pos, name)
		}
	}
	l.table, l.c, l.reused = t, c, from.reused
	l.classes, l.subjectKeys = classes.byKey, classes.subjectKeys
	l.ingressNamed, l.namedNets = c.ingressNamed, c.namedNets
	l.users = map[string]int{}
	for _, p := range local {
		for _, cl := range l.localClasses(p) {
			if cl.chain != "" {
				l.users[cl.chain]++
			}
		}
	}
	return t, nil
}

// policiesHere are the policies of pols that apply to pods of the node
// (local, in key order): those an earlier call found when the node's pods
// are the same (the same *policy.Policy is the same policy), the others
// matched against the pods.
func (l *IdentityIncremental) policiesHere(pols []*policy.Policy, local []*PodState) []*policy.Policy {
	sig := make([]string, len(local))
	for i, p := range local {
		sig[i] = localSignature(p.Namespace, p.Labels, nil, l.subjectKeys)
	}
	key := strings.Join(slices.Compact(slices.Sorted(slices.Values(sig))), "\x01")
	if key != l.here.pods {
		l.here.pods, l.here.of = key, nil
	}
	var fresh []*policy.Policy
	for _, p := range pols {
		if _, ok := l.here.of[p]; !ok {
			fresh = append(fresh, p)
		}
	}
	found := map[*policy.Policy]bool{}
	for _, p := range localPolicies(fresh, func(yield func(PodState, labels.Set) bool) {
		for _, p := range local {
			if !yield(*p, l.ns[p.Namespace]) {
				return
			}
		}
	}) {
		found[p] = true
	}
	of := make(map[*policy.Policy]bool, len(pols))
	var out []*policy.Policy
	for _, p := range pols {
		here, ok := l.here.of[p]
		if !ok {
			here = found[p]
		}
		of[p] = here
		if here {
			out = append(out, p)
		}
	}
	l.here.of = of
	return out
}

// subjectKeysOf is subjectLabelKeys(pols), each policy's keys read once.
func (l *IdentityIncremental) subjectKeysOf(pols []*policy.Policy) []string {
	of := make(map[*policy.Policy][]string, len(pols))
	keys := map[string]bool{}
	for _, p := range pols {
		ks, ok := l.keysOf[p]
		if !ok {
			ks = subjectKeysOf(p)
		}
		of[p] = ks
		for _, k := range ks {
			keys[k] = true
		}
	}
	l.keysOf = of
	return slices.Sorted(maps.Keys(keys))
}
