package lab

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// plan is what the lab should look like for one snapshot: computed and
// validated before anything is created, so that Up and Update share it.
type plan struct {
	nodes []*nodePlan // snapshot order
	pods  []*podPlan  // by namespace/name
	// left maps pods the evaluator lists but the lab cannot build to why.
	left  map[string]string
	notes []string
	// The outside of the cluster (see outside.go): the underlay's own
	// addresses, the Service addresses nodes route, and where the underlay
	// sends load-balancer and external IPs.
	external []netip.Addr
	vips     []netip.Addr
	lbRoutes []lbRoute
	// outsideServes are the ports the outside serves on each external
	// address (Options.OutsidePorts that the kernel can serve).
	outsideServes []l4.Port
	// services are the proxied Service ports (proxy.Build's), primary
	// each Service's primary family by namespace/name.
	services []*proxy.ServicePort
	primary  map[string]corev1.IPFamily
	// dns is the zone the lab serves (nil without one), clusterDNS the
	// ClusterIPs of Service kube-system/kube-dns (see dns.go).
	dns        *dnsPlan
	clusterDNS []netip.Addr
}

// nodePlan is one node: a network namespace with an uplink into the
// underlay.
type nodePlan struct {
	name string
	// addrs are the uplink's addresses: InternalIP and ExternalIP, then
	// host-network pod addresses that are not among them, then synthetic
	// ones.
	addrs     []netip.Addr
	synthetic []netip.Addr
	// status are the InternalIP and ExternalIP addresses alone: where
	// NodePorts are served.
	status   []netip.Addr
	podCIDRs []netip.Prefix
}

// podPlan is one pod the lab runs servers for: in its own namespace, or in
// its node's for host-network pods.
type podPlan struct {
	key         string // namespace/name
	node        string
	hostNetwork bool
	addrs       []netip.Addr // primary first, as the evaluator orders them
	serves      []l4.Port
	// dns are the serves the lab's DNS server answers instead of a probe
	// server (it answers probes too; see dns.go), in serves' order.
	dns []l4.Port
}

// sameServers: the pod serves the same ports with the same servers.
func (p *podPlan) sameServers(q *podPlan) bool {
	return slices.Equal(p.serves, q.serves) && slices.Equal(p.dns, q.dns)
}

// probeServes are the serves that probe servers answer: all but dns.
func (p *podPlan) probeServes() []l4.Port {
	return slices.DeleteFunc(slices.Clone(p.serves), func(pr l4.Port) bool { return slices.Contains(p.dns, pr) })
}

// sameNetwork: the pod can stay as it is, at most serving other ports.
func (p *podPlan) sameNetwork(q *podPlan) bool {
	return p.key == q.key && p.node == q.node && p.hostNetwork == q.hostNetwork &&
		slices.Equal(p.addrs, q.addrs)
}

