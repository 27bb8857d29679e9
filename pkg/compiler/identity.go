package compiler

// The identity layout (docs/architecture.md, "The identity layout"): a
// node's table whose size grows with pods plus policies. Every pod-network
// pod has an identity, namespace << 16 | class; one data map per family
// (pod-ids4/6) takes an address to it, and a class chain writes the peer's
// identity into the packet mark, so that peers are matched as interval
// sets of identities (a whole namespace is one range) instead of sets of
// pod addresses. Each Admin or Baseline policy's rules are one chain per
// direction, shared by every class it applies to; egress and ingress have
// base chains of their own so that an Accept (`accept`) is final for its
// direction only; a Pass leaves a shared policy chain through a map from
// the local pod's address to its class's next tier.
//
// Compile builds it with Options.Layout = LayoutIdentities;
// IdentityIncremental keeps it up to date with pod events (identity_incremental.go).

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// Layout is how Compile lays out a node's policy table.
type Layout int

const (
	// LayoutAddresses: peer sets of pod addresses (the layout before
	// the identities; the zero value).
	LayoutAddresses Layout = iota
	// LayoutIdentities: pods as identities in the packet mark.
	LayoutIdentities
)

// DefaultLayout is what the agent (netpol agent --layout) and the lab
// program unless told otherwise.
const DefaultLayout = LayoutIdentities

func (l Layout) String() string {
	if l == LayoutIdentities {
		return "identities"
	}
	return "addresses"
}

// ParseLayout reads a layout's name.
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "addresses":
		return LayoutAddresses, nil
	case "identities":
		return LayoutIdentities, nil
	}
	return 0, fmt.Errorf("layout %q: addresses or identities", s)
}

// Names of the identity layout's fixed objects.
const (
	// chainIngressDispatch sends a connection to its destination's
	// ingress class (after its source's egress allowed it).
	chainIngressDispatch = "ingress-dispatch"
	mapPodIDs            = "pod-ids" // + family suffix: every pod-network address -> identity
	mapEgressPass        = "eg-pass" // + family suffix: local pod saddr -> its egress class's next tier
	mapIngressPass       = "in-pass" // + family suffix: local pod daddr -> its ingress class's next tier
	classBits            = 16        // an identity is namespace << classBits | class
	maxIdentityPart      = 1<<16 - 1 // namespaces, and classes in one namespace
	namespaceSpan        = 1 << classBits
)

// identities numbers the pod-network pods: pods with the same namespace,
// the same values of the labels peers select on and the same named
// container ports share one identity (they are selected by the same peers
// and resolve named ports alike). Namespaces are
// numbered so that those with the same values of their least varied
// labels (env, team) are neighbours, which keeps a peer that selects
// such namespaces to a few ranges.
type identities struct {
	of []uint32 // by pod index; 0: none (host network, no address)
	// namespaces: each numbered namespace's identities, in order.
	namespaces map[string][]uint32
	base       map[string]uint32 // a namespace's first identity (class 0)
	nsOf       map[uint32]string // the reverse of base
}

// Identities is the numbering one compile of the identity layout used, for
// the next compile of the same node to keep (Options.Identities): a pod
// whose namespace and labels were numbered keeps its number, so an event
// changes the elements it is about, not every number after it. Numbers of
// namespaces and label sets that are gone are given to new ones.
type Identities struct {
	base  map[string]uint32            // by namespace
	class map[string]map[string]uint32 // by namespace, then labels and named ports: the class part
}

// Empty reports whether nothing has been numbered yet.
func (n *Identities) Empty() bool { return len(n.base) == 0 }

// identityKey is what makes a pod's class in its namespace: the labels
// that some peer's pod selector reads (relevant: a label no selector
// reads, such as pod-template-hash, does not split a workload), and its
// named ports.
func identityKey(podLabels labels.Set, ports []corev1.ContainerPort, relevant []string) string {
	var b strings.Builder
	for _, k := range relevant { // sorted
		if v, ok := podLabels[k]; ok {
			b.WriteString(k)
			b.WriteByte('=')
			b.WriteString(v)
			b.WriteByte(',')
		}
	}
	b.WriteByte(0)
	b.WriteString(namedPortsSignature(ports))
	return b.String()
}

// localPolicies are the policies whose subjects select one of the local
// pods (the node's pod-network pods, given as namespace, namespace labels
// and labels): only their peers' selectors shape the node's table (a
// policy that applies to no pod here changes nothing in it, Incremental's
// premise).
func localPolicies(pols []*policy.Policy, local iter.Seq2[PodState, labels.Set]) []*policy.Policy {
	// The node's pods by namespace: most policies are NetworkPolicies of
	// namespaces with no pod here, and are skipped at once.
	type namespace struct {
		labels labels.Set
		pods   []labels.Set
	}
	byNS := map[string]*namespace{}
	for p, nsLabels := range local {
		n := byNS[p.Namespace]
		if n == nil {
			n = &namespace{labels: nsLabels}
			byNS[p.Namespace] = n
		}
		n.pods = append(n.pods, p.Labels)
	}
	selects := func(s policy.Subject, ns string, n *namespace) bool {
		if !s.SelectsNamespace(ns, n.labels) {
			return false
		}
		return s.Pods.Empty() || slices.ContainsFunc(n.pods, func(l labels.Set) bool { return s.Pods.Matches(l) })
	}
	var out []*policy.Policy
	for _, pol := range pols {
		if ns := pol.Subject.Namespace; ns != "" {
			if n := byNS[ns]; n != nil && selects(pol.Subject, ns, n) {
				out = append(out, pol)
			}
			continue
		}
		for ns, n := range byNS {
			if selects(pol.Subject, ns, n) {
				out = append(out, pol)
				break
			}
		}
	}
	return out
}

// localPods are r's pod-network pods of node, with their namespaces'
// labels.
func localPods(r *eval.Resolved, node int) iter.Seq2[PodState, labels.Set] {
	return func(yield func(PodState, labels.Set) bool) {
		for i := 0; i < r.NumPods(); i++ {
			p := r.Pod(i)
			if p.Node == node && !p.HostNetwork && len(p.Addrs) > 0 {
				if !yield(PodState{Namespace: p.Namespace, Labels: p.Labels}, p.NamespaceLabels) {
					return
				}
			}
		}
	}
}

