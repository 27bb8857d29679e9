package eval

import (
	"cmp"
	"iter"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/policy"
)

// bitset is a set of small integers (pod, identity or node indexes). It
// keeps the words from its first member's to its last member's (lo is
// the first one's index): a selection is mostly one namespace's pods or
// identities, a few words, where a bit for each of the cluster's was
// 3.4 KB at 27,000 identities, for each of thousands of selectors (the
// agent's evaluator keeps them).
type bitset struct {
	lo    int
	words []uint64
}

// newBitset is an empty set of integers under n, every word kept (set
// writes any of them).
func newBitset(n int) bitset { return bitset{words: make([]uint64, (n+63)/64)} }

// set adds i, which must be within the words kept.
func (b bitset) set(i int) { b.words[i/64-b.lo] |= 1 << (uint(i) % 64) }

func (b bitset) has(i int) bool {
	if i < 0 {
		return false
	}
	w := i/64 - b.lo
	return w >= 0 && w < len(b.words) && b.words[w]&(1<<(uint(i)%64)) != 0
}

// take returns b's members in a bitset of their words alone, and empties
// b for its next use (a scratch set, all of whose words are kept).
func (b bitset) take() bitset {
	first, last := 0, len(b.words)
	for first < last && b.words[first] == 0 {
		first++
	}
	for last > first && b.words[last-1] == 0 {
		last--
	}
	if first == last {
		return bitset{}
	}
	out := bitset{lo: b.lo + first, words: slices.Clone(b.words[first:last])}
	clear(b.words[first:last])
	return out
}

// members yields the integers in the set, in order (no list is made: a
// full compile walks every rule's peer pods).
func (b bitset) members() iter.Seq[int] {
	return func(yield func(int) bool) {
		for w, word := range b.words {
			for word != 0 {
				bit := bits.TrailingZeros64(word)
				if !yield((b.lo+w)*64 + bit) {
					return
				}
				word &= word - 1
			}
		}
	}
}

// podInfo is what the evaluator needs of one pod, precomputed.
type podInfo struct {
	// namespace and labels, not the pod: the snapshot's pods may be
	// made for one sync only (the agent's lean pods), so the index keeps
	// none of them alive.
	namespace   string
	labels      labels.Set
	key         string // namespace/name
	hostNetwork bool
	node        int // index into nodes, -1 when unknown
	addrs       []netip.Addr
	ports       []corev1.ContainerPort
	nsLabels    labels.Set
}

type nodeInfo struct {
	node  *corev1.Node
	addrs []netip.Addr
}

// compiledPolicy is a model policy with its selectors resolved against the
// snapshot's pods and nodes.
type compiledPolicy struct {
	*policy.Policy
	// subjectIdents are the identities of the pod-network pods the
	// policy applies to (isSubject).
	subjectIdents bitset
	// compiled holds the rules with their peers resolved, made on first
	// use (rules): a node's compile needs only the rules of the policies
	// that select its pods.
	compiled     [2][]compiledRule
	compiledOnce sync.Once
	ix           *index
}

// rules are the policy's rules for direction d with their peers resolved.
func (cp *compiledPolicy) rules(d policy.Direction) []compiledRule {
	cp.compiledOnce.Do(cp.compileRules)
	return cp.compiled[d]
}

type compiledRule struct {
	*policy.Rule
	pods     bitset // pod-network pods matched by any pods/namespaces peer
	nodes    bitset // nodes matched by any nodes peer
	ipBlocks []policy.Peer
	domains  []string // the domainNames patterns of its peers (they match DNS-learned IPs)
}

