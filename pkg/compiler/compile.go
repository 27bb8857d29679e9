// Package compiler turns the policy model, resolved against a snapshot by
// the evaluator, into the nftables ruleset one node enforces (an
// nft.Table). Layout (see docs/architecture.md):
//
//   - base chains on forward (pod <-> pod, after DNAT), output (node ->
//     local pod) and input (local pod -> own node), each starting with
//     `ct state established,related accept` and ICMPv6 neighbour discovery;
//   - dispatch through verdict maps keyed by local pod address
//     (egress-pods4/6 on saddr, ingress-pods4/6 on daddr) into one chain
//     per pod class: local pods whose policies are the same share a chain;
//   - in a class chain, Admin rules in order (Accept -> return, Deny ->
//     drop, Pass -> the next tier), then either the NetworkPolicy allow-list
//     (one concatenated set lookup per family, then drop) or the Baseline
//     rules; the end of the chain returns (default allow);
//   - every peer is a named set, so pods coming, going or changing labels
//     change set elements, not rules.
package compiler

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// DefaultTable is the inet table netpol owns on every node.
const DefaultTable = "netpol"

// Options say which node to compile for.
type Options struct {
	Node  string
	Table string // default DefaultTable
	// AgentPorts, when not empty, protects the agent's own ports in the
	// input chain (agentports.go).
	AgentPorts *AgentPorts
	// DNS, when set, queues the cluster DNS's answers to the node's pods
	// with domainNames rules to the agent (dns.go).
	DNS *DNS
	// Layout is the table's layout (identity.go; the zero value is the
	// address layout, DefaultLayout the agent's); Incremental keeps an address
	// layout table up to date, IdentityIncremental an identity layout one.
	Layout Layout
	// Identities, with the identity layout, is the numbering of the
	// node's last compile, kept where it still fits and updated to this
	// compile's (nil: numbered afresh).
	Identities *Identities
	// Adopt, with the identity layout and an empty Identities, is the
	// node's table as the kernel holds it (an agent's restart): the
	// identities its pod-ids maps give the pods are kept, so that the
	// compile sends the kernel nothing it already holds.
	Adopt *nft.Table
	// Audit, when set, writes the connections policy decides to the
	// verdict log (audit.go; the identity layout only).
	Audit *Audit
	// RuleCounters puts a named counter of its policy rule on every rule
	// that decides (counters.go; the identity layout only).
	RuleCounters bool
	// Staged are the staged policies (policy.Model.Staged): not
	// enforced, but evaluated beside the enforced ones, logging and
	// counting the connections whose verdict they would change
	// (shadow.go; the identity layout only: the address layout leaves
	// them out).
	Staged []*policy.Policy
}

// Names of the fixed objects.
const (
	chainForward = "forward"
	chainInput   = "input"
	chainOutput  = "output"
	mapEgress    = "egress-pods"  // + family suffix: local pod saddr -> class
	mapIngress   = "ingress-pods" // + family suffix: local pod daddr -> class
	setSelf      = "self-pods"    // + family suffix: addr . addr of policed local pods
)

// Compile builds the desired nftables table for one node from the
// evaluator's resolution of a snapshot and its policy model.
func Compile(r *eval.Resolved, opts Options) (*nft.Table, error) {
	if opts.Audit != nil && opts.Layout != LayoutIdentities {
		return nil, errAuditLayout
	}
	if opts.RuleCounters && opts.Layout != LayoutIdentities {
		return nil, errCountersLayout
	}
	if opts.Layout == LayoutIdentities {
		if opts.Table == "" {
			opts.Table = DefaultTable
		}
		return compileIdentities(r, opts)
	}
	// The sets of pod addresses are filled by the code that keeps them
	// up to date pod by pod (Incremental): one answer to which elements
	// go in which set, for a full compile, an update and a rebase.
	l, err := NewIncremental(r, opts)
	if err != nil {
		return nil, err
	}
	for _, s := range l.table.Sets {
		sortElements(s)
	}
	return l.table, nil
}