// selectedLabelKeys are the pod label keys the pod selectors of the
// policies' peers read, sorted.
func selectedLabelKeys(pols []*policy.Policy) []string {
	keys := map[string]bool{}
	for _, p := range pols {
		for _, d := range policy.Directions {
			for _, r := range p.Rules[d] {
				for _, peer := range r.Peers {
					if peer.Kind != policy.PeerPods || peer.Pods == nil {
						continue
					}
					reqs, _ := peer.Pods.Requirements()
					for _, req := range reqs {
						keys[req.Key()] = true
					}
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

// newIdentities numbers r's pods over the relevant label keys; with
// prev, the numbers prev gave are kept and prev is updated to this
// numbering.
func newIdentities(r *eval.Resolved, prev *Identities, relevant []string, adopt *nft.Table) (*identities, error) {
	nsLabels := map[string]labels.Set{}
	classes := map[string]map[string]bool{}
	keyOf := make([]string, r.NumPods())
	for i := 0; i < r.NumPods(); i++ {
		p := r.Pod(i)
		if p.HostNetwork || len(p.Addrs) == 0 {
			continue
		}
		keyOf[i] = identityKey(p.Labels, p.Ports, relevant)
		if classes[p.Namespace] == nil {
			classes[p.Namespace] = map[string]bool{}
			nsLabels[p.Namespace] = p.NamespaceLabels
		}
		classes[p.Namespace][keyOf[i]] = true
	}
	if len(classes) > maxIdentityPart {
		return nil, fmt.Errorf("the identity layout numbers at most %d namespaces with pods, not %d", maxIdentityPart, len(classes))
	}
	if prev == nil {
		prev = &Identities{}
	}
	if len(prev.base) == 0 && adopt != nil {
		prev = adoptedNumbering(r, keyOf, adopt)
	}
	next := &Identities{base: map[string]uint32{}, class: map[string]map[string]uint32{}}
	// Namespaces: the numbers kept first, then the new ones, in order,
	// each in the lowest free number.
	usedNS := map[uint32]bool{}
	order := orderNamespaces(nsLabels)
	for _, ns := range order {
		if b, ok := prev.base[ns]; ok {
			next.base[ns], usedNS[b] = b, true
		}
	}
	free := uint32(1)
	for _, ns := range order {
		if _, ok := next.base[ns]; ok {
			continue
		}
		for usedNS[free<<classBits] {
			free++
		}
		next.base[ns], usedNS[free<<classBits] = free<<classBits, true
	}
	ids := &identities{of: make([]uint32, r.NumPods()), namespaces: map[string][]uint32{}, base: next.base, nsOf: map[uint32]string{}}
	for _, ns := range order {
		keys := slices.Sorted(maps.Keys(classes[ns]))
		if len(keys) > maxIdentityPart {
			return nil, fmt.Errorf("namespace %s: the identity layout numbers at most %d distinct pod label sets, not %d", ns, maxIdentityPart, len(keys))
		}
		base := next.base[ns]
		ids.nsOf[base] = ns
		kept, used := map[string]uint32{}, map[uint32]bool{}
		if prev.base[ns] == base {
			for _, k := range keys {
				if c, ok := prev.class[ns][k]; ok {
					kept[k], used[c] = c, true
				}
			}
		}
		c := uint32(1)
		for _, k := range keys {
			if _, ok := kept[k]; ok {
				continue
			}
			for used[c] {
				c++
			}
			kept[k], used[c] = c, true
		}
		next.class[ns] = kept
		for _, k := range keys {
			ids.namespaces[ns] = append(ids.namespaces[ns], base|kept[k])
		}
		slices.Sort(ids.namespaces[ns])
	}
	for i, k := range keyOf {
		if k != "" {
			ns := r.Pod(i).Namespace
			ids.of[i] = next.base[ns] | next.class[ns][k]
		}
	}
	*prev = *next
	return ids, nil
}

// adoptedNumbering is the numbering a kernel's table shows: each pod whose
// address its pod-ids maps hold gives its namespace that identity's
// namespace part and its label set (keyOf, by pod) the class part. A
// number claimed for two namespaces or two label sets of one namespace (a
// table of another state) is kept for the first only; what no pod shows
// is numbered afresh.
func adoptedNumbering(r *eval.Resolved, keyOf []string, kernel *nft.Table) *Identities {
	held := map[string]uint32{}
	for _, f := range nft.Families {
		if s := kernel.Sets[mapPodIDs+f.Suffix]; s != nil {
			for _, e := range s.Elements {
				if len(e.Data) == 4 {
					held[string(e.Key)] = binary.NativeEndian.Uint32(e.Data)
				}
			}
		}
	}
	n := &Identities{base: map[string]uint32{}, class: map[string]map[string]uint32{}}
	baseOwner := map[uint32]string{}
	classOwner := map[uint32]string{} // identity -> label set
	for i, key := range keyOf {
		if key == "" {
			continue
		}
		p := r.Pod(i)
		a := p.Addrs[0]
		id, ok := held[string(nft.FamilyOf(a).AddrBytes(a))]
		if !ok || id == 0 {
			continue
		}
		base, class := id&^(namespaceSpan-1), id&(namespaceSpan-1)
		if b, ok := n.base[p.Namespace]; ok && b != base || baseOwner[base] != "" && baseOwner[base] != p.Namespace {
			continue
		}
		if c, ok := n.class[p.Namespace][key]; ok && c != class || classOwner[id] != "" && classOwner[id] != key {
			continue
		}
		n.base[p.Namespace], baseOwner[base] = base, p.Namespace
		if n.class[p.Namespace] == nil {
			n.class[p.Namespace] = map[string]uint32{}
		}
		n.class[p.Namespace][key], classOwner[id] = class, key
	}
	return n
}

// namedPortsSignature is what resolves a pod's named ports.
func namedPortsSignature(ports []corev1.ContainerPort) string {
	var out []string
	for _, p := range ports {
		if p.Name != "" {
			out = append(out, p.Name+"/"+string(policy.ContainerPortProtocol(p))+"/"+strconv.Itoa(int(p.ContainerPort)))
		}
	}
	if len(out) > 1 {
		slices.Sort(out)
	}
	return strings.Join(out, ",")
}

// orderNamespaces sorts namespaces by the values of their label keys,
// the keys with the fewest distinct values first, then by name.
func orderNamespaces(nsLabels map[string]labels.Set) []string {
	values := map[string]map[string]bool{}
	for _, ls := range nsLabels {
		for k, v := range ls {
			if values[k] == nil {
				values[k] = map[string]bool{}
			}
			values[k][v] = true
		}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		return cmp.Or(cmp.Compare(len(values[a]), len(values[b])), strings.Compare(a, b))
	})
	tuple := func(ns string) []string {
		out := make([]string, 0, len(keys)+1)
		for _, k := range keys {
			v, ok := nsLabels[ns][k]
			if !ok {
				v = "\xff" // unlabelled after every value
			}
			out = append(out, v)
		}
		return append(out, ns)
	}
	names := make([]string, 0, len(nsLabels))
	tuples := map[string][]string{}
	for ns := range nsLabels {
		names = append(names, ns)
		tuples[ns] = tuple(ns)
	}
	slices.SortFunc(names, func(a, b string) int { return slices.Compare(tuples[a], tuples[b]) })
	return names
}

// idAddr is an identity as a 4-byte address: identity ranges reuse the
// address range machinery (union, flatten), and an address's bytes are
// the identity as an interval set of marks holds it (nft.MarkKeyBytes).
func idAddr(id uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], id)
	return netip.AddrFrom4(b)
}

// ranges is the identities of the pods, as ranges: a namespace all of
// whose identities are in is its whole span; neighbouring ranges merge.
func (ids *identities) ranges(pods []int) []addrRange {
	list := make([]uint32, 0, len(pods))
	for _, pod := range pods {
		if id := ids.of[pod]; id != 0 {
			list = append(list, id)
		}
	}
	// Pods in (namespace, name) order give each namespace's identities
	// as one run: sorting the runs on their own is enough. Otherwise
	// the whole list is sorted.
	sorted := true
	seen := map[uint32]bool{}
	for i, id := range list {
		if base := id &^ (namespaceSpan - 1); i == 0 || base != list[i-1]&^(namespaceSpan-1) {
			if seen[base] {
				sorted = false
				break
			}
			seen[base] = true
		}
	}
	if !sorted {
		slices.Sort(list)
	}
	var out []addrRange
	for i := 0; i < len(list); {
		base := list[i] &^ (namespaceSpan - 1)
		j := i
		for j < len(list) && list[j]&^(namespaceSpan-1) == base {
			j++
		}
		run := list[i:j]
		if sorted {
			slices.Sort(run)
		}
		ns := ids.nsOf[base]
		out = append(out, ids.portion(ns, slices.Compact(run), ids.namespaces[ns])...)
		i = j
	}
	return union(out)
}

// span is namespace ns's identities as one range: all it may number.
func (ids *identities) span(ns string) addrRange {
	base := ids.base[ns]
	return addrRange{idAddr(base), idAddr(base | (namespaceSpan - 1))}
}

// portion is what ranges makes of selected, some of namespace ns's
// identities all: its whole span when they are all, else each one.
func (ids *identities) portion(ns string, selected, all []uint32) []addrRange {
	if len(selected) > 0 && len(selected) == len(all) {
		return []addrRange{ids.span(ns)}
	}
	var out []addrRange
	for _, id := range selected {
		out = append(out, singleAddr(idAddr(id)))
	}
	return out
}

// idCompiler builds one node's table in the identity layout.
type idCompiler struct {
	r    *eval.Resolved
	pols []*policy.Policy
	node int
	t    *nft.Table
	ids  *identities
	// relevant are the pod label keys identities are made of, sorted.
	relevant []string
	// classes maps a class key to its chain and pass verdict;
	// policyChains a policy's rules (by policy, direction, rules) to
	// their chain; tiers a next tier's key to its chain.
	classes             map[string]idClass
	policyChains, tiers map[string]string
	policyRuns          map[[2]int32]string // a policy's chain by (policy, direction)
	// idSets are the identity sets by content; ruleIDs the identity
	// ranges of each rule's pod peers.
	idSets  map[string]string
	ruleIDs map[[3]int][]addrRange
	// peerDefIDs are the identity ranges of pod peers by how they are
	// written (namespace, namespace and pod selectors); peerDefs what
	// those peers select, ruleDef each rule's definition.
	peerDefIDs map[string][]addrRange
	peerDefs   map[string][]policy.Subject
	ruleDef    map[[3]int]string
	// The chains whose rules name identity sets, with what built them:
	// a namespace relabelled changes which identities a peer holds, and
	// IdentityIncremental builds those chains again (IdentityIncremental.refresh).
	policyRecipes map[string]policyRecipe
	npRecipes     map[string]npRecipe
	// uses are the identity and allow-list sets each such chain made or
	// named; building is the chain being built ("" outside them).
	uses     map[string]map[string]bool
	building string
	// namedIDSets are the Admin and Baseline egress named-port sets by
	// identity, with their ports; egressNamedAllow says a NetworkPolicy
	// allow-list resolves egress named ports on every identity.
	namedIDSets      map[string][]policy.Port
	egressNamedAllow bool
	// ingressNamed are the ingress named-port sets (by name without the
	// family suffix) with their ports: they hold the local pods'
	// addresses. namedNets are the networks of egress NetworkPolicy
	// rules with named ports: a pod address in them is allowed by
	// address, not identity.
	ingressNamed map[string][]policy.Port
	namedNets    map[*nft.Family][]addrRange
	rules        *compiler // the address layout's helpers: networks, ports, domains
	// chainSig is what each class and Baseline tier chain jumps to: the
	// next compile reuses a chain of the same name and jumps.
	chainSig map[string]string
	// from is set when r holds the node's pods alone (IdentityIncremental.Rebase).
	from *fromLast
	// audit, when set, puts the verdict log on the deciding rules (audit.go).
	audit *Audit
	// counters puts per-rule counters on them (counters.go).
	counters bool
	// shadow is set in the shadow compile of the staged policies
	// (shadow.go): its objects are named apart and its verdicts mark the
	// connection instead of deciding. funnel, in the enforced compile
	// beside one, sends every final verdict through the chains that
	// compare it with the shadow's.
	shadow *shadow
	funnel bool
}

// fromLast is what a compile whose evaluator holds only the node's pods
// takes from the last compile (last, its table), which held the
// cluster's: the identity ranges of pod peers (selectIDs, over the
// identities), the egress named-port sets (which hold every identity and
// host-network pod, by name), and the chains whose recipes are unchanged
// (reuse). missing is the first thing the compile needed that none of
// these has.
type fromLast struct {
	last      lastRecords
	table     *nft.Table
	selectIDs func(subjects []policy.Subject) []addrRange
	missing   string
	// index is the last compile's policies by value (an unchanged
	// policy is the same *policy.Policy: policy.Cache), idSetKey its
	// identity sets' contents by name.
	index    map[*policy.Policy]int32
	idSetKey map[string]string
	reused   int // chains taken
}

// lastRecords are what a compile takes from the one before it: its
// records, not the compile itself, which would hold the one before it in
// turn (every compile since the last full one, and its evaluator of the
// cluster's identities).
type lastRecords struct {
	chainSig                  map[string]string
	uses                      map[string]map[string]bool
	namedIDSets, ingressNamed map[string][]policy.Port
	ruleDef                   map[[3]int]string
	peerDefIDs                map[string][]addrRange
	peerDefs                  map[string][]policy.Subject
}

func newFromLast(last *idCompiler, table *nft.Table, selectIDs func([]policy.Subject) []addrRange) *fromLast {
	records := lastRecords{chainSig: last.chainSig, uses: last.uses, namedIDSets: last.namedIDSets, ingressNamed: last.ingressNamed,
		ruleDef: last.ruleDef, peerDefIDs: last.peerDefIDs, peerDefs: last.peerDefs}
	f := &fromLast{last: records, table: table, selectIDs: selectIDs,
		index: make(map[*policy.Policy]int32, len(last.pols)), idSetKey: make(map[string]string, len(last.idSets))}
	for i, p := range last.pols {
		f.index[p] = int32(i)
	}
	for key, name := range last.idSets {
		f.idSetKey[name] = key
	}
	return f
}

// lacks records that the compile needed the cluster's pods for what.
func (f *fromLast) lacks(what string) {
	if f.missing == "" {
		f.missing = what
	}
}

// idClass is a class's chain and what its pods' pass map entries hold
// (nil when its Admin tier is empty); dnsClient says its pods' DNS
// answers are learned (its Admin or Baseline rules name domains).
type idClass struct {
	chain     string
	pass      *nft.Verdict
	dnsClient bool
}

func compileIdentities(r *eval.Resolved, opts Options) (*nft.Table, error) {
	c, err := buildIdentities(r, opts, nil)
	if err != nil {
		return nil, err
	}
	return c.t, nil
}

// buildIdentities compiles the node's table; each pod-network pod is
// given to pod (when not nil) with its identity and, for a pod of the
// node, its classes by direction (IdentityIncremental records them).
func buildIdentities(r *eval.Resolved, opts Options, pod podClasses) (*idCompiler, error) {
	node := r.NodeIndex(opts.Node)
	if node < 0 {
		return nil, fmt.Errorf("node %q is not in the snapshot", opts.Node)
	}
	// Staged policies' peers number identities too: the shadow
	// evaluation shares the enforced one's pod-ids maps.
	relevant := selectedLabelKeys(localPolicies(append(r.Policies(), opts.Staged...), localPods(r, node))) // r.Policies is a copy
	ids, err := newIdentities(r, opts.Identities, relevant, opts.Adopt)
	if err != nil {
		return nil, err
	}
	return buildIdentitiesFrom(r, opts, node, relevant, ids, nil, pod)
}

// buildIdentitiesFrom is buildIdentities with the pods numbered (ids) and,
// for a compile of the node's pods alone (from not nil), what it takes
// from the last compile instead of the cluster's pods.
func buildIdentitiesFrom(r *eval.Resolved, opts Options, node int, relevant []string, ids *identities, from *fromLast, pod podClasses) (*idCompiler, error) {
	t := nft.NewTable(opts.Table)
	c := newIDCompiler(r, node, t, ids, relevant)
	c.from, c.audit, c.counters = from, opts.Audit, opts.RuleCounters
	// The shadow evaluation where a staged policy selects a pod of the
	// node: elsewhere it would change no verdict.
	c.funnel = len(opts.Staged) > 0 && len(localPolicies(opts.Staged, localPods(r, node))) > 0
	if c.funnel && from != nil {
		return nil, errStagedIncremental
	}
	c.fixedObjects()
	if opts.DNS != nil {
		if err := c.rules.dnsChains(opts.DNS); err != nil {
			return nil, err
		}
	}
	if !opts.AgentPorts.Empty() {
		c.rules.protectAgentPorts(opts.AgentPorts) // in the input chain, as the address layout does
	}
	// An address two pods claim is the first one's: in pod-ids, and in
	// each direction's dispatch (with its pass and DNS entries).
	claimed := map[addrClaim]bool{}
	for i := 0; i < r.NumPods(); i++ {
		p := r.Pod(i)
		if p.HostNetwork || ids.of[i] == 0 {
			continue
		}
		var classes [2]idClass
		if p.Node == node {
			for _, d := range policy.Directions {
				classes[d] = c.class(i, d)
			}
		}
		elems := podElements(ids.of[i], p.Addrs, p.Node == node, classes, opts.DNS != nil, "")
		for _, e := range elems {
			if !claimed[e.claim] {
				s := t.Sets[e.set]
				s.Elements = append(s.Elements, e.Element)
			}
		}
		for _, e := range elems {
			claimed[e.claim] = true
		}
		if pod != nil {
			pod(i, ids.of[i], classes)
		}
	}
	if c.funnel {
		c.compileShadow(opts)
	}
	for _, s := range t.Sets {
		if c.from == nil || c.from.table.Sets[s.Name] != s { // a set taken keeps its order: IdentityIncremental indexes it
			sortElements(s)
		}
	}
	return c, nil
}

// newIDCompiler is a compile of r's policies for node into table t.
func newIDCompiler(r *eval.Resolved, node int, t *nft.Table, ids *identities, relevant []string) *idCompiler {
	return &idCompiler{r: r, pols: r.Policies(), node: node, t: t, ids: ids, relevant: relevant,
		classes: map[string]idClass{}, policyChains: map[string]string{}, tiers: map[string]string{}, policyRuns: map[[2]int32]string{},
		idSets: map[string]string{}, ruleIDs: map[[3]int][]addrRange{}, peerDefIDs: map[string][]addrRange{},
		peerDefs: map[string][]policy.Subject{}, ruleDef: map[[3]int]string{},
		policyRecipes: map[string]policyRecipe{}, npRecipes: map[string]npRecipe{}, uses: map[string]map[string]bool{},
		namedIDSets: map[string][]policy.Port{}, chainSig: map[string]string{},
		ingressNamed: map[string][]policy.Port{}, namedNets: map[*nft.Family][]addrRange{},
		rules: &compiler{r: r, pols: r.Policies(), node: node, t: t, peerCache: map[peerKey][]addrRange{}}}
}

// setElement is an element and the set it belongs to; claim is what of
// an address it stands for (pod-ids, a direction, self): of two pods with
// one address, the first claims it.
type setElement struct {
	set   string
	claim addrClaim
	nft.Element
}

// addrClaim is a use of an address: "ids", a direction's prefix, "self".
type addrClaim struct {
	use  string
	addr netip.Addr
}

// podElements are the elements a pod-network pod with identity id and
// addresses addrs puts in the node's table: its pod-ids entries and, for a
// pod of the node (local), its dispatch, pass, self and DNS-client entries.
// With a prefix (the shadow evaluation's, stagedPrefix) they are its
// dispatch, pass and self entries in the maps of that name alone.
func podElements(id uint32, addrs []netip.Addr, local bool, classes [2]idClass, dns bool, prefix string) []setElement {
	var out []setElement
	for _, a := range addrs {
		f := nft.FamilyOf(a)
		key := f.AddrBytes(a)
		if prefix == "" {
			out = append(out, setElement{mapPodIDs + f.Suffix, addrClaim{"ids", a}, nft.Element{Key: key, Data: nft.IntegerBytes(id)}})
		}
		if !local {
			continue
		}
		self := false
		for _, d := range policy.Directions {
			cl := classes[d]
			if cl.chain == "" {
				continue
			}
			self = true
			claim := addrClaim{directionPrefix(d), a}
			out = append(out, setElement{prefix + dispatchMap(d) + f.Suffix, claim, nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.Jump, Chain: cl.chain}}})
			if cl.pass != nil {
				out = append(out, setElement{prefix + passMap(d) + f.Suffix, claim, nft.Element{Key: key, Verdict: cl.pass}})
			}
			if dns && prefix == "" && d == policy.Egress && cl.dnsClient {
				out = append(out, setElement{setDNSClients + f.Suffix, claim, nft.Element{Key: key}})
			}
		}
		if self {
			out = append(out, setElement{prefix + setSelf + f.Suffix, addrClaim{"self", a}, nft.Element{Key: nft.Key(key, key)}})
		}
	}
	return out
}