// index holds the snapshot resolved for fast lookups: every selector is
// matched once, here, and evaluation only tests bits.
type index struct {
	pods []podInfo
	// podsSorted says pods are in (namespace, name) order, as the
	// sequences given are: a pod is then found by binary search. The
	// lookups by key and by address serve explain's queries, not a
	// compile, so the agent's full syncs do not build 100,000-entry maps
	// for them: by key is a search, by address a map made on first use.
	podsSorted bool
	byKeyOnce  sync.Once
	podByKey   map[string]int // only when the pods came unsorted
	byIPOnce   sync.Once
	podByIP    map[netip.Addr]int // pod-network pods only
	// idents group the pod-network pods by namespace and labels: pods
	// that share both are selected by the same selectors, so selectors
	// are matched against identities and policies walked by them, not by
	// pods (a Deployment's pods are one identity).
	idents []identity
	// identOf[pod] is the pod's identity, -1 for a host-network pod.
	identOf []int32
	// identsByNamespace lists the identities of each namespace.
	identsByNamespace map[string][]int
	nodes             []nodeInfo
	nodeByIP          map[netip.Addr]int
	policies          []*compiledPolicy // model order
	// bySelecting[tier][dir][identity] lists the policies (indexes into
	// policies, in evaluation order) that apply to the identity's pods
	// (see selecting). Kept by identity, not by pod: pods of one
	// identity share their lists, and 6 slice headers per pod add up.
	bySelecting [3][2][][]int32
	// plans are the pods' plans, made on first use (planOf).
	plans plans
	// selected caches selectPods by selector: policies share selectors
	// (every "all pods of namespaces labelled ..." peer is one), and each
	// distinct one is matched against the identities once. The bitsets
	// are shared and never written after they are made.
	selected   map[string]*selection
	none       *selection // what a selector of a namespace without pods selects
	selectedMu sync.Mutex
	// scratchIdents and scratchPods are where a selection is made, all
	// of their words kept, before it keeps its own (bitset.take); under
	// selectedMu.
	scratchIdents, scratchPods bitset
}

// identity is a namespace (by its labels) and a set of pod labels, and
// the pod-network pods that have them.
type identity struct {
	nsLabels labels.Set
	labels   labels.Set
	pods     []int
}

// selection is what one selector selects: identities, and their pods
// (made on first use: a subject needs only its identities, and a bitset of
// every pod for each of 10,000 policies was most of a full sync's
// garbage).
type selection struct {
	idents   bitset
	pods     bitset
	podsMade bool
}

// buildIndex indexes the snapshot's pods, in (namespace, name) order.
func buildIndex(snap *cluster.Snapshot, model *policy.Model) *index {
	// The names are copied next to each other first, so that the sort's
	// comparisons do not visit the pods (100,000 of them: most of the
	// sort's time).
	type named struct {
		ns, name string
		pod      *corev1.Pod
	}
	pods := make([]named, len(snap.Pods))
	for i, p := range snap.Pods {
		pods[i] = named{p.Namespace, p.Name, p}
	}
	slices.SortFunc(pods, func(a, b named) int {
		return cmp.Or(strings.Compare(a.ns, b.ns), strings.Compare(a.name, b.name))
	})
	return buildIndexFrom(snap, model, func(yield func(*corev1.Pod) bool) {
		for _, n := range pods {
			if !yield(n.pod) {
				return
			}
		}
	}, len(pods))
}

