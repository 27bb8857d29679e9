package compiler

import (
	"errors"
	"fmt"
	"maps"
	"weak"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// NewIncrementalFromPods (tests only) is Rebase from an empty table: the node's
// table from every pod of the cluster (finished pods left out), the
// namespaces' labels (NamespaceLabelsOf), every Node and the policy
// model, without resolving the cluster's pods. Every pod-dependent set is
// then one Rebase fills, so TestIncrementalMatchesCompile holds fillSets to a
// full compile on every set.
func NewIncrementalFromPods(pods []*PodState, nsLabels func(ns string) labels.Set, nodes []*corev1.Node, model *policy.Model, opts Options) (*Incremental, error) {
	l := &Incremental{opts: opts, node: opts.Node, table: nft.NewTable(opts.Table),
		recipe: &recipe{podSets: map[string][]policy.Subject{}, namedSets: map[string][]policy.Port{}, classes: map[string][2]string{}},
		pods:   make(map[string]*PodState, len(pods)), byAddr: newAddrIndex(len(pods)),
		byNamespace: map[string]map[string]*PodState{}, nsLabels: map[string]labels.Set{}, local: map[string]int{},
		pos: map[string]map[string]int{}, classUsers: map[string]int{}}
	if opts.DNS != nil {
		l.dnsServers = opts.DNS.Servers
	}
	for _, p := range pods {
		if _, ok := l.nsLabels[p.Namespace]; !ok {
			l.nsLabels[p.Namespace] = nsLabels(p.Namespace)
		}
		l.add(p)
	}
	if _, err := l.Rebase(Changes{}, model, nodes); err != nil {
		var full *NeedsFullError
		if errors.As(err, &full) {
			return nil, fmt.Errorf("node %q is not in the snapshot", opts.Node)
		}
		return nil, err
	}
	return l, nil
}

// Clone (tests only) is a copy of the numbering that compiles made from
// it do not change.
func (n *Identities) Clone() *Identities {
	c := &Identities{base: maps.Clone(n.base), class: map[string]map[string]uint32{}}
	for ns, m := range n.class {
		c.class[ns] = maps.Clone(m)
	}
	return c
}

// Len is the number of identities numbered.
func (n *Identities) Len() int {
	total := 0
	for _, classes := range n.class {
		total += len(classes)
	}
	return total
}

// ReusedChains is how many chains the last Rebase took from the compile
// before it.
func (l *IdentityIncremental) ReusedChains() int { return l.reused }

// CompileCollected (tests only) reports, from a weak pointer, whether the
// compile l holds now has been garbage collected.
func CompileCollected(l *IdentityIncremental) func() bool {
	wp := weak.Make(l.c)
	return func() bool { return wp.Value() == nil }
}