func passMap(d policy.Direction) string {
	if d == policy.Egress {
		return mapEgressPass
	}
	return mapIngressPass
}

// localSide is the packet address that holds the local pod in direction d.
func localSide(d policy.Direction) nft.Side {
	if d == policy.Egress {
		return nft.Src
	}
	return nft.Dst
}

func (c *idCompiler) fixedObjects() {
	for _, f := range nft.Families {
		if c.shadow == nil {
			c.t.AddSet(&nft.Set{Name: mapPodIDs + f.Suffix, Fields: []nft.FieldType{f.Field}, Data: []nft.FieldType{nft.FieldInteger},
				Typeof: f.Name + " daddr : meta mark"})
		}
		for _, m := range []string{mapEgress, mapIngress, mapEgressPass, mapIngressPass} {
			c.t.AddSet(&nft.Set{Name: c.named(m) + f.Suffix, Fields: []nft.FieldType{f.Field}, Verdict: true})
		}
		c.t.AddSet(&nft.Set{Name: c.named(setSelf) + f.Suffix, Fields: []nft.FieldType{f.Field, f.Field}})
	}
	// One base chain per hook. On forward, egress is decided first and
	// its allow goes on to the ingress dispatch (allowed(Egress)), so a
	// packet pays one base chain, not one per direction; a packet whose
	// source has no egress class goes there at once. On input only egress
	// applies (the destination is the node: the ingress dispatch finds
	// nothing and accepts), on output only ingress.
	ingress := c.t.AddChain(&nft.Chain{Name: c.named(chainIngressDispatch)})
	for _, f := range nft.Families {
		ingress.Rules = append(ingress.Rules, nft.NewRule().Vmap(f, localSide(policy.Ingress), c.named(dispatchMap(policy.Ingress))+f.Suffix))
	}
	end := nft.NewRule().Verdict(c.accept())
	end.Comment = "the destination has no ingress policy"
	ingress.Rules = append(ingress.Rules, end)
	base := []struct {
		chain, hook string
		directions  []policy.Direction
		self        bool
	}{
		{chainForward, nft.HookForward, []policy.Direction{policy.Egress, policy.Ingress}, true},
		{chainInput, nft.HookInput, []policy.Direction{policy.Egress}, false},
		{chainOutput, nft.HookOutput, []policy.Direction{policy.Ingress}, false},
	}
	priority := 0
	if c.shadow != nil {
		priority = shadowPriority
	}
	for _, b := range base {
		ch := c.t.AddChain(&nft.Chain{Name: c.named(b.chain), Base: &nft.Hook{Type: "filter", Hook: b.hook, Priority: priority, Policy: "accept"}})
		ch.Rules = append(ch.Rules,
			nft.NewRule().CtEstablishedRelated().Verdict(verdictAccept),
			nft.NewRule().ICMPv6NeighborDiscovery().Verdict(verdictAccept))
		if c.shadow != nil {
			clear := nft.NewRule().CtMarkClear(shadowMask).Done()
			clear.Comment = "the staged policies' evaluation starts afresh: no would-be verdict yet"
			ch.Rules = append(ch.Rules, clear)
		}
		for _, f := range nft.Families {
			if b.self {
				r := nft.NewRule().In(f, c.named(setSelf)+f.Suffix, nft.AddrOf(f, nft.Src), nft.AddrOf(f, nft.Dst)).Verdict(verdictAccept)
				r.Comment = "a pod reaching itself through its Service (hairpin): policy never applies to a pod's own traffic"
				ch.Rules = append(ch.Rules, r)
			}
		}
		for _, d := range b.directions {
			if d == policy.Ingress && len(b.directions) > 1 {
				ch.Rules = append(ch.Rules, nft.NewRule().Verdict(nft.Verdict{Kind: nft.Goto, Chain: c.named(chainIngressDispatch)}))
				continue
			}
			for _, f := range nft.Families {
				ch.Rules = append(ch.Rules, nft.NewRule().Vmap(f, localSide(d), c.named(dispatchMap(d))+f.Suffix))
			}
		}
		if len(b.directions) == 1 && (c.funnel || c.shadow != nil) {
			// No class: the default allows, said out loud so that the
			// two evaluations compare it.
			end := nft.NewRule().Verdict(c.accept())
			end.Comment = "no policy applies: the default allows"
			ch.Rules = append(ch.Rules, end)
		}
	}
}

