package compiler

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// This file is the incremental compiler. A node's table depends on the
// pods of other nodes only through set elements keyed by their addresses:
// the hash sets of Admin/Baseline pod peers, the named-port sets and the
// NetworkPolicy allow-lists of the node's classes (class chains, dispatch
// and self-pods depend on the node's own pods and the policies that
// select them). Incremental keeps the table of the last full compile and, for
// a change to pods of other nodes or to namespaces without pods here,
// recomputes only the elements of the addresses involved: the cost of an
// update follows the change, not the cluster. The node's own pods are
// handled too when their classes are known (the namespace, labels and
// ports of a pod the last full compile placed). Anything else needs a
// full compile (NeedsFullError). Compile and Incremental agree exactly; the
// tests and the agent's periodic resync check it.

// recipe is what a full compile records for Incremental: how each pod-dependent
// set is defined.
type recipe struct {
	// podSets: the pods subjects of Admin/Baseline pod peer sets, by set
	// prefix (+ family suffix).
	podSets map[string][]policy.Subject
	// namedSets: the named ports of named-port sets, by set prefix.
	namedSets map[string][]policy.Port
	npTiers   []*npTier
	// classes are the class chains (by direction, "" for none) of the
	// node's pods, by classSignature: a pod of the node with the
	// signature of one compiled is dispatched to the same chains.
	classes map[string][2]string
	// dns: the table has the DNS objects (Options.DNS); domainClasses
	// are the egress class chains that look up a domain set, whose pods
	// are DNS clients (dns.go).
	dns           bool
	domainClasses map[string]bool
}

// classSignature is what decides a pod's classes besides its namespace's
// labels (which only a full compile changes for a namespace with pods
// here): namespace, labels and container ports (ingress named ports
// resolve on them).
func classSignature(ns string, podLabels labels.Set, ports []corev1.ContainerPort) string {
	return fmt.Sprintf("%s\x00%s\x00%v", ns, podLabels.String(), ports)
}

func selectsAny(subjects []policy.Subject, p *PodState, nsLabels labels.Set) bool {
	for _, s := range subjects {
		if s.Selects(p.Namespace, nsLabels, p.Labels) {
			return true
		}
	}
	return false
}

// PodState is what a node's table depends on of one pod.
type PodState struct {
	Key, Namespace string
	// Node is the pod's node name.
	Node        string
	Labels      labels.Set
	HostNetwork bool
	Addrs       []netip.Addr
	Ports       []corev1.ContainerPort
}

// PodStateOf is p as the evaluator sees it; nil for a finished pod (no
// address, in no policy).
func PodStateOf(p *corev1.Pod) *PodState {
	if cluster.PodFinished(p) {
		return nil
	}
	return &PodState{Key: p.Namespace + "/" + p.Name, Namespace: p.Namespace, Node: p.Spec.NodeName,
		Labels: labels.Set(p.Labels), HostNetwork: p.Spec.HostNetwork, Addrs: cluster.PodAddresses(p), Ports: cluster.ContainerPorts(p)}
}

// resolvedPodState is pod v of r as a PodState.
func resolvedPodState(r *eval.Resolved, v eval.PodView) *PodState {
	ps := &PodState{Key: v.Key, Namespace: v.Namespace, Labels: v.Labels, HostNetwork: v.HostNetwork, Addrs: v.Addrs, Ports: v.Ports}
	if v.Node >= 0 {
		ps.Node = r.NodeName(v.Node)
	}
	return ps
}

// NamespaceLabelsOf are the labels of a namespace as the evaluator sees
// them (with kubernetes.io/metadata.name, which the API server puts on
// every namespace); ns nil means the namespace is unknown.
func NamespaceLabelsOf(name string, ns *corev1.Namespace) labels.Set {
	if ns == nil {
		return labels.Set{"kubernetes.io/metadata.name": name}
	}
	return labels.Set(cluster.WithNamespaceNameLabel(ns).Labels)
}