func (n *nodePlan) addrOf(f *ipFamily) (netip.Addr, bool) {
	for _, a := range n.addrs {
		if familyOf(a) == f {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (p *plan) node(name string) *nodePlan {
	for _, n := range p.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// makePlan reads the snapshot. previous is what the lab has now (nil on
// Up): its synthetic and external addresses are kept when still free, so
// that Update does not renumber them. Conflicts the lab cannot build (two
// owners of one address, two host-network servers on one socket, a pinned
// outside address a node or pod has) are errors; pods it can leave out (no
// address, no node) are noted.
func makePlan(snap *cluster.Snapshot, opts Options, previous *plan) (*plan, error) {
	extra := opts.ExtraPorts
	p := &plan{left: map[string]string{}}
	pinned, err := pinnedOutside(opts.Outside)
	if err != nil {
		return nil, err
	}
	owner := map[netip.Addr]string{} // address -> "node X" or "pod ns/name"
	nodeOwner := map[netip.Addr]string{}
	for _, n := range snap.Nodes {
		if p.node(n.Name) != nil {
			return nil, fmt.Errorf("node %s: listed twice", n.Name)
		}
		np := &nodePlan{name: n.Name}
		for _, sa := range n.Status.Addresses {
			if sa.Type != corev1.NodeInternalIP && sa.Type != corev1.NodeExternalIP {
				continue
			}
			a, err := netip.ParseAddr(sa.Address)
			if err != nil {
				// The evaluator ignores it too.
				p.notes = append(p.notes, fmt.Sprintf("node %s: ignoring %s %q: not an IP address", n.Name, sa.Type, sa.Address))
				continue
			}
			a = a.Unmap()
			if why := usable(a); why != "" {
				return nil, fmt.Errorf("node %s: %s %s is a %s, which the lab cannot give a node", n.Name, sa.Type, a, why)
			}
			if prev, taken := owner[a]; taken {
				if prev == "node "+n.Name {
					continue
				}
				return nil, fmt.Errorf("node %s: address %s belongs to %s too", n.Name, a, prev)
			}
			owner[a], nodeOwner[a] = "node "+n.Name, n.Name
			np.addrs = append(np.addrs, a)
		}
		np.status = slices.Clone(np.addrs)
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		for _, s := range cidrs {
			c, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("node %s: spec.podCIDRs: %q: %w", n.Name, s, err)
			}
			np.podCIDRs = append(np.podCIDRs, c.Masked())
		}
		p.nodes = append(p.nodes, np)
	}

	pods := append([]*corev1.Pod(nil), snap.Pods...)
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
	sctpOK, sctpWhy := SCTPSupported()
	sctpSkipped := false
	type hostSocket struct {
		node  string
		addr  netip.Addr
		probe l4.Port
	}
	hostServer := map[hostSocket]string{}
	fromSlices := endpointSlicePorts(snap, pods)
	for _, pod := range pods {
		key := pod.Namespace + "/" + pod.Name
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue // the evaluator leaves finished pods out entirely
		}
		pp := &podPlan{key: key, hostNetwork: pod.Spec.HostNetwork, addrs: cluster.PodAddresses(pod)}
		if len(pp.addrs) == 0 {
			p.left[key] = "it has no IP address"
			continue
		}
		for _, a := range pp.addrs {
			if why := usable(a); why != "" {
				return nil, fmt.Errorf("pod %s: address %s is a %s, which the lab cannot give a pod", key, a, why)
			}
		}
		node := p.node(pod.Spec.NodeName)
		if node == nil && pp.hostNetwork {
			// As the evaluator: a host-network pod is on the node that
			// has its address.
			for _, a := range pp.addrs {
				if name, ok := nodeOwner[a]; ok {
					node = p.node(name)
					break
				}
			}
		}
		if node == nil {
			p.left[key] = fmt.Sprintf("its node %q is not in the snapshot", pod.Spec.NodeName)
			continue
		}
		pp.node = node.name
		for _, a := range pp.addrs {
			prev, taken := owner[a]
			switch {
			case pp.hostNetwork && prev == "node "+node.name:
			case pp.hostNetwork && !taken:
				// The lab gives the node this address too.
				owner[a], nodeOwner[a] = "node "+node.name, node.name
				node.addrs = append(node.addrs, a)
			case taken:
				return nil, fmt.Errorf("pod %s: address %s belongs to %s too", key, a, prev)
			default:
				owner[a] = "pod " + key
			}
		}
		var skipped bool
		pp.serves, skipped = servedProbes(pod, append(slices.Clone(extra), fromSlices[key]...), sctpOK)
		sctpSkipped = sctpSkipped || skipped
		if pp.hostNetwork {
			for _, a := range pp.addrs {
				for _, pr := range pp.serves {
					hs := hostSocket{node.name, a, pr}
					if other, dup := hostServer[hs]; dup {
						return nil, fmt.Errorf("host-network pods %s and %s both serve %s on %s (node %s)", other, key, pr, a, node.name)
					}
					hostServer[hs] = key
				}
			}
		}
		p.pods = append(p.pods, pp)
	}
	// A pod without containers: the outside serves exactly OutsidePorts.
	var skipped bool
	p.outsideServes, skipped = servedProbes(&corev1.Pod{}, opts.OutsidePorts, sctpOK)
	if sctpSkipped = sctpSkipped || skipped; sctpSkipped {
		p.notes = append(p.notes, "SCTP ports are not served: "+sctpWhy)
	}
	for key, why := range p.left {
		p.notes = append(p.notes, fmt.Sprintf("pod %s is not in the lab: %s", key, why))
	}
	// Pinned outside addresses are reserved before synthetic ones are
	// chosen, which then go around them.
	for _, a := range pinned {
		if prev, taken := owner[a]; taken {
			return nil, fmt.Errorf("the outside's address %s belongs to %s too", a, prev)
		}
		owner[a] = "the outside"
	}
	// The zone's addresses are the outside's too: reserved as well.
	if err := p.planDNS(snap, owner); err != nil {
		return nil, err
	}
	p.addSynthetic(owner, previous)
	p.planServices(snap, owner, pinned, previous)
	sort.Strings(p.notes)
	return p, nil
}

// addSynthetic gives every node an address in each family some node or pod
// uses: other nodes need it as the next hop to the node's pods.
func (p *plan) addSynthetic(owner map[netip.Addr]string, previous *plan) {
	used := map[*ipFamily]bool{}
	for _, n := range p.nodes {
		for _, a := range n.addrs {
			used[familyOf(a)] = true
		}
		for _, c := range n.podCIDRs {
			used[familyOf(c.Addr())] = true
		}
	}
	for _, pp := range p.pods {
		for _, a := range pp.addrs {
			used[familyOf(a)] = true
		}
	}
	for _, f := range ipFamilies {
		if !used[f] {
			continue
		}
		next := f.synthetic.Addr().Next()
		for _, n := range p.nodes {
			if _, ok := n.addrOf(f); ok {
				continue
			}
			a := netip.Addr{}
			var kept []netip.Addr
			if previous != nil && previous.node(n.name) != nil {
				kept = previous.node(n.name).synthetic
			}
			for _, prev := range kept {
				if familyOf(prev) == f && owner[prev] == "" {
					a = prev
				}
			}
			for ; !a.IsValid() && f.synthetic.Contains(next); next = next.Next() {
				if owner[next] == "" {
					a = next
				}
			}
			if !a.IsValid() {
				continue // 2^15 nodes at least: not a lab
			}
			owner[a] = "node " + n.name
			n.addrs = append(n.addrs, a)
			n.synthetic = append(n.synthetic, a)
			p.notes = append(p.notes, fmt.Sprintf("node %s has no %s address: the lab gives it %s (synthetic, a next hop between nodes)", n.name, f.name, a))
		}
	}
}

// servedProbes are the pod's declared container ports (TCP when no
// protocol is given) plus extra (the lab's ExtraPorts and the ports
// EndpointSlices send the pod), sorted by port then protocol. SCTP is left
// out when the kernel has none; skipped says so.
func servedProbes(pod *corev1.Pod, extra []l4.Port, sctp bool) (out []l4.Port, skipped bool) {
	add := func(pr l4.Port) {
		if pr.Port < 1 || pr.Port > 65535 {
			return
		}
		if pr.Protocol == corev1.ProtocolSCTP && !sctp {
			skipped = true
			return
		}
		if !slices.Contains(out, pr) {
			out = append(out, pr)
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			add(l4.Port{Protocol: policy.ContainerPortProtocol(cp), Port: cp.ContainerPort})
		}
	}
	for _, pr := range extra {
		add(pr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].Protocol < out[j].Protocol
	})
	return out, skipped
}

// route is one route in a node's namespace through its uplink: on-link to
// another node's address when via is not valid, else through that node.
type route struct {
	dst netip.Prefix
	via netip.Addr
}

// routesFor lists node n's uplink routes: every other node's addresses
// on-link, every other node's pod CIDRs through it, and host routes for
// pods on other nodes whose address those CIDRs would send elsewhere (or
// nowhere). Works for arbitrary, even overlapping, addresses.
func (p *plan) routesFor(n *nodePlan) []route {
	var out []route
	taken := map[netip.Prefix]bool{}
	add := func(r route) {
		if !taken[r.dst] {
			taken[r.dst] = true
			out = append(out, r)
		}
	}
	for _, o := range p.nodes {
		if o != n {
			for _, a := range o.addrs {
				add(route{dst: hostPrefix(a)})
			}
		}
	}
	// Which node the CIDR routes lead each address to; first node wins a
	// CIDR listed twice.
	type cidrRoute struct {
		cidr netip.Prefix
		node *nodePlan
	}
	var cidrs []cidrRoute
	seen := map[netip.Prefix]bool{}
	for _, o := range p.nodes {
		for _, c := range o.podCIDRs {
			if o != n && !seen[c] {
				seen[c] = true
				cidrs = append(cidrs, cidrRoute{c, o})
			}
		}
	}
	ledTo := func(a netip.Addr) *nodePlan {
		var best *cidrRoute
		for i, c := range cidrs {
			if c.cidr.Contains(a) && (best == nil || c.cidr.Bits() > best.cidr.Bits()) {
				best = &cidrs[i]
			}
		}
		if best == nil {
			return nil
		}
		return best.node
	}
	for _, pp := range p.pods {
		if pp.hostNetwork || pp.node == n.name {
			continue // host-network addresses are node addresses, routed above
		}
		o := p.node(pp.node)
		for _, a := range pp.addrs {
			if ledTo(a) != o {
				via, _ := o.addrOf(familyOf(a))
				add(route{dst: hostPrefix(a), via: via})
			}
		}
	}
	for _, c := range cidrs {
		via, _ := c.node.addrOf(familyOf(c.cidr.Addr()))
		add(route{dst: c.cidr, via: via})
	}
	return out
}
