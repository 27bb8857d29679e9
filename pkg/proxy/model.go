// Package proxy turns Services and EndpointSlices into the service model of
// one node: for every port of every proxied Service and every IP family, the
// virtual addresses that must be load balanced and the endpoints that this
// node should send the traffic to. kpng called this the "local model"; it is
// the input of the NAT ruleset compiler and of the eTP Local health server.
//
// Build is pure (no I/O, no clock) and deterministic: the same snapshot gives
// the same model, sorted. It mirrors the behaviour of kube-proxy
// (k8s.io/kubernetes/pkg/proxy, v1.37):
//
//   - servicechangetracker / serviceport.go: Services of type ExternalName,
//     headless Services (clusterIP None or empty) and Services labelled
//     service.kubernetes.io/service-proxy-name are not proxied; a
//     Service yields one ServicePort per spec.ports entry and IP family of
//     its clusterIPs; externalIPs, load-balancer ingress IPs (ipMode VIP or
//     unset) and loadBalancerSourceRanges are split by family, and a
//     zero-length source range means "allow all" (empty list); the
//     health-check node port exists only for type LoadBalancer with
//     externalTrafficPolicy Local; ClientIP affinity defaults to 10800 s.
//   - endpointslicecache: slices belong to the Service named by their
//     kubernetes.io/service-name label; slices labelled
//     service.kubernetes.io/headless or service-proxy-name are ignored (kube-proxy's
//     informer selects them out); a slice port contributes to the
//     Service port with the same name and protocol, and its port number is
//     the (already resolved) target port; only the first address of an
//     endpoint is used; ready defaults to true, serving defaults to ready's
//     default (true), terminating to false; the same address+port in several
//     slices is one endpoint, a non-terminating copy winning over a
//     terminating one; slices of address type FQDN are ignored.
//   - topology.go CategorizeEndpoints: the cluster endpoints are the ready
//     endpoints (restricted by topology hints, below), or, if there are none,
//     the serving+terminating endpoints; the local endpoints are the ready
//     endpoints on this node or, if there are none, the serving+terminating
//     ones on this node. The two fallbacks are independent. Topology: when
//     every ready endpoint carries a node hint and some endpoint is hinted for
//     this node, only the endpoints hinted for this node are used
//     (PreferSameNode); otherwise when every ready endpoint carries a zone
//     hint and some endpoint is hinted for this node's zone
//     (topology.kubernetes.io/zone label of the Node), only those are used
//     (PreferSameZone); otherwise all. As in kube-proxy v1.37, the
//     decision reads only the hints: the Service's trafficDistribution and
//     topology-mode annotation tell the EndpointSlice controller to write
//     hints, and are carried in the model for reference only.
//
// Traffic policies: internalTrafficPolicy Local makes ClusterIP traffic use
// LocalEndpoints (no fallback to remote endpoints); externalTrafficPolicy
// Local makes NodePort, load-balancer and externalIP traffic use
// LocalEndpoints. InternalEndpoints and ExternalEndpoints pick the list that
// applies.
//
// Bad input (a port without protocol, an unparsable address, ...) becomes a
// *FieldError in Model.Errors naming the object and field; the offending
// item is skipped and everything else is still built.
package proxy

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
)

// DefaultAffinityTimeout is the ClientIP session affinity timeout, in
// seconds, when the Service does not set one (as the API server defaults).
const DefaultAffinityTimeout = 10800

// Topology modes, as chosen for a ServicePort's cluster endpoints.
const (
	TopologyNone           = ""
	TopologyPreferSameZone = corev1.ServiceTrafficDistributionPreferSameZone
	TopologyPreferSameNode = corev1.ServiceTrafficDistributionPreferSameNode
)

// Options tune Build.
type Options struct {
	// NodePortAddresses are the node addresses on which NodePorts are
	// served. Nil means the node's status addresses of type InternalIP and
	// ExternalIP.
	NodePortAddresses []netip.Addr
	// ClusterCIDRs are the pod networks of the cluster. Nil means the
	// union of every Node's spec.podCIDRs.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are ranges ClusterIPs are allocated from (the API
	// server's --service-cluster-ip-range), beside the cluster's
	// ServiceCIDR objects. New connections to an address of them that no
	// Service holds are dropped, as kube-proxy's nftables mode drops them:
	// outside them such connections follow the node's routes (a default
	// route takes them off the cluster).
	ServiceCIDRs []netip.Prefix
}

