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
//
// A port the two models share unchanged (the same *ServicePort, as the
// Syncer keeps them) changes nothing and costs no more than a map lookup.
func StaleUDP(prev, next *Model) (frontends, endpoints []netip.AddrPort) {
	if prev == nil {
		prev = &Model{}
	}
	prevPorts, nextPorts := udpPorts(prev), udpPorts(next)
	prevFrontends := map[netip.AddrPort]bool{} // frontends of changed ports that had endpoints
	for k, p := range prevPorts {
		n := nextPorts[k]
		if n == p {
			continue
		}
		var still map[netip.AddrPort]bool
		if n != nil {
			still = map[netip.AddrPort]bool{}
			for _, ep := range n.ReachableEndpoints() {
				still[ep.addrPort()] = true
			}
		}
		for _, ep := range p.ReachableEndpoints() {
			if !still[ep.addrPort()] {
				endpoints = append(endpoints, ep.addrPort())
			}
		}
		for _, fe := range p.frontends(prev.NodePortAddresses) {
			if fe.hasEndpoints {
				prevFrontends[fe.AddrPort] = true
			}
		}
	}
	for k, n := range nextPorts {
		if prevPorts[k] == n {
			continue
		}
		for _, fe := range n.frontends(next.NodePortAddresses) {
			if fe.hasEndpoints && !prevFrontends[fe.AddrPort] {
				frontends = append(frontends, fe.AddrPort)
			}
		}
	}
	return sortedUnique(frontends), sortedUnique(endpoints)
}

// servicePortKey names a ServicePort across models.
type servicePortKey struct {
	namespace, name, port string
	family                corev1.IPFamily
}

// udpPorts indexes a model's UDP ports.
func udpPorts(m *Model) map[servicePortKey]*ServicePort {
	out := map[servicePortKey]*ServicePort{}
	for _, p := range m.Services {
		if p.Protocol == corev1.ProtocolUDP {
			out[servicePortKey{p.Namespace, p.Name, p.PortName, p.Family}] = p
		}
	}
	return out
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
	for _, ap := range p.externalAddrPorts(nodePortAddresses) {
		out = append(out, servedFrontend{ap, external})
	}
	return out
}

func sortedUnique(s []netip.AddrPort) []netip.AddrPort {
	slices.SortFunc(s, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(s)
}