// allowed is the verdict of a connection that direction d's policy
// allows: accept, but for egress the destination's ingress is decided
// next (the forward hook's one base chain does both).
func (c *idCompiler) allowed(d policy.Direction) nft.Verdict {
	if d == policy.Egress {
		return nft.Verdict{Kind: nft.Goto, Chain: c.named(chainIngressDispatch)}
	}
	return c.accept()
}

// class returns pod's class for direction d (chain "" when no policy
// applies): its chain, built on first use, and, when its Admin tier can
// Pass, the verdict its pods' pass map entries hold (the next tier's
// chain, or accept: the default allows).
func (c *idCompiler) class(pod int, d policy.Direction) idClass {
	plan := c.r.Plan(pod, d)
	if plan == nil || plan.Empty() {
		return idClass{}
	}
	named := ""
	if d == policy.Ingress {
		named = c.rules.resolveNamedPorts(plan.Allow, pod)
	}
	key := plan.Key + named
	if cl, ok := c.classes[key]; ok {
		return cl
	}
	next := c.nextTier(plan, pod, named)
	cl := idClass{chain: c.named(directionPrefix(d) + "." + contentID(key)), dnsClient: d == policy.Egress && c.namesDomains(plan)}
	if len(plan.Admin) > 0 {
		v := c.defaultAllow(d)
		if next != "" {
			v = nft.Verdict{Kind: nft.Goto, Chain: next}
		}
		cl.pass = &v
	}
	c.classes[key] = cl
	var jumps []string
	for _, group := range byPolicy(plan.Admin) {
		jumps = append(jumps, c.policyChain(group, d, policy.TierAdmin))
	}
	end := nft.NewRule().Verdict(c.defaultAllow(d))
	end.Comment = "no policy decided: the default allows"
	if next != "" {
		end = nft.NewRule().Verdict(nft.Verdict{Kind: nft.Goto, Chain: next})
		if len(plan.Admin) > 0 {
			end.Comment = "no Admin rule decided: on to the next tier"
		}
	}
	if c.reuseJumps(cl.chain, jumps, end) {
		return cl
	}
	ch := c.t.AddChain(&nft.Chain{Name: cl.chain})
	peer := peerSide(d)
	ch.Rules = append(ch.Rules, nft.NewRule().MarkSetConst(0).Done())
	for _, f := range nft.Families {
		r := nft.NewRule().MarkSetMap(f, mapPodIDs+f.Suffix, nft.AddrOf(f, peer)).Done()
		r.Comment = "the peer's identity, in the packet mark (0: not a pod-network pod)"
		ch.Rules = append(ch.Rules, r)
	}
	for _, name := range jumps {
		ch.Rules = append(ch.Rules, nft.NewRule().Verdict(nft.Verdict{Kind: nft.Jump, Chain: name}))
	}
	ch.Rules = append(ch.Rules, end)
	return cl
}

