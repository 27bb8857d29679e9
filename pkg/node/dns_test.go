package node

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/netpol/netpol/pkg/proxy"
)

// TestClusterDNS: the ready endpoints of kube-system/kube-dns on its DNS
// ports (named dns or dns-tcp, or 53), both families; not its metrics
// port, not other Services' slices, not endpoints that are not ready;
// the same from the API objects and from the slices parsed (the agent's).
func TestClusterDNS(t *testing.T) {
	slice := func(ns, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		typ := discoveryv1.AddressTypeIPv4
		if netip.MustParseAddr(eps[0].Addresses[0]).Is6() {
			typ = discoveryv1.AddressTypeIPv6
		}
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: typ, Ports: ports, Endpoints: eps}
	}
	port := func(name string, n int32, proto corev1.Protocol) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(n), Protocol: ptr.To(proto)}
	}
	ep := func(ready *bool, addrs ...string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	dnsPorts := []discoveryv1.EndpointPort{port("dns", 53, corev1.ProtocolUDP), port("dns-tcp", 53, corev1.ProtocolTCP), port("metrics", 9153, corev1.ProtocolTCP)}
	all := []*discoveryv1.EndpointSlice{
		slice("kube-system", "kube-dns", dnsPorts, ep(nil, "10.244.1.53"), ep(ptr.To(false), "10.244.2.53"), ep(ptr.To(true), "10.244.3.53")),
		slice("kube-system", "kube-dns", []discoveryv1.EndpointPort{port("dns", 5353, corev1.ProtocolUDP)}, ep(nil, "fd00::53")),
		slice("kube-system", "other", dnsPorts, ep(nil, "10.244.9.9")),
		slice("default", "kube-dns", dnsPorts, ep(nil, "10.244.8.8")),
		nil,
	}
	var want []netip.AddrPort
	for _, s := range []string{"10.244.1.53:53", "10.244.3.53:53", "[fd00::53]:5353"} {
		want = append(want, netip.MustParseAddrPort(s))
	}
	if got := ClusterDNS(all); !slices.Equal(got, want) {
		t.Errorf("ClusterDNS = %v, want %v", got, want)
	}
	if got := ClusterDNSOf(proxy.ParseSlices(all, "node-1")); !slices.Equal(got, want) {
		t.Errorf("ClusterDNSOf = %v, want %v", got, want)
	}
}
