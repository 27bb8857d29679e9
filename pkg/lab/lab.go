// Package lab builds a cluster data plane on one machine out of network
// namespaces, so that tests can prove with real packets that the kernel
// rules do what the policy evaluator says.
//
// Topology (every namespace name starts with the lab's prefix):
//
//   - <prefix>-underlay: a bridge, br0, with one port per node (n<i>). br0
//     also has an address per family (chosen, or Options.Outside), so that
//     the underlay is a host outside the cluster ("external"), with routes
//     to the nodes, to the pods through their nodes, and to Service
//     load-balancer and external IPs (see outside.go, External); it serves
//     Options.OutsidePorts.
//   - <prefix>-n-<i>, one per Node: its uplink ("uplink", the peer of n<i>)
//     carries the node's InternalIP/ExternalIP addresses as /32 and /128,
//     with on-link host routes to every other node's addresses, routes to
//     other nodes' spec.podCIDRs through those nodes, host routes for pods
//     outside their node's CIDRs, and on-link host routes to the
//     underlay's addresses and to Service addresses (a node's own sockets
//     need a route before DNAT in output can apply). Forwarding is on,
//     rp_filter off, DAD off. A node without an address in a family that
//     some node or pod uses gets a synthetic one (198.18.0.0/15,
//     fd6c:6162::/64), used only as a next hop; Lab.Notes and
//     Node.Synthetic name them.
//   - <prefix>-p-<i>, one per pod-network Pod: eth0 carries the pod's
//     addresses (/32, /128, no DAD) and default routes via 169.254.1.1 and
//     fe80::1 (onlink), which the node side of the veth (p<i>) holds; the
//     node has a host route to each pod address through p<i>.
//   - host-network pods get no namespace: they serve from their node's, on
//     their podIP (given to the node's uplink when it is not already a node
//     address).
//
// Every pod serves each declared container port, Options.ExtraPorts, and
// each port an EndpointSlice sends it (by targetRef, or by address for
// pod-network pods) on each of its addresses, answering with its
// namespace/name. The root namespace is never touched except for the
// names under /run/netns (and one SCTP socket opened and closed to learn
// whether the kernel has SCTP), and no probe ever leaves the lab's
// namespaces: nodes and the underlay have no default route, only routes
// to lab addresses (pod CIDRs among them) and Service addresses.
//
// A snapshot with ConfigMap kube-system/netpol-lab-dns gets a DNS server
// (dns.go): its data.zone, an RFC 1035 master file of A, AAAA and CNAME
// records, is served over UDP and TCP by the ready endpoint pods of
// Service kube-system/kube-dns on their slices' ports (which then answer
// DNS queries and probes alike), so pods ask the Service's ClusterIP as
// in a cluster, through netpol's Service NAT where nodes run it; and
// every address of the zone is the outside's, where OutsidePorts answer.
// Resolve asks from a pod; Zone, DNSServers and ClusterDNS describe it.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/domain"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/probe"
)

// Options configure Up.
type Options struct {
	// Prefix starts every namespace name; default "netpol-" and 6 random
	// hex digits.
	Prefix string
	// ExtraPorts are served by every pod besides its declared container
	// ports (the conformance model's pods listen on undeclared ones).
	ExtraPorts []l4.Port
	// Outside pins the outside's addresses (see External), at most one per
	// family; a family without one gets the automatic choice when the
	// nodes use it. A pinned address must not be a node's or a pod's.
	Outside []netip.Addr
	// OutsidePorts are served on every address of the outside, answering
	// with that address (e.g. "192.0.2.10"), so that the outside is a peer
	// pods can reach, not only a client.
	OutsidePorts []l4.Port
}

