package compiler

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// IdentityIncremental is the identity layout's incremental table (what Incremental is to
// the address layout). In this layout a pod of another node is nothing but
// its pod-ids entries: a pod whose namespace and labels are an identity
// the last compile numbered is added, moved or removed by writing those
// entries alone, whatever the number of policies that select it. A pod of
// the node whose namespace, labels and ports are those of one compiled
// (its class is known) adds its dispatch, pass, self, DNS-client and
// ingress named-port entries too. A namespace relabelled that has no pod
// of the node, or a new identity on another node, changes which
// identities some peers hold: the chains whose rules look those peers up
// are built again from what the full compile kept (relabel, number).
// Anything else that changes what an identity is or which identities a
// peer holds (a new identity of the node, the last pod of one gone, the
// labels of a namespace with pods here, policies that apply here) needs a
// full compile (NeedsFullError); the numbering kept across compiles
// (Identities) makes that one send only what changed.
type IdentityIncremental struct {
	opts      Options
	table     *nft.Table
	numbering *Identities
	relevant  []string
	// subjectKeys are the pod label keys the policies' subjects read: a
	// pod of the node has the class of any compiled pod with the same
	// namespace, values of these keys and named ports.
	subjectKeys []string
	pods        map[string]idPod
	// claims counts the pods that hold each address: of two, only a
	// full compile says whose the address is.
	claims map[netip.Addr]int
	perID  map[uint32]int        // pods by identity
	users  map[string]int        // the node's pods by class chain
	local  map[string]*PodState  // the node's pod-network pods, by key
	ns     map[string]labels.Set // namespaces with pods: their labels
	// classes are the classes (by direction) of the node's pods, by
	// localSignature.
	classes      map[string][2]idClass
	ingressNamed map[string][]policy.Port
	namedNets    map[*nft.Family][]addrRange
	pos          map[string]map[string]int
	dnsServers   []netip.AddrPort
	resolved     int // pods the evaluator resolved for the compile
	// c is the last full compile, kept for the chains a namespace
	// relabelled or a new identity builds again (relabel, number);
	// idLabels are the identities' pod labels, made on first use.
	c        *idCompiler
	idLabels map[uint32]labels.Set
	// fresh are the identities an Update is numbering (by namespace and
	// identity key), until it applies them.
	fresh map[[2]string]freshIdentity
	// reused counts the chains the last Rebase took from the compile
	// before it.
	reused int
	// here says, for the node's pods as they were (pods: their
	// signatures), which policies apply to them; keysOf are the pod label
	// keys each policy's subject reads. Rebase keeps both from one call to
	// the next.
	here struct {
		pods string
		of   map[*policy.Policy]bool
	}
	keysOf map[*policy.Policy][]string
}

// freshIdentity is an identity a pod of another node brings: numbered in
// place, it joins the peers that select it (as a namespace relabelled
// does).
type freshIdentity struct {
	ns, key string
	id      uint32
	labels  labels.Set
	ports   []corev1.ContainerPort
}

// idPod is what IdentityIncremental keeps of a pod.
type idPod struct {
	id          uint32 // 0: host network, or no address yet
	hostNetwork bool
	addrs       []netip.Addr
	local       *PodState // a pod-network pod of the node
}

// NewIdentityIncremental compiles the node's table in the identity layout (as
// Compile) and keeps what it needs to update it.
func NewIdentityIncremental(r *eval.Resolved, opts Options) (*IdentityIncremental, error) {
	opts = identityOptions(opts)
	c, classes, err := buildWithClasses(r, opts)
	if err != nil {
		return nil, err
	}
	recs := make([]idRec, r.NumPods())
	nsLabels := map[string]labels.Set{}
	for i := range recs {
		v := r.Pod(i)
		nsLabels[v.Namespace] = v.NamespaceLabels
		recs[i] = idRec{ns: v.Namespace, idPod: idPod{id: c.ids.of[i], hostNetwork: v.HostNetwork, addrs: v.Addrs}}
		if recs[i].id != 0 && v.Node == c.node {
			recs[i].local = resolvedPodState(r, v)
		}
		recs[i].key = v.Key
	}
	return newIdentityIncremental(c, opts, classes, recs, nsLabels), nil
}