// buildIndexFrom indexes the pods of the sequence (snap's are not read),
// which yields them in (namespace, name) order. A yielded pod is read
// during its step only; the index keeps strings, label maps and port
// lists it holds, never the pod. podCount is how many pods it yields,
// about (0: unknown): the pod lists and maps are made that size (grown one
// append at a time, 100,000 pods' lists took five times their size).
func buildIndexFrom(snap *cluster.Snapshot, model *policy.Model, pods iter.Seq[*corev1.Pod], podCount int) *index {
	ix := &index{nodeByIP: map[netip.Addr]int{}, identsByNamespace: map[string][]int{}, selected: map[string]*selection{},
		pods: make([]podInfo, 0, podCount), identOf: make([]int32, 0, podCount), podsSorted: true}
	identByKey := map[string]int{}
	nodeByName := map[string]int{}
	for _, n := range snap.Nodes {
		ni := nodeInfo{node: n}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ni.addrs = append(ni.addrs, ip.Unmap())
				ix.nodeByIP[ip.Unmap()] = len(ix.nodes)
			}
		}
		nodeByName[n.Name] = len(ix.nodes)
		ix.nodes = append(ix.nodes, ni)
	}
	nsLabels := map[string]labels.Set{}
	for _, ns := range snap.Namespaces {
		nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	for p := range pods {
		if cluster.PodFinished(p) {
			continue // finished pods hold no address and are in no policy
		}
		pi := podInfo{namespace: p.Namespace, labels: p.Labels, key: p.Namespace + "/" + p.Name, hostNetwork: p.Spec.HostNetwork, node: -1,
			nsLabels: nsLabels[p.Namespace]}
		if pi.nsLabels == nil {
			// A pod whose namespace is not in the snapshot still has the
			// label the API server puts on every namespace.
			pi.nsLabels = labels.Set{"kubernetes.io/metadata.name": p.Namespace}
		}
		if n, ok := nodeByName[p.Spec.NodeName]; ok {
			pi.node = n
		}
		pi.addrs = cluster.PodAddresses(p)
		pi.ports = cluster.ContainerPorts(p)
		idx := len(ix.pods)
		if idx > 0 && comparePod(&ix.pods[idx-1], pi.namespace, p.Name) >= 0 {
			ix.podsSorted = false
		}
		ident := int32(-1)
		if !pi.hostNetwork {
			ident = int32(ix.identity(identByKey, p.Namespace, pi.nsLabels, p.Labels))
			ix.idents[ident].pods = append(ix.idents[ident].pods, idx)
		} else if pi.node < 0 {
			for _, a := range pi.addrs {
				if n, ok := ix.nodeByIP[a]; ok {
					pi.node = n
				}
			}
		}
		ix.pods = append(ix.pods, pi)
		ix.identOf = append(ix.identOf, ident)
	}
	ix.setPolicies(model.Policies)
	return ix
}

// setPolicies resolves pols (in evaluation order) against the indexed pods.
func (ix *index) setPolicies(pols []*policy.Policy) {
	for _, pol := range pols {
		ix.policies = append(ix.policies, ix.compile(pol))
	}
	ix.indexSelecting()
	ix.initPlans()
}

// indexSelecting finds, once, the policies selecting each identity,
// shared by its pods (read-only). The lists are counted first and cut
// from one array, each with no spare room (a later append copies): grown
// one policy at a time, they left a copy of garbage per growth.
func (ix *index) indexSelecting() {
	byIdent := &ix.bySelecting
	var counts [len(byIdent)][len(byIdent[0])][]int32
	total := 0
	ix.eachSelecting(func(t policy.Tier, d policy.Direction, id, _ int) {
		if counts[t][d] == nil {
			counts[t][d] = make([]int32, len(ix.idents))
		}
		counts[t][d][id]++
		total++
	})
	all := make([]int32, 0, total)
	for t := range byIdent {
		for d := range byIdent[t] {
			byIdent[t][d] = make([][]int32, len(ix.idents))
			for id, n := range counts[t][d] {
				if n == 0 {
					continue // nil, as no policy selects it
				}
				byIdent[t][d][id] = all[len(all) : len(all) : len(all)+int(n)]
				all = all[:len(all)+int(n)]
			}
		}
	}
	ix.eachSelecting(func(t policy.Tier, d policy.Direction, id, pi int) {
		byIdent[t][d][id] = append(byIdent[t][d][id], int32(pi))
	})
}

// eachSelecting calls f for each policy pi, identity id it selects, and
// direction d it applies to there (for the NetworkPolicy tier, the
// directions it isolates), in policy order.
func (ix *index) eachSelecting(f func(t policy.Tier, d policy.Direction, id, pi int)) {
	for pi, cp := range ix.policies {
		for id := range cp.subjectIdents.members() {
			for _, d := range policy.Directions {
				if cp.Tier == policy.TierNetworkPolicy && !cp.Isolates[d] {
					continue
				}
				f(cp.Tier, d, id, pi)
			}
		}
	}
}

// selecting lists the policies (indexes into policies, in evaluation
// order) of a tier that apply to the pod in direction d; for the
// NetworkPolicy tier only those that isolate it. Host-network pods have
// none.
func (ix *index) selecting(t policy.Tier, d policy.Direction, pod int) []int32 {
	id := ix.identOf[pod]
	if id < 0 {
		return nil
	}
	return ix.bySelecting[t][d][id]
}

