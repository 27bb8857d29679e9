package node

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dnssnoop"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
	"golang.org/x/sys/unix"
)

// DNSOptions turn on domainNames enforcement: the node's policy table
// queues the cluster DNS's answers to its pods with domainNames rules
// (compiler.DNS), and the Programmer reads the queue and learns their
// addresses into the domain sets (dnssnoop.Learner).
type DNSOptions struct {
	// QueueNum is the NFQUEUE queue (default DefaultDNSQueue).
	QueueNum uint16
	// Servers are cluster DNS servers besides the endpoints of Service
	// kube-system/kube-dns (`--dns-server`; a node-local cache, say).
	Servers []netip.AddrPort
	// Learner bounds the learned addresses' lifetimes.
	Learner dnssnoop.LearnerOptions
	// MaxQueueLen is how many answers the kernel holds for the reader
	// (dnssnoop.Config.MaxLen); past it answers pass unread.
	MaxQueueLen uint32
	// Latency, if set, hears each queued answer's time in the agent.
	Latency func(time.Duration)
}

// DefaultDNSQueue is the NFQUEUE queue the DNS answers go to.
const DefaultDNSQueue = 53

// ClusterDNSService is the Service whose endpoints are the cluster DNS.
const ClusterDNSService = "kube-system/kube-dns"

// dnsSnooper is the Programmer's DNS side.
type dnsSnooper struct {
	opts    DNSOptions
	kind    nft.QueueKind
	learner *dnssnoop.Learner
	queue   *dnssnoop.Queue
	netns   int // a copy of the namespace's fd (-1: the current one), for the rule counters
	table   string

	mu       sync.Mutex // DNS() reads these while a sync runs
	patterns []string   // the learner's, as last set
	servers  []netip.AddrPort
}

// DNSStatus is what the DNS side does and has learned.
type DNSStatus struct {
	// Queue is the kernel's queue statement ("no queue": domainNames
	// rules admit nothing on this node).
	Queue    string                `json:"queue"`
	QueueNum uint16                `json:"queueNum,omitempty"`
	Servers  []netip.AddrPort      `json:"servers"`
	Patterns []string              `json:"patterns"`
	Stats    dnssnoop.LearnerStats `json:"stats"`
	// QueuePackets and QueueErrors are the reader's counts.
	QueuePackets uint64 `json:"queuePackets"`
	QueueErrors  uint64 `json:"queueErrors"`
	// QueuedAnswers is what the queue rules' counters counted: answers
	// handed to the queue, read or not. Past the queue's length the
	// kernel lets answers pass unread (fail-open; it counts them nowhere
	// else): QueuedAnswers - QueuePackets.
	QueuedAnswers uint64           `json:"queuedAnswers"`
	Entries       []dnssnoop.Entry `json:"entries"`
}

// startDNS detects the kernel's queue statement and starts reading the
// queue. Without a queue statement the node works without DNS learning
// (domainNames rules admit nothing), which the returned error says; the
// Programmer is still made.
func (p *Programmer) startDNS(netnsFd int, opts DNSOptions) error {
	d := &dnsSnooper{opts: opts, netns: -1, table: p.opts.Table}
	if d.opts.QueueNum == 0 {
		d.opts.QueueNum = DefaultDNSQueue
	}
	kind, err := kernel.DetectQueue(netnsFd)
	if err != nil {
		return fmt.Errorf("domainNames rules admit nothing on this node: the kernel has no queue statement (neither nft_queue nor the xtables NFQUEUE target): %w", err)
	}
	d.kind = kind
	if netnsFd >= 0 {
		if d.netns, err = unix.Dup(netnsFd); err != nil {
			return fmt.Errorf("domainNames: %w", err)
		}
	}
	closeNetNS := func() {
		if d.netns >= 0 {
			unix.Close(d.netns)
		}
	}
	if d.learner, err = dnssnoop.NewLearner(netnsFd, p.opts.Table, d.opts.Learner); err != nil {
		closeNetNS()
		return fmt.Errorf("domainNames: %w", err)
	}
	qfd := netnsFd
	if qfd < 0 {
		qfd = 0 // dnssnoop.Config: 0 is the current namespace
	}
	log := p.opts.Logger
	d.queue, err = dnssnoop.Open(dnssnoop.Config{NetNS: qfd, Num: d.opts.QueueNum, MaxLen: d.opts.MaxQueueLen, Latency: d.opts.Latency},
		d.learner.Handler(func(err error) { log.Debug("a DNS answer taught nothing", "err", err) })) // counted: netpol_dns_answer_errors_total
	if err != nil {
		d.learner.Close()
		closeNetNS()
		return fmt.Errorf("domainNames: %w", err)
	}
	p.dns = d
	log.Info("domainNames: learning from the cluster DNS's answers", "queue", d.opts.QueueNum, "statement", kind.String())
	return nil
}

// compilerDNS is the compiler's view, with the input's servers; nil
// when the node does not learn.
func (p *Programmer) compilerDNS(in *Input) *compiler.DNS {
	if p.dns == nil {
		return nil
	}
	return &compiler.DNS{Queue: p.dns.kind, QueueNum: p.dns.opts.QueueNum, Servers: p.dnsServers(in)}
}

