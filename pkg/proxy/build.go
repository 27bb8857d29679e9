package proxy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/policy"
)

// Build computes the service model of node from the Services,
// EndpointSlices and Nodes of snap. It never fails: problems in the input
// are reported in Model.Errors and the rest is still built.
func Build(snap *cluster.Snapshot, node string, opts Options) *Model {
	b := &builder{m: &Model{Node: node}, node: node}
	if snap == nil {
		snap = &cluster.Snapshot{}
	}
	b.nodeInfo(snap, opts)
	parsed := ParseSlices(snap.EndpointSlices, node)
	for _, ps := range parsed {
		b.m.Errors = append(b.m.Errors, ps.Errors...)
	}
	bySvc := map[svcKey][]*Slice{}
	groupSlices(bySvc, parsed)
	for _, svc := range snap.Services {
		if svc != nil {
			b.service(svc, bySvc[svcKey{svc.Namespace, svc.Name}])
		}
	}
	sortPorts(b.m.Services)
	slices.SortFunc(b.m.HealthChecks, func(x, y HealthCheck) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	return b.m
}

// sortPorts sorts by namespace, name, port name, protocol, family.
func sortPorts(ports []*ServicePort) {
	slices.SortFunc(ports, func(x, y *ServicePort) int {
		return cmp.Or(
			cmp.Compare(x.Namespace, y.Namespace),
			cmp.Compare(x.Name, y.Name),
			cmp.Compare(x.PortName, y.PortName),
			cmp.Compare(x.Protocol, y.Protocol),
			cmp.Compare(x.Family, y.Family), // "IPv4" < "IPv6"
		)
	})
}

type builder struct {
	m    *Model
	node string
	// Scratch for service, emptied and reused from one Service to the
	// next: made per Service, these small maps were a large share of a
	// NAT first sync's garbage.
	byFamily   map[corev1.IPFamily]map[portKey][]Endpoint
	localReady map[netip.Addr]bool
	merged     map[familyPort]bool
}

type familyPort struct {
	family corev1.IPFamily
	port   portKey
}

type svcKey struct{ namespace, name string }

// portKey matches an EndpointSlice port to a Service port.
type portKey struct {
	name     string
	protocol corev1.Protocol
}

func (b *builder) errorf(obj cluster.ObjectKey, field, format string, args ...any) {
	b.m.Errors = append(b.m.Errors, newFieldError(obj, field, format, args...))
}

func newFieldError(obj cluster.ObjectKey, field, format string, args ...any) *FieldError {
	return &FieldError{Object: obj, Field: field, Message: fmt.Sprintf(format, args...)}
}

// nodeInfo sets what the model takes from the cluster beside its
// Services: the node's zone and NodePort addresses, the pod networks and
// the Service ranges.
func (b *builder) nodeInfo(snap *cluster.Snapshot, opts Options) {
	nodes := snap.Nodes
	var node *corev1.Node
	for _, n := range nodes {
		if n != nil && n.Name == b.node && b.node != "" {
			node = n
			break
		}
	}
	if node != nil {
		b.m.Zone = node.Labels[corev1.LabelTopologyZone]
	}
	b.clusterCIDRs(nodes, opts)
	b.serviceCIDRs(snap.ServiceCIDRs, opts)
	if opts.NodePortAddresses != nil {
		b.m.NodePortAddresses = slices.Clone(opts.NodePortAddresses)
		return
	}
	if node == nil {
		return
	}
	obj := cluster.ObjectKey{Kind: cluster.KindNode, Name: node.Name}
	for i, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			b.errorf(obj, fmt.Sprintf("status.addresses[%d].address", i), "invalid IP %q", a.Address)
			continue
		}
		if !slices.Contains(b.m.NodePortAddresses, ip) {
			b.m.NodePortAddresses = append(b.m.NodePortAddresses, ip)
		}
	}
}