// NewIdentityIncrementalFromPods is NewIdentityIncremental for a sync that has the pods
// as a sequence (in (namespace, name) order, which may be read more than
// once; each Pod and its container list may be made for its step alone,
// not the maps and lists they point to) and the model: the
// evaluator resolves one pod of each identity, every pod of the node and
// every host-network pod, instead of every pod, and each other pod is
// its identity's pod-ids entries. A full compile then costs the cluster's
// identities, not its pods, in selector lookups. It falls back to every
// pod when a pod address is in the networks of a NetworkPolicy rule with
// named ports (such a pod is allowed by address).
func NewIdentityIncrementalFromPods(snap *cluster.Snapshot, model *policy.Model, pods iter.Seq[*corev1.Pod], podCount int, opts Options) (*IdentityIncremental, error) {
	opts = identityOptions(opts)
	nsLabels := map[string]labels.Set{}
	for _, ns := range snap.Namespaces {
		nsLabels[ns.Name] = NamespaceLabelsOf(ns.Name, ns)
	}
	labelsOf := func(ns string) labels.Set {
		if l, ok := nsLabels[ns]; ok {
			return l
		}
		return NamespaceLabelsOf(ns, nil)
	}
	local := func(yield func(PodState, labels.Set) bool) {
		for p := range pods {
			if p.Spec.NodeName != opts.Node {
				continue
			}
			if st := PodStateOf(p); st != nil && !st.HostNetwork && len(st.Addrs) > 0 {
				if !yield(*st, labelsOf(st.Namespace)) {
					return
				}
			}
		}
	}
	relevant := selectedLabelKeys(localPolicies(slices.Concat(model.Policies, opts.Staged), local))
	// One pod of each identity represents it; every pod is a record.
	var reps []*corev1.Pod
	repOf := map[string]int{}
	recs := make([]idRec, 0, podCount)
	repIndex := make([]int, 0, podCount) // by record: its representative
	for p := range pods {
		st := PodStateOf(p)
		if st == nil {
			continue
		}
		rep := -1
		switch {
		case st.HostNetwork || st.Node == opts.Node:
			rep = len(reps)
			reps = append(reps, keptPod(p))
		case len(st.Addrs) > 0:
			k := st.Namespace + "\x00" + identityKey(st.Labels, st.Ports, relevant)
			i, ok := repOf[k]
			if !ok {
				i = len(reps)
				repOf[k] = i
				reps = append(reps, keptPod(p))
			}
			rep = i
		}
		nsLabels[st.Namespace] = labelsOf(st.Namespace)
		recs = append(recs, idRec{key: st.Key, ns: st.Namespace, idPod: idPod{hostNetwork: st.HostNetwork, addrs: st.Addrs}})
		repIndex = append(repIndex, rep)
	}
	r := eval.NewFromPods(snap, model, slices.Values(reps), len(reps)).Resolved()
	if r.NumPods() != len(reps) {
		return nil, fmt.Errorf("the evaluator took %d of %d representative pods", r.NumPods(), len(reps))
	}
	c, classes, err := buildWithClasses(r, opts)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		ri := repIndex[i]
		if ri < 0 {
			continue
		}
		recs[i].id = c.ids.of[ri]
		v := r.Pod(ri)
		if v.Key == recs[i].key && recs[i].id != 0 && v.Node == c.node {
			recs[i].local = resolvedPodState(r, v)
		}
		if v.Key != recs[i].key {
			for _, a := range recs[i].addrs {
				if containsAddr(c.namedNets[nft.FamilyOf(a)], a) {
					// Allowed by address: only a resolution of every pod
					// says which of its identity's pods are.
					return NewIdentityIncremental(eval.NewFromPods(snap, model, pods, podCount).Resolved(), opts)
				}
			}
		}
	}
	return newIdentityIncremental(c, opts, classes, recs, nsLabels), nil
}

// keptPod is a copy of p that outlives its step of the sequence. It
// shares p's labels, ports and addresses: a deep copy's label maps, one
// per identity, were 9 MB of the agent's heap at 100,000 realistic pods
// (the evaluator keeps a pod's labels).
func keptPod(p *corev1.Pod) *corev1.Pod {
	c := *p
	c.Spec.Containers = slices.Clone(p.Spec.Containers)
	return &c
}

// identityOptions are opts with the defaults an IdentityIncremental needs.
func identityOptions(opts Options) Options {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.Identities == nil {
		opts.Identities = &Identities{}
	}
	opts.Layout = LayoutIdentities
	return opts
}

