// Package dataplane is a cluster's data plane as netpol programs it: every
// node's compiled policy table and Service NAT table, and the netfilter
// hooks a connection's first packet crosses on its way from one endpoint to
// another. Running that packet through the tables with the exact userspace
// interpreter (trace.Tracer) answers what the kernels would do, without root:
// `netpol table --engine nft` and `netpol trace`.
package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/trace"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// Cluster holds every node's tables, ready to trace.
type Cluster struct {
	ev    *eval.Evaluator
	r     *eval.Resolved
	nodes []*Node // by node index

	mu       sync.Mutex
	firstErr error
}

// Node is one node's programmed state.
type Node struct {
	Name   string
	Addrs  []netip.Addr
	Policy *nft.Table
	NAT    *nft.Table
	tracer *trace.Tracer
}

// New compiles the tables of every node of the snapshot, as the agent on
// that node would (policy table and, unless noProxy, its NAT table).
func New(snap *cluster.Snapshot, ev *eval.Evaluator, noProxy bool) (*Cluster, error) {
	return NewWith(snap, ev, Options{NoProxy: noProxy})
}

// Options are how the agents program their nodes.
type Options struct {
	// NoProxy: no Service NAT table (`netpol agent --no-proxy`).
	NoProxy bool
	// AgentPorts: the policy tables protect the agent's ports
	// (`--protect-agent-ports`); give the evaluator the same guard
	// (Evaluator.GuardNodes) for it to agree.
	AgentPorts *compiler.AgentPorts
	// Layout: the policy tables' layout (compiler.Layout).
	Layout compiler.Layout
	// Audit: the policy tables log decisions (`--audit`, compiler.Audit).
	Audit *compiler.Audit
	// RuleCounters: the policy tables count each rule's decisions
	// (`--rule-counters`, compiler.Options.RuleCounters).
	RuleCounters bool
	// Staged: the staged policies the policy tables evaluate beside the
	// enforced ones (compiler.Options.Staged; the model's Staged).
	Staged []*policy.Policy
}

// NewWith is New with the agents' options.
func NewWith(snap *cluster.Snapshot, ev *eval.Evaluator, opts Options) (*Cluster, error) {
	r := ev.Resolved()
	c := &Cluster{ev: ev, r: r}
	for i := 0; i < r.NumNodes(); i++ {
		n := &Node{Name: r.NodeName(i), Addrs: r.NodeAddrs(i)}
		var err error
		if n.Policy, err = compiler.Compile(r, compiler.Options{Node: n.Name, AgentPorts: opts.AgentPorts, Layout: opts.Layout, Audit: opts.Audit,
			RuleCounters: opts.RuleCounters, Staged: opts.Staged}); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		tables := []*nft.Table{n.Policy}
		if !opts.NoProxy {
			if n.NAT, err = proxy.Compile(proxy.Build(snap, n.Name, proxy.Options{}), proxy.CompileOptions{}); err != nil {
				return nil, fmt.Errorf("node %s: services: %w", n.Name, err)
			}
			tables = append(tables, n.NAT)
		}
		if n.tracer, err = trace.NewTracer(tables...); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		c.nodes = append(c.nodes, n)
	}
	return c, nil
}

// Nodes are the cluster's nodes in snapshot order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Hop is one hook a packet crossed on one node.
type Hop struct {
	Node   string
	Hook   string
	Result trace.Result
}

// Path is one way a connection's first packet can go (a Service with
// several endpoints has one path per endpoint the node may choose).
type Path struct {
	Hops    []Hop
	Allowed bool
	// Delivered is where the packet ended up: namespace/pod, a node
	// address, or an outside address; empty when it was dropped.
	Delivered string
}

// sourcePort is the client port of traced packets: policy never looks at
// it, and conntrack's original tuple needs one.
const sourcePort = 40000

// Allowed is the data plane's verdict for one truth-table cell: true iff
// every path the first packet can take is accepted. An error (a table the
// tracer cannot evaluate) counts as denied and is kept for Err.
func (c *Cluster) Allowed(src, dst eval.Endpoint, probe l4.Port) bool {
	allowed := true
	err := c.walk(src, dst, probe, false, func(p Path) bool {
		allowed = allowed && p.Allowed
		return allowed
	})
	if err != nil {
		c.mu.Lock()
		if c.firstErr == nil {
			c.firstErr = err
		}
		c.mu.Unlock()
		return false
	}
	return allowed
}