// Node is a node of the lab.
type Node struct {
	Name  string
	NetNS string // network namespace name, under /run/netns
	// Handle is an open descriptor of the namespace, valid until Down
	// (e.g. for nftables.WithNetNSFd(int(Handle))). Do not close it.
	Handle netns.NsHandle
	// Addrs are the uplink's addresses: the snapshot's, host-network pod
	// addresses that are not among them, and Synthetic.
	Addrs     []netip.Addr
	Synthetic []netip.Addr
}

// Pod is a pod the lab runs.
type Pod struct {
	Name        string // namespace/name
	Node        string
	HostNetwork bool
	// NetNS and Handle are the pod's namespace, or its node's for a
	// host-network pod.
	NetNS  string
	Handle netns.NsHandle
	Addrs  []netip.Addr
	Serves []l4.Port
	// DNS are the Serves the lab's DNS server answers (see Lab.Zone); it
	// answers probes on them too.
	DNS []l4.Port
}

// Lab is a running lab. Its methods are safe for concurrent use.
type Lab struct {
	mu       sync.RWMutex
	prefix   string
	opts     Options
	underlay *namespace
	bridge   int          // ifindex of br0 in the underlay
	external []netip.Addr // br0's addresses, as last reconciled
	nodes    map[string]*labNode
	pods     map[string]*labPod
	plan     *plan
	eval     *eval.Evaluator // over an empty policy model: rows, columns and order of tables
	nextNode int
	nextPod  int
	down     bool

	// outsideServers serve OutsidePorts on the external addresses.
	outsideServers []*probe.Server
	// zone is what the DNS servers answer from (nil: no zone); they
	// count the queries they answer in dnsQueries.
	zone       atomic.Pointer[domain.Zone]
	dnsQueries atomic.Uint64
}

type labNode struct {
	plan   *nodePlan
	index  int
	ns     *namespace
	uplink int // ifindex of the uplink in ns
}

type labPod struct {
	plan     *podPlan
	node     *labNode
	ns       *namespace // nil for host-network pods
	nodeLink string     // node side of the pod's veth
	servers  []*probe.Server
	dns      []*dnsServer // on plan.dns ports
}

// Up builds a lab for the snapshot. If it fails, everything it made is
// removed again. The lab keeps references into snap (as the evaluator
// does): do not modify it afterwards; pass Update a new one.
func Up(ctx context.Context, snap *cluster.Snapshot, opts Options) (*Lab, error) {
	if opts.Prefix == "" {
		b := make([]byte, 3)
		rand.Read(b)
		opts.Prefix = DefaultPrefix + hex.EncodeToString(b)
	}
	if err := checkPrefix(opts.Prefix); err != nil {
		return nil, err
	}
	if existing, err := namespacesWithPrefix(opts.Prefix + "-"); err != nil {
		return nil, err
	} else if len(existing) > 0 {
		return nil, fmt.Errorf("lab %s: network namespaces with this prefix exist already (%s ...); remove them with DownAll", opts.Prefix, existing[0])
	}
	p, err := makePlan(snap, opts, nil)
	if err != nil {
		return nil, fmt.Errorf("lab %s: %w", opts.Prefix, err)
	}
	l := &Lab{prefix: opts.Prefix, opts: opts, nodes: map[string]*labNode{}, pods: map[string]*labPod{}}
	err = l.createUnderlay()
	if err == nil {
		err = l.apply(ctx, p, snap)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("lab %s: %w", l.prefix, err), l.Down())
	}
	return l, nil
}

// Update makes the lab match a new snapshot without rebuilding it: nodes
// and pods that appeared are added, those gone are removed, pods whose
// node, addresses or hostNetwork changed are recreated, and pods whose
// served ports changed (an EndpointSlice, say, or the DNS zone's
// ConfigMap: see dns.go) start and stop servers; a changed zone is
// answered at once. Node namespaces stay (rules programmed into them
// survive); their addresses and routes are reconciled. Label changes need
// nothing. After an error the lab holds whatever was done; Update again or
// Down.
func (l *Lab) Update(ctx context.Context, snap *cluster.Snapshot) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return fmt.Errorf("lab %s is down", l.prefix)
	}
	// What the kernel has now (after a failed apply, partly the failed
	// plan's): addresses to keep.
	previous := &plan{external: l.external}
	for _, n := range l.nodes {
		previous.nodes = append(previous.nodes, n.plan)
	}
	p, err := makePlan(snap, l.opts, previous)
	if err == nil {
		err = l.apply(ctx, p, snap)
	}
	if err != nil {
		return fmt.Errorf("lab %s: %w", l.prefix, err)
	}
	return nil
}