// nodeClasses are the classes (by direction) of the node's pods, by
// localSignature over subjectKeys.
type nodeClasses struct {
	byKey       map[string][2]idClass
	subjectKeys []string
}

// buildWithClasses compiles r and returns the classes of the node's pods.
func buildWithClasses(r *eval.Resolved, opts Options) (*idCompiler, nodeClasses, error) {
	return withClasses(r, opts, subjectLabelKeys(r.Policies()), func(pod podClasses) (*idCompiler, error) { return buildIdentities(r, opts, pod) })
}

// podClasses is given each pod-network pod a compile numbered, with its
// classes by direction when it is of the node.
type podClasses func(i int, id uint32, classes [2]idClass)

// withClasses runs build, a compile of r, and returns the classes of the
// node's pods with it, by localSignature over subjectKeys (the pod label
// keys every policy's subject reads).
func withClasses(r *eval.Resolved, opts Options, subjectKeys []string, build func(podClasses) (*idCompiler, error)) (*idCompiler, nodeClasses, error) {
	classes := nodeClasses{byKey: map[string][2]idClass{}, subjectKeys: subjectKeys}
	c, err := build(func(i int, _ uint32, cl [2]idClass) {
		if p := r.Pod(i); p.Node >= 0 && r.NodeName(p.Node) == opts.Node {
			classes.byKey[localSignature(p.Namespace, p.Labels, p.Ports, classes.subjectKeys)] = cl
		}
	})
	return c, classes, err
}