// compile builds the node's classes and chains, and the sets that do not
// depend on the cluster's pods. The sets of pod addresses (peers, named
// ports, allow-lists) are made without elements: Incremental fills them
// (fillSets) from every pod, or a rebase takes them from the old table.
func compile(r *eval.Resolved, opts Options) (*compiler, error) {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	node := r.NodeIndex(opts.Node)
	if node < 0 {
		return nil, fmt.Errorf("node %q is not in the snapshot", opts.Node)
	}
	c := &compiler{r: r, pols: r.Policies(), node: node, t: nft.NewTable(opts.Table),
		classes: map[string]string{}, lists: map[string]*npTier{}, peerCache: map[peerKey][]addrRange{}, ruleSets: map[peerKey]ruleSetNames{}, self: map[string]bool{},
		live: &recipe{podSets: map[string][]policy.Subject{}, namedSets: map[string][]policy.Port{}, classes: map[string][2]string{}, domainClasses: map[string]bool{}}}
	c.baseChains()
	if !opts.AgentPorts.Empty() {
		c.protectAgentPorts(opts.AgentPorts)
	}
	if opts.DNS != nil {
		c.live.dns = true
		if err := c.dnsChains(opts.DNS); err != nil {
			return nil, err
		}
	}
	dispatched := map[string]bool{}
	for i := 0; i < r.NumPods(); i++ {
		p := r.Pod(i)
		if p.Node != node || p.HostNetwork || len(p.Addrs) == 0 {
			continue
		}
		var classes [2]string
		for _, d := range policy.Directions {
			chain := c.class(i, d)
			classes[d] = chain
			if chain == "" {
				continue
			}
			c.addSelf(p.Addrs)
			for _, a := range p.Addrs {
				f := nft.FamilyOf(a)
				m := c.t.Sets[dispatchMap(d)+f.Suffix]
				key := f.AddrBytes(a)
				if dispatched[string(key)+m.Name] {
					continue // two pods claim one address; the first keeps it
				}
				dispatched[string(key)+m.Name] = true
				m.Elements = append(m.Elements, nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.Jump, Chain: chain}})
				if d == policy.Egress && c.live.isDNSClient(chain) {
					s := c.t.Sets[setDNSClients+f.Suffix]
					s.Elements = append(s.Elements, nft.Element{Key: key})
				}
			}
		}
		c.live.classes[classSignature(p.Namespace, p.Labels, p.Ports)] = classes
	}
	// Elements are in the order they were made: Compile sorts them (for
	// people and golden files), Incremental and the kernel need no order.
	return c, nil
}

// addSelf lets a policed pod reach itself: traffic to its own address
// never leaves it, but traffic through its own Service (hairpin) comes back
// through the node after DNAT. Policy never applies to a pod's traffic to
// itself (as the evaluator decides), so neither may the kernel.
func (c *compiler) addSelf(addrs []netip.Addr) {
	for _, a := range addrs {
		f := nft.FamilyOf(a)
		s := c.t.Sets[setSelf+f.Suffix]
		key := nft.Key(f.AddrBytes(a), f.AddrBytes(a))
		if !c.self[string(key)] {
			c.self[string(key)] = true
			s.Elements = append(s.Elements, nft.Element{Key: key})
		}
	}
}

type compiler struct {
	r    *eval.Resolved
	pols []*policy.Policy
	node int
	t    *nft.Table
	// classes maps a class key to its entry chain.
	classes map[string]string
	// lists are the NetworkPolicy allow-lists made, by id: classes that
	// differ only in their Admin or Baseline tiers share one.
	lists map[string]*npTier
	self  map[string]bool // self-pods keys added
	// peerCache memoizes peerRanges, ruleSets ruleSetsFor (by rule: the
	// family is not set): classes share policies.
	peerCache map[peerKey][]addrRange
	ruleSets  map[peerKey]ruleSetNames
	// domains: the class being built looks up a domain set.
	domains bool
	// live is what Incremental needs to keep the table up to date pod by pod.
	live *recipe
}

func dispatchMap(d policy.Direction) string {
	if d == policy.Egress {
		return mapEgress
	}
	return mapIngress
}

// peerSide is the packet address that holds the peer in direction d.
func peerSide(d policy.Direction) nft.Side {
	if d == policy.Egress {
		return nft.Dst
	}
	return nft.Src
}

var (
	verdictReturn = nft.Verdict{Kind: nft.Return}
	verdictDrop   = nft.Verdict{Kind: nft.Drop}
	verdictAccept = nft.Verdict{Kind: nft.Accept}
)