// Down stops the servers and deletes every namespace the lab made. It is
// idempotent.
func (l *Lab) Down() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return nil
	}
	l.down = true
	l.zone.Store(nil)
	errs := []error{probe.StopServers(l.outsideServers)}
	l.outsideServers = nil
	for _, p := range l.pods {
		errs = append(errs, probe.StopServers(p.servers), stopDNS(p.dns))
		p.servers, p.dns = nil, nil
		if p.ns != nil {
			errs = append(errs, p.ns.delete())
		}
	}
	for _, n := range l.nodes {
		errs = append(errs, n.ns.delete())
	}
	if l.underlay != nil {
		errs = append(errs, l.underlay.delete())
	}
	l.pods, l.nodes = map[string]*labPod{}, map[string]*labNode{}
	errs = append(errs, RemoveStatus(l.prefix))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("lab %s down: %w", l.prefix, err)
	}
	return nil
}

// Prefix is the prefix of the lab's namespace names.
func (l *Lab) Prefix() string { return l.prefix }

// Nodes lists the lab's nodes in snapshot order.
func (l *Lab) Nodes() []*Node {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []*Node
	if l.plan == nil {
		return nil
	}
	for _, np := range l.plan.nodes {
		if n := l.nodes[np.name]; n != nil {
			out = append(out, n.export())
		}
	}
	return out
}

// Node returns the node called name, or nil.
func (l *Lab) Node(name string) *Node {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if n := l.nodes[name]; n != nil {
		return n.export()
	}
	return nil
}

func (n *labNode) export() *Node {
	return &Node{Name: n.plan.name, NetNS: n.ns.name, Handle: n.ns.handle,
		Addrs: slices.Clone(n.plan.addrs), Synthetic: slices.Clone(n.plan.synthetic)}
}

// Pods lists the pods the lab runs, by namespace/name.
func (l *Lab) Pods() []*Pod {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []*Pod
	if l.plan == nil {
		return nil
	}
	for _, pp := range l.plan.pods {
		p := l.pods[pp.key]
		if p == nil {
			continue
		}
		ns := p.node.ns
		if p.ns != nil {
			ns = p.ns
		}
		out = append(out, &Pod{Name: pp.key, Node: pp.node, HostNetwork: pp.hostNetwork,
			NetNS: ns.name, Handle: ns.handle, Addrs: slices.Clone(pp.addrs), Serves: slices.Clone(pp.serves), DNS: slices.Clone(pp.dns)})
	}
	return out
}

// Notes are what the lab left out or made up: pods it could not build,
// synthetic node addresses, SCTP ports not served.
func (l *Lab) Notes() []string {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.plan == nil {
		return nil
	}
	return slices.Clone(l.plan.notes)
}

// emptyModel is no policy at all: the evaluator's table over it has the
// pods, ports and cell order of any table for the same snapshot.
var emptyModel = &policy.Model{}

// FlushConntrack forgets every connection the node namespaces track, so
// the next probes are all new connections. Without it a UDP probe whose
// random source port happens to repeat one of an earlier probe (allowed,
// before a policy change) would pass as "established": right for a real
// flow, wrong for a matrix that asks what policy allows now.
func (l *Lab) FlushConntrack() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var errs []error
	for name, n := range l.nodes {
		if err := n.ns.nl.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			errs = append(errs, fmt.Errorf("node %s: flushing conntrack: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