// Err is the first error Allowed met.
func (c *Cluster) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.firstErr
}

// TruthTable is the truth table computed by tracing every cell through the
// tables: the same rows, columns and JSON as the evaluator's.
func (c *Cluster) TruthTable(opts eval.TruthTableOptions) (*eval.TruthTable, error) {
	t := c.ev.TruthTableWith(opts, c.Allowed)
	return t, c.Err()
}

// Paths traces the connection src -> dst with every rule recorded: one
// path per alternative (numgen choice of a Service endpoint).
func (c *Cluster) Paths(src, dst eval.Endpoint, probe l4.Port) ([]Path, error) {
	var out []Path
	err := c.walk(src, dst, probe, true, func(p Path) bool {
		out = append(out, p)
		return true
	})
	return out, err
}

// where a packet is on a node.
type arrival int

const (
	fromPod  arrival = iota // from a local pod's veth: prerouting
	fromHost                // sent by the node itself: output
	fromWire                // from another node or the outside: prerouting
)

// walk calls visit with every path of the connection's first packet.
func (c *Cluster) walk(src, dst eval.Endpoint, probe l4.Port, record bool, visit func(Path) bool) error {
	if src.Pod >= 0 && src.Pod == dst.Pod {
		// A pod's traffic to its own address never leaves it.
		visit(Path{Allowed: true, Delivered: c.ev.Name(dst)})
		return nil
	}
	proto, ok := policy.IPProtocol(probe.Protocol)
	if !ok {
		return fmt.Errorf("protocol %q", probe.Protocol)
	}
	pkt := trace.Packet{Family: nft.FamilyOf(dst.Addr), Src: src.Addr, Dst: dst.Addr, L4Proto: proto,
		SrcPort: sourcePort, DstPort: uint16(probe.Port)}
	srcNode, err := c.nodeOf(src)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	w := &walker{c: c, record: record, visit: visit}
	switch {
	case srcNode < 0:
		// From outside: it enters the cluster at the node that owns the
		// destination, or (a Service address) at the first node, where the
		// lab routes load-balancer and external IPs.
		dn, err := c.nodeOf(c.r.EndpointOf(dst.Addr))
		if err != nil {
			return fmt.Errorf("destination: %w", err)
		}
		if dn < 0 {
			if dn = c.firstNode(); dn < 0 {
				return errors.New("the snapshot has no nodes")
			}
		}
		w.at(dn, fromWire, pkt, nil)
	case c.isPodNetwork(src):
		w.at(srcNode, fromPod, pkt, nil)
	default:
		w.at(srcNode, fromHost, pkt, nil)
	}
	return w.err
}

// firstNode is the node, first by name, that receives connections from
// outside to addresses no node owns (load-balancer and external IPs), as
// the lab routes them; -1 without nodes.
func (c *Cluster) firstNode() int {
	first := -1
	for i, n := range c.nodes {
		if first < 0 || n.Name < c.nodes[first].Name {
			first = i
		}
	}
	return first
}

func (c *Cluster) isPodNetwork(ep eval.Endpoint) bool {
	return ep.Pod >= 0 && !c.r.Pod(ep.Pod).HostNetwork
}

// nodeOf is the node an endpoint lives on; -1 for an outside address.
func (c *Cluster) nodeOf(ep eval.Endpoint) (int, error) {
	if ep.Pod >= 0 {
		p := c.r.Pod(ep.Pod)
		if p.Node < 0 {
			return -1, fmt.Errorf("pod %s is on no node of the snapshot: no tables to trace", p.Key)
		}
		return p.Node, nil
	}
	return ep.Node, nil
}

// walker follows one connection's first packet from hook to hook,
// branching on every numgen alternative.
type walker struct {
	c       *Cluster
	record  bool
	visit   func(Path) bool
	stopped bool
	err     error
}

// at runs the packet through node n from where it arrived, then onwards.
func (w *walker) at(n int, how arrival, pkt trace.Packet, hops []Hop) {
	if w.stopped || w.err != nil {
		return
	}
	node := w.c.nodes[n]
	pkt.SrcLocal = w.c.isNodeAddr(n, pkt.Src)
	pkt.MasqueradeTo = node.addr(pkt.Family)
	switch how {
	case fromPod, fromWire:
		w.hook(n, nft.HookPrerouting, pkt, hops, func(pkt trace.Packet, hops []Hop) { w.route(n, pkt, hops) })
	case fromHost:
		w.hook(n, nft.HookOutput, pkt, hops, func(pkt trace.Packet, hops []Hop) {
			w.hook(n, nft.HookPostrouting, pkt, hops, func(pkt trace.Packet, hops []Hop) { w.leave(n, pkt, hops, true) })
		})
	}
}