// identity returns the index of the identity of a pod-network pod in
// namespace ns with podLabels, adding it when new.
func (ix *index) identity(byKey map[string]int, ns string, nsLabels labels.Set, podLabels map[string]string) int {
	key := ns + "\x00" + labels.Set(podLabels).String()
	if id, ok := byKey[key]; ok {
		return id
	}
	id := len(ix.idents)
	byKey[key] = id
	ix.idents = append(ix.idents, identity{nsLabels: nsLabels, labels: labels.Set(podLabels)})
	ix.identsByNamespace[ns] = append(ix.identsByNamespace[ns], id)
	return id
}

func (ix *index) compile(pol *policy.Policy) *compiledPolicy {
	return &compiledPolicy{Policy: pol, subjectIdents: ix.selectIdents(pol.Subject), ix: ix}
}

// isSubject reports whether the policy applies to pod.
func (cp *compiledPolicy) isSubject(pod int) bool {
	id := cp.ix.identOf[pod]
	return id >= 0 && cp.subjectIdents.has(int(id))
}

func (cp *compiledPolicy) compileRules() {
	ix := cp.ix
	for _, d := range policy.Directions {
		for ri := range cp.Rules[d] {
			r := &cp.Rules[d][ri]
			cr := compiledRule{Rule: r, nodes: newBitset(len(ix.nodes))}
			var peerSets []bitset
			for _, peer := range r.Peers {
				switch peer.Kind {
				case policy.PeerPods:
					peerSets = append(peerSets, ix.selectPods(peer.PodSubject()))
				case policy.PeerNodes:
					for i, n := range ix.nodes {
						if peer.Nodes.Matches(labels.Set(n.node.Labels)) {
							cr.nodes.set(i)
						}
					}
				case policy.PeerIPBlock:
					cr.ipBlocks = append(cr.ipBlocks, peer)
				case policy.PeerDomainNames:
					cr.domains = append(cr.domains, peer.DomainNames...)
				}
			}
			cr.pods = union(peerSets)
			cp.compiled[d] = append(cp.compiled[d], cr)
		}
	}
}

// union is the union of sets: the one set itself when there is one (shared,
// read-only), else a new one, of the words they span.
func union(sets []bitset) bitset {
	if len(sets) == 1 {
		return sets[0]
	}
	lo, hi := 0, 0 // the words spanned
	for _, s := range sets {
		if len(s.words) == 0 {
			continue
		}
		if hi == 0 || s.lo < lo {
			lo = s.lo
		}
		hi = max(hi, s.lo+len(s.words))
	}
	if hi == 0 {
		return bitset{}
	}
	out := bitset{lo: lo, words: make([]uint64, hi-lo)}
	for _, s := range sets {
		for w, word := range s.words {
			out.words[s.lo+w-lo] |= word
		}
	}
	return out
}

// selectPods is the pod-network pods s selects, shared with every other
// use of the same selector (do not write to it).
func (ix *index) selectPods(s policy.Subject) bitset {
	ix.selectedMu.Lock() // rules are compiled on first use, by any goroutine
	defer ix.selectedMu.Unlock()
	sel := ix.selectionLocked(s)
	if !sel.podsMade {
		if len(ix.scratchPods.words) == 0 {
			ix.scratchPods = newBitset(len(ix.pods))
		}
		for id := range sel.idents.members() {
			for _, pod := range ix.idents[id].pods {
				ix.scratchPods.set(pod)
			}
		}
		sel.pods, sel.podsMade = ix.scratchPods.take(), true
	}
	return sel.pods
}

// selectIdents is the identities s selects (shared, read only).
func (ix *index) selectIdents(s policy.Subject) bitset {
	ix.selectedMu.Lock()
	defer ix.selectedMu.Unlock()
	return ix.selectionLocked(s).idents
}