// clusterCIDRs sets the pod networks: the option, or every node's
// spec.podCIDRs (spec.podCIDR when the list is empty).
func (b *builder) clusterCIDRs(nodes []*corev1.Node, opts Options) {
	if opts.ClusterCIDRs != nil {
		b.m.ClusterCIDRs = slices.Clone(opts.ClusterCIDRs)
		return
	}
	for _, n := range nodes {
		if n == nil {
			continue
		}
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		obj := cluster.ObjectKey{Kind: cluster.KindNode, Name: n.Name}
		for i, s := range cidrs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				b.errorf(obj, fmt.Sprintf("spec.podCIDRs[%d]", i), "invalid CIDR %q", s)
				continue
			}
			if p = p.Masked(); !slices.Contains(b.m.ClusterCIDRs, p) {
				b.m.ClusterCIDRs = append(b.m.ClusterCIDRs, p)
			}
		}
	}
	slices.SortFunc(b.m.ClusterCIDRs, comparePrefixes)
}

// serviceCIDRs sets the Service ranges: the option's and every
// ServiceCIDR's spec.cidrs, as kube-proxy reads them (all of them, ready
// or not: a ServiceCIDR being deleted still holds allocated ClusterIPs).
func (b *builder) serviceCIDRs(objs []*networkingv1.ServiceCIDR, opts Options) {
	b.m.ServiceCIDRs = slices.Clone(opts.ServiceCIDRs)
	for _, o := range objs {
		if o == nil {
			continue
		}
		obj := cluster.ObjectKey{Kind: cluster.KindServiceCIDR, Name: o.Name}
		for i, s := range o.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				b.errorf(obj, fmt.Sprintf("spec.cidrs[%d]", i), "invalid CIDR %q", s)
				continue
			}
			b.m.ServiceCIDRs = append(b.m.ServiceCIDRs, p.Masked())
		}
	}
	slices.SortFunc(b.m.ServiceCIDRs, comparePrefixes)
	b.m.ServiceCIDRs = slices.Compact(b.m.ServiceCIDRs)
}

func comparePrefixes(x, y netip.Prefix) int {
	return cmp.Or(x.Addr().Compare(y.Addr()), cmp.Compare(x.Bits(), y.Bits()))
}

// LabelServiceProxyName on a Service (and its EndpointSlices) names the
// proxy implementation that serves it instead of the default one: kube-proxy
// (and netpol) leave such Services alone, whatever the value.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

func validProtocol(p corev1.Protocol) bool {
	return p == corev1.ProtocolTCP || p == corev1.ProtocolUDP || p == corev1.ProtocolSCTP
}