// route is the routing decision after prerouting: local delivery (input)
// or forwarding.
func (w *walker) route(n int, pkt trace.Packet, hops []Hop) {
	if w.c.isNodeAddr(n, pkt.Dst) {
		w.hook(n, nft.HookInput, pkt, hops, func(pkt trace.Packet, hops []Hop) { w.deliver(pkt, hops) })
		return
	}
	w.hook(n, nft.HookForward, pkt, hops, func(pkt trace.Packet, hops []Hop) {
		w.hook(n, nft.HookPostrouting, pkt, hops, func(pkt trace.Packet, hops []Hop) { w.leave(n, pkt, hops, false) })
	})
}

// leave is where a packet goes after postrouting on node n.
func (w *walker) leave(n int, pkt trace.Packet, hops []Hop, local bool) {
	if local && w.c.isNodeAddr(n, pkt.Dst) {
		// To the node's own address: back in through prerouting and input,
		// on the same connection (its NAT already set up).
		pkt.NATDone = true
		w.hook(n, nft.HookPrerouting, pkt, hops, func(pkt trace.Packet, hops []Hop) {
			w.hook(n, nft.HookInput, pkt, hops, func(pkt trace.Packet, hops []Hop) { w.deliver(pkt, hops) })
		})
		return
	}
	dst := w.c.r.EndpointOf(pkt.Dst)
	m, err := w.c.nodeOf(dst)
	if err != nil {
		w.err = err
		return
	}
	if m < 0 || (m == n && w.c.isPodNetwork(dst)) {
		w.deliver(pkt, hops) // to a local pod, or out of the cluster
		return
	}
	// On to another node (or this node's host-network side, through the
	// wire when it is another node): a new conntrack there.
	next := trace.Packet{Family: pkt.Family, Src: pkt.Src, Dst: pkt.Dst, L4Proto: pkt.L4Proto, SrcPort: pkt.SrcPort, DstPort: pkt.DstPort}
	w.at(m, fromWire, next, hops)
}

func (w *walker) deliver(pkt trace.Packet, hops []Hop) {
	if w.stopped {
		return
	}
	ep := w.c.r.EndpointOf(pkt.Dst)
	name := pkt.Dst.String()
	if ep.Pod >= 0 {
		name = w.c.ev.Name(ep)
	}
	if !w.visit(Path{Hops: hops, Allowed: true, Delivered: name}) {
		w.stopped = true
	}
}

// hook runs pkt through one hook of node n; each accepted alternative goes
// on with then, each other one ends its path.
func (w *walker) hook(n int, hook string, pkt trace.Packet, hops []Hop, then func(trace.Packet, []Hop)) {
	if w.stopped || w.err != nil {
		return
	}
	node := w.c.nodes[n]
	each := func(r trace.Result) bool {
		h := hops
		if w.record {
			h = append(append([]Hop(nil), hops...), Hop{Node: node.Name, Hook: hook, Result: r})
		}
		if r.Verdict != trace.Accept {
			if !w.visit(Path{Hops: h}) {
				w.stopped = true
			}
		} else {
			then(r.Packet, h)
		}
		return !w.stopped && w.err == nil
	}
	var err error
	if w.record {
		var rs []trace.Result
		if rs, err = node.tracer.Trace(hook, pkt); err == nil {
			for _, r := range rs {
				if !each(r) {
					break
				}
			}
		}
	} else {
		err = node.tracer.Verdicts(hook, pkt, each)
	}
	if err != nil && w.err == nil {
		w.err = fmt.Errorf("node %s hook %s: %w", node.Name, hook, err)
	}
}

func (c *Cluster) isNodeAddr(n int, a netip.Addr) bool {
	for _, x := range c.nodes[n].Addrs {
		if x == a.Unmap() {
			return true
		}
	}
	return false
}

// addr is the node's first address in family f (what masquerade uses).
func (n *Node) addr(f *nft.Family) netip.Addr {
	for _, a := range n.Addrs {
		if nft.FamilyOf(a) == f {
			return a
		}
	}
	return netip.Addr{}
}