// reuseJumps takes chain name, a class or Baseline tier chain that jumps
// to jumps and ends in end, from the last compile when it was the same
// (fromLast), and records what it is for the next.
func (c *idCompiler) reuseJumps(name string, jumps []string, end *nft.Rule) bool {
	sig := strings.Join(jumps, ",") + "|" + end.ID()
	c.chainSig[name] = sig
	if c.from == nil || c.from.last.chainSig[name] != sig || c.from.table.Chains[name] == nil {
		return false
	}
	c.t.AddChain(c.from.table.Chains[name])
	c.adoptCounters(c.from.table.Chains[name], c.from.table)
	c.from.reused++
	return true
}

// reuse takes chain name (a policy or NetworkPolicy tier chain, built
// from rules of the policies pols) from the last compile when those
// policies are unchanged (fromLast): the chain as it is, the sets it made
// or named, the named ports they resolve, and its rules' pod peers (which
// IdentityIncremental.refresh follows), under this compile's policy indexes.
// Nodes, which a chain's networks read, do not change between compiles
// that keep a table (a Node's change is a full compile).
func (c *idCompiler) reuse(name string, pols []int32, rules []eval.PlanRule, d policy.Direction) bool {
	f := c.from
	if f == nil || f.table.Chains[name] == nil || f.last.uses[name] == nil {
		return false
	}
	for _, pi := range pols {
		if _, ok := f.index[c.pols[pi]]; !ok {
			return false
		}
	}
	last := f.last
	c.t.AddChain(f.table.Chains[name])
	c.adoptCounters(f.table.Chains[name], f.table)
	f.reused++
	c.uses[name] = last.uses[name]
	for set := range last.uses[name] {
		if c.t.Sets[set] == nil && f.table.Sets[set] != nil {
			c.t.AddSet(f.table.Sets[set])
		}
		if key, ok := f.idSetKey[set]; ok {
			c.idSets[key] = set
		}
		if named, ok := last.namedIDSets[set]; ok {
			c.namedIDSets[set] = named
		}
		if id, ok := strings.CutSuffix(set, "."+nft.IPv4.Suffix); ok {
			if named, ok := last.ingressNamed[id]; ok {
				c.ingressNamed[id] = named
			}
		}
	}
	for _, pr := range rules {
		k := [3]int{int(pr.Policy), int(d), pr.Rule}
		if def, ok := last.ruleDef[[3]int{int(f.index[c.pols[pr.Policy]]), int(d), pr.Rule}]; ok {
			c.ruleDef[k], c.ruleIDs[k] = def, last.peerDefIDs[def]
			c.peerDefIDs[def], c.peerDefs[def] = last.peerDefIDs[def], last.peerDefs[def]
		}
	}
	return true
}