// dnsServers are the endpoints of the cluster DNS Service (ready ones,
// their DNS ports) and the configured servers, sorted.
func (p *Programmer) dnsServers(in *Input) []netip.AddrPort {
	out := slices.Clone(p.dns.opts.Servers)
	switch {
	case in.EndpointSlices != nil:
		out = append(out, ClusterDNSOf(in.EndpointSlices)...)
	case in.Snapshot != nil:
		out = append(out, ClusterDNS(in.Snapshot.EndpointSlices)...)
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}

// ClusterDNS are the ready endpoints of Service kube-system/kube-dns, on
// the ports named dns or dns-tcp (or numbered 53): not its metrics port;
// sorted, each once. Its slices are read as the proxy reads them
// (ClusterDNSOf).
func ClusterDNS(endpointSlices []*discoveryv1.EndpointSlice) []netip.AddrPort {
	ns, name := clusterDNSName()
	var dns []*proxy.Slice
	for _, s := range endpointSlices {
		if s != nil && s.Namespace == ns && s.Labels[discoveryv1.LabelServiceName] == name {
			dns = append(dns, proxy.ParseSlice(s, ""))
		}
	}
	return ClusterDNSOf(dns)
}

// ClusterDNSOf is ClusterDNS of parsed slices: an endpoint's first
// address (as the proxy uses), the valid TCP and UDP ports.
func ClusterDNSOf(endpointSlices []*proxy.Slice) []netip.AddrPort {
	ns, name := clusterDNSName()
	var out []netip.AddrPort
	for _, s := range endpointSlices {
		if s == nil || s.Namespace != ns || s.Service != name {
			continue
		}
		var ports []uint16
		for _, pt := range s.Ports {
			if pt.Protocol != corev1.ProtocolUDP && pt.Protocol != corev1.ProtocolTCP {
				continue
			}
			if pt.Name == "dns" || pt.Name == "dns-tcp" || pt.Port == 53 {
				ports = append(ports, uint16(pt.Port))
			}
		}
		for _, ep := range s.Endpoints {
			if !ep.Ready {
				continue
			}
			for _, port := range ports {
				out = append(out, netip.AddrPortFrom(ep.Address, port))
			}
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

func clusterDNSName() (namespace, name string) {
	namespace, name, _ = strings.Cut(ClusterDNSService, "/")
	return namespace, name
}

// DomainPatterns are the canonical domainNames patterns of the model's
// rules, sorted.
func DomainPatterns(model *policy.Model) []string {
	var out []string
	for _, pol := range model.Policies {
		for _, rules := range pol.Rules {
			for _, r := range rules {
				for _, pe := range r.Peers {
					if pe.Kind == policy.PeerDomainNames {
						out = append(out, pe.DomainNames...)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// learnPatterns tells the learner the patterns whose sets table has.
func (p *Programmer) learnPatterns(model *policy.Model, table *nft.Table) error {
	if p.dns == nil || model == nil {
		return nil
	}
	var here []string
	for _, pat := range DomainPatterns(model) {
		if table.Sets[compiler.DomainSetPrefix(pat)+nft.IPv4.Suffix] != nil {
			here = append(here, pat)
		}
	}
	d := p.dns
	d.mu.Lock()
	defer d.mu.Unlock()
	d.servers = p.live.DNSServers()
	if slices.Equal(here, d.patterns) {
		return nil
	}
	if err := d.learner.SetPatterns(here); err != nil {
		return err
	}
	d.patterns = here
	return nil
}

// syncDNSServers brings the dns-servers sets in line with the snapshot's
// cluster DNS when only the Services were synced (an EndpointSlice
// changed): an element change in the policy table, not a compile.
func (p *Programmer) syncDNSServers(in *Input) error {
	if p.dns == nil || p.live == nil {
		return nil
	}
	servers := p.dnsServers(in)
	if slices.Equal(servers, p.live.DNSServers()) {
		return nil
	}
	t, err := p.live.SetDNSServers(servers)
	if err == nil {
		_, err = p.policy.Apply(t)
	}
	if err != nil {
		p.live = nil // only a full compile starts again from a known state
		return fmt.Errorf("node %s: policy table %s: the cluster DNS's servers: %w", p.opts.Node, p.opts.Table, err)
	}
	p.dns.mu.Lock()
	p.dns.servers = servers
	p.dns.mu.Unlock()
	return nil
}

// DNS is the DNS side's state; nil when DNS was not asked for. Unlike
// the Programmer's other methods it may run while a sync does. Without
// entries, the learned addresses are left out (metrics need only counts).
func (p *Programmer) DNS(entries bool) *DNSStatus {
	if p.dnsErr != nil {
		return &DNSStatus{Queue: p.dnsErr.Error()}
	}
	d := p.dns
	if d == nil {
		return nil
	}
	d.mu.Lock()
	st := &DNSStatus{Queue: d.kind.String(), QueueNum: d.opts.QueueNum, Patterns: slices.Clone(d.patterns), Servers: slices.Clone(d.servers)}
	d.mu.Unlock()
	st.Stats = d.learner.Stats()
	if entries {
		st.Entries = d.learner.Entries()
	}
	st.QueuePackets, st.QueueErrors = d.queue.Stats.Packets.Load(), d.queue.Stats.Errors.Load()
	for _, chain := range compiler.DNSChains {
		n, err := kernel.RuleCounters(d.netns, d.table, chain)
		if err != nil {
			break // before the first sync: no chain yet
		}
		st.QueuedAnswers += n
	}
	return st
}

func (d *dnsSnooper) close() error {
	if d == nil {
		return nil
	}
	err := errors.Join(d.queue.Close(), d.learner.Close())
	if d.netns >= 0 {
		unix.Close(d.netns)
	}
	return err
}