func (c *compiler) baseChains() {
	for _, f := range nft.Families {
		c.t.AddSet(&nft.Set{Name: mapEgress + f.Suffix, Fields: []nft.FieldType{f.Field}, Verdict: true})
		c.t.AddSet(&nft.Set{Name: mapIngress + f.Suffix, Fields: []nft.FieldType{f.Field}, Verdict: true})
		c.t.AddSet(&nft.Set{Name: setSelf + f.Suffix, Fields: []nft.FieldType{f.Field, f.Field}})
	}
	// dispatch lists, per base chain, which directions it polices: forward
	// carries pod -> pod, output node -> local pod (ingress), input local
	// pod -> this node (egress).
	dispatch := []struct {
		chain string
		dirs  []policy.Direction
	}{
		{chainForward, []policy.Direction{policy.Egress, policy.Ingress}},
		{chainInput, []policy.Direction{policy.Egress}},
		{chainOutput, []policy.Direction{policy.Ingress}},
	}
	for _, dp := range dispatch {
		ch := c.t.AddChain(&nft.Chain{Name: dp.chain, Base: &nft.Hook{Type: "filter", Hook: dp.chain, Policy: "accept"}})
		ch.Rules = append(ch.Rules,
			nft.NewRule().CtEstablishedRelated().Verdict(verdictAccept),
			nft.NewRule().ICMPv6NeighborDiscovery().Verdict(verdictAccept))
		if dp.chain == chainForward {
			for _, f := range nft.Families {
				r := nft.NewRule().In(f, setSelf+f.Suffix, nft.AddrOf(f, nft.Src), nft.AddrOf(f, nft.Dst)).Verdict(verdictAccept)
				r.Comment = "a pod reaching itself through its Service (hairpin): policy never applies to a pod's own traffic"
				ch.Rules = append(ch.Rules, r)
			}
		}
		for _, d := range dp.dirs {
			side := nft.Src
			if d == policy.Ingress {
				side = nft.Dst
			}
			for _, f := range nft.Families {
				ch.Rules = append(ch.Rules, nft.NewRule().Vmap(f, side, dispatchMap(d)+f.Suffix))
			}
		}
	}
}

// class returns the entry chain for pod's direction d, building the class
// on first use; "" when no policy applies to it. A class is the pod's plan
// (eval.Plan: the tier semantics, shared by pods with the same policies)
// plus, for ingress, how the pod resolves the named ports its
// NetworkPolicies use.
func (c *compiler) class(pod int, d policy.Direction) string {
	plan := c.r.Plan(pod, d)
	if plan == nil || plan.Empty() {
		return ""
	}
	named := ""
	if d == policy.Ingress {
		named = c.resolveNamedPorts(plan.Allow, pod)
	}
	id := plan.Key + named
	if chain, ok := c.classes[id]; ok {
		return chain
	}
	sum := sha256.Sum256([]byte(id))
	name := directionPrefix(d) + "." + hex.EncodeToString(sum[:6])
	c.classes[id] = name
	c.domains = false
	c.buildClass(name, plan, pod, named)
	if c.domains {
		c.live.domainClasses[name] = true
	}
	return name
}

// directionPrefix starts the names of a direction's classes and
// allow-lists.
func directionPrefix(d policy.Direction) string {
	if d == policy.Ingress {
		return "in"
	}
	return "eg"
}

