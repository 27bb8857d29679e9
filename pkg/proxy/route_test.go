package proxy_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/proxy"
)

// TestRoute is the NAT rules' packet flows as a table, in the manner of
// kube-proxy's: {DNATing node, client, destination} -> {outcome,
// endpoints, whether each is masqueraded and whether policy at it sees the
// node}. testdata/services.yaml: n1 (192.168.0.1, pods 10.244.1.0/24) and
// n2 (192.168.0.2, 10.244.2.0/24).
func TestRoute(t *testing.T) {
	snap, report := cluster.LoadPaths([]string{"testdata/services.yaml"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	const (
		podN1   = "10.244.1.9"
		podN2   = "10.244.2.9"
		nodeN1  = "192.168.0.1"
		outside = "198.51.100.20" // inside web's loadBalancerSourceRanges
		far     = "203.0.113.99"  // outside them
	)
	// Endpoints are written ADDRESS[:m][:n]: m masqueraded, n policy sees the
	// node; h a hairpin.
	tests := []struct {
		name, node, service, client string
		nodeLocal                   bool
		to                          string // the address dialed: ClusterIP, LB or external IP, node address
		outcome                     proxy.Outcome
		endpoints                   []string
		refusal                     string
	}{
		{"ClusterIP from a pod: every endpoint, its address kept", "n1", "kube-system/dns:dns-tcp", podN1, false, "10.96.0.10", proxy.Routed,
			[]string{"10.244.1.5", "10.244.2.5"}, ""},
		{"ClusterIP from the node itself: masqueraded, the other node's endpoint sees the node", "n1", "kube-system/dns:dns-tcp", nodeN1, true, "10.96.0.10", proxy.Routed,
			[]string{"10.244.1.5:m", "10.244.2.5:m:n"}, ""},
		{"ClusterIP, a pod reaching itself: hairpin, masqueraded on its own node", "n1", "kube-system/dns:dns-tcp", "10.244.1.5", false, "10.96.0.10", proxy.Routed,
			[]string{"10.244.1.5:m:h", "10.244.2.5"}, ""},
		{"ClusterIP without endpoints: TCP reset", "n1", "shop/empty:http", podN1, false, "10.96.0.40", proxy.Refused, nil, "a TCP reset"},
		{"ClusterIP, UDP", "n1", "kube-system/dns:dns", podN1, false, "10.96.0.10", proxy.Routed,
			[]string{"10.244.1.5", "10.244.2.5"}, ""},
		{"iTP Local, no endpoint on this node: dropped", "n1", "shop/local:http", podN1, false, "10.96.0.50", proxy.Dropped, nil, ""},
		{"iTP Local on the endpoint's node", "n2", "shop/local:http", podN2, false, "10.96.0.50", proxy.Routed, []string{"10.244.2.50"}, ""},
		{"NodePort eTP Cluster from outside: masqueraded", "n1", "shop/cart:http", outside, false, nodeN1, proxy.Routed,
			[]string{"10.244.1.30:m", "10.244.2.30:m:n"}, ""},
		{"NodePort eTP Local from outside: local endpoints, client kept", "n2", "shop/web:http", outside, false, "192.168.0.2", proxy.Routed,
			[]string{"10.244.2.20", "10.244.2.21"}, ""},
		{"NodePort eTP Local from a pod of another node: every endpoint, client kept", "n1", "shop/web:http", podN2, false, nodeN1, proxy.Routed,
			[]string{"10.244.1.20", "10.244.2.20", "10.244.2.21"}, ""},
		{"NodePort eTP Local from the node itself: every endpoint, masqueraded", "n1", "shop/web:http", nodeN1, true, nodeN1, proxy.Routed,
			[]string{"10.244.1.20:m", "10.244.2.20:m:n", "10.244.2.21:m:n"}, ""},
		{"load-balancer IP in the source ranges: local endpoints", "n1", "shop/web:http", outside, false, "192.0.2.10", proxy.Routed,
			[]string{"10.244.1.20"}, ""},
		{"load-balancer IP outside the source ranges: filtered", "n1", "shop/web:http", far, false, "192.0.2.10", proxy.Filtered, nil, ""},
		{"external IP: no source ranges", "n1", "shop/web:http", far, false, "203.0.113.7", proxy.Routed, []string{"10.244.1.20"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := proxy.Build(snap, tt.node, proxy.Options{})
			i := slices.IndexFunc(m.Services, func(p *proxy.ServicePort) bool {
				return p.Namespace+"/"+p.Name+":"+p.PortName == tt.service && p.Family == corev1.IPv4Protocol
			})
			if i < 0 {
				t.Fatalf("no port %s", tt.service)
			}
			p := m.Services[i]
			to := netip.MustParseAddr(tt.to)
			r := m.Route(p, p.KindOf(to), proxy.Client{Addr: netip.MustParseAddr(tt.client), NodeLocal: tt.nodeLocal})
			var got []string
			for _, ep := range r.Endpoints {
				s := ep.Address.String()
				if ep.Masqueraded {
					s += ":m"
				}
				if ep.NodeSource {
					s += ":n"
				}
				if ep.Hairpin {
					s += ":h"
				}
				got = append(got, s)
			}
			if r.Outcome != tt.outcome || !slices.Equal(got, tt.endpoints) || r.Refusal != tt.refusal {
				t.Errorf("%s %s: %v %v %q; want %v %v %q (%s)", p.KindOf(to), tt.to, r.Outcome, got, r.Refusal, tt.outcome, tt.endpoints, tt.refusal, strings.Join(r.Why, "; "))
			}
		})
	}
	// The refusal of a Service without endpoints names the protocol's
	// answer.
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		p := &proxy.ServicePort{Protocol: proto, ClusterIP: netip.MustParseAddr("10.96.9.9"), Port: 80}
		r := (&proxy.Model{Node: "n1"}).Route(p, proxy.FrontendClusterIP, proxy.Client{Addr: netip.MustParseAddr(podN1)})
		want := map[corev1.Protocol]string{corev1.ProtocolTCP: "a TCP reset", corev1.ProtocolUDP: "ICMP port unreachable"}[proto]
		if r.Outcome != proxy.Refused || r.Refusal != want {
			t.Errorf("%s without endpoints: %v %q, want refused with %q", proto, r.Outcome, r.Refusal, want)
		}
	}
}
