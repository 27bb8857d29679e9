package lab

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/probe"
	"github.com/netpol/netpol/pkg/proxy"
)

// The outside of the cluster. The underlay namespace, which holds the
// bridge, doubles as a host outside the cluster ("external"):
//
//   - br0 gets the pinned addresses (Options.Outside, at most one per
//     family) and, for every other family the nodes use, one chosen: the
//     highest free address but one of the /24 (IPv4) or /64 (IPv6) around
//     the first node's (snapshot order) InternalIP/ExternalIP of that
//     family, or of the synthetic range when no node has one; free means
//     no node, pod, synthetic address or Service address has it. Update
//     keeps it while it stays free.
//   - The underlay has on-link host routes to every node address, routes
//     to the pods as a node has them (every pod CIDR through its node, host
//     routes through the node for pods outside their node's CIDRs: a flat
//     network, where pods are reachable from outside and their replies
//     to the outside come back), and a route for every Service
//     load-balancer ingress IP and external IP through one node (the first
//     by name with an address of its family), as an L2 or BGP load
//     balancer would announce it. It has no route to ClusterIPs, and it
//     does not forward.
//   - Every node has an on-link host route to the underlay's addresses (for
//     replies, and for pods' connections to the outside), and one to every
//     Service address (ClusterIPs, load-balancer and external IPs) over its
//     uplink: a socket on the node needs a route before the output hook's
//     DNAT can change the destination, as a real node's default route
//     provides. Without DNAT such packets find no one on the bridge and
//     time out; they never leave the lab. Host routes work for any address,
//     so a pinned one need not be near the nodes'.
//   - The underlay serves Options.OutsidePorts on each of its addresses
//     with the same probe servers as pods, answering with the address.
//   - With a DNS zone (see dns.go), every A and AAAA address of the zone
//     is the outside's too: on br0, routed by the nodes and served as
//     the addresses above are, so that a name a pod resolves leads to a
//     peer that answers.
//
// Service addresses that are lab addresses already (an external IP equal
// to a node address, say) need none of these routes and get none.

// pinnedOutside checks Options.Outside: usable addresses, at most one per
// family (Dial binds the outside's one address of the destination's
// family), IPv4 first.
func pinnedOutside(list []netip.Addr) ([]netip.Addr, error) {
	byFamily := map[*ipFamily]netip.Addr{}
	for _, a := range list {
		a = a.Unmap()
		if why := usable(a); why != "" {
			return nil, fmt.Errorf("outside address %s is a %s, which the lab cannot give the outside", a, why)
		}
		f := familyOf(a)
		if prev, dup := byFamily[f]; dup && prev != a {
			return nil, fmt.Errorf("the outside gets at most one %s address, not %s and %s", f.name, prev, a)
		}
		byFamily[f] = a
	}
	var out []netip.Addr
	for _, f := range ipFamilies {
		if a, ok := byFamily[f]; ok {
			out = append(out, a)
		}
	}
	return out, nil
}

// lbRoute sends a load-balancer or external IP from the underlay to a node.
type lbRoute struct {
	dst  netip.Addr
	node string
	via  netip.Addr
}