// Model is the service model of one node.
type Model struct {
	// Node is the node's name; Zone its topology.kubernetes.io/zone label
	// (empty when the Node is unknown or unlabelled).
	Node string
	Zone string
	// NodePortAddresses are the addresses NodePorts are served on.
	NodePortAddresses []netip.Addr
	// ClusterCIDRs are the pod networks: traffic from them to a ClusterIP
	// keeps its source address; traffic from elsewhere is masqueraded.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are Options.ServiceCIDRs and the spec.cidrs of the
	// snapshot's ServiceCIDRs, sorted, each once.
	ServiceCIDRs []netip.Prefix
	// Services holds one entry per Service, port and IP family, sorted by
	// namespace, name, port name, protocol, family (IPv4 first).
	Services []*ServicePort
	// HealthChecks lists the Services with a health-check node port
	// (type LoadBalancer, externalTrafficPolicy Local), sorted by name.
	HealthChecks []HealthCheck
	// Errors are problems in the input; each is a *FieldError.
	Errors []error
}

// HealthCheck is what the eTP Local health server answers for one Service:
// 200 when LocalEndpoints > 0, 503 otherwise.
type HealthCheck struct {
	Namespace, Name string
	NodePort        int32
	// LocalEndpoints counts the distinct addresses of ready endpoints on
	// this node, over all ports and families of the Service (terminating
	// endpoints do not count, as in kube-proxy).
	LocalEndpoints int
}

// ServicePort is one port of one Service for one IP family.
type ServicePort struct {
	Namespace, Name string
	PortName        string
	Protocol        corev1.Protocol // TCP, UDP or SCTP
	Family          corev1.IPFamily // IPv4 or IPv6

	ClusterIP netip.Addr
	Port      int32
	NodePort  int32 // 0: none
	// LoadBalancerIPs are the status.loadBalancer.ingress IPs of this
	// family in VIP mode.
	LoadBalancerIPs []netip.Addr
	ExternalIPs     []netip.Addr
	// LoadBalancerSourceRanges of this family; empty means any source.
	LoadBalancerSourceRanges []netip.Prefix

	// AffinityTimeout is the ClientIP session affinity timeout in seconds;
	// 0 means no session affinity.
	AffinityTimeout int32

	InternalPolicyLocal bool // internalTrafficPolicy: Local
	ExternalPolicyLocal bool // externalTrafficPolicy: Local (and externally reachable Service)
	HealthCheckNodePort int32
	// TrafficDistribution is spec.trafficDistribution (informational).
	TrafficDistribution string
	// TopologyMode is the topology filter applied to ClusterEndpoints:
	// TopologyNone, TopologyPreferSameZone or TopologyPreferSameNode.
	TopologyMode string

	// ClusterEndpoints serve traffic under the Cluster policy (ClusterIP
	// unless iTP Local; external traffic unless eTP Local). Empty when no
	// endpoint is usable or the port never uses the Cluster policy
	// (iTP Local and not externally accessible).
	ClusterEndpoints []Endpoint
	// LocalEndpoints serve traffic under the Local policy: the ready
	// endpoints on this node, else its serving terminating ones. Empty when
	// there are none or the port never uses the Local policy.
	LocalEndpoints []Endpoint
	// AnyEndpoints says whether the Service port has usable (ready, or
	// serving and terminating) endpoints anywhere in the cluster; with none,
	// traffic is rejected, otherwise (no local endpoint) dropped.
	AnyEndpoints bool
}

// String names the port: "namespace/name:portname/PROTOCOL/family".
func (p *ServicePort) String() string {
	return fmt.Sprintf("%s/%s:%s/%s/%s", p.Namespace, p.Name, p.PortName, p.Protocol, p.Family)
}

// ExternallyAccessible says whether the port is reachable other than through
// its ClusterIP (NodePort, load-balancer IPs or externalIPs).
func (p *ServicePort) ExternallyAccessible() bool {
	return p.NodePort != 0 || len(p.LoadBalancerIPs) > 0 || len(p.ExternalIPs) > 0
}