// selectionLocked matches s against the identities once per distinct
// selector: policies share selectors (every "all pods of namespaces
// labelled ..." peer is one). Namespaces are matched once each, and only
// their identities are tested against the pod selector: a NetworkPolicy
// looks at one namespace, not the cluster, and pods that share labels are
// tested once.
func (ix *index) selectionLocked(s policy.Subject) *selection {
	if s.Namespace != "" && len(ix.identsByNamespace[s.Namespace]) == 0 {
		// A NetworkPolicy of a namespace without pods here: most of
		// them when the snapshot is one node's pods (compiler.Incremental.Rebase).
		if ix.none == nil {
			ix.none = &selection{podsMade: true}
		}
		return ix.none
	}
	key := s.Key()
	if out, ok := ix.selected[key]; ok {
		return out
	}
	out := &selection{}
	ix.selected[key] = out
	if len(ix.scratchIdents.words) == 0 {
		ix.scratchIdents = newBitset(len(ix.idents))
	}
	defer func() { out.idents = ix.scratchIdents.take() }()
	match := func(ns string, idents []int) {
		if len(idents) == 0 || !s.Namespaces.Matches(ix.idents[idents[0]].nsLabels) {
			return // the namespace is tested once, not per identity
		}
		for _, id := range idents {
			if s.Selects(ns, ix.idents[id].nsLabels, ix.idents[id].labels) {
				ix.scratchIdents.set(id)
			}
		}
	}
	if s.Namespace != "" {
		match(s.Namespace, ix.identsByNamespace[s.Namespace])
		return out
	}
	for ns, idents := range ix.identsByNamespace {
		match(ns, idents)
	}
	return out
}

// Endpoint is one side of a connection: a pod, or a bare address (an
// external host or a node).
type Endpoint struct {
	Pod  int        // index of the pod, -1 for a bare address
	Addr netip.Addr // the address the connection uses
	Node int        // the node that owns Addr (node address or host-network pod), else -1
}

// pick is the address of family f among a pod's (its first, its primary,
// for ipfamily.Any).
func pick(f ipfamily.Family, addrs []netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		if f.Has(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (ix *index) podNetwork(ep Endpoint) bool {
	return ep.Pod >= 0 && !ix.pods[ep.Pod].hostNetwork
}

// podEndpoint makes the endpoint of pod i for family f.
func (ix *index) podEndpoint(i int, f ipfamily.Family) (Endpoint, bool) {
	p := ix.pods[i]
	addr, ok := pick(f, p.addrs)
	ep := Endpoint{Pod: i, Addr: addr, Node: -1}
	if p.hostNetwork {
		ep.Node = p.node
	}
	return ep, ok
}

// comparePod orders a pod by (namespace, name) against another's.
func comparePod(p *podInfo, namespace, name string) int {
	return cmp.Or(strings.Compare(p.namespace, namespace), strings.Compare(p.key[len(p.namespace)+1:], name))
}

// podByName finds a pod by its "namespace/name" key.
func (ix *index) podByName(key string) (int, bool) {
	if !ix.podsSorted {
		ix.byKeyOnce.Do(func() {
			ix.podByKey = make(map[string]int, len(ix.pods))
			for i := range ix.pods {
				ix.podByKey[ix.pods[i].key] = i
			}
		})
		i, ok := ix.podByKey[key]
		return i, ok
	}
	namespace, name, _ := strings.Cut(key, "/")
	return slices.BinarySearchFunc(ix.pods, name, func(p podInfo, name string) int { return comparePod(&p, namespace, name) })
}

// podByAddr finds the pod-network pod with address a (unmapped).
func (ix *index) podByAddr(a netip.Addr) (int, bool) {
	ix.byIPOnce.Do(func() {
		ix.podByIP = make(map[netip.Addr]int, len(ix.pods))
		for i := range ix.pods {
			if ix.identOf[i] < 0 {
				continue // host network: its addresses are its node's
			}
			for _, a := range ix.pods[i].addrs {
				ix.podByIP[a] = i
			}
		}
	})
	i, ok := ix.podByIP[a]
	return i, ok
}

// addrEndpoint makes the endpoint for a bare address: the pod-network pod
// that has it, else a node (or host-network pod's node), else external.
func (ix *index) addrEndpoint(a netip.Addr) Endpoint {
	a = a.Unmap()
	if i, ok := ix.podByAddr(a); ok {
		return Endpoint{Pod: i, Addr: a, Node: -1}
	}
	ep := Endpoint{Pod: -1, Addr: a, Node: -1}
	if n, ok := ix.nodeByIP[a]; ok {
		ep.Node = n
	}
	return ep
}
