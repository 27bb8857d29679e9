package proxy

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// This file answers, from the model, what the NAT table (chains.go) does
// with a connection's first packet: which endpoints the node may send it
// to, what source address policy at each endpoint sees, and why it is
// refused or dropped. explain, the lab's timeout reasons and the
// conformance suite's Service comparison ask it instead of working it out
// again; TestRouteAgreesWithTracedTables holds it to the traced tables.

// FrontendKind is how a connection reaches a Service port before DNAT.
type FrontendKind int

const (
	FrontendClusterIP    FrontendKind = iota
	FrontendNodePort                  // a node address and the NodePort
	FrontendLoadBalancer              // a load-balancer ingress IP
	FrontendExternalIP                // one of spec.externalIPs
)

func (k FrontendKind) String() string {
	switch k {
	case FrontendClusterIP:
		return "ClusterIP"
	case FrontendNodePort:
		return "NodePort"
	case FrontendLoadBalancer:
		return "LoadBalancer"
	case FrontendExternalIP:
		return "ExternalIP"
	}
	return fmt.Sprintf("FrontendKind(%d)", int(k))
}

// DNATNode is the node whose NAT table rewrites a connection to a frontend
// of kind: for a ClusterIP the client's own (clientNode); for a NodePort
// the node dialed (a node's table holds only its own NodePort addresses:
// every other node forwards the packet unchanged); for a load-balancer or
// external IP the client's node, or from outside the cluster (clientNode
// "") entry, the node the network delivers it to.
func DNATNode(kind FrontendKind, clientNode, dialedNode, entry string) string {
	switch {
	case kind == FrontendNodePort:
		return dialedNode
	case clientNode != "":
		return clientNode
	case kind == FrontendClusterIP:
		return "" // a ClusterIP is reached from inside the cluster only
	}
	return entry
}

// Client is a connection's source as the NAT rules see it.
type Client struct {
	// Addr is the source address.
	Addr netip.Addr
	// NodeLocal: Addr is one of the DNATing node's own addresses (the
	// node itself, or a host-network pod of it).
	NodeLocal bool
}

// Outcome is what becomes of a connection's first packet.
type Outcome int

const (
	// Routed: DNAT to one of Route.Endpoints; policy decides from there.
	Routed Outcome = iota
	// Refused: the Service port has no endpoint anywhere; TCP is answered
	// with a reset, other protocols with ICMP port unreachable, before any
	// policy.
	Refused
	// Dropped: endpoints exist, but none the traffic policy lets this
	// node use (internal or external traffic policy Local).
	Dropped
	// Filtered: loadBalancerSourceRanges do not hold the client.
	Filtered
)

func (o Outcome) String() string {
	return [...]string{"routed", "refused", "dropped by the traffic policy", "dropped by loadBalancerSourceRanges"}[o]
}

// RoutedEndpoint is an endpoint a connection may be sent to.
type RoutedEndpoint struct {
	Endpoint
	// Masqueraded: the DNATing node rewrites the source to its own
	// address on the way out (postrouting), so the endpoint sees the node.
	Masqueraded bool
	// NodeSource: policy at the endpoint sees the DNATing node's address.
	// Policy runs on the endpoint's node (forward, input or output),
	// before the DNATing node's postrouting when that is the same node: a
	// masqueraded connection to an endpoint of the DNATing node is judged
	// from the client, one to an endpoint of another node from the node.
	NodeSource bool
	// Hairpin: the endpoint is the client itself, which is masqueraded
	// (so that the reply comes back through the DNATing node).
	Hairpin bool
}

// Route is what the DNATing node's NAT table does with a connection.
type Route struct {
	Kind      FrontendKind
	Outcome   Outcome
	Endpoints []RoutedEndpoint // when Routed
	// Refusal is how a refused connection is answered.
	Refusal string
	// Why says which endpoints the traffic policy chose, and who is
	// masqueraded.
	Why []string
}