// Incremental is one node's table, kept up to date with the pods of other
// nodes and with namespace labels without a full compile. It updates its
// table in place: Table is valid until the next Update (Snapshot is a
// copy that stays). Unchanged sets keep their nft.Set Revision, changed
// ones carry their Changes, so the Applier's cost follows the change too.
// Elements added by updates are not in key order (the kernel keeps no
// order either).
type Incremental struct {
	opts   Options
	node   string
	recipe *recipe
	table  *nft.Table
	pods   map[string]*PodState
	byAddr addrIndex
	// byNamespace lists the pods of each namespace.
	byNamespace map[string]map[string]*PodState
	nsLabels    map[string]labels.Set
	// local counts this node's pod-network pods by namespace.
	local map[string]int
	// pos indexes the elements of the sets updated so far, by key.
	pos map[string]map[string]int
	// classUsers counts the node's pods dispatched to each class chain.
	classUsers map[string]int
	// dnsServers are what the dns-servers sets hold (SetDNSServers).
	dnsServers []netip.AddrPort
}

// NeedsFullError says why a change needs a full compile.
type NeedsFullError struct{ Reason string }

func (e *NeedsFullError) Error() string { return "needs a full compile: " + e.Reason }

// revisions numbers set contents process-wide, so that no two Lives (a
// full compile replaces the last one) give one revision to two lists.
var revisions atomic.Uint64

// NewIncremental compiles the node's table (as Compile) and keeps what it needs
// to update it.
func NewIncremental(r *eval.Resolved, opts Options) (*Incremental, error) {
	if opts.Audit != nil {
		return nil, errAuditLayout
	}
	if opts.RuleCounters {
		return nil, errCountersLayout
	}
	c, err := compile(r, opts)
	if err != nil {
		return nil, err
	}
	l := &Incremental{opts: opts, node: opts.Node, recipe: c.live, table: c.t, pods: make(map[string]*PodState, r.NumPods()),
		byAddr: newAddrIndex(r.NumPods()), byNamespace: map[string]map[string]*PodState{},
		nsLabels: map[string]labels.Set{}, local: map[string]int{}, pos: map[string]map[string]int{}, classUsers: map[string]int{}}
	if opts.DNS != nil {
		l.dnsServers = slices.Clone(opts.DNS.Servers)
	}
	for i := 0; i < r.NumPods(); i++ {
		v := r.Pod(i)
		l.nsLabels[v.Namespace] = v.NamespaceLabels
		l.add(resolvedPodState(r, v))
	}
	l.fillSets(c.t, c.live)
	for _, tier := range c.live.npTiers {
		tier.rebuildChain(c.t)
	}
	l.dropUnusedPortSets(c.t)
	for _, s := range c.t.Sets {
		s.Revision = revisions.Add(1)
	}
	return l, nil
}

// Table is the current table, valid until the next Update.
func (l *Incremental) Table() *nft.Table { return l.table }

func (l *Incremental) isLocal(p *PodState) bool { return !p.HostNetwork && p.Node == l.node }

func (l *Incremental) add(p *PodState) {
	l.pods[p.Key] = p
	for _, a := range p.Addrs {
		l.byAddr.add(a, p)
	}
	if l.byNamespace[p.Namespace] == nil {
		l.byNamespace[p.Namespace] = map[string]*PodState{}
	}
	l.byNamespace[p.Namespace][p.Key] = p
	if l.isLocal(p) {
		l.local[p.Namespace]++
	}
	if l.dispatched(p) {
		l.countUsers(l.classUsers, p, +1)
	}
}

func (l *Incremental) remove(p *PodState) {
	delete(l.pods, p.Key)
	for _, a := range p.Addrs {
		l.byAddr.remove(a, p)
	}
	delete(l.byNamespace[p.Namespace], p.Key)
	if len(l.byNamespace[p.Namespace]) == 0 {
		delete(l.byNamespace, p.Namespace)
	}
	if l.isLocal(p) {
		l.local[p.Namespace]--
	}
	if l.dispatched(p) {
		l.countUsers(l.classUsers, p, -1)
	}
}