// UsesClusterEndpoints says whether some traffic to the port uses the
// Cluster policy.
func (p *ServicePort) UsesClusterEndpoints() bool {
	return !p.InternalPolicyLocal || p.ExternallyAccessible()
}

// UsesLocalEndpoints says whether some traffic to the port uses the Local
// policy.
func (p *ServicePort) UsesLocalEndpoints() bool {
	return p.InternalPolicyLocal || (p.ExternalPolicyLocal && p.ExternallyAccessible())
}

// InternalEndpoints are the endpoints for traffic to the ClusterIP.
func (p *ServicePort) InternalEndpoints() []Endpoint {
	if p.InternalPolicyLocal {
		return p.LocalEndpoints
	}
	return p.ClusterEndpoints
}

// ExternalEndpoints are the endpoints for traffic to the NodePort,
// load-balancer IPs and externalIPs (nil when the port has none of them).
func (p *ServicePort) ExternalEndpoints() []Endpoint {
	if !p.ExternallyAccessible() {
		return nil
	}
	if p.ExternalPolicyLocal {
		return p.LocalEndpoints
	}
	return p.ClusterEndpoints
}

// ReachableEndpoints is the union of ClusterEndpoints and LocalEndpoints,
// sorted: every endpoint that this node may send the port's traffic to.
// Read only: when one list holds the other (the usual case: the local
// endpoints are among the cluster's), it is that list itself.
func (p *ServicePort) ReachableEndpoints() []Endpoint {
	all, other := p.ClusterEndpoints, p.LocalEndpoints
	if len(all) < len(other) {
		all, other = other, all
	}
	if strictlySorted(all) && holdsAll(all, other) {
		return all
	}
	// Stable, so that an endpoint in both lists is ClusterEndpoints' copy.
	out := append(slices.Clone(p.ClusterEndpoints), p.LocalEndpoints...)
	slices.SortStableFunc(out, compareEndpoints)
	return slices.CompactFunc(out, func(a, b Endpoint) bool { return compareEndpoints(a, b) == 0 })
}

// strictlySorted reports whether eps is sorted without repeated address and
// port.
func strictlySorted(eps []Endpoint) bool {
	for i := 1; i < len(eps); i++ {
		if compareEndpoints(eps[i-1], eps[i]) >= 0 {
			return false
		}
	}
	return true
}

// holdsAll reports whether sorted holds every endpoint of eps (the same
// address and port, and the same endpoint).
func holdsAll(sorted, eps []Endpoint) bool {
	for _, ep := range eps {
		i, found := slices.BinarySearchFunc(sorted, ep, compareEndpoints)
		if !found || !equalEndpoint(sorted[i], ep) {
			return false
		}
	}
	return true
}

// Endpoint is one backend of a ServicePort.
type Endpoint struct {
	Address netip.Addr
	Port    int32 // the resolved target port
	// The conditions next to Port, where the struct has room: a model
	// holds one Endpoint per endpoint and port (16 bytes less each).
	Local       bool // NodeName is this node
	Ready       bool
	Serving     bool
	Terminating bool
	// PodNamespace and PodName come from the endpoint's targetRef (empty
	// when there is none).
	PodNamespace, PodName string
	NodeName              string
	Zone                  string
	// Hints are the endpoint's topology hints (nil: none).
	Hints *EndpointHints
}

// EndpointHints are an endpoint's topology hints: the zones and nodes it
// should serve. Behind a pointer in Endpoint, as most endpoints have none:
// 40 bytes less per endpoint and port than two lists.
type EndpointHints struct {
	Zones, Nodes []string
}

// ZoneHints are the zones the endpoint's hints name.
func (e Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints are the nodes the endpoint's hints name.
func (e Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// String is "address:port" ("[v6]:port" for IPv6).
func (e Endpoint) String() string {
	return netip.AddrPortFrom(e.Address, uint16(e.Port)).String()
}

// FieldError is a problem in one field of one input object.
type FieldError struct {
	Object  cluster.ObjectKey
	Field   string
	Message string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Object, e.Field, e.Message)
}

func itoa(i int) string { return strconv.Itoa(i) }