// planServices reads the Services: the addresses nodes route, where the
// underlay sends load-balancer and external IPs, and the underlay's own
// addresses (pinned, else chosen). It runs after addSynthetic; owner has
// every lab address, pinned ones included.
func (p *plan) planServices(snap *cluster.Snapshot, owner map[netip.Addr]string, pinned []netip.Addr, previous *plan) {
	model := proxy.Build(snap, "", proxy.Options{})
	p.services = model.Services
	for _, err := range model.Errors {
		p.notes = append(p.notes, "services: "+err.Error())
	}
	p.primary = map[string]corev1.IPFamily{}
	for _, svc := range snap.Services {
		if svc == nil {
			continue
		}
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 {
			ips = []string{svc.Spec.ClusterIP}
		}
		for _, s := range ips {
			if a, err := netip.ParseAddr(s); err == nil {
				p.primary[svc.Namespace+"/"+svc.Name] = ipfamily.Of(a).Kubernetes()
				break
			}
		}
	}

	isVIP := map[netip.Addr]bool{}
	lbNode := map[netip.Addr]bool{}
	byName := slices.Clone(p.nodes)
	sort.Slice(byName, func(i, j int) bool { return byName[i].name < byName[j].name })
	for _, sp := range p.services {
		exposed := append(slices.Clone(sp.LoadBalancerIPs), sp.ExternalIPs...)
		for i, a := range append([]netip.Addr{sp.ClusterIP}, exposed...) {
			if owner[a] != "" || usable(a) != "" || isVIP[a] && (i == 0 || lbNode[a]) {
				continue
			}
			isVIP[a] = true
			if i == 0 {
				continue // a ClusterIP: not reachable from outside
			}
			lbNode[a] = true
			for _, n := range byName {
				if via, ok := n.addrOf(familyOf(a)); ok {
					p.lbRoutes = append(p.lbRoutes, lbRoute{dst: a, node: n.name, via: via})
					break
				}
			}
		}
	}
	for a := range isVIP {
		p.vips = append(p.vips, a)
	}
	slices.SortFunc(p.vips, netip.Addr.Compare)
	slices.SortFunc(p.lbRoutes, func(x, y lbRoute) int { return x.dst.Compare(y.dst) })

	taken := func(a netip.Addr) bool { return owner[a] != "" || isVIP[a] || usable(a) != "" }
	for _, f := range ipFamilies {
		if i := slices.IndexFunc(pinned, func(a netip.Addr) bool { return familyOf(a) == f }); i >= 0 {
			p.external = append(p.external, pinned[i])
			continue
		}
		base, used := netip.Prefix{}, false
		for _, n := range p.nodes {
			if _, ok := n.addrOf(f); ok {
				used = true
			}
			for _, a := range n.status {
				if !base.IsValid() && familyOf(a) == f {
					base = netip.PrefixFrom(a, f.outsideBits).Masked()
				}
			}
		}
		if !used {
			continue
		}
		if !base.IsValid() {
			base = f.synthetic
		}
		a := netip.Addr{}
		if previous != nil {
			for _, prev := range previous.external {
				if familyOf(prev) == f && base.Contains(prev) && !taken(prev) {
					a = prev
				}
			}
		}
		for c := lastAddr(base).Prev(); !a.IsValid() && base.Contains(c) && c != base.Addr(); c = c.Prev() {
			if !taken(c) {
				a = c
			}
		}
		if !a.IsValid() {
			p.notes = append(p.notes, fmt.Sprintf("the underlay gets no %s address: %s is full; nothing can probe from outside over %s", f.name, base, f.name))
			continue
		}
		owner[a] = "the underlay"
		p.external = append(p.external, a)
	}
}

