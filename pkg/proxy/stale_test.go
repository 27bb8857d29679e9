package proxy

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestStaleUDP(t *testing.T) {
	ep := func(a string, port int32) Endpoint {
		return Endpoint{Address: netip.MustParseAddr(a), Port: port, Ready: true, Serving: true}
	}
	udp := func(cip string, nodePort int32, eps ...Endpoint) *ServicePort {
		return &ServicePort{Namespace: "ns", Name: "dns", PortName: "dns", Protocol: corev1.ProtocolUDP, Family: corev1.IPv4Protocol,
			ClusterIP: netip.MustParseAddr(cip), Port: 53, NodePort: nodePort, ClusterEndpoints: eps, AnyEndpoints: len(eps) > 0}
	}
	tcp := func(eps ...Endpoint) *ServicePort {
		p := udp("10.96.0.10", 0, eps...)
		p.Protocol, p.PortName = corev1.ProtocolTCP, "dns-tcp"
		return p
	}
	model := func(ports ...*ServicePort) *Model {
		return &Model{NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.168.0.1")}, Services: ports}
	}
	aps := func(s ...string) []netip.AddrPort {
		var out []netip.AddrPort
		for _, x := range s {
			out = append(out, netip.MustParseAddrPort(x))
		}
		return out
	}
	a, b := ep("10.244.1.5", 5353), ep("10.244.2.5", 5353)
	cases := []struct {
		name                    string
		prev, next              *Model
		wantFrontends, wantEnds []netip.AddrPort
	}{
		{"first sync: every served frontend", nil, model(udp("10.96.0.10", 30053, a)),
			aps("10.96.0.10:53", "192.168.0.1:30053"), nil},
		{"unchanged", model(udp("10.96.0.10", 0, a)), model(udp("10.96.0.10", 0, a)), nil, nil},
		{"endpoint removed", model(udp("10.96.0.10", 0, a, b)), model(udp("10.96.0.10", 0, a)), nil, aps("10.244.2.5:5353")},
		{"endpoint replaced", model(udp("10.96.0.10", 0, a)), model(udp("10.96.0.10", 0, b)), nil, aps("10.244.1.5:5353")},
		{"service deleted", model(udp("10.96.0.10", 0, a)), model(), nil, aps("10.244.1.5:5353")},
		{"endpoints appear", model(udp("10.96.0.10", 30053)), model(udp("10.96.0.10", 30053, a)),
			aps("10.96.0.10:53", "192.168.0.1:30053"), nil},
		{"all endpoints gone", model(udp("10.96.0.10", 0, a)), model(udp("10.96.0.10", 0)), nil, aps("10.244.1.5:5353")},
		{"TCP is left alone", model(tcp(a)), model(tcp(b)), nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fe, eps := StaleUDP(c.prev, c.next)
			if !slices.Equal(fe, c.wantFrontends) || !slices.Equal(eps, c.wantEnds) {
				t.Errorf("StaleUDP = frontends %v, endpoints %v; want %v, %v", fe, eps, c.wantFrontends, c.wantEnds)
			}
		})
	}
}