// SelectsLocal reports whether s selects a pod of this node: a policy
// whose subject does not (before and after a change) changes nothing in
// the node's table.
func (l *Incremental) SelectsLocal(s policy.Subject) bool {
	for ns, n := range l.local {
		if n == 0 {
			continue
		}
		for _, p := range l.byNamespace[ns] {
			if l.isLocal(p) && s.Selects(p.Namespace, l.nsLabels[ns], p.Labels) {
				return true
			}
		}
	}
	return false
}

// Changes are what changed since the last update.
type Changes struct {
	// Pods are the changed pods by key, nil for a pod deleted (or
	// finished).
	Pods map[string]*PodState
	// Namespaces may have changed labels.
	Namespaces []string
	// NamespaceLabels gives a namespace's current labels
	// (NamespaceLabelsOf).
	NamespaceLabels func(ns string) labels.Set
}

// Update applies ch and returns the table, or a NeedsFullError when ch
// touches what only a compile of the node's classes builds
// (localChangesKnown, or the labels of a namespace with pods here; Rebase
// does that); the state is then unchanged.
func (l *Incremental) Update(ch Changes) (*nft.Table, error) {
	for _, ns := range ch.Namespaces {
		if l.local[ns] > 0 {
			return nil, &NeedsFullError{Reason: "namespace " + ns + " has pods on this node"}
		}
	}
	newLabels := l.newNamespaceLabels(ch)
	if err := l.localChangesKnown(ch); err != nil {
		return nil, err
	}
	l.applyPods(ch, newLabels)
	return l.table, nil
}

// newNamespaceLabels are the namespaces of ch whose labels changed, with
// their new labels. The classes of their pods are forgotten: they were
// compiled with the old labels.
func (l *Incremental) newNamespaceLabels(ch Changes) map[string]labels.Set {
	out := map[string]labels.Set{}
	for _, ns := range ch.Namespaces {
		if cur := ch.NamespaceLabels(ns); !maps.Equal(cur, l.nsLabels[ns]) {
			out[ns] = cur
		}
	}
	if len(out) > 0 {
		for sig := range l.recipe.classes {
			ns, _, _ := strings.Cut(sig, "\x00")
			if _, changed := out[ns]; changed {
				delete(l.recipe.classes, sig)
			}
		}
	}
	return out
}

// applyPods takes ch, and the namespaces' new labels (newNamespaceLabels),
// into the pod state and patches the pod-dependent elements of the
// changed addresses as the recipe defines them. A pod of the node with a
// signature the recipe lacks gets no dispatch entry: only Rebase, which
// compiles the node's classes afterwards, may give it one.
func (l *Incremental) applyPods(ch Changes, newLabels map[string]labels.Set) {
	addrs := map[netip.Addr]bool{}
	for key, p := range ch.Pods {
		if old := l.pods[key]; old != nil {
			for _, a := range old.Addrs {
				addrs[a] = true
			}
		}
		if p != nil {
			for _, a := range p.Addrs {
				addrs[a] = true
			}
		}
	}
	for ns := range newLabels {
		for _, p := range l.byNamespace[ns] {
			for _, a := range p.Addrs {
				addrs[a] = true
			}
		}
	}
	before := l.elements(addrs)
	maps.Copy(l.nsLabels, newLabels)
	for key, p := range ch.Pods {
		if old := l.pods[key]; old != nil {
			l.remove(old)
		}
		if p != nil {
			if _, ok := l.nsLabels[p.Namespace]; !ok {
				l.nsLabels[p.Namespace] = ch.NamespaceLabels(p.Namespace)
			}
			l.add(p)
		}
	}
	after := l.elements(addrs)
	l.patch(before, after)
}