// subjectLabelKeys are the pod label keys the policies' subjects read,
// sorted.
func subjectLabelKeys(pols []*policy.Policy) []string {
	keys := map[string]bool{}
	for _, p := range pols {
		for _, k := range subjectKeysOf(p) {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

// subjectKeysOf are the pod label keys p's subject reads.
func subjectKeysOf(p *policy.Policy) []string {
	reqs, _ := p.Subject.Pods.Requirements()
	out := make([]string, 0, len(reqs))
	for _, req := range reqs {
		out = append(out, req.Key())
	}
	return out
}

// localSignature is what decides the classes of a pod of the node besides
// its namespace's labels (a change of which is a full compile): its
// namespace, the values of the label keys subjects read (a rollout's
// pod-template-hash is none of them) and its named ports (ingress named
// ports resolve on them).
func localSignature(ns string, podLabels labels.Set, ports []corev1.ContainerPort, subjectKeys []string) string {
	return ns + "\x00" + identityKey(podLabels, ports, subjectKeys)
}

// idRec is a pod as NewIdentityIncremental reads it.
type idRec struct {
	key, ns string
	idPod
}

// newIdentityIncremental keeps c's table and what updates need: recs are every
// pod, in (namespace, name) order, whose pod-ids entries the table gets
// (the first of two pods with one address has it).
func newIdentityIncremental(c *idCompiler, opts Options, classes nodeClasses, recs []idRec, nsLabels map[string]labels.Set) *IdentityIncremental {
	l := &IdentityIncremental{opts: opts, table: c.t, numbering: opts.Identities, relevant: c.relevant, subjectKeys: classes.subjectKeys,
		pods: make(map[string]idPod, len(recs)), claims: make(map[netip.Addr]int, len(recs)),
		perID: map[uint32]int{}, users: map[string]int{}, local: map[string]*PodState{}, ns: map[string]labels.Set{}, classes: classes.byKey,
		ingressNamed: c.ingressNamed, namedNets: c.namedNets, pos: map[string]map[string]int{}, resolved: c.r.NumPods(), c: c}
	if opts.DNS != nil {
		l.dnsServers = slices.Clone(opts.DNS.Servers)
	}
	for _, f := range nft.Families {
		c.t.Sets[mapPodIDs+f.Suffix].Elements = nil
	}
	for _, rec := range recs {
		l.ns[rec.ns] = nsLabels[rec.ns]
		if rec.id != 0 {
			for _, a := range rec.addrs {
				if l.claims[a] == 0 {
					f := nft.FamilyOf(a)
					s := c.t.Sets[mapPodIDs+f.Suffix]
					s.Elements = append(s.Elements, nft.Element{Key: f.AddrBytes(a), Data: nft.IntegerBytes(rec.id)})
				}
			}
		}
		l.add(rec.idPod, +1)
		l.pods[rec.key] = rec.idPod
	}
	for _, s := range c.t.Sets {
		if strings.HasPrefix(s.Name, mapPodIDs) {
			sortElements(s)
		}
		s.Revision = revisions.Add(1)
	}
	return l
}

// ResolvedPods is how many pods the evaluator resolved for the compile
// (NewIdentityIncrementalFromPods: one of each identity, the node's and the
// host-network ones).
func (l *IdentityIncremental) ResolvedPods() int { return l.resolved }

// Table is the current table, valid until the next Update.
func (l *IdentityIncremental) Table() *nft.Table { return l.table }

// Snapshot is a copy of the current table that later updates do not
// change.
func (l *IdentityIncremental) Snapshot() *nft.Table { return snapshot(l.table) }

// add counts p in (delta +1) or out (-1) of the claims, identities, class
// users and the node's pods.
func (l *IdentityIncremental) add(p idPod, delta int) {
	if p.id == 0 {
		return
	}
	for _, a := range p.addrs {
		l.claims[a] += delta
		if l.claims[a] == 0 {
			delete(l.claims, a)
		}
	}
	l.perID[p.id] += delta
	if p.local != nil {
		if delta > 0 {
			l.local[p.local.Key] = p.local
		} else {
			delete(l.local, p.local.Key)
		}
		for _, cl := range l.localClasses(p.local) {
			if cl.chain != "" {
				l.users[cl.chain] += delta
			}
		}
	}
}

func (l *IdentityIncremental) localClasses(p *PodState) [2]idClass {
	return l.classes[localSignature(p.Namespace, p.Labels, p.Ports, l.subjectKeys)]
}

// SelectsLocal reports whether s selects a pod-network pod of this node,
// or reads a pod label no subject of the last compile read: a policy for
// which it is false (before and after a change) changes nothing in the
// node's table, nor which labels identities and classes are made of.
func (l *IdentityIncremental) SelectsLocal(s policy.Subject) bool {
	reqs, _ := s.Pods.Requirements()
	for _, req := range reqs {
		if _, known := slices.BinarySearch(l.subjectKeys, req.Key()); !known {
			// Pods of the node that differ only in this key share a
			// class: only a full compile tells them apart.
			return true
		}
	}
	for _, p := range l.local {
		if s.Selects(p.Namespace, l.ns[p.Namespace], p.Labels) {
			return true
		}
	}
	return false
}

// stagedChange reports whether ch may change the shadow evaluation of the
// staged policies (shadow.go), which only a full compile builds: a pod of
// the node (a staged policy may select it), or, with a shadow, a
// host-network pod (the shadow's named-port sets may hold it). The
// changes that number a new identity or follow a namespace relabelled are
// refused in Update. What is left, the pods of other nodes with
// identities the table has, is their pod-ids entries, which both
// evaluations share.
func (l *IdentityIncremental) stagedChange(ch Changes) bool {
	if len(l.opts.Staged) == 0 {
		return false
	}
	for key, p := range ch.Pods {
		if _, ok := l.local[key]; ok || p != nil && p.Node == l.opts.Node {
			return true
		}
		if old, ok := l.pods[key]; l.shadowed() && (ok && old.hostNetwork || p != nil && p.HostNetwork) {
			return true
		}
	}
	return false
}

// shadowed says the table has a shadow evaluation of staged policies.
func (l *IdentityIncremental) shadowed() bool { return l.c != nil && l.c.funnel }

// Update applies ch and returns the table, or a NeedsFullError (the state
// is then unchanged).
func (l *IdentityIncremental) Update(ch Changes) (*nft.Table, error) {
	if l.stagedChange(ch) {
		return nil, &NeedsFullError{Reason: errStagedIncremental.Error()}
	}
	var relabelled []string
	for _, ns := range ch.Namespaces {
		if cur, ok := l.ns[ns]; ok && !maps.Equal(cur, ch.NamespaceLabels(ns)) {
			if err := l.canRelabel(ns); err != nil {
				return nil, err
			}
			relabelled = append(relabelled, ns)
		}
	}
	if l.shadowed() && len(relabelled) > 0 {
		return nil, &NeedsFullError{Reason: errStagedIncremental.Error() + " (a namespace relabelled)"}
	}
	defer func() { l.fresh = nil }()
	next := make(map[string]idPod, len(ch.Pods))
	for key, p := range ch.Pods {
		np, err := l.podOf(key, p)
		if err != nil {
			return nil, err
		}
		next[key] = np
	}
	if l.shadowed() && len(l.fresh) > 0 {
		return nil, &NeedsFullError{Reason: errStagedIncremental.Error() + " (a new identity)"}
	}
	// Counted as they would be after the change, then put back when the
	// change needs a full compile.
	for key, np := range next {
		l.add(l.pods[key], -1)
		l.add(np, +1)
	}
	if err := l.checkCounts(next); err != nil {
		for key, np := range next {
			l.add(np, -1)
			l.add(l.pods[key], +1)
		}
		return nil, err
	}
	for _, ns := range relabelled {
		l.relabel(ns, ch.NamespaceLabels(ns))
	}
	for _, k := range slices.SortedFunc(maps.Keys(l.fresh), func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	}) {
		l.number(l.fresh[k])
	}
	var del, add []setElement
	for key, np := range next {
		del = append(del, l.elements(l.pods[key])...)
		add = append(add, l.elements(np)...)
		if ch.Pods[key] == nil {
			delete(l.pods, key)
		} else {
			l.pods[key] = np
		}
	}
	l.patch(del, add)
	return l.table, nil
}

// freshID numbers the new identity of pod p (key), which another node
// runs, in place: the lowest class number its namespace has free. A pod of
// this node with a new identity may be a new class, and only a full
// compile places an identity that a NetworkPolicy allow-list or a named-
// port set empty so far would have to resolve egress named ports on.
func (l *IdentityIncremental) freshID(key string, p *PodState, idKey string) (uint32, error) {
	k := [2]string{p.Namespace, idKey}
	if f, ok := l.fresh[k]; ok {
		return f.id, nil
	}
	refuse := func(why string) (uint32, error) {
		return 0, &NeedsFullError{Reason: "pod " + key + " is a new identity" + why}
	}
	switch {
	case l.c == nil:
		return refuse("")
	case p.Node == l.opts.Node:
		return refuse(" of this node")
	case l.c.egressNamedAllow && namedPortsSignature(p.Ports) != "":
		return refuse(" with named ports, which a NetworkPolicy's egress rule resolves")
	}
	for set, named := range l.c.namedIDSets {
		if len(namedMatches(named, p.Ports)) > 0 && len(l.table.Sets[set].Elements) == 0 {
			return refuse(" that an empty named-port set would hold")
		}
	}
	used := map[uint32]bool{}
	for _, c := range l.numbering.class[p.Namespace] {
		used[c] = true
	}
	for _, f := range l.fresh {
		if f.ns == p.Namespace {
			used[f.id&(namespaceSpan-1)] = true
		}
	}
	class := uint32(1)
	for used[class] {
		class++
	}
	if class > maxIdentityPart {
		return refuse(": its namespace has no number left")
	}
	id := l.numbering.base[p.Namespace] | class
	if l.fresh == nil {
		l.fresh = map[[2]string]freshIdentity{}
	}
	l.fresh[k] = freshIdentity{ns: p.Namespace, key: idKey, id: id, labels: p.Labels, ports: p.Ports}
	return id, nil
}

// number applies a fresh identity: the numbering keeps it, the peers that
// select it hold it, and the egress named-port sets its ports.
func (l *IdentityIncremental) number(f freshIdentity) {
	l.numbering.class[f.ns][f.key] = f.id & (namespaceSpan - 1)
	l.identityLabels()[f.id] = f.labels
	ids := l.c.ids.namespaces[f.ns]
	at, _ := slices.BinarySearch(ids, f.id)
	grown := slices.Insert(slices.Clone(ids), at, f.id)
	l.c.ids.namespaces[f.ns] = grown
	l.refresh(f.ns, l.ns[f.ns], l.ns[f.ns], ids, grown)
	var add []setElement
	for _, set := range slices.Sorted(maps.Keys(l.c.namedIDSets)) {
		for _, e := range namedIDElements(f.id, l.c.namedIDSets[set], f.ports) {
			add = append(add, setElement{set: set, Element: e})
		}
	}
	l.patch(nil, add)
}

// canRelabel says whether relabel can follow new labels of namespace ns
// (which has pods): only a full compile can when pods of this node are in
// it (which policies apply to them may change) or when a pod's identity
// is not all that places it (egress named ports of NetworkPolicies allow
// some pods by address).
func (l *IdentityIncremental) canRelabel(ns string) error {
	if l.c == nil {
		return &NeedsFullError{Reason: "namespace " + ns + " was relabelled"}
	}
	for _, p := range l.local {
		if p.Namespace == ns {
			return &NeedsFullError{Reason: "namespace " + ns + ", which has pods of this node, was relabelled"}
		}
	}
	for _, nets := range l.namedNets {
		if len(nets) > 0 {
			return &NeedsFullError{Reason: "namespace " + ns + " was relabelled, and a NetworkPolicy names egress ports"}
		}
	}
	return nil
}

// relabel follows new labels of namespace ns, which has no pod of this
// node: a namespace's labels make no identity, they decide which of its
// identities each pod peer selects (refresh).
func (l *IdentityIncremental) relabel(ns string, next labels.Set) {
	prev := l.ns[ns]
	l.ns[ns] = next
	ids := l.c.ids.namespaces[ns]
	l.refresh(ns, prev, next, ids, ids)
}

// refresh follows namespace ns's change from the labels prev and the
// identities before to next and after: each pod peer whose selection of
// the namespace's identities changes gets its new identity ranges, the
// chains whose rules look them up are built again (their names stay: they
// are named by their policies and plans), and identity sets no chain
// names any more are dropped.
func (l *IdentityIncremental) refresh(ns string, prev, next labels.Set, before, after []uint32) {
	c := l.c
	span := c.ids.span(ns)
	changed := map[string]bool{}
	for def, subjects := range c.peerDefs {
		was := c.ids.portion(ns, l.selectedIn(subjects, ns, prev, before), before)
		is := c.ids.portion(ns, l.selectedIn(subjects, ns, next, after), after)
		if slices.Equal(was, is) {
			continue
		}
		c.peerDefIDs[def] = union(append(subtract(c.peerDefIDs[def], span), is...))
		changed[def] = true
	}
	if len(changed) == 0 {
		return
	}
	for k, def := range c.ruleDef {
		if changed[def] {
			c.ruleIDs[k] = c.peerDefIDs[def]
		}
	}
	affected := func(rules []eval.PlanRule, d policy.Direction) bool {
		return slices.ContainsFunc(rules, func(pr eval.PlanRule) bool {
			def, ok := c.ruleDef[[3]int{int(pr.Policy), int(d), pr.Rule}]
			return ok && changed[def]
		})
	}
	for _, name := range slices.Sorted(maps.Keys(c.policyRecipes)) {
		if rc := c.policyRecipes[name]; affected(rc.rules, rc.d) {
			l.rebuild(name, func(ch *nft.Chain) { c.fillPolicyChain(ch, rc) })
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.npRecipes)) {
		if rc := c.npRecipes[name]; affected(rc.plan.Allow, rc.plan.Direction) {
			l.rebuild(name, func(ch *nft.Chain) { c.fillNetworkPolicyTier(ch, rc) })
		}
	}
	for _, s := range l.table.Sets {
		if s.Revision == 0 {
			s.Revision = revisions.Add(1) // made by a rebuilt chain
		}
	}
}

// selectIDs is the identity ranges subjects select among every
// identity (what identities.ranges makes of the pods they select).
func (l *IdentityIncremental) selectIDs(subjects []policy.Subject) []addrRange {
	var out []addrRange
	for ns, ids := range l.c.ids.namespaces {
		out = append(out, l.c.ids.portion(ns, l.selectedIn(subjects, ns, l.ns[ns], ids), ids)...)
	}
	return union(out)
}

// identityLabels are the pod labels of each identity (those of the
// compile's pod that represents it, and of identities numbered since).
func (l *IdentityIncremental) identityLabels() map[uint32]labels.Set {
	if l.idLabels == nil {
		l.idLabels = map[uint32]labels.Set{}
		for i := 0; i < l.c.r.NumPods(); i++ {
			if id := l.c.ids.of[i]; id != 0 {
				l.idLabels[id] = l.c.r.Pod(i).Labels
			}
		}
	}
	return l.idLabels
}

// selectedIn is which of ids (namespace ns's identities, in order) the
// subjects select when ns has the labels nsLabels.
func (l *IdentityIncremental) selectedIn(subjects []policy.Subject, ns string, nsLabels labels.Set, ids []uint32) []uint32 {
	var out []uint32
	for _, s := range subjects {
		if !s.SelectsNamespace(ns, nsLabels) {
			continue
		}
		idLabels := l.identityLabels()
		for _, id := range ids {
			if s.Pods.Empty() || s.Pods.Matches(idLabels[id]) {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// rebuild builds chain name again with fill, in a new Chain (snapshots
// share the old one), and drops the sets it made or named before that no
// chain names now.
func (l *IdentityIncremental) rebuild(name string, fill func(*nft.Chain)) {
	c := l.c
	before := c.uses[name]
	old := l.table.Chains[name]
	ch := &nft.Chain{Name: name}
	l.table.Chains[name] = ch
	c.fill(ch, fill)
	if old != nil {
		dropUnusedCounters(l.table, old)
	}
	named := func(set string) bool {
		for _, u := range c.uses {
			if u[set] {
				return true
			}
		}
		return false
	}
	for set := range before {
		if named(set) {
			continue
		}
		delete(l.table.Sets, set)
		delete(l.pos, set)
		for key, n := range c.idSets {
			if n == set {
				delete(c.idSets, key)
			}
		}
		delete(c.namedIDSets, set)
		if id, ok := strings.CutSuffix(set, "."+nft.IPv4.Suffix); ok {
			delete(c.ingressNamed, id) // its sets are made and named together
		}
	}
}

// podOf is what a changed pod (nil: deleted) will be, or why only a full
// compile can place it (an address two pods held before the change is
// the first one's, which only a full compile knows).
func (l *IdentityIncremental) podOf(key string, p *PodState) (idPod, error) {
	old := l.pods[key]
	if old.hostNetwork || p != nil && p.HostNetwork {
		return idPod{}, &NeedsFullError{Reason: "host-network pod " + key}
	}
	var addrs []netip.Addr
	if p != nil {
		addrs = p.Addrs
	}
	for _, a := range slices.Concat(old.addrs, addrs) {
		if l.claims[a] > 1 {
			return idPod{}, &NeedsFullError{Reason: fmt.Sprintf("address %s is held by two pods", a)}
		}
		if containsAddr(l.namedNets[nft.FamilyOf(a)], a) {
			return idPod{}, &NeedsFullError{Reason: "pod " + key + " is in the networks of a rule with named ports"}
		}
	}
	if len(addrs) == 0 {
		return idPod{}, nil
	}
	base, numbered := l.numbering.base[p.Namespace]
	idKey := identityKey(p.Labels, p.Ports, l.relevant)
	class, known := l.numbering.class[p.Namespace][idKey]
	if !numbered {
		return idPod{}, &NeedsFullError{Reason: "pod " + key + " is the first of its namespace"}
	}
	id := base | class
	if !known {
		var err error
		if id, err = l.freshID(key, p, idKey); err != nil {
			return idPod{}, err
		}
	}
	np := idPod{id: id, addrs: p.Addrs}
	if p.Node == l.opts.Node {
		if _, ok := l.classes[localSignature(p.Namespace, p.Labels, p.Ports, l.subjectKeys)]; !ok {
			return idPod{}, &NeedsFullError{Reason: "pod " + key + " of this node is a new class"}
		}
		np.local = p
	}
	return np, nil
}

// checkCounts says whether the counts after a change (of the pods next)
// are ones an update can follow: no address held twice, no identity or
// class left without pods.
func (l *IdentityIncremental) checkCounts(next map[string]idPod) error {
	for key, np := range next {
		old := l.pods[key]
		for _, a := range slices.Concat(old.addrs, np.addrs) {
			if l.claims[a] > 1 {
				return &NeedsFullError{Reason: fmt.Sprintf("address %s is held by two pods", a)}
			}
		}
		if old.id != 0 && l.perID[old.id] == 0 {
			return &NeedsFullError{Reason: fmt.Sprintf("identity %#x has no pods left", old.id)}
		}
		if old.local != nil {
			for _, cl := range l.localClasses(old.local) {
				if cl.chain != "" && l.users[cl.chain] == 0 {
					return &NeedsFullError{Reason: "class " + cl.chain + " has no pods left on this node"}
				}
			}
		}
		// A named-port set's rules exist while it has elements.
		for _, e := range slices.Concat(l.namedElements(old.local), l.namedElements(np.local)) {
			if (len(l.table.Sets[e.set].Elements) == 0) != (l.namedLeft(e, next) == 0) {
				return &NeedsFullError{Reason: "ingress named-port set " + e.set + " is emptied or filled"}
			}
		}
	}
	return nil
}

// namedLeft counts the elements of e's set after the change (of the pods
// next): its elements now, less those of the changed pods, plus theirs
// after.
func (l *IdentityIncremental) namedLeft(e setElement, next map[string]idPod) int {
	n := len(l.table.Sets[e.set].Elements)
	for key, np := range next {
		for _, pe := range l.namedElements(l.pods[key].local) {
			if pe.set == e.set {
				n--
			}
		}
		for _, pe := range l.namedElements(np.local) {
			if pe.set == e.set {
				n++
			}
		}
	}
	return n
}

// elements are what pod p puts in the table (podElements and its ingress
// named ports).
func (l *IdentityIncremental) elements(p idPod) []setElement {
	if p.id == 0 {
		return nil
	}
	var classes [2]idClass
	if p.local != nil {
		classes = l.localClasses(p.local)
	}
	return append(podElements(p.id, p.addrs, p.local != nil, classes, l.opts.DNS != nil, ""), l.namedElements(p.local)...)
}

// namedElements are the ingress named-port entries of a pod of the node
// (nil: none).
func (l *IdentityIncremental) namedElements(p *PodState) []setElement {
	if p == nil {
		return nil
	}
	var out []setElement
	for _, id := range slices.Sorted(maps.Keys(l.ingressNamed)) {
		boxes := namedMatches(l.ingressNamed[id], p.Ports)
		for _, a := range p.Addrs {
			f := nft.FamilyOf(a)
			for _, b := range boxes {
				out = append(out, setElement{set: id + "." + f.Suffix, Element: nft.Element{Key: nft.Key(f.AddrBytes(a), nft.ProtoBytes(b.protoLo), nft.PortBytes(b.portLo))}})
			}
		}
	}
	return out
}

// patch deletes del and adds add; an element in both (same set, key and
// value) is left alone, so a pod whose elements do not change writes
// nothing.
func (l *IdentityIncremental) patch(del, add []setElement) {
	id := func(e setElement) string {
		v := ""
		if e.Verdict != nil {
			v = e.Verdict.String()
		}
		return e.set + "\x00" + string(e.Key) + "\x00" + string(e.Data) + "\x00" + v
	}
	both := map[string]int{}
	for _, e := range del {
		both[id(e)] |= 1
	}
	for _, e := range add {
		both[id(e)] |= 2
	}
	type change struct{ add, del []nft.Element }
	changes := map[string]*change{}
	at := func(set string) *change {
		if changes[set] == nil {
			changes[set] = &change{}
		}
		return changes[set]
	}
	for _, e := range del {
		if k := id(e); both[k] == 1 {
			both[k] = 0 // once
			at(e.set).del = append(at(e.set).del, e.Element)
		}
	}
	for _, e := range add {
		if k := id(e); both[k] == 2 {
			both[k] = 0
			at(e.set).add = append(at(e.set).add, e.Element)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(changes)) {
		s, c := l.table.Sets[name], changes[name]
		patchSet(s, elementPositions(l.pos, s), c.add, c.del, false)
	}
}

// SetDNSServers makes the dns-servers sets hold servers (in place, as an
// Update does). It is an error when the table has no DNS objects.
func (l *IdentityIncremental) SetDNSServers(servers []netip.AddrPort) (*nft.Table, error) {
	if l.opts.DNS == nil {
		return nil, fmt.Errorf("the table has no DNS objects")
	}
	elements := func(list []netip.AddrPort) []setElement {
		var out []setElement
		for _, f := range nft.Families {
			for _, e := range dnsServerElements(list, f) {
				out = append(out, setElement{set: setDNSServers + f.Suffix, Element: e})
			}
		}
		return out
	}
	l.patch(elements(l.dnsServers), elements(servers))
	l.dnsServers = slices.Clone(servers)
	return l.table, nil
}

// DNSServers are the servers the dns-servers sets hold.
func (l *IdentityIncremental) DNSServers() []netip.AddrPort { return slices.Clone(l.dnsServers) }
