package compiler

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// IdentityLive is the identity layout's incremental table (what Live is to
// the address layout). In this layout a pod of another node is nothing but
// its pod-ids entries: a pod whose namespace and labels are an identity
// the last compile numbered is added, moved or removed by writing those
// entries alone, whatever the number of policies that select it. A pod of
// the node whose namespace, labels and ports are those of one compiled
// (its class is known) adds its dispatch, pass, self, DNS-client and
// ingress named-port entries too. Anything that changes what an identity
// is or which identities a peer holds (a new identity, the last pod of one
// gone, namespace labels, policies that apply here) needs a full compile
// (NeedsFullError); the numbering kept across compiles (Identities) makes
// that one send only what changed.
type IdentityLive struct {
	opts      Options
	table     *nft.Table
	numbering *Identities
	relevant  map[string]bool
	pods      map[string]idPod
	// claims counts the pods that hold each address: of two, only a
	// full compile says whose the address is.
	claims map[netip.Addr]int
	perID  map[uint32]int        // pods by identity
	users  map[string]int        // the node's pods by class chain
	ns     map[string]labels.Set // namespaces with pods: their labels
	// classes are the classes (by direction) of the node's pods, by
	// classSignature.
	classes      map[string][2]idClass
	ingressNamed map[string][]policy.Port
	namedNets    map[*nft.Family][]addrRange
	pos          map[string]map[string]int
	dnsServers   []netip.AddrPort
}

// idPod is what IdentityLive keeps of a pod.
type idPod struct {
	id          uint32 // 0: host network, or no address yet
	hostNetwork bool
	addrs       []netip.Addr
	local       *PodState // a pod-network pod of the node
}

// NewIdentityLive compiles the node's table in the identity layout (as
// Compile) and keeps what it needs to update it.
func NewIdentityLive(r *eval.Resolved, opts Options) (*IdentityLive, error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	if opts.Identities == nil {
		opts.Identities = &Identities{}
	}
	classes := map[string][2]idClass{}
	c, err := buildIdentities(r, opts, func(i int, _ uint32, cl [2]idClass) {
		if p := r.Pod(i); p.Node >= 0 && r.NodeName(p.Node) == opts.Node {
			classes[classSignature(p.Namespace, p.Labels, p.Ports)] = cl
		}
	})
	if err != nil {
		return nil, err
	}
	for _, s := range c.t.Sets {
		s.Revision = revisions.Add(1)
	}
	l := &IdentityLive{opts: opts, table: c.t, numbering: opts.Identities, relevant: c.relevant,
		pods: make(map[string]idPod, r.NumPods()), claims: make(map[netip.Addr]int, r.NumPods()),
		perID: map[uint32]int{}, users: map[string]int{}, ns: map[string]labels.Set{}, classes: classes,
		ingressNamed: c.ingressNamed, namedNets: c.namedNets, pos: map[string]map[string]int{}}
	if opts.DNS != nil {
		l.dnsServers = slices.Clone(opts.DNS.Servers)
	}
	for i := 0; i < r.NumPods(); i++ {
		v := r.Pod(i)
		l.ns[v.Namespace] = v.NamespaceLabels
		ip := idPod{id: c.ids.of[i], hostNetwork: v.HostNetwork, addrs: v.Addrs}
		if ip.id != 0 && v.Node == c.node {
			ip.local = &PodState{Key: v.Key, Namespace: v.Namespace, Node: opts.Node, Labels: v.Labels, Addrs: v.Addrs, Ports: v.Ports}
		}
		l.add(ip, +1)
		l.pods[v.Key] = ip
	}
	return l, nil
}

// Table is the current table, valid until the next Update.
func (l *IdentityLive) Table() *nft.Table { return l.table }

// Snapshot is a copy of the current table that later updates do not
// change.
func (l *IdentityLive) Snapshot() *nft.Table { return snapshot(l.table) }

// add counts p in (delta +1) or out (-1) of the claims, identities and
// class users.
func (l *IdentityLive) add(p idPod, delta int) {
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
		for _, cl := range l.localClasses(p.local) {
			if cl.chain != "" {
				l.users[cl.chain] += delta
			}
		}
	}
}

func (l *IdentityLive) localClasses(p *PodState) [2]idClass {
	return l.classes[classSignature(p.Namespace, p.Labels, p.Ports)]
}

// SelectsLocal reports whether s selects a pod-network pod of this node:
// a policy whose subject does not (before and after a change) changes
// nothing in the node's table, nor which labels identities are made of.
func (l *IdentityLive) SelectsLocal(s policy.Subject) bool {
	for _, p := range l.pods {
		if p.local != nil && s.Selects(p.local.Namespace, l.ns[p.local.Namespace], p.local.Labels) {
			return true
		}
	}
	return false
}

// Update applies ch and returns the table, or a NeedsFullError (the state
// is then unchanged).
func (l *IdentityLive) Update(ch Changes) (*nft.Table, error) {
	for _, ns := range ch.Namespaces {
		if cur, ok := l.ns[ns]; ok && !maps.Equal(cur, ch.NamespaceLabels(ns)) {
			return nil, &NeedsFullError{Reason: "namespace " + ns + ", which has pods, was relabelled"}
		}
	}
	next := make(map[string]idPod, len(ch.Pods))
	for key, p := range ch.Pods {
		np, err := l.podOf(key, p)
		if err != nil {
			return nil, err
		}
		next[key] = np
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

// podOf is what a changed pod (nil: deleted) will be, or why only a full
// compile can place it (an address two pods held before the change is
// the first one's, which only a full compile knows).
func (l *IdentityLive) podOf(key string, p *PodState) (idPod, error) {
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
	class, known := l.numbering.class[p.Namespace][identityKey(p.Labels, p.Ports, l.relevant)]
	if !numbered || !known {
		return idPod{}, &NeedsFullError{Reason: "pod " + key + " is a new identity"}
	}
	np := idPod{id: base | class, addrs: p.Addrs}
	if p.Node == l.opts.Node {
		if _, ok := l.classes[classSignature(p.Namespace, p.Labels, p.Ports)]; !ok {
			return idPod{}, &NeedsFullError{Reason: "pod " + key + " of this node is a new class"}
		}
		np.local = p
	}
	return np, nil
}

// checkCounts says whether the counts after a change (of the pods next)
// are ones an update can follow: no address held twice, no identity or
// class left without pods.
func (l *IdentityLive) checkCounts(next map[string]idPod) error {
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
func (l *IdentityLive) namedLeft(e setElement, next map[string]idPod) int {
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
func (l *IdentityLive) elements(p idPod) []setElement {
	if p.id == 0 {
		return nil
	}
	var classes [2]idClass
	if p.local != nil {
		classes = l.localClasses(p.local)
	}
	return append(podElements(p.id, p.addrs, p.local != nil, classes, l.opts.DNS != nil), l.namedElements(p.local)...)
}

// namedElements are the ingress named-port entries of a pod of the node
// (nil: none).
func (l *IdentityLive) namedElements(p *PodState) []setElement {
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
func (l *IdentityLive) patch(del, add []setElement) {
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
func (l *IdentityLive) SetDNSServers(servers []netip.AddrPort) (*nft.Table, error) {
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
func (l *IdentityLive) DNSServers() []netip.AddrPort { return slices.Clone(l.dnsServers) }
