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

// This file is IdentityLive's answer to a policy change that applies to
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
// identities are made of, or need what only the cluster's pods say. After
// any error the state may hold ch: only a full compile may follow.
func (l *IdentityLive) Rebase(ch Changes, model *policy.Model, nodes []*corev1.Node) (*nft.Table, error) {
	if !slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return n.Name == l.opts.Node }) {
		return nil, &NeedsFullError{Reason: "node " + l.opts.Node + " is not among the nodes"}
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
	relevant := selectedLabelKeys(localPolicies(model.Policies, func(yield func(PodState, labels.Set) bool) {
		for _, p := range local {
			if !yield(*p, l.ns[p.Namespace]) {
				return
			}
		}
	}))
	if !slices.Equal(relevant, l.relevant) {
		return nil, &NeedsFullError{Reason: "the policies that apply here read other pod labels than the identities are made of"}
	}
	opts := l.opts
	if opts.DNS != nil {
		dns := *opts.DNS
		dns.Servers = l.dnsServers // SetDNSServers may have changed them
		opts.DNS = &dns
	}
	r := eval.New(podsSnapshot(nodes, local, nsLabels), model).Resolved()
	l.identityLabels() // made from the last compile's evaluator, which goes
	last := l.c
	ids := &identities{of: make([]uint32, r.NumPods()), namespaces: last.ids.namespaces, base: last.ids.base, nsOf: last.ids.nsOf}
	for i := range ids.of {
		ids.of[i] = l.pods[r.Pod(i).Key].id
	}
	from := newFromLast(last, l.table, l.selectIDs)
	c, classes, err := withClasses(r, opts, func(pod podClasses) (*idCompiler, error) {
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