// service adds the ServicePorts of one Service, whose slices are
// endpointSlices (sorted by name).
func (b *builder) service(svc *corev1.Service, endpointSlices []*Slice) {
	spec := &svc.Spec
	if spec.Type == corev1.ServiceTypeExternalName {
		return
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return // another proxy's, as kube-proxy leaves it
	}
	if spec.ClusterIP == "" || spec.ClusterIP == corev1.ClusterIPNone {
		return // headless
	}
	obj := cluster.ObjectKey{Kind: cluster.KindService, Namespace: svc.Namespace, Name: svc.Name}

	// ClusterIPs by family (one per family).
	clusterIPs := map[corev1.IPFamily]netip.Addr{}
	var families []corev1.IPFamily
	ips, field := spec.ClusterIPs, "spec.clusterIPs"
	if len(ips) == 0 {
		ips, field = []string{spec.ClusterIP}, "spec.clusterIP"
	}
	for i, s := range ips {
		f := field
		if field == "spec.clusterIPs" {
			f += "[" + itoa(i) + "]"
		}
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			b.errorf(obj, f, "invalid IP %q", s)
			continue
		}
		ip = ip.Unmap()
		fam := ipfamily.Of(ip).Kubernetes()
		if i < len(spec.IPFamilies) && spec.IPFamilies[i] != fam {
			b.errorf(obj, f, "%s does not match spec.ipFamilies[%d] %s", ip, i, spec.IPFamilies[i])
			continue
		}
		if _, dup := clusterIPs[fam]; dup {
			b.errorf(obj, f, "second %s cluster IP %s", fam, ip)
			continue
		}
		clusterIPs[fam] = ip
		families = append(families, fam)
	}
	if len(families) == 0 {
		return
	}

	externalIPs := map[corev1.IPFamily][]netip.Addr{}
	for i, s := range spec.ExternalIPs {
		ip, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || ip.Zone() != "" {
			b.errorf(obj, "spec.externalIPs["+itoa(i)+"]", "invalid IP %q", s)
			continue
		}
		ip = ip.Unmap()
		externalIPs[ipfamily.Of(ip).Kubernetes()] = append(externalIPs[ipfamily.Of(ip).Kubernetes()], ip)
	}
	lbIPs := map[corev1.IPFamily][]netip.Addr{}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
			continue // hostname-only or proxy-mode load balancer
		}
		ip, err := netip.ParseAddr(ing.IP)
		if err != nil || ip.Zone() != "" {
			b.errorf(obj, "status.loadBalancer.ingress["+itoa(i)+"].ip", "invalid IP %q", ing.IP)
			continue
		}
		ip = ip.Unmap()
		lbIPs[ipfamily.Of(ip).Kubernetes()] = append(lbIPs[ipfamily.Of(ip).Kubernetes()], ip)
	}
	ranges := map[corev1.IPFamily][]netip.Prefix{}
	anySource := map[corev1.IPFamily]bool{}
	for i, s := range spec.LoadBalancerSourceRanges {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			b.errorf(obj, "spec.loadBalancerSourceRanges["+itoa(i)+"]", "invalid CIDR %q", s)
			continue
		}
		p = p.Masked()
		fam := ipfamily.Of(p.Addr()).Kubernetes()
		if p.Bits() == 0 {
			anySource[fam] = true
		}
		ranges[fam] = append(ranges[fam], p)
	}

	var affinity int32
	if spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		affinity = DefaultAffinityTimeout
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			affinity = *c.ClientIP.TimeoutSeconds
			if affinity <= 0 {
				b.errorf(obj, "spec.sessionAffinityConfig.clientIP.timeoutSeconds", "must be positive, using %d", DefaultAffinityTimeout)
				affinity = DefaultAffinityTimeout
			}
		}
	}
	internalLocal := spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	externallyAccessible := spec.Type == corev1.ServiceTypeLoadBalancer || spec.Type == corev1.ServiceTypeNodePort ||
		((spec.Type == corev1.ServiceTypeClusterIP || spec.Type == "") && len(spec.ExternalIPs) > 0)
	externalLocal := externallyAccessible && spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	var hcPort int32
	if spec.Type == corev1.ServiceTypeLoadBalancer && externalLocal {
		if spec.HealthCheckNodePort == 0 {
			b.errorf(obj, "spec.healthCheckNodePort", "unset for a LoadBalancer with externalTrafficPolicy Local")
		} else {
			hcPort = spec.HealthCheckNodePort
		}
	}
	var trafficDist string
	if spec.TrafficDistribution != nil {
		trafficDist = *spec.TrafficDistribution
	}

	// Endpoints by family and port, sorted and de-duplicated across slices.
	if b.byFamily == nil {
		b.byFamily = map[corev1.IPFamily]map[portKey][]Endpoint{}
	}
	endpoints := b.byFamily
	for _, byPort := range endpoints {
		clear(byPort)
	}
	// A slice's own list is shared, read only (ParseSlice sorted it and
	// set its port); lists merged from several slices, or for one of
	// several ports, are made here and de-duplicated again.
	if b.merged == nil {
		b.merged = map[familyPort]bool{}
	}
	clear(b.merged)
	for _, ps := range endpointSlices {
		if ps.Family == "" {
			continue // not proxied
		}
		byPort := endpoints[ps.Family]
		if byPort == nil {
			byPort = map[portKey][]Endpoint{}
			endpoints[ps.Family] = byPort
		}
		for _, sp := range ps.Ports {
			k := sp.key()
			if len(ps.Ports) == 1 && byPort[k] == nil {
				byPort[k] = ps.Endpoints
				continue
			}
			if len(ps.Endpoints) == 0 {
				continue
			}
			// Never appended to in place: a slice's list has no room.
			list := slices.Grow(byPort[k], len(ps.Endpoints))
			for _, ep := range ps.Endpoints {
				ep.Port = sp.Port
				list = append(list, ep)
			}
			byPort[k] = list
			b.merged[familyPort{ps.Family, k}] = true
		}
	}
	for fp := range b.merged {
		byPort := endpoints[fp.family]
		byPort[fp.port] = dedupSorted(byPort[fp.port])
	}

	if b.localReady == nil {
		b.localReady = map[netip.Addr]bool{}
	}
	localReady := b.localReady
	clear(localReady)
	for i, port := range spec.Ports {
		pf := "spec.ports[" + itoa(i) + "]"
		// The API server defaults an unset protocol to TCP; a file may
		// leave it out.
		proto := policy.DefaultProtocol(port.Protocol)
		if !validProtocol(proto) {
			b.errorf(obj, pf+".protocol", "unsupported protocol %q", proto)
			continue
		}
		if port.Port <= 0 || port.Port > 65535 {
			b.errorf(obj, pf+".port", "%d out of range", port.Port)
			continue
		}
		nodePort := port.NodePort
		if nodePort < 0 || nodePort > 65535 {
			b.errorf(obj, pf+".nodePort", "%d out of range", nodePort)
			nodePort = 0
		}
		for _, fam := range families {
			sp := &ServicePort{
				Namespace:                svc.Namespace,
				Name:                     svc.Name,
				PortName:                 port.Name,
				Protocol:                 proto,
				Family:                   fam,
				ClusterIP:                clusterIPs[fam],
				Port:                     port.Port,
				NodePort:                 nodePort,
				LoadBalancerIPs:          lbIPs[fam],
				ExternalIPs:              externalIPs[fam],
				LoadBalancerSourceRanges: ranges[fam],
				AffinityTimeout:          affinity,
				InternalPolicyLocal:      internalLocal,
				ExternalPolicyLocal:      externalLocal,
				HealthCheckNodePort:      hcPort,
				TrafficDistribution:      trafficDist,
			}
			if anySource[fam] {
				sp.LoadBalancerSourceRanges = nil // a /0 allows every source
			}
			// Shared by the ports of one key (there is one, unless the
			// object repeats a port), read only.
			eps := endpoints[fam][portKey{port.Name, proto}]
			for _, ep := range eps {
				if ep.Local && ep.Ready {
					localReady[ep.Address] = true
				}
			}
			b.categorize(sp, eps)
			b.m.Services = append(b.m.Services, sp)
		}
	}
	if hcPort != 0 {
		b.m.HealthChecks = append(b.m.HealthChecks, HealthCheck{
			Namespace: svc.Namespace, Name: svc.Name, NodePort: hcPort, LocalEndpoints: len(localReady),
		})
	}
}