// KindOf is the kind of p's frontend at address to: its ClusterIP, a
// load-balancer IP, an external IP, or else a node address (NodePort).
func (p *ServicePort) KindOf(to netip.Addr) FrontendKind {
	switch {
	case to == p.ClusterIP:
		return FrontendClusterIP
	case slices.Contains(p.LoadBalancerIPs, to):
		return FrontendLoadBalancer
	case slices.Contains(p.ExternalIPs, to):
		return FrontendExternalIP
	}
	return FrontendNodePort
}

// Route is what this node's NAT table (m is its model) does with client's
// connection to port p at the frontend of kind: the rules of chains.go, in
// their order.
func (m *Model) Route(p *ServicePort, kind FrontendKind, c Client) Route {
	r := Route{Kind: kind}
	if kind == FrontendLoadBalancer && len(p.LoadBalancerSourceRanges) > 0 &&
		!slices.ContainsFunc(p.LoadBalancerSourceRanges, func(pf netip.Prefix) bool { return pf.Contains(c.Addr) }) {
		r.Outcome = Filtered
		r.Why = append(r.Why, fmt.Sprintf("loadBalancerSourceRanges %v do not hold %s: dropped before DNAT", p.LoadBalancerSourceRanges, c.Addr))
		return r
	}
	if !p.AnyEndpoints {
		r.Outcome, r.Refusal = Refused, "ICMP port unreachable"
		if p.Protocol == corev1.ProtocolTCP {
			r.Refusal = "a TCP reset"
		}
		r.Why = append(r.Why, "the Service has no endpoint: the connection is rejected ("+r.Refusal+"), before any policy")
		return r
	}
	// The rules test the source against the cluster's pod networks; with
	// none known, those rules are left out.
	inPodNetwork := slices.ContainsFunc(m.ClusterCIDRs, func(pf netip.Prefix) bool { return pf.Contains(c.Addr) })
	haveCIDRs := len(m.ClusterCIDRs) > 0
	var eps []Endpoint
	masquerade := false
	if kind == FrontendClusterIP {
		eps = p.InternalEndpoints()
		if p.InternalPolicyLocal {
			r.Why = append(r.Why, fmt.Sprintf("internalTrafficPolicy Local: only endpoints on node %s", m.Node))
		}
		if haveCIDRs && !inPodNetwork {
			masquerade = true
			r.Why = append(r.Why, fmt.Sprintf("a client outside the pod network is masqueraded to node %s's address", m.Node))
		}
	} else {
		switch {
		case !p.ExternalPolicyLocal:
			eps, masquerade = p.ExternalEndpoints(), true
			r.Why = append(r.Why, fmt.Sprintf("externalTrafficPolicy Cluster: every cluster endpoint; the client is masqueraded to node %s's address", m.Node))
		case haveCIDRs && inPodNetwork:
			eps = p.ClusterEndpoints
			r.Why = append(r.Why, "externalTrafficPolicy Local: a pod's connection uses every cluster endpoint, keeping its address")
		case c.NodeLocal:
			eps, masquerade = p.ClusterEndpoints, true
			r.Why = append(r.Why, fmt.Sprintf("externalTrafficPolicy Local: node %s itself uses every cluster endpoint, masqueraded", m.Node))
		default:
			eps = p.LocalEndpoints
			r.Why = append(r.Why, fmt.Sprintf("externalTrafficPolicy Local: only endpoints on node %s, and the client keeps its address", m.Node))
		}
	}
	if len(eps) == 0 {
		r.Outcome = Dropped
		r.Why = append(r.Why, fmt.Sprintf("no endpoint serves this port for node %s under the Service's traffic policy: the connection is dropped, before any policy", m.Node))
		return r
	}
	for _, ep := range eps {
		hairpin := ep.Address == c.Addr
		masq := masquerade || hairpin
		r.Endpoints = append(r.Endpoints, RoutedEndpoint{Endpoint: ep, Masqueraded: masq, NodeSource: masq && !ep.Local, Hairpin: hairpin})
	}
	return r
}