// localChangesKnown checks that the changes to the node's own pods keep
// to classes a full compile made: every pod of the node that comes or
// changes has the signature of a compiled one, and no address is claimed
// by two pods of the node (which one a full compile dispatches depends on
// their order).
func (l *Incremental) localChangesKnown(ch Changes) error {
	local := map[netip.Addr]int{}
	count := func(a netip.Addr, except map[string]bool) int {
		n := 0
		var buf [2]*PodState
		for _, p := range l.byAddr.at(a, buf[:0]) {
			if l.isLocal(p) && !except[p.Key] {
				n++
			}
		}
		return n
	}
	changed := map[string]bool{}
	for key := range ch.Pods {
		changed[key] = true
	}
	users := maps.Clone(l.classUsers)
	for key, p := range ch.Pods {
		old := l.pods[key]
		if old != nil && l.dispatched(old) {
			for _, a := range old.Addrs {
				if count(a, nil) > 1 {
					return &NeedsFullError{Reason: "pod " + key + " shares an address with another pod of this node"}
				}
			}
			l.countUsers(users, old, -1)
		}
		if p == nil || !l.dispatched(p) {
			continue
		}
		if _, ok := l.recipe.classes[classSignature(p.Namespace, p.Labels, p.Ports)]; !ok {
			return &NeedsFullError{Reason: "pod " + key + " of this node has labels or ports no compiled pod has"}
		}
		for _, a := range p.Addrs {
			local[a]++
			if local[a]+count(a, changed) > 1 {
				return &NeedsFullError{Reason: "pod " + key + " shares an address with another pod of this node"}
			}
		}
		l.countUsers(users, p, +1)
	}
	for chain, n := range users {
		if n <= 0 {
			// A full compile leaves out a class no pod uses.
			return &NeedsFullError{Reason: "class " + chain + " loses its last pod"}
		}
	}
	return nil
}

// dispatched reports whether p is a pod of the node that the dispatch
// maps may send to a class (one with an address).
func (l *Incremental) dispatched(p *PodState) bool { return l.isLocal(p) && len(p.Addrs) > 0 }

// countUsers adds delta to the user counts of p's class chains.
func (l *Incremental) countUsers(users map[string]int, p *PodState, delta int) {
	for _, chain := range l.recipe.classes[classSignature(p.Namespace, p.Labels, p.Ports)] {
		if chain != "" {
			users[chain] += delta
		}
	}
}

// elementRef is one pod-dependent element: set and key.
type elementRef struct {
	set string
	key string
	// verdict is the chain a dispatch map entry jumps to.
	verdict string
	f       *nft.Family
	// tier is set for an allow-list element (its set comes and goes
	// with its elements).
	tier *npTier
}

// elements computes the pod-dependent elements of addrs from the pods
// that hold them now.
func (l *Incremental) elements(addrs map[netip.Addr]bool) map[elementRef]bool {
	return l.recipeElements(l.recipe, addrs, true)
}

// recipeElements computes the elements of addrs in the sets rec
// defines, and with dispatch the dispatch entries.
func (l *Incremental) recipeElements(rec *recipe, addrs map[netip.Addr]bool, dispatch bool) map[elementRef]bool {
	out := map[elementRef]bool{}
	sets := rec.sets()
	var buf [2]*PodState
	for a := range addrs {
		l.addrElements(sets, a, l.byAddr.at(a, buf[:0]), dispatch, func(e elementRef) { out[e] = true })
	}
	return out
}

// recipeSets are the sets of a recipe as addrElements reads them: each
// with its name in every family, and one tier of each allow-list.
type recipeSets struct {
	pods  []recipeSet
	named []recipeSet
	tiers []*npTier
}

type recipeSet struct {
	names    map[*nft.Family]string
	subjects []policy.Subject
	ports    []policy.Port
}

func familyNames(prefix string) map[*nft.Family]string {
	out := make(map[*nft.Family]string, len(nft.Families))
	for _, f := range nft.Families {
		out[f] = prefix + f.Suffix
	}
	return out
}

func (r *recipe) sets() recipeSets {
	var out recipeSets
	for prefix, subjects := range r.podSets {
		out.pods = append(out.pods, recipeSet{names: familyNames(prefix), subjects: subjects})
	}
	for prefix, named := range r.namedSets {
		out.named = append(out.named, recipeSet{names: familyNames(prefix), ports: named})
	}
	// Tiers that share an allow-list share its sets: the first of each.
	for _, t := range r.npTiers {
		if !slices.ContainsFunc(out.tiers, func(u *npTier) bool { return u.list == t.list }) {
			out.tiers = append(out.tiers, t)
		}
	}
	return out
}