// namesDomains reports whether an Admin or Baseline rule of the plan looks
// up learned domain addresses.
func (c *idCompiler) namesDomains(plan *eval.Plan) bool {
	for _, rules := range [][]eval.PlanRule{plan.Admin, plan.Baseline} {
		for _, pr := range rules {
			if pr.Match != eval.MatchPeersPorts {
				continue
			}
			r := c.rules.rule(pr, plan.Direction)
			if !r.AllPeers && slices.ContainsFunc(r.Peers, func(p policy.Peer) bool { return p.Kind == policy.PeerDomainNames }) {
				return true
			}
		}
	}
	return false
}

// rulesKey names plan rules by their policies' names, not their indexes:
// a policy added elsewhere renumbers the policies, and must not rename
// the chains of others (nor make a node that it does not concern
// rewrite them).
func (c *idCompiler) rulesKey(rules []eval.PlanRule) string {
	var b strings.Builder
	for _, pr := range rules {
		fmt.Fprintf(&b, "%s#%d/%s/%d,", c.pols[pr.Policy].Ref(), pr.Rule, pr.Action, pr.Match)
	}
	return b.String()
}

// byPolicy splits a tier's plan rules into runs of one policy each.
func byPolicy(rules []eval.PlanRule) [][]eval.PlanRule {
	var out [][]eval.PlanRule
	for i, pr := range rules {
		if i == 0 || rules[i-1].Policy != pr.Policy {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], pr)
	}
	return out
}

// policyChain is the chain of one policy's rules in direction d (one run
// of a plan): made once, jumped to from every class it applies to.
func (c *idCompiler) policyChain(rules []eval.PlanRule, d policy.Direction, tier policy.Tier) string {
	// A plan holds every rule of a policy that selects the pod: the run
	// is the policy's, its chain the same in every class.
	run := [2]int32{rules[0].Policy, int32(d)}
	if name, ok := c.policyRuns[run]; ok {
		return name
	}
	p := c.pols[rules[0].Policy]
	key := fmt.Sprintf("%s|%d|%d|%s", p.Ref(), d, tier, c.rulesKey(rules))
	if name, ok := c.policyChains[key]; ok {
		c.policyRuns[run] = name
		return name
	}
	prefix := "adm"
	if tier == policy.TierBaseline {
		prefix = "bl"
	}
	name := c.named(fmt.Sprintf("%s.%s.%s", prefix, contentID(key), directionPrefix(d)))
	c.policyChains[key], c.policyRuns[run] = name, name
	rc := policyRecipe{rules: rules, d: d, tier: tier}
	c.policyRecipes[name] = rc
	if !c.reuse(name, []int32{rules[0].Policy}, rules, d) {
		c.fill(c.t.AddChain(&nft.Chain{Name: name}), func(ch *nft.Chain) { c.fillPolicyChain(ch, rc) })
	}
	return name
}

// policyRecipe is what a policy chain is built from.
type policyRecipe struct {
	rules []eval.PlanRule
	d     policy.Direction
	tier  policy.Tier
}

// fill builds ch's rules with build, recording the sets they make or name
// as ch's (uses).
func (c *idCompiler) fill(ch *nft.Chain, build func(*nft.Chain)) {
	outer := c.building
	c.building = ch.Name
	c.uses[ch.Name] = map[string]bool{}
	build(ch)
	c.building = outer
}

// use records that the chain being built names set.
func (c *idCompiler) use(set string) {
	if c.building != "" {
		c.uses[c.building][set] = true
	}
}

func (c *idCompiler) fillPolicyChain(ch *nft.Chain, rc policyRecipe) {
	p := c.pols[rc.rules[0].Policy]
	var pass *nft.Verdict // nil: through the pass map
	if rc.tier == policy.TierBaseline {
		v := c.defaultAllow(rc.d)
		pass = &v // a Baseline Pass goes to the default
	}
	for _, pr := range rc.rules {
		r := c.rules.rule(pr, rc.d)
		comment := fmt.Sprintf("%s %s: %s", p.Ref(), r.Ref(rc.d), r.Action)
		if r.FailClosed != "" {
			comment += " (fails closed: " + r.FailClosed + ")"
		}
		var log *auditLog
		if pr.Action != policy.Pass {
			log = c.audit.logOf(p, nft.Attribution{Verdict: verdictWord(pr.Action), Direction: rc.d.String(), Tier: rc.tier.String(),
				Policy: p.Ref(), Rule: r.Ref(rc.d), Action: pr.Action.String()})
		}
		dc := c.decider(log, c.ruleCounter(p, r.Ref(rc.d), pr.Action, rc.d))
		dc.stage = c.shadow.mark(p, nft.Attribution{Direction: rc.d.String(), Tier: rc.tier.String(), Policy: p.Ref(), Rule: r.Ref(rc.d), Action: pr.Action.String()})
		for _, nr := range c.ruleMatches(pr, rc.d, pr.Action, pass, dc) {
			nr.Comment = comment
			ch.Rules = append(ch.Rules, nr)
		}
	}
}

