package proxy

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// StaleUDP compares the model a node was programmed with (prev, nil for
// none) with the one it is now programmed with, and returns what UDP
// conntrack entries have gone stale (UDP has no teardown, so a client that
// keeps sending keeps its entry and its old NAT decision):
//
//   - endpoints: endpoints of a UDP Service port that this node may no
//     longer send that port's traffic to (removed, or the Service deleted);
//     entries NATed to them must go;
//   - frontends: UDP frontends (ClusterIP, NodePort on each NodePort
//     address, load-balancer and external IPs) that had no endpoint before
//     and have some now; entries made while they were rejected or dropped
//     must go so the next datagram is NATed.
//
// Both lists are sorted and without duplicates.
func StaleUDP(prev, next *Model) (frontends, endpoints []netip.AddrPort) {
	if prev == nil {
		prev = &Model{}
	}
	nextEndpoints := map[string]map[netip.AddrPort]bool{}
	for _, p := range next.Services {
		if p.Protocol != corev1.ProtocolUDP {
			continue
		}
		set := map[netip.AddrPort]bool{}
		for _, ep := range p.ReachableEndpoints() {
			set[ep.addrPort()] = true
		}
		nextEndpoints[p.String()] = set
	}
	prevFrontends := map[netip.AddrPort]bool{} // frontends that had endpoints
	for _, p := range prev.Services {
		if p.Protocol != corev1.ProtocolUDP {
			continue
		}
		for _, ep := range p.ReachableEndpoints() {
			if !nextEndpoints[p.String()][ep.addrPort()] {
				endpoints = append(endpoints, ep.addrPort())
			}
		}
		for _, fe := range p.frontends(prev.NodePortAddresses) {
			if fe.hasEndpoints {
				prevFrontends[fe.AddrPort] = true
			}
		}
	}
	for _, p := range next.Services {
		if p.Protocol != corev1.ProtocolUDP {
			continue
		}
		for _, fe := range p.frontends(next.NodePortAddresses) {
			if fe.hasEndpoints && !prevFrontends[fe.AddrPort] {
				frontends = append(frontends, fe.AddrPort)
			}
		}
	}
	return sortedUnique(frontends), sortedUnique(endpoints)
}

func (e Endpoint) addrPort() netip.AddrPort { return netip.AddrPortFrom(e.Address, uint16(e.Port)) }

type servedFrontend struct {
	netip.AddrPort
	hasEndpoints bool
}

// frontends lists where the port is reached and whether it has endpoints
// there.
func (p *ServicePort) frontends(nodePortAddresses []netip.Addr) []servedFrontend {
	out := []servedFrontend{{netip.AddrPortFrom(p.ClusterIP, uint16(p.Port)), len(p.InternalEndpoints()) > 0}}
	external := len(p.ExternalEndpoints()) > 0
	if p.NodePort != 0 {
		for _, a := range nodePortAddresses {
			if a.Is4() == p.ClusterIP.Is4() {
				out = append(out, servedFrontend{netip.AddrPortFrom(a, uint16(p.NodePort)), external})
			}
		}
	}
	for _, ip := range append(slices.Clone(p.LoadBalancerIPs), p.ExternalIPs...) {
		out = append(out, servedFrontend{netip.AddrPortFrom(ip, uint16(p.Port)), external})
	}
	return out
}

func sortedUnique(s []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(s, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(s)
}