// addrElements yields address a's elements in sets, from the pods that
// hold it now (pods: byAddr's), and with dispatch its dispatch entries. It is the one
// answer to which pod address goes in which set: a full compile fills
// the sets with it (fillSets), an update patches what it says before and
// after a change, a rebase fills the sets it made anew.
func (l *Incremental) addrElements(sets recipeSets, a netip.Addr, pods []*PodState, dispatch bool, yield func(elementRef)) {
	if len(pods) == 0 {
		return
	}
	f := nft.FamilyOf(a)
	key := string(f.AddrBytes(a))
	for _, s := range sets.pods {
		for _, p := range pods {
			if !p.HostNetwork && selectsAny(s.subjects, p, l.nsLabels[p.Namespace]) {
				yield(elementRef{set: s.names[f], key: key, f: f})
				break
			}
		}
	}
	for _, s := range sets.named {
		var keys []string // pods that share an address may name one port
		for _, p := range pods {
			for _, b := range namedMatches(s.ports, p.Ports) {
				k := string(nft.Key([]byte(key), nft.ProtoBytes(b.protoLo), nft.PortBytes(b.portLo)))
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
					yield(elementRef{set: s.names[f], key: k, f: f})
				}
			}
		}
	}
	if dispatch {
		l.dispatchElements(a, f, pods, yield)
	}
	for _, t := range sets.tiers {
		var boxes []portBox
		for _, p := range pods {
			boxes = append(boxes, t.podPorts(p, l.nsLabels[p.Namespace], a, f)...)
		}
		if len(boxes) > 0 {
			yield(elementRef{set: t.podSetFor(boxes, f), key: key, f: f, tier: t})
		}
	}
}

// dispatchElements are address a's entries in the dispatch maps and
// self-pods when a pod of the node holds it (localChangesKnown made sure
// that at most one does).
func (l *Incremental) dispatchElements(a netip.Addr, f *nft.Family, pods []*PodState, yield func(elementRef)) {
	for _, p := range pods {
		if !l.isLocal(p) {
			continue
		}
		classes := l.recipe.classes[classSignature(p.Namespace, p.Labels, p.Ports)]
		key := string(f.AddrBytes(a))
		for _, d := range policy.Directions {
			if classes[d] != "" {
				yield(elementRef{set: dispatchMap(d) + f.Suffix, key: key, verdict: classes[d], f: f})
			}
		}
		if l.recipe.isDNSClient(classes[policy.Egress]) {
			yield(elementRef{set: setDNSClients + f.Suffix, key: key, f: f})
		}
		if classes[policy.Egress] != "" || classes[policy.Ingress] != "" {
			yield(elementRef{set: setSelf + f.Suffix, key: string(nft.Key([]byte(key), []byte(key))), f: f})
		}
		return
	}
}

// element is the set element e stands for.
func (e elementRef) element() nft.Element { return e.elementWith([]byte(e.key)) }

// elementWith is element with key, e.key's bytes.
func (e elementRef) elementWith(key []byte) nft.Element {
	el := nft.Element{Key: key}
	if e.verdict != "" {
		el.Verdict = &nft.Verdict{Kind: nft.Jump, Chain: e.verdict}
	}
	return el
}