// dedupSorted sorts eps (in place) and keeps one endpoint per address
// and port: the last copy that is not terminating, else the first, as
// kube-proxy prefers a non-terminating copy (an IP reused by a new pod
// while the old one terminates).
func dedupSorted(eps []Endpoint) []Endpoint {
	slices.SortStableFunc(eps, compareEndpoints)
	out := eps[:0]
	for i := 0; i < len(eps); {
		j, keep := i+1, eps[i]
		for ; j < len(eps) && compareEndpoints(eps[i], eps[j]) == 0; j++ {
			if !eps[j].Terminating {
				keep = eps[j]
			}
		}
		out = append(out, keep)
		i = j
	}
	return slices.Clip(out)
}

// compareEndpoints orders endpoints by address, then port.
func compareEndpoints(x, y Endpoint) int {
	return cmp.Or(x.Address.Compare(y.Address), cmp.Compare(x.Port, y.Port))
}

// equalEndpoint reports whether two endpoints are the same in every field.
func equalEndpoint(x, y Endpoint) bool {
	return x.Address == y.Address && x.Port == y.Port && x.PodNamespace == y.PodNamespace &&
		x.PodName == y.PodName && x.NodeName == y.NodeName && x.Zone == y.Zone && x.Local == y.Local &&
		x.Ready == y.Ready && x.Serving == y.Serving && x.Terminating == y.Terminating &&
		slices.Equal(x.ZoneHints(), y.ZoneHints()) && slices.Equal(x.NodeHints(), y.NodeHints())
}

