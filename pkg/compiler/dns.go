package compiler

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// DNS makes the node hand the cluster DNS's answers to its pods that
// domainNames rules select to a userspace queue, where the agent learns
// the answers' addresses into the domain sets (pkg/dnssnoop). The queue
// statement has bypass: with no reader, answers pass unread and nothing is
// learned, so domainNames rules admit nothing (fail closed) while DNS
// keeps working.
//
// Layout: a base chain on forward (answers from pods or other nodes) and
// one on output (answers from the node itself, a node-local cache), both
// before the policy chains, queue an established UDP or TCP packet whose
// source address, protocol and port are a DNS server's (dns-servers4/6)
// and whose destination is a node's pod that some domainNames rule
// selects (dns-clients4/6: the pods whose egress class looks up a domain
// set). The reader's accept goes on with the hook's next chain, where the
// policy table's `ct state established` accepts it.
type DNS struct {
	// Queue is the kernel's queue statement (kernel.DetectQueue) and
	// QueueNum the queue the agent reads.
	Queue    nft.QueueKind
	QueueNum uint16
	// Servers are the cluster DNS's addresses and ports: the endpoints of
	// Service kube-system/kube-dns and any the operator names; UDP and TCP
	// answers from each are queued.
	Servers []netip.AddrPort
}

// Names of the DNS objects.
const (
	setDNSServers = "dns-servers" // + family suffix: addr . l4proto . port of the cluster DNS
	setDNSClients = "dns-clients" // + family suffix: local pods whose egress has domainNames
	// DNSChainPriority runs the DNS chains before the policy chains
	// (priority 0) of the same hooks.
	DNSChainPriority = -10
)

// DNSChains are the chains whose rules' counters count the answers
// handed to the queue, read or passed unread.
var DNSChains = []string{"dns-" + chainForward, "dns-" + chainOutput}

// commentDNSAnswers names the queue rules in explain and trace.
const commentDNSAnswers = "answers of the cluster DNS to a pod with domainNames rules: the agent learns their addresses"

// dnsChains adds the DNS sets and chains (see DNS).
func (c *compiler) dnsChains(d *DNS) error {
	for _, f := range nft.Families {
		c.t.AddSet(&nft.Set{Name: setDNSServers + f.Suffix, Fields: []nft.FieldType{f.Field, nft.FieldProto, nft.FieldPort},
			Elements: dnsServerElements(d.Servers, f)})
		c.t.AddSet(&nft.Set{Name: setDNSClients + f.Suffix, Fields: []nft.FieldType{f.Field}})
	}
	for i, hook := range []string{chainForward, chainOutput} {
		ch := c.t.AddChain(&nft.Chain{Name: DNSChains[i], Base: &nft.Hook{Type: "filter", Hook: hook, Priority: DNSChainPriority, Policy: "accept"}})
		for _, f := range nft.Families {
			r, err := nft.NewRule().CtEstablishedRelated().
				In(f, setDNSServers+f.Suffix, nft.AddrOf(f, nft.Src), nft.L4Proto(), nft.SrcPort()).
				AddrInSet(f, nft.Dst, setDNSClients+f.Suffix).
				Counter(). // answers queued, read or not (DNSChains)
				Queue(d.Queue, d.QueueNum)
			if err != nil {
				return fmt.Errorf("the DNS answers' queue: %w", err)
			}
			r.Comment = commentDNSAnswers
			ch.Rules = append(ch.Rules, r)
		}
	}
	return nil
}

// dnsServerElements are the dns-servers elements of family f: each
// server's address and port, for UDP and for TCP.
func dnsServerElements(servers []netip.AddrPort, f *nft.Family) []nft.Element {
	var out []nft.Element
	seen := map[string]bool{}
	for _, s := range servers {
		a := s.Addr().Unmap()
		if nft.FamilyOf(a) != f {
			continue
		}
		for _, proto := range []uint8{17, 6} {
			key := nft.Key(f.AddrBytes(a), nft.ProtoBytes(proto), nft.PortBytes(s.Port()))
			if !seen[string(key)] {
				seen[string(key)] = true
				out = append(out, nft.Element{Key: key})
			}
		}
	}
	return out
}

// isDNSClient reports whether the pods of an egress class chain are DNS
// clients: the table has the DNS objects and the class looks up a domain
// set.
func (r *recipe) isDNSClient(egressChain string) bool {
	return r.dns && r.domainClasses[egressChain]
}

// usesDomains reports whether a rule's peers include domain sets: its
// class's pods are DNS clients.
func usesDomains(r *policy.Rule, names ruleSetNames) bool {
	return !r.AllPeers && len(names.domains) > 0
}

// SetDNSServers makes the dns-servers sets hold servers (in place, as an
// Update does): the cluster DNS's endpoints changed. It is an error when
// the table has no DNS objects (Options.DNS was nil).
func (l *Incremental) SetDNSServers(servers []netip.AddrPort) (*nft.Table, error) {
	if l.opts.DNS == nil {
		return nil, fmt.Errorf("the table has no DNS objects")
	}
	refs := func(list []netip.AddrPort) map[elementRef]bool {
		out := map[elementRef]bool{}
		for _, f := range nft.Families {
			for _, e := range dnsServerElements(list, f) {
				out[elementRef{set: setDNSServers + f.Suffix, key: string(e.Key), f: f}] = true
			}
		}
		return out
	}
	l.patch(refs(l.dnsServers), refs(servers))
	l.dnsServers = slices.Clone(servers)
	return l.table, nil
}

// DNSServers are the servers the dns-servers sets hold.
func (l *Incremental) DNSServers() []netip.AddrPort { return slices.Clone(l.dnsServers) }