// patch turns the elements of the changed addresses from before into
// after, in place: an element is found through the set's position index
// and removed by moving the last element into its place, so a change
// costs the same in a set of ten elements as in one of 100,000. Changed
// sets get a new Revision and their Changes; chains whose allow-list
// sets came or went are rebuilt (new Chain objects: chains are never
// changed in place).
func (l *Incremental) patch(before, after map[elementRef]bool) {
	type change struct {
		ref      elementRef
		add, del []nft.Element
	}
	changes := map[string]*change{}
	at := func(e elementRef) *change {
		if changes[e.set] == nil {
			changes[e.set] = &change{ref: e}
		}
		return changes[e.set]
	}
	for e := range before {
		if !after[e] {
			c := at(e)
			c.del = append(c.del, e.element())
		}
	}
	for e := range after {
		if !before[e] {
			c := at(e)
			c.add = append(c.add, e.element())
		}
	}
	t := l.table
	rebuild := map[string]bool{} // allow-lists whose tiers' chains change
	for name, c := range changes {
		s := t.Sets[name]
		created := s == nil
		if created {
			s = &nft.Set{Name: name, Fields: []nft.FieldType{c.ref.f.Field}}
			t.Sets[name] = s
		}
		patchSet(s, l.positions(s), c.add, c.del, created)
		switch {
		case c.ref.tier == nil:
		case len(s.Elements) == 0:
			delete(t.Sets, name) // Compile makes no empty allow-list set
			delete(l.pos, name)
			rebuild[c.ref.tier.list] = true
		case created:
			rebuild[c.ref.tier.list] = true
		}
	}
	for _, tier := range l.recipe.npTiers {
		if rebuild[tier.list] {
			tier.rebuildChain(t)
		}
	}
	if len(rebuild) > 0 {
		l.dropUnusedPortSets(t)
	}
}

// positions is the index of a set's elements by key, made on the set's
// first change.
func (l *Incremental) positions(s *nft.Set) map[string]int { return elementPositions(l.pos, s) }

// elementPositions is the index of s's elements by key, kept in index
// from the set's first change on.
func elementPositions(index map[string]map[string]int, s *nft.Set) map[string]int {
	pos, ok := index[s.Name]
	if !ok {
		pos = make(map[string]int, len(s.Elements))
		for i, e := range s.Elements {
			pos[string(e.Key)] = i
		}
		index[s.Name] = pos
	}
	return pos
}

// patchSet deletes del from s and adds add, in place, by key (pos is the
// index of s's elements): an element is removed by moving the last one
// into its place, so a change costs the same in a set of ten elements as
// in one of 100,000. s gets a new Revision and, unless created, the
// Changes from its last one (the Applier then sends only those).
func patchSet(s *nft.Set, pos map[string]int, add, del []nft.Element, created bool) {
	for _, e := range del {
		i, ok := pos[string(e.Key)]
		if !ok {
			continue
		}
		delete(pos, string(e.Key))
		last := len(s.Elements) - 1
		if i != last {
			s.Elements[i] = s.Elements[last]
			pos[string(s.Elements[i].Key)] = i
		}
		s.Elements[last] = nft.Element{}
		s.Elements = s.Elements[:last]
	}
	for _, e := range add {
		if _, ok := pos[string(e.Key)]; !ok {
			pos[string(e.Key)] = len(s.Elements)
			s.Elements = append(s.Elements, e)
		}
	}
	s.Changes = nil
	if !created && s.Revision != 0 {
		s.Changes = &nft.SetChanges{From: s.Revision, Add: add, Delete: del}
	}
	s.Revision = revisions.Add(1)
}

// Snapshot is a copy of the current table that later updates do not
// change, its set elements in key order (as Compile gives them).
func (l *Incremental) Snapshot() *nft.Table { return snapshot(l.table) }

// snapshot is a copy of t whose sets later patches do not change (chains
// are never changed in place), elements in key order.
func snapshot(t *nft.Table) *nft.Table {
	c := &nft.Table{Name: t.Name, Chains: maps.Clone(t.Chains), Sets: make(map[string]*nft.Set, len(t.Sets)), Counters: maps.Clone(t.Counters)}
	for name, s := range t.Sets {
		cs := s.WithElements(slices.Clone(s.Elements))
		sortElements(cs)
		c.Sets[name] = cs
	}
	return c
}

// dropUnusedPortSets deletes the profile port sets no class uses any more.
func (l *Incremental) dropUnusedPortSets(t *nft.Table) {
	used := map[string]bool{}
	for _, tier := range l.recipe.npTiers {
		for id := range tier.profiles {
			for _, kind := range []string{"pods", "nets"} {
				for _, f := range nft.Families {
					if t.Sets[allowSetName(tier.list, kind, id, f)] != nil {
						used[npPortSet(id)] = true
					}
				}
			}
		}
	}
	for name := range t.Sets {
		if strings.HasPrefix(name, npPortSet("")) && !used[name] {
			delete(t.Sets, name)
		}
	}
}