// outsideAddrs are br0's addresses: the outside's own (external), then
// the zone's that are not among them.
func (p *plan) outsideAddrs() []netip.Addr {
	out := slices.Clone(p.external)
	if p.dns != nil {
		for _, a := range p.dns.addrs {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// outsideRoutes are node n's uplink routes beyond routesFor: the
// underlay's addresses and the Service addresses, on-link.
func (p *plan) outsideRoutes(n *nodePlan) []route {
	var out []route
	for _, list := range [][]netip.Addr{p.outsideAddrs(), p.vips} {
		for _, a := range list {
			if _, ok := n.addrOf(familyOf(a)); ok {
				out = append(out, route{dst: hostPrefix(a)})
			}
		}
	}
	return out
}

// underlayRoutes are the routes on br0: those of a node that is none of
// the lab's (every node address on-link, every pod through its node), then
// every load-balancer and external IP through its node.
func (p *plan) underlayRoutes() []route {
	out := p.routesFor(&nodePlan{})
	taken := map[netip.Prefix]bool{}
	for _, r := range out {
		taken[r.dst] = true
	}
	for _, r := range p.lbRoutes {
		if dst := hostPrefix(r.dst); !taken[dst] { // a /32 pod CIDR, say
			out = append(out, route{dst: dst, via: r.via})
		}
	}
	return out
}

// reconcileUnderlay gives br0 the plan's outside addresses and routes,
// then makes the outside serve the plan's ports on those addresses.
func (l *Lab) reconcileUnderlay(p *plan) error {
	if err := syncLink(l.underlay, l.bridge, p.outsideAddrs(), p.underlayRoutes()); err != nil {
		return fmt.Errorf("underlay: %w", err)
	}
	l.external = p.external
	if err := l.reconcileOutsideServers(p); err != nil {
		return fmt.Errorf("underlay: %w", err)
	}
	return nil
}

// reconcileOutsideServers stops the outside's servers the plan does not
// want (an address gone) and starts those it lacks; the others keep
// running across Update.
func (l *Lab) reconcileOutsideServers(p *plan) error {
	addrs := p.outsideAddrs()
	want := map[serverKey]bool{}
	for _, a := range addrs {
		for _, pr := range p.outsideServes {
			want[serverKey{a, pr}] = true
		}
	}
	var keep, stop []*probe.Server
	have := map[serverKey]bool{}
	for _, s := range l.outsideServers {
		if k := (serverKey{s.Addr, s.Probe}); want[k] {
			keep, have[k] = append(keep, s), true
		} else {
			stop = append(stop, s)
		}
	}
	l.outsideServers = keep
	if err := probe.StopServers(stop); err != nil {
		return err
	}
	for _, a := range addrs {
		for _, pr := range p.outsideServes {
			if have[serverKey{a, pr}] {
				continue
			}
			s, err := probe.Serve(l.underlay.handle, a.String(), a, pr)
			if err != nil {
				return err
			}
			l.outsideServers = append(l.outsideServers, s)
		}
	}
	return nil
}

// endpointSlicePorts maps pods (namespace/name) to the ports EndpointSlices
// send them: each port of a slice, for each endpoint that endpointPod
// finds a pod for.
func endpointSlicePorts(snap *cluster.Snapshot, pods []*corev1.Pod) map[string][]l4.Port {
	byAddr := map[netip.Addr]string{}
	for _, pod := range pods {
		if pod.Spec.HostNetwork {
			continue
		}
		for _, a := range cluster.PodAddresses(pod) {
			if _, dup := byAddr[a]; !dup {
				byAddr[a] = pod.Namespace + "/" + pod.Name
			}
		}
	}
	out := map[string][]l4.Port{}
	for _, es := range snap.EndpointSlices {
		probes := slicePorts(es)
		if len(probes) == 0 {
			continue
		}
		for _, ep := range es.Endpoints {
			if key := endpointPod(es, ep, byAddr); key != "" {
				out[key] = append(out[key], probes...)
			}
		}
	}
	return out
}

// slicePorts are the ports of an EndpointSlice of addresses (not FQDN)
// with a number and a protocol the lab knows.
func slicePorts(es *discoveryv1.EndpointSlice) []l4.Port {
	if es == nil || es.AddressType == discoveryv1.AddressTypeFQDN {
		return nil
	}
	var probes []l4.Port
	for _, sp := range es.Ports {
		var proto corev1.Protocol
		if sp.Protocol != nil {
			proto = *sp.Protocol
		}
		proto = policy.DefaultProtocol(proto)
		if _, known := policy.IPProtocol(proto); sp.Port == nil || !known {
			continue
		}
		probes = append(probes, l4.Port{Protocol: proto, Port: *sp.Port})
	}
	return probes
}

// endpointPod is the pod (namespace/name) an endpoint of es stands for:
// its targetRef's or, without a Pod targetRef, the pod-network pod that
// byAddr gives one of its addresses (host-network pods share their node's
// address, so only a targetRef names one); "" when there is none.
func endpointPod(es *discoveryv1.EndpointSlice, ep discoveryv1.Endpoint, byAddr map[netip.Addr]string) string {
	if ref := ep.TargetRef; ref != nil && (ref.Kind == "Pod" || ref.Kind == "") && ref.Name != "" {
		ns := ref.Namespace
		if ns == "" {
			ns = es.Namespace
		}
		return ns + "/" + ref.Name
	}
	for _, s := range ep.Addresses {
		if a, err := netip.ParseAddr(s); err == nil && byAddr[a.Unmap()] != "" {
			return byAddr[a.Unmap()]
		}
	}
	return ""
}

// External is the lab's outside: the underlay namespace as a client
// outside the cluster (Dial from ExternalSource).
type External struct {
	NetNS string
	// Handle is an open descriptor of the namespace, valid until Down. Do
	// not close it.
	Handle netns.NsHandle
	// Addrs are its addresses, IPv4 first: Options.Outside, and one per
	// other family the nodes use.
	Addrs []netip.Addr
	// Zone are the DNS zone's addresses (see Lab.Zone), sorted, that are
	// not in Addrs: the outside has them too, and serves Serves on them.
	Zone []netip.Addr
	// Serves are the ports served on each address (Options.OutsidePorts
	// the kernel supports); a server answers with its address.
	Serves []l4.Port
	// Routes send Service load-balancer and external IPs to a node.
	Routes []ExternalRoute
}

// ExternalRoute sends Dst from the underlay to Node, through Via (Node's
// first address of Dst's family).
type ExternalRoute struct {
	Dst  netip.Addr
	Node string
	Via  netip.Addr
}

// External describes the lab's outside.
func (l *Lab) External() *External {
	l.mu.RLock()
	defer l.mu.RUnlock()
	e := &External{NetNS: l.underlay.name, Handle: l.underlay.handle}
	if l.plan == nil {
		return e
	}
	e.Addrs = slices.Clone(l.plan.external)
	if zone := l.plan.outsideAddrs()[len(l.plan.external):]; len(zone) > 0 {
		e.Zone = zone
	}
	e.Serves = slices.Clone(l.plan.outsideServes)
	for _, r := range l.plan.lbRoutes {
		e.Routes = append(e.Routes, ExternalRoute{Dst: r.dst, Node: r.node, Via: r.via})
	}
	return e
}