// ruleMatches compiles one Admin or Baseline rule: its peers (identities,
// networks, learned domains) and ports as lookups, ending in the action's
// verdict (a Pass without a pass verdict ends in the pass map), written
// by dc.
func (c *idCompiler) ruleMatches(pr eval.PlanRule, d policy.Direction, action policy.Action, pass *nft.Verdict, dc decider) []*nft.Rule {
	end := func(match func() *nft.Builder, f *nft.Family) []*nft.Rule {
		// Into a pass map: its family matched before the counters, which
		// would otherwise count the other family's packets too.
		passing := func(f *nft.Family) *nft.Rule {
			m := match
			if len(dc.counters) > 0 {
				m = func() *nft.Builder { return match().Family(f) }
			}
			return dc.counted(m)().Vmap(f, localSide(d), c.named(passMap(d))+f.Suffix)
		}
		switch {
		case action == policy.Accept:
			return dc.decide(match, c.allowed(d))
		case action == policy.Deny:
			return dc.decide(match, c.drop())
		case pass != nil:
			return []*nft.Rule{dc.counted(match)().Verdict(*pass)}
		case f != nil:
			return []*nft.Rule{passing(f)}
		}
		// A family-free match (identities) in both families' pass maps.
		var out []*nft.Rule
		for _, f := range nft.Families {
			out = append(out, passing(f))
		}
		return out
	}
	switch pr.Match {
	case eval.MatchNothing:
		return nil
	case eval.MatchAll:
		return end(nft.NewRule, nil)
	}
	pi, ri, r := int(pr.Policy), pr.Rule, c.rules.rule(pr, d)
	sets := c.ruleSets(pi, d, ri)
	numbered, named := splitPorts(r.Ports)
	// The peer matches: nil is every peer; f says the match is of one
	// family.
	type peerMatch struct {
		f     *nft.Family
		match func(*nft.Builder) *nft.Builder
	}
	var peers []peerMatch
	if r.AllPeers {
		peers = append(peers, peerMatch{nil, func(b *nft.Builder) *nft.Builder { return b }})
	} else {
		if set := c.idSet(pi, d, ri); set != "" {
			peers = append(peers, peerMatch{nil, func(b *nft.Builder) *nft.Builder { return b.In(nil, set, nft.MarkKey()) }})
		}
		for _, f := range nft.Families {
			var prefixes []string
			if sets.nets != "" && len(c.t.Sets[sets.nets+f.Suffix].Elements) > 0 {
				prefixes = append(prefixes, sets.nets)
			}
			prefixes = append(prefixes, sets.domains...)
			for _, prefix := range prefixes {
				peers = append(peers, peerMatch{f, func(b *nft.Builder) *nft.Builder { return b.AddrInSet(f, peerSide(d), prefix+f.Suffix) }})
			}
		}
	}
	var out []*nft.Rule
	for _, pm := range peers {
		if r.AllPorts {
			out = append(out, end(func() *nft.Builder { return pm.match(nft.NewRule()) }, pm.f)...)
			continue
		}
		if len(numbered) > 0 {
			out = append(out, end(func() *nft.Builder { return pm.match(nft.NewRule()).L4ProtoPortInSet(sets.ports) }, pm.f)...)
		}
		if len(named) > 0 {
			for _, nm := range c.namedPortMatches(named, d) {
				if pm.f != nil && nm.f != nil && nm.f != pm.f {
					continue
				}
				out = append(out, end(func() *nft.Builder { return nm.match(pm.match(nft.NewRule())) }, cmp.Or(pm.f, nm.f))...)
			}
		}
	}
	return out
}

// ruleSets makes the sets of one Admin/Baseline rule that the identity
// layout keeps from the address layout: its numbered ports, its node and
// ipBlock networks (per family) and its domainNames' learned addresses.
func (c *idCompiler) ruleSets(pi int, d policy.Direction, ri int) ruleSetNames {
	r := &c.pols[pi].Rules[d][ri]
	var names ruleSetNames
	if numbered, _ := splitPorts(r.Ports); len(numbered) > 0 {
		elems := portElements(portBoxes(numbered))
		names.ports = "ports." + contentID(fmt.Sprint(elems))
		c.rules.addSharedSet(&nft.Set{Name: names.ports, Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true}, func() []nft.Element { return elems })
		c.use(names.ports)
	}
	if r.AllPeers {
		return names
	}
	if slices.ContainsFunc(r.Peers, func(p policy.Peer) bool { return p.Kind == policy.PeerNodes || p.Kind == policy.PeerIPBlock }) {
		names.nets = "nets." + contentID(peersDefinition(r.Peers)) + "."
	}
	for _, p := range r.Peers {
		if p.Kind == policy.PeerDomainNames {
			for _, name := range p.DomainNames {
				if prefix := DomainSetPrefix(name); !slices.Contains(names.domains, prefix) {
					names.domains = append(names.domains, prefix)
				}
			}
		}
	}
	for _, f := range nft.Families {
		if names.nets != "" {
			c.rules.addSharedSet(&nft.Set{Name: names.nets + f.Suffix, Fields: []nft.FieldType{f.Field}, Interval: true},
				func() []nft.Element { return rangeElements(c.rules.peerRanges(pi, d, ri, f), f) })
			c.use(names.nets + f.Suffix)
		}
		for _, prefix := range names.domains {
			c.rules.addSharedSet(DomainSet(prefix, f), func() []nft.Element { return nil })
			c.use(prefix + f.Suffix)
		}
	}
	return names
}

// namedMatch is one way to match named ports on the destination.
type namedMatch struct {
	f     *nft.Family
	match func(*nft.Builder) *nft.Builder
}