// categorize fills the ServicePort's cluster and local endpoints from all of
// its endpoints, as kube-proxy's CategorizeEndpoints does.
func (b *builder) categorize(sp *ServicePort, eps []Endpoint) {
	if len(eps) == 0 {
		return
	}
	if sp.UsesClusterEndpoints() {
		sp.TopologyMode = topologyMode(eps, b.node, b.m.Zone)
		sp.ClusterEndpoints = filter(eps, func(ep Endpoint) bool {
			return ep.Ready && availableForTopology(ep, sp.TopologyMode, b.node, b.m.Zone)
		})
		if len(sp.ClusterEndpoints) == 0 {
			// No ready endpoint anywhere (topology never empties the
			// list): fall back to serving terminating endpoints.
			sp.ClusterEndpoints = filter(eps, func(ep Endpoint) bool { return ep.Serving && ep.Terminating })
		}
		sp.AnyEndpoints = len(sp.ClusterEndpoints) > 0
	}
	if !sp.UsesLocalEndpoints() {
		return
	}
	var localReady, localTerminating bool
	for _, ep := range eps {
		switch {
		case ep.Ready:
			sp.AnyEndpoints = true
			localReady = localReady || ep.Local
		case ep.Serving && ep.Terminating:
			sp.AnyEndpoints = true
			localTerminating = localTerminating || ep.Local
		}
	}
	switch {
	case localReady:
		sp.LocalEndpoints = filter(eps, func(ep Endpoint) bool { return ep.Local && ep.Ready })
	case localTerminating:
		sp.LocalEndpoints = filter(eps, func(ep Endpoint) bool { return ep.Local && ep.Serving && ep.Terminating })
	}
}

// topologyMode decides which hints restrict the cluster endpoints: node
// hints if every ready endpoint has one and some endpoint is hinted for
// this node; else zone hints, likewise for this node's zone; else none.
func topologyMode(eps []Endpoint, node, zone string) string {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		anyReady = true
		if len(ep.NodeHints()) == 0 {
			allNode = false
		} else if node != "" && slices.Contains(ep.NodeHints(), node) {
			forNode = true
		}
		if len(ep.ZoneHints()) == 0 {
			allZone = false
		} else if zone != "" && slices.Contains(ep.ZoneHints(), zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return TopologyNone
	case allNode && forNode:
		return TopologyPreferSameNode
	case allZone && forZone:
		return TopologyPreferSameZone
	}
	return TopologyNone
}

func availableForTopology(ep Endpoint, mode, node, zone string) bool {
	switch mode {
	case TopologyPreferSameNode:
		return slices.Contains(ep.NodeHints(), node)
	case TopologyPreferSameZone:
		return slices.Contains(ep.ZoneHints(), zone)
	}
	return true
}

// filter returns the endpoints keep keeps: eps itself when it keeps them
// all (the usual case: every endpoint ready), shared and read only.
func filter(eps []Endpoint, keep func(Endpoint) bool) []Endpoint {
	all := true
	for _, ep := range eps {
		if !keep(ep) {
			all = false
			break
		}
	}
	if all {
		return slices.Clip(eps)
	}
	var out []Endpoint
	for _, ep := range eps {
		if keep(ep) {
			out = append(out, ep)
		}
	}
	return out
}
