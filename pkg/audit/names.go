package audit

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
)

// Names names addresses as the verdict log writes them: a node's
// addresses (its own and its host-network pods') node/NAME, a pod-network
// pod's namespace/name.
type Names map[netip.Addr]string

// NamesOf are the names of a snapshot's nodes and pods.
func NamesOf(snap *cluster.Snapshot) Names {
	n := Names{}
	for _, node := range snap.Nodes {
		for _, a := range node.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if addr, err := netip.ParseAddr(a.Address); err == nil {
				n[addr] = "node/" + node.Name
			}
		}
	}
	for _, p := range snap.Pods {
		if p.Spec.HostNetwork || cluster.PodFinished(p) {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if addr, err := netip.ParseAddr(ip.IP); err == nil {
				n[addr] = p.Namespace + "/" + p.Name
			}
		}
		if addr, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			n[addr] = p.Namespace + "/" + p.Name
		}
	}
	return n
}

// Name is n's name of a ("" when it has none).
func (n Names) Name(a netip.Addr) string { return n[a.Unmap()] }