// namedPortMatches resolves named ports on the destination: for ingress the
// local pods (by address), for egress a pod-network destination by its
// identity (in the mark) and a host-network one by its address.
func (c *idCompiler) namedPortMatches(named []policy.Port, d policy.Direction) []namedMatch {
	id := "named." + contentID(fmt.Sprint(named)+directionPrefix(d))
	var out []namedMatch
	if d == policy.Egress {
		name := id + ".ids"
		c.namedIDSets[name] = named
		if c.t.Sets[name] == nil && c.from != nil {
			c.carry(name)
		}
		if c.t.Sets[name] == nil {
			s := c.t.AddSet(&nft.Set{Name: name, Fields: []nft.FieldType{nft.FieldInteger, nft.FieldProto, nft.FieldPort}, Interval: true,
				Typeof: "meta mark . meta l4proto . th dport"})
			seen := map[uint32]bool{}
			for j := 0; j < c.r.NumPods(); j++ {
				idj := c.ids.of[j]
				if idj == 0 || seen[idj] {
					continue
				}
				seen[idj] = true
				s.Elements = append(s.Elements, namedIDElements(idj, named, c.r.Pod(j).Ports)...)
			}
		}
		c.use(name)
		if len(c.t.Sets[name].Elements) > 0 {
			out = append(out, namedMatch{nil, func(b *nft.Builder) *nft.Builder {
				return b.In(nil, name, nft.MarkKey(), nft.L4Proto(), nft.DstPort())
			}})
		}
	}
	if d == policy.Ingress {
		c.ingressNamed[id] = named
	}
	for _, f := range nft.Families {
		name := id + "." + f.Suffix
		if c.t.Sets[name] == nil && c.from != nil && d == policy.Egress {
			c.carry(name) // host-network pods of every node
		}
		if c.t.Sets[name] == nil {
			s := c.t.AddSet(&nft.Set{Name: name, Fields: []nft.FieldType{f.Field, nft.FieldProto, nft.FieldPort}})
			seen := map[string]bool{}
			for j := 0; j < c.r.NumPods(); j++ {
				p := c.r.Pod(j)
				local := p.Node == c.node && !p.HostNetwork
				if d == policy.Ingress && !local || d == policy.Egress && !p.HostNetwork {
					continue
				}
				for _, a := range p.Addrs {
					if !inFamily(a, f) {
						continue
					}
					for _, b := range namedMatches(named, p.Ports) {
						k := nft.Key(f.AddrBytes(a), nft.ProtoBytes(b.protoLo), nft.PortBytes(b.portLo))
						if !seen[string(k)] {
							seen[string(k)] = true
							s.Elements = append(s.Elements, nft.Element{Key: k})
						}
					}
				}
			}
		}
		c.use(name)
		if len(c.t.Sets[name].Elements) > 0 {
			out = append(out, namedMatch{f, func(b *nft.Builder) *nft.Builder {
				return b.AddrL4ProtoPortInSet(f, nft.Dst, name)
			}})
		}
	}
	return out
}

// carry takes set name from the last compile (fromLast), or records that
// only the cluster's pods can fill it.
func (c *idCompiler) carry(name string) {
	if s := c.from.table.Sets[name]; s != nil {
		c.t.AddSet(s)
		return
	}
	c.from.lacks("egress named-port set " + name + ", which no compile has filled yet")
}

// namedIDElements are identity id's elements in an egress named-port set
// of named: its ports of those names.
func namedIDElements(id uint32, named []policy.Port, ports []corev1.ContainerPort) []nft.Element {
	var out []nft.Element
	for _, b := range namedMatches(named, ports) {
		k := nft.Key(nft.MarkKeyBytes(id), nft.ProtoBytes(b.protoLo), nft.PortBytes(b.portLo))
		out = append(out, intervalElement(k, k))
	}
	return out
}

// peerIDs is the identity ranges of rule ri's pod peers.
func (c *idCompiler) peerIDs(pi int, d policy.Direction, ri int) []addrRange {
	k := [3]int{pi, int(d), ri}
	if rs, ok := c.ruleIDs[k]; ok {
		return rs
	}
	// Rules whose pod peers are written alike select the same pods: the
	// realistic shape's Admin policies repeat a few peers hundreds of
	// times.
	var def strings.Builder
	var subjects []policy.Subject
	for _, p := range c.pols[pi].Rules[d][ri].Peers {
		if p.Kind == policy.PeerPods {
			fmt.Fprintf(&def, "%s|%s|%s;", p.Namespace, p.Namespaces, p.Pods)
			subjects = append(subjects, p.PodSubject())
		}
	}
	c.ruleDef[k] = def.String()
	if rs, ok := c.peerDefIDs[def.String()]; ok {
		c.ruleIDs[k] = rs
		return rs
	}
	var rs []addrRange
	if c.from != nil {
		rs, ok := c.from.last.peerDefIDs[def.String()]
		if !ok {
			rs = c.from.selectIDs(subjects)
		}
		c.ruleIDs[k], c.peerDefIDs[def.String()], c.peerDefs[def.String()] = rs, rs, subjects
		return rs
	}
	var pods []int
	for j := range c.r.EachPeerPod(pi, d, ri) {
		pods = append(pods, j)
	}
	rs = c.ids.ranges(pods)
	c.ruleIDs[k], c.peerDefIDs[def.String()], c.peerDefs[def.String()] = rs, rs, subjects
	return rs
}

// idSet is the set of the identities rule ri's pod peers have, shared by
// every rule whose peers have the same ("" when none).
func (c *idCompiler) idSet(pi int, d policy.Direction, ri int) string {
	rs := c.peerIDs(pi, d, ri)
	if len(rs) == 0 {
		return ""
	}
	return c.idSetOf(rs)
}

func (c *idCompiler) idSetOf(rs []addrRange) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s-%s,", r.lo, r.hi) // the identities, as their 4-byte addresses
	}
	key := b.String()
	name, ok := c.idSets[key]
	if !ok {
		name = "ids." + contentID(key)
		c.idSets[key] = name
		c.t.AddSet(&nft.Set{Name: name, Fields: []nft.FieldType{nft.FieldInteger}, Interval: true, Typeof: "meta mark", Elements: rangeElements(rs, nft.IPv4)})
	}
	c.use(name)
	return name
}

// nextTier returns the chain of the plan's NetworkPolicy tier or, when
// none isolates the pod, of its Baseline tier ("" when neither).
func (c *idCompiler) nextTier(plan *eval.Plan, pod int, named string) string {
	if len(plan.Isolating) > 0 {
		return c.networkPolicyTier(plan, pod, named)
	}
	if len(plan.Baseline) == 0 {
		return ""
	}
	key := fmt.Sprintf("baseline|%d|%s", plan.Direction, c.rulesKey(plan.Baseline))
	if name, ok := c.tiers[key]; ok {
		return name
	}
	name := c.named(directionPrefix(plan.Direction) + ".bl." + contentID(key))
	c.tiers[key] = name
	var jumps []string
	for _, group := range byPolicy(plan.Baseline) {
		jumps = append(jumps, c.policyChain(group, plan.Direction, policy.TierBaseline))
	}
	end := nft.NewRule().Verdict(c.defaultAllow(plan.Direction))
	end.Comment = "no Baseline rule decided: the default allows"
	if c.reuseJumps(name, jumps, end) {
		return name
	}
	ch := c.t.AddChain(&nft.Chain{Name: name})
	for _, jump := range jumps {
		ch.Rules = append(ch.Rules, nft.NewRule().Verdict(nft.Verdict{Kind: nft.Jump, Chain: jump}))
	}
	ch.Rules = append(ch.Rules, end)
	return name
}