// resolveNamedPorts renders how pod resolves the port names its ingress
// NetworkPolicy rules use.
func (c *compiler) resolveNamedPorts(allow []eval.PlanRule, pod int) string {
	names := map[string]bool{}
	for _, pr := range allow {
		for _, p := range c.rule(pr, policy.Ingress).Ports {
			if p.Name != "" {
				names[p.Name] = true
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	var out []string
	for _, cp := range c.r.Pod(pod).Ports {
		if names[cp.Name] {
			out = append(out, fmt.Sprintf("%s=%s/%d", cp.Name, policy.ContainerPortProtocol(cp), cp.ContainerPort))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

// rule is the model rule a plan rule names.
func (c *compiler) rule(pr eval.PlanRule, d policy.Direction) *policy.Rule {
	return &c.pols[pr.Policy].Rules[d][pr.Rule]
}

// buildClass writes the class chain(s) of a plan: name holds the Admin
// tier and continues in name+".next" with the NetworkPolicy or Baseline
// tier.
func (c *compiler) buildClass(name string, plan *eval.Plan, pod int, named string) {
	d := plan.Direction
	entry := c.t.AddChain(&nft.Chain{Name: name})
	rest := entry
	after := verdictReturn // where a Pass in the Admin tier goes
	restNeeded := len(plan.Isolating) > 0 || len(plan.Baseline) > 0
	if len(plan.Admin) > 0 && restNeeded {
		rest = c.t.AddChain(&nft.Chain{Name: name + ".next"})
		after = nft.Verdict{Kind: nft.Goto, Chain: rest.Name}
	}
	entry.Rules = append(entry.Rules, c.tierRules(plan.Admin, d, after)...)
	if rest != entry {
		next := nft.NewRule().Verdict(after)
		next.Comment = "no Admin rule decided: on to the next tier"
		entry.Rules = append(entry.Rules, next)
	}
	if len(plan.Isolating) > 0 {
		tier := c.networkPolicyRules(plan, pod, named)
		tier.chain, tier.prefix = rest.Name, len(rest.Rules)
		rest.Rules = append(rest.Rules, tier.rules(c.t)...)
		c.live.npTiers = append(c.live.npTiers, tier)
		return
	}
	rest.Rules = append(rest.Rules, c.tierRules(plan.Baseline, d, verdictReturn)...)
}

// tierRules compiles the Admin or Baseline rules of a plan for direction
// d, in order. pass is where a Pass rule goes.
func (c *compiler) tierRules(rules []eval.PlanRule, d policy.Direction, pass nft.Verdict) []*nft.Rule {
	var out []*nft.Rule
	for _, pr := range rules {
		p, r := c.pols[pr.Policy], c.rule(pr, d)
		v := verdictReturn
		switch pr.Action {
		case policy.Deny:
			v = verdictDrop
		case policy.Pass:
			v = pass
		}
		comment := fmt.Sprintf("%s %s: %s", p.Ref(), r.Ref(d), r.Action)
		if r.FailClosed != "" {
			comment += " (fails closed: " + r.FailClosed + ")"
		}
		// Every nft rule of the policy rule names it (a trace may stop
		// at any of them); Render prints it once.
		for _, nr := range c.tierRule(pr, d, v) {
			nr.Comment = comment
			out = append(out, nr)
		}
	}
	return out
}

// tierRule compiles one Admin/Baseline rule: per family and peer set
// (pod addresses, networks), peers and ports as set lookups, ending in v.
func (c *compiler) tierRule(pr eval.PlanRule, d policy.Direction, v nft.Verdict) []*nft.Rule {
	switch pr.Match {
	case eval.MatchNothing:
		return nil
	case eval.MatchAll:
		return []*nft.Rule{nft.NewRule().Verdict(v)}
	}
	pi, ri, r := int(pr.Policy), pr.Rule, c.rule(pr, d)
	sets := c.ruleSetsFor(pi, d, ri)
	c.domains = c.domains || usesDomains(r, sets)
	numbered, named := splitPorts(r.Ports)
	peerSets := []string{""} // every peer
	if !r.AllPeers {
		peerSets = nil
		for _, s := range []string{sets.pods, sets.nets} {
			if s != "" {
				peerSets = append(peerSets, s)
			}
		}
		peerSets = append(peerSets, sets.domains...)
	}
	var out []*nft.Rule
	for _, f := range nft.Families {
		for _, peers := range peerSets {
			start := func() *nft.Builder {
				b := nft.NewRule()
				if peers != "" {
					b.AddrInSet(f, peerSide(d), peers+f.Suffix)
				}
				return b
			}
			if r.AllPorts {
				out = append(out, start().Verdict(v))
				continue
			}
			if len(numbered) > 0 {
				out = append(out, start().L4ProtoPortInSet(sets.ports).Verdict(v))
			}
			if len(named) > 0 {
				out = append(out, start().AddrL4ProtoPortInSet(f, nft.Dst, sets.named+f.Suffix).Verdict(v))
			}
		}
	}
	return out
}

func splitPorts(ports []policy.Port) (numbered, named []policy.Port) {
	for _, p := range ports {
		if p.Name != "" {
			named = append(named, p)
		} else {
			numbered = append(numbered, p)
		}
	}
	return numbered, named
}

// ruleSetNames are the sets of one Admin/Baseline rule; pods, nets and
// named are prefixes (+ family suffix), "" when the rule has none;
// domains are the prefixes of its domainNames' sets.
type ruleSetNames struct {
	pods, nets, ports, named string
	domains                  []string
}

// DomainSetTimeout is the domain sets' default element lifetime: the
// floor for a TTL-0 answer (the agent gives every address the TTL of its
// record, no less than this).
const DomainSetTimeout = 5 * time.Second

// DomainSetSize is the most addresses a domain set holds: no limit in
// practice (nft's 65535 for dynamic sets would cap a pattern).
const DomainSetSize = 1 << 24

// DomainSetPrefix is the name of a domainNames pattern's sets (+ family
// suffix): the addresses the node's agent learned from DNS answers for
// names the pattern matches, each until its record's TTL runs out. The
// agent fills them; a compile leaves them empty and a sync leaves their
// elements alone (dynamic sets), so nothing learned means nothing
// admitted.
func DomainSetPrefix(pattern string) string { return "dns." + contentID("domain:"+pattern) + "." }

// DomainSet is the set of a DomainSetPrefix in family f.
func DomainSet(prefix string, f *nft.Family) *nft.Set {
	return &nft.Set{Name: prefix + f.Suffix, Fields: []nft.FieldType{f.Field}, Dynamic: true, Timeout: DomainSetTimeout, Size: DomainSetSize}
}

// ruleSetsFor creates the sets one Admin/Baseline rule matches against:
// the addresses of its pod peers (a hash set per family: pods come and go
// one address at a time), of its node and ipBlock peers (an interval set
// per family), its numbered ports, and its named ports resolved on every
// pod (address . protocol . port). Sets are named by what defines them
// (the peers, the ports), so rules with the same peers share one set: a
// pod that comes or goes changes it once.
func (c *compiler) ruleSetsFor(pi int, d policy.Direction, ri int) ruleSetNames {
	key := peerKey{pi: pi, d: d, ri: ri}
	if names, ok := c.ruleSets[key]; ok {
		return names // classes share policies: the sets are there
	}
	names := c.makeRuleSets(pi, d, ri)
	c.ruleSets[key] = names
	return names
}

func (c *compiler) makeRuleSets(pi int, d policy.Direction, ri int) ruleSetNames {
	r := &c.pols[pi].Rules[d][ri]
	numbered, named := splitPorts(r.Ports)
	var names ruleSetNames
	if len(numbered) > 0 {
		elems := portElements(portBoxes(numbered))
		names.ports = "ports." + contentID(fmt.Sprint(elems))
		c.addSharedSet(&nft.Set{Name: names.ports, Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true}, func() []nft.Element { return elems })
	}
	if !r.AllPeers {
		id := "peers." + contentID(peersDefinition(r.Peers))
		subjects := podSubjects(r.Peers)
		if len(subjects) > 0 {
			names.pods = id + ".pods."
			c.live.podSets[names.pods] = subjects
		}
		if slices.ContainsFunc(r.Peers, func(p policy.Peer) bool { return p.Kind == policy.PeerNodes || p.Kind == policy.PeerIPBlock }) {
			names.nets = id + ".nets."
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
	}
	if len(named) > 0 {
		names.named = "named." + contentID(fmt.Sprint(named)) + "."
		c.live.namedSets[names.named] = named
	}
	for _, f := range nft.Families {
		if names.pods != "" {
			c.addSharedSet(&nft.Set{Name: names.pods + f.Suffix, Fields: []nft.FieldType{f.Field}}, noElements)
		}
		if names.nets != "" {
			c.addSharedSet(&nft.Set{Name: names.nets + f.Suffix, Fields: []nft.FieldType{f.Field}, Interval: true},
				func() []nft.Element { return rangeElements(c.peerRanges(pi, d, ri, f), f) })
		}
		for _, prefix := range names.domains {
			c.addSharedSet(DomainSet(prefix, f), noElements)
		}
		if names.named != "" {
			c.addSharedSet(&nft.Set{Name: names.named + f.Suffix, Fields: []nft.FieldType{f.Field, nft.FieldProto, nft.FieldPort}}, noElements)
		}
	}
	return names
}

// podSubjects are the pods peers among peers, as subjects.
func podSubjects(peers []policy.Peer) []policy.Subject {
	var out []policy.Subject
	for _, p := range peers {
		if p.Kind == policy.PeerPods {
			out = append(out, p.PodSubject())
		}
	}
	return out
}

// noElements fills a set that compile makes empty: the agent's (domain
// sets) or Incremental's (the sets of pod addresses, fillSets).
func noElements() []nft.Element { return nil }

// addSharedSet adds s with the elements fill computes, unless a set of
// that name is already there (same definition, same elements).
func (c *compiler) addSharedSet(s *nft.Set, fill func() []nft.Element) {
	if _, ok := c.t.Sets[s.Name]; ok {
		return
	}
	s.Elements = fill()
	c.t.AddSet(s)
}

// peersDefinition is a canonical description of a rule's peers: what
// decides which addresses they match.
func peersDefinition(peers []policy.Peer) string {
	var b strings.Builder
	for _, p := range peers {
		switch p.Kind {
		case policy.PeerPods:
			fmt.Fprintf(&b, "pods(%s|%s|%s)", p.Namespace, p.Namespaces, p.Pods)
		case policy.PeerNodes:
			fmt.Fprintf(&b, "nodes(%s)", p.Nodes)
		case policy.PeerIPBlock:
			fmt.Fprintf(&b, "ipBlock(%v-%v)", p.CIDRs, p.Except)
		case policy.PeerDomainNames:
			fmt.Fprintf(&b, "domains(%v)", p.DomainNames)
		}
	}
	return b.String()
}

// contentID is a short stable hash for object names.
func contentID(definition string) string {
	sum := sha256.Sum256([]byte(definition))
	return hex.EncodeToString(sum[:6])
}

// peerRanges is the network addresses rule ri's peers match in family
// f: nodes and ipBlocks. Pod peers are in podAddrs; domainNames have sets
// of their own (DomainSetPrefix).
func (c *compiler) peerRanges(pi int, d policy.Direction, ri int, f *nft.Family) []addrRange {
	r := &c.pols[pi].Rules[d][ri]
	key := peerKey{pi, d, ri, f}
	if rs, ok := c.peerCache[key]; ok {
		return rs
	}
	var out []addrRange
	for n := 0; n < c.r.NumNodes(); n++ {
		if !c.r.PeerNodes(pi, d, ri, n) {
			continue
		}
		for _, a := range c.r.NodeAddrs(n) {
			if inFamily(a, f) {
				out = append(out, singleAddr(a))
			}
		}
	}
	for _, peer := range r.Peers {
		if peer.Kind == policy.PeerIPBlock {
			out = append(out, blockRanges(peer.CIDRs, peer.Except, f)...)
		}
	}
	out = union(out)
	c.peerCache[key] = out
	return out
}

// peerKey identifies the network peer addresses of one rule in one family.
type peerKey struct {
	pi int
	d  policy.Direction
	ri int
	f  *nft.Family
}

// portBoxes turns numbered ports into protocol x port boxes.
func portBoxes(ports []policy.Port) []portBox {
	var out []portBox
	for _, p := range ports {
		proto, _ := policy.IPProtocol(p.Protocol) // validated by pkg/policy
		b := portBox{proto, proto, 0, 65535}
		if p.Start != 0 {
			b.portLo, b.portHi = uint16(p.Start), uint16(p.End)
		}
		out = append(out, b)
	}
	return out
}

// namedMatches lists the container ports that named ports match.
func namedMatches(named []policy.Port, ports []corev1.ContainerPort) []portBox {
	var out []portBox
	for _, cp := range ports {
		for _, p := range named {
			if p.Resolves(cp) {
				n, _ := policy.IPProtocol(cp.Protocol)
				out = append(out, portBox{n, n, uint16(cp.ContainerPort), uint16(cp.ContainerPort)})
			}
		}
	}
	return out
}

func sortElements(s *nft.Set) {
	slices.SortFunc(s.Elements, func(a, b nft.Element) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return bytes.Compare(a.KeyEnd, b.KeyEnd)
	})
}
