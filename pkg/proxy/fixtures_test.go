package proxy

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netpol/netpol/pkg/cluster"
)

// The node under test is n1 in zone z1; n2 is in z2, n3 in z3.
const thisNode = "n1"

func node(name, zone string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
	for i, a := range addrs {
		t := corev1.NodeInternalIP
		if i%2 == 1 {
			t = corev1.NodeExternalIP
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: t, Address: a})
	}
	return n
}

var defaultNodes = []*corev1.Node{
	node("n1", "z1", "192.168.0.1"),
	node("n2", "z2", "192.168.0.2"),
	node("n3", "z3", "192.168.0.3"),
}

// svc is a ClusterIP Service ns/name with 10.96.0.10 and port http 80/TCP
// -> target "http", changed by the mutators.
func svc(name string, mut ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Selector:   map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"),
			}},
		},
	}
	for _, m := range mut {
		m(s)
	}
	return s
}

func withType(t corev1.ServiceType, nodePort int32) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.Type = t
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = nodePort + int32(i)
		}
	}
}

func withETPLocal(hc int32) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = hc
	}
}

func withITPLocal(s *corev1.Service) {
	s.Spec.InternalTrafficPolicy = to(corev1.ServiceInternalTrafficPolicyLocal)
}

func withTrafficDistribution(td string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.TrafficDistribution = to(td) }
}

func withDualStack(s *corev1.Service) {
	s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
	s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
}

// sp is an EndpointSlice port.
type sp struct {
	name  string
	port  int32
	proto corev1.Protocol
}

// slice is an EndpointSlice of Service ns/svcName. Address type from the
// first endpoint's address (IPv4 when none).
func slice(svcName, name string, ports []sp, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	at := discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && strings.Contains(eps[0].Addresses[0], ":") {
		at = discoveryv1.AddressTypeIPv6
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: at,
		Endpoints:   eps,
	}
	for _, p := range ports {
		proto := p.proto
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: to(p.name), Port: to(p.port), Protocol: to(proto)})
	}
	return es
}

var httpPort = []sp{{"http", 8080, ""}}

// ep is a ready endpoint for pod NAME at addr on node, changed by mutators.
func ep(pod, addr, nodeName string, mut ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: to(true), Serving: to(true), Terminating: to(false)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: pod},
	}
	if nodeName != "" {
		e.NodeName = to(nodeName)
		e.Zone = to("z" + nodeName[1:])
	}
	for _, m := range mut {
		m(&e)
	}
	return e
}

// notReady: not ready, not serving, not terminating (starting up).
func notReady(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: to(false), Serving: to(false), Terminating: to(false)}
}

// terminating: serving but terminating (so not ready).
func terminating(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: to(false), Serving: to(true), Terminating: to(true)}
}

// terminatingNotServing: terminating and no longer serving.
func terminatingNotServing(e *discoveryv1.Endpoint) {
	e.Conditions = discoveryv1.EndpointConditions{Ready: to(false), Serving: to(false), Terminating: to(true)}
}

func noConditions(e *discoveryv1.Endpoint) { e.Conditions = discoveryv1.EndpointConditions{} }

func zoneHints(zones ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func nodeHints(nodes ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

func snapshot(objs ...any) *cluster.Snapshot {
	s := &cluster.Snapshot{Nodes: defaultNodes}
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			s.Services = append(s.Services, o)
		case *discoveryv1.EndpointSlice:
			s.EndpointSlices = append(s.EndpointSlices, o)
		case *corev1.Node:
			s.Nodes = append(s.Nodes, o)
		default:
			panic("unexpected fixture")
		}
	}
	return s
}

// names renders endpoints as "pod@addr:port" (with a "~" suffix for a
// terminating one) for compact comparisons.
func names(eps []Endpoint) string {
	var out []string
	for _, e := range eps {
		s := e.PodName + "@" + e.String()
		if e.Terminating {
			s += "~"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// port returns the only ServicePort of ns/name with the port name and
// family, failing the test if there is not exactly one.
func port(t *testing.T, m *Model, name, portName string, fam corev1.IPFamily) *ServicePort {
	t.Helper()
	var found []*ServicePort
	for _, p := range m.Services {
		if p.Name == name && p.PortName == portName && p.Family == fam {
			found = append(found, p)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want 1 ServicePort %s:%s/%s, got %d (model has %d)", name, portName, fam, len(found), len(m.Services))
	}
	return found[0]
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func noErrors(t *testing.T, m *Model) {
	t.Helper()
	for _, err := range m.Errors {
		t.Errorf("unexpected error: %v", err)
	}
}

func to[T any](v T) *T { return &v }

type snapshotT = cluster.Snapshot
