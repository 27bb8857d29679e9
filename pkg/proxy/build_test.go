package proxy

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const v4, v6 = corev1.IPv4Protocol, corev1.IPv6Protocol

// epCase checks the endpoint lists of one ServicePort.
type epCase struct {
	name     string
	objs     []any
	svc      string // Service name (port "http", IPv4) to check; default "web"
	internal string // InternalEndpoints()
	external string // ExternalEndpoints(); "-" to skip
	local    string // LocalEndpoints; "-" to skip
	mode     string // TopologyMode
	any      bool   // AnyEndpoints
}

func runEPCases(t *testing.T, cases []epCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := Build(snapshot(tc.objs...), thisNode, Options{})
			noErrors(t, m)
			name := tc.svc
			if name == "" {
				name = "web"
			}
			p := port(t, m, name, "http", v4)
			if got := names(p.InternalEndpoints()); got != tc.internal {
				t.Errorf("internal endpoints:\n got %q\nwant %q", got, tc.internal)
			}
			if tc.external != "-" {
				if got := names(p.ExternalEndpoints()); got != tc.external {
					t.Errorf("external endpoints:\n got %q\nwant %q", got, tc.external)
				}
			}
			if tc.local != "-" {
				if got := names(p.LocalEndpoints); got != tc.local {
					t.Errorf("local endpoints:\n got %q\nwant %q", got, tc.local)
				}
			}
			if p.TopologyMode != tc.mode {
				t.Errorf("topology mode %q, want %q", p.TopologyMode, tc.mode)
			}
			if p.AnyEndpoints != tc.any {
				t.Errorf("AnyEndpoints %v, want %v", p.AnyEndpoints, tc.any)
			}
		})
	}
}

func TestReadinessAndTerminatingFallback(t *testing.T) {
	nodePort := withType(corev1.ServiceTypeNodePort, 30080)
	runEPCases(t, []epCase{
		{
			name: "ready endpoints only",
			objs: []any{svc("web"), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1"),
				ep("b", "10.0.2.1", "n2", notReady),
				ep("c", "10.0.3.1", "n3", terminating),
				ep("d", "10.0.3.2", "n3"))},
			internal: "a@10.0.1.1:8080 d@10.0.3.2:8080", external: "-", local: "", any: true,
		},
		{
			name: "unset conditions mean ready",
			objs: []any{svc("web"), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1", noConditions))},
			internal: "a@10.0.1.1:8080", external: "-", local: "", any: true,
		},
		{
			name: "cluster falls back to serving terminating endpoints",
			objs: []any{svc("web"), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1", terminatingNotServing),
				ep("b", "10.0.2.1", "n2", terminating),
				ep("c", "10.0.3.1", "n3", notReady))},
			internal: "b@10.0.2.1:8080~", external: "-", local: "", any: true,
		},
		{
			name: "no usable endpoint at all",
			objs: []any{svc("web"), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1", terminatingNotServing),
				ep("c", "10.0.3.1", "n3", notReady))},
			internal: "", external: "-", local: "", any: false,
		},
		{
			name:     "no slices",
			objs:     []any{svc("web")},
			internal: "", external: "", local: "", any: false,
		},
		{
			// Cluster scope has a ready remote endpoint; the local scope
			// has only a terminating one and falls back on its own.
			name: "local scope falls back independently of cluster scope",
			objs: []any{svc("web", nodePort, withETPLocal(0)), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1", terminating),
				ep("b", "10.0.2.1", "n2"))},
			internal: "b@10.0.2.1:8080", external: "a@10.0.1.1:8080~", local: "a@10.0.1.1:8080~", any: true,
		},
		{
			// The converse: a ready local endpoint; the cluster scope has
			// it too, so no fallback anywhere.
			name: "local ready, remote terminating",
			objs: []any{svc("web", nodePort, withETPLocal(0)), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1"),
				ep("b", "10.0.2.1", "n2", terminating))},
			internal: "a@10.0.1.1:8080", external: "a@10.0.1.1:8080", local: "a@10.0.1.1:8080", any: true,
		},
		{
			// Local has ready and terminating endpoints: only the ready ones.
			name: "local prefers ready over terminating",
			objs: []any{svc("web", nodePort, withETPLocal(0)), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1"),
				ep("a2", "10.0.1.2", "n1", terminating),
				ep("b", "10.0.2.1", "n2"))},
			internal: "a@10.0.1.1:8080 b@10.0.2.1:8080", external: "a@10.0.1.1:8080", local: "a@10.0.1.1:8080", any: true,
		},
		{
			// All terminating: both scopes fall back, each to its own set.
			name: "both scopes fall back",
			objs: []any{svc("web", nodePort, withETPLocal(0)), slice("web", "web-1", httpPort,
				ep("a", "10.0.1.1", "n1", terminating),
				ep("b", "10.0.2.1", "n2", terminating))},
			internal: "a@10.0.1.1:8080~ b@10.0.2.1:8080~", external: "a@10.0.1.1:8080~", local: "a@10.0.1.1:8080~", any: true,
		},
	})
}

func TestTrafficPolicies(t *testing.T) {
	nodePort := withType(corev1.ServiceTypeNodePort, 30080)
	twoNodes := func(name string) *discoveryv1.EndpointSlice {
		return slice(name, name+"-1", httpPort, ep("a", "10.0.1.1", "n1"), ep("b", "10.0.2.1", "n2"))
	}
	remoteOnly := func(name string) *discoveryv1.EndpointSlice {
		return slice(name, name+"-1", httpPort, ep("b", "10.0.2.1", "n2"))
	}
	runEPCases(t, []epCase{
		{
			name:     "iTP Local: ClusterIP uses only local endpoints",
			objs:     []any{svc("web", withITPLocal), twoNodes("web")},
			internal: "a@10.0.1.1:8080", external: "", local: "a@10.0.1.1:8080", any: true,
		},
		{
			name:     "iTP Local without local endpoint: no fallback to remote ones",
			objs:     []any{svc("web", withITPLocal), remoteOnly("web")},
			internal: "", external: "-", local: "", any: true,
		},
		{
			name:     "iTP Local, eTP Cluster NodePort: external traffic still uses all",
			objs:     []any{svc("web", withITPLocal, nodePort), twoNodes("web")},
			internal: "a@10.0.1.1:8080", external: "a@10.0.1.1:8080 b@10.0.2.1:8080", local: "a@10.0.1.1:8080", any: true,
		},
		{
			name:     "eTP Local NodePort: external uses local, ClusterIP uses all",
			objs:     []any{svc("web", nodePort, withETPLocal(0)), twoNodes("web")},
			internal: "a@10.0.1.1:8080 b@10.0.2.1:8080", external: "a@10.0.1.1:8080", local: "a@10.0.1.1:8080", any: true,
		},
		{
			name:     "eTP Local without local endpoint: external traffic has none",
			objs:     []any{svc("web", nodePort, withETPLocal(0)), remoteOnly("web")},
			internal: "b@10.0.2.1:8080", external: "", local: "", any: true,
		},
		{
			// eTP Local on a ClusterIP Service without externalIPs has
			// no effect (apiservice.ExternalPolicyLocal).
			name:     "eTP Local ignored when not externally accessible",
			objs:     []any{svc("web", withETPLocal(0)), twoNodes("web")},
			internal: "a@10.0.1.1:8080 b@10.0.2.1:8080", external: "", local: "", any: true,
		},
		{
			name: "eTP Local with externalIPs on a ClusterIP Service",
			objs: []any{svc("web", withETPLocal(0), func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.7"} }),
				twoNodes("web")},
			internal: "a@10.0.1.1:8080 b@10.0.2.1:8080", external: "a@10.0.1.1:8080", local: "a@10.0.1.1:8080", any: true,
		},
	})
}

func TestHealthCheck(t *testing.T) {
	lb := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "https", Protocol: corev1.ProtocolTCP, Port: 443, NodePort: 30443})
		s.Spec.Ports[0].NodePort = 30080
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.1"}}
	}
	ports := []sp{{"http", 8080, ""}, {"https", 8443, ""}}
	m := Build(snapshot(
		// Two local ready pods (each serving both ports: counted once),
		// one local terminating, one remote.
		svc("lb", lb, withETPLocal(32000)), slice("lb", "lb-1", ports,
			ep("a", "10.0.1.1", "n1"), ep("a2", "10.0.1.2", "n1"),
			ep("t", "10.0.1.3", "n1", terminating), ep("b", "10.0.2.1", "n2")),
		// Only a terminating local pod: traffic goes to it, but the health
		// check fails (kube-proxy counts ready endpoints only).
		svc("term", lb, withETPLocal(32001)), slice("term", "term-1", ports, ep("t", "10.0.1.3", "n1", terminating)),
		// No local pod.
		svc("remote", lb, withETPLocal(32002)), slice("remote", "remote-1", ports, ep("b", "10.0.2.1", "n2")),
		// NodePort with eTP Local has no health-check port.
		svc("np", withType(corev1.ServiceTypeNodePort, 30100), withETPLocal(32003)),
		// LoadBalancer with eTP Cluster neither.
		svc("cl", lb, func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 32004 }),
	), thisNode, Options{})
	noErrors(t, m)
	want := []HealthCheck{
		{Namespace: "ns", Name: "lb", NodePort: 32000, LocalEndpoints: 2},
		{Namespace: "ns", Name: "remote", NodePort: 32002, LocalEndpoints: 0},
		{Namespace: "ns", Name: "term", NodePort: 32001, LocalEndpoints: 0},
	}
	if !slices.Equal(m.HealthChecks, want) {
		t.Errorf("health checks:\n got %+v\nwant %+v", m.HealthChecks, want)
	}
	for _, c := range []struct {
		svc, port string
		hc        int32
		local     int
	}{{"lb", "http", 32000, 2}, {"lb", "https", 32000, 2}, {"term", "http", 32001, 1}, {"remote", "http", 32002, 0}, {"np", "http", 0, 0}, {"cl", "http", 0, 0}} {
		p := port(t, m, c.svc, c.port, v4)
		if p.HealthCheckNodePort != c.hc || len(p.LocalEndpoints) != c.local {
			t.Errorf("%s: health-check port %d, %d local endpoints; want %d, %d", p, p.HealthCheckNodePort, len(p.LocalEndpoints), c.hc, c.local)
		}
	}
	if p := port(t, m, "lb", "https", v4); names(p.ExternalEndpoints()) != "a@10.0.1.1:8443 a2@10.0.1.2:8443" {
		t.Errorf("lb https external endpoints: %s", names(p.ExternalEndpoints()))
	}
}

func TestTopology(t *testing.T) {
	three := func(mods ...[]func(*discoveryv1.Endpoint)) *discoveryv1.EndpointSlice {
		get := func(i int) []func(*discoveryv1.Endpoint) {
			if i < len(mods) {
				return mods[i]
			}
			return nil
		}
		return slice("web", "web-1", httpPort,
			ep("a", "10.0.1.1", "n1", get(0)...),
			ep("b", "10.0.2.1", "n2", get(1)...),
			ep("c", "10.0.3.1", "n3", get(2)...))
	}
	hint := func(fs ...func(*discoveryv1.Endpoint)) []func(*discoveryv1.Endpoint) { return fs }
	all := "a@10.0.1.1:8080 b@10.0.2.1:8080 c@10.0.3.1:8080"
	runEPCases(t, []epCase{
		{
			name:     "zone hints for this zone",
			objs:     []any{svc("web"), three(hint(zoneHints("z1")), hint(zoneHints("z2")), hint(zoneHints("z1")))},
			internal: "a@10.0.1.1:8080 c@10.0.3.1:8080", external: "-", local: "-", mode: TopologyPreferSameZone, any: true,
		},
		{
			name:     "zone hints, one endpoint hinted for several zones",
			objs:     []any{svc("web"), three(hint(zoneHints("z2")), hint(zoneHints("z2", "z1")), hint(zoneHints("z3")))},
			internal: "b@10.0.2.1:8080", external: "-", local: "-", mode: TopologyPreferSameZone, any: true,
		},
		{
			name:     "a ready endpoint without hint disables zone hints",
			objs:     []any{svc("web"), three(hint(zoneHints("z1")), hint(zoneHints("z2")), nil)},
			internal: all, external: "-", local: "-", mode: TopologyNone, any: true,
		},
		{
			name:     "a non-ready endpoint without hint does not matter",
			objs:     []any{svc("web"), three(hint(zoneHints("z1")), hint(zoneHints("z2")), hint(notReady))},
			internal: "a@10.0.1.1:8080", external: "-", local: "-", mode: TopologyPreferSameZone, any: true,
		},
		{
			name:     "no endpoint hinted for this zone: all endpoints",
			objs:     []any{svc("web"), three(hint(zoneHints("z2")), hint(zoneHints("z2")), hint(zoneHints("z3")))},
			internal: all, external: "-", local: "-", mode: TopologyNone, any: true,
		},
		{
			name:     "node hints for this node",
			objs:     []any{svc("web"), three(hint(nodeHints("n1"), zoneHints("z1")), hint(nodeHints("n2"), zoneHints("z2")), hint(nodeHints("n1", "n3"), zoneHints("z3")))},
			internal: "a@10.0.1.1:8080 c@10.0.3.1:8080", external: "-", local: "-", mode: TopologyPreferSameNode, any: true,
		},
		{
			name:     "node hints incomplete: zone hints used",
			objs:     []any{svc("web"), three(hint(nodeHints("n1"), zoneHints("z1")), hint(zoneHints("z2")), hint(nodeHints("n3"), zoneHints("z1")))},
			internal: "a@10.0.1.1:8080 c@10.0.3.1:8080", external: "-", local: "-", mode: TopologyPreferSameZone, any: true,
		},
		{
			name:     "node hints not for this node: zone hints used",
			objs:     []any{svc("web"), three(hint(nodeHints("n2"), zoneHints("z1")), hint(nodeHints("n2"), zoneHints("z2")), hint(nodeHints("n3"), zoneHints("z3")))},
			internal: "a@10.0.1.1:8080", external: "-", local: "-", mode: TopologyPreferSameZone, any: true,
		},
		{
			name:     "node hints only, not for this node: all endpoints",
			objs:     []any{svc("web"), three(hint(nodeHints("n2")), hint(nodeHints("n2")), hint(nodeHints("n3")))},
			internal: all, external: "-", local: "-", mode: TopologyNone, any: true,
		},
		{
			// The hinted endpoint is not ready: the hinted subset is
			// empty, so topology is ignored (hints of ready endpoints only).
			name:     "hinted subset has no ready endpoint",
			objs:     []any{svc("web"), three(hint(zoneHints("z1"), notReady), hint(zoneHints("z2")), hint(zoneHints("z3")))},
			internal: "b@10.0.2.1:8080 c@10.0.3.1:8080", external: "-", local: "-", mode: TopologyNone, any: true,
		},
		{
			// Topology filters the cluster endpoints only, never the local.
			name:     "eTP Local endpoints ignore hints",
			objs:     []any{svc("web", withType(corev1.ServiceTypeNodePort, 30080), withETPLocal(0)), three(hint(zoneHints("z2")), hint(zoneHints("z1")), hint(zoneHints("z3")))},
			internal: "b@10.0.2.1:8080", external: "a@10.0.1.1:8080", local: "a@10.0.1.1:8080", mode: TopologyPreferSameZone, any: true,
		},
	})

	// trafficDistribution and the topology-mode annotation are inputs of
	// the EndpointSlice controller; kube-proxy (and this model) follow the
	// hints it wrote, and use every endpoint when there are none.
	for _, td := range []string{corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone, corev1.ServiceTrafficDistributionPreferSameNode} {
		t.Run("trafficDistribution "+td, func(t *testing.T) {
			withAnnotation := func(s *corev1.Service) {
				s.Annotations = map[string]string{corev1.AnnotationTopologyMode: "Auto"}
			}
			var hinted *discoveryv1.EndpointSlice
			wantHinted, wantMode := "a@10.0.1.1:8080", TopologyPreferSameZone
			if td == corev1.ServiceTrafficDistributionPreferSameNode {
				// The controller writes node hints and zone hints.
				hinted = three(hint(nodeHints("n1"), zoneHints("z1")), hint(nodeHints("n2"), zoneHints("z1")), hint(nodeHints("n3"), zoneHints("z3")))
				wantMode = TopologyPreferSameNode
			} else {
				hinted = three(hint(zoneHints("z1")), hint(zoneHints("z2")), hint(zoneHints("z3")))
			}
			m := Build(snapshot(svc("web", withTrafficDistribution(td), withAnnotation), hinted), thisNode, Options{})
			noErrors(t, m)
			p := port(t, m, "web", "http", v4)
			if p.TrafficDistribution != td || p.TopologyMode != wantMode || names(p.ClusterEndpoints) != wantHinted {
				t.Errorf("hinted: distribution %q mode %q endpoints %q; want %q %q %q", p.TrafficDistribution, p.TopologyMode, names(p.ClusterEndpoints), td, wantMode, wantHinted)
			}
			m = Build(snapshot(svc("web", withTrafficDistribution(td)), three()), thisNode, Options{})
			p = port(t, m, "web", "http", v4)
			if p.TopologyMode != TopologyNone || names(p.ClusterEndpoints) != all {
				t.Errorf("unhinted: mode %q endpoints %q; want all", p.TopologyMode, names(p.ClusterEndpoints))
			}
		})
	}

	t.Run("node without zone label ignores zone hints", func(t *testing.T) {
		s := snapshot(svc("web"), three(hint(zoneHints("z1")), hint(zoneHints("z2")), hint(zoneHints("z3"))))
		s.Nodes = []*corev1.Node{node("n1", "")}
		p := port(t, Build(s, thisNode, Options{}), "web", "http", v4)
		if p.TopologyMode != TopologyNone || names(p.ClusterEndpoints) != all {
			t.Errorf("mode %q endpoints %q; want all", p.TopologyMode, names(p.ClusterEndpoints))
		}
	})
}

func TestNamedPorts(t *testing.T) {
	s := svc("web", func(s *corev1.Service) {
		s.Spec.Ports = []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web")},
			{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9100, TargetPort: intstr.FromInt32(9090)},
			{Name: "dns", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
		}
	})
	m := Build(snapshot(s,
		// Two pods expose "web" on different container ports: the slice
		// controller splits them into slices with the resolved numbers.
		slice("web", "web-a", []sp{{"http", 8080, ""}, {"metrics", 9090, ""}, {"dns", 5353, corev1.ProtocolUDP}},
			ep("a", "10.0.1.1", "n1")),
		slice("web", "web-b", []sp{{"http", 8081, ""}, {"metrics", 9090, ""}, {"dns-udp", 53, corev1.ProtocolUDP}},
			ep("b", "10.0.2.1", "n2")),
	), thisNode, Options{})
	noErrors(t, m)
	for _, c := range []struct{ port, want string }{
		{"http", "a@10.0.1.1:8080 b@10.0.2.1:8081"},
		{"metrics", "a@10.0.1.1:9090 b@10.0.2.1:9090"},
		{"dns", ""}, // the slice's "dns" port is UDP: protocol must match too
		{"dns-udp", "b@10.0.2.1:53"},
	} {
		if got := names(port(t, m, "web", c.port, v4).ClusterEndpoints); got != c.want {
			t.Errorf("port %s: got %q, want %q", c.port, got, c.want)
		}
	}
}

func TestDeduplication(t *testing.T) {
	runEPCases(t, []epCase{
		{
			name: "same address and port in two slices is one endpoint",
			objs: []any{svc("web"),
				slice("web", "web-1", httpPort, ep("a", "10.0.1.1", "n1"), ep("b", "10.0.2.1", "n2")),
				slice("web", "web-2", httpPort, ep("a", "10.0.1.1", "n1"), ep("c", "10.0.3.1", "n3"))},
			internal: "a@10.0.1.1:8080 b@10.0.2.1:8080 c@10.0.3.1:8080", external: "-", local: "-", any: true,
		},
		{
			// An IP reused by a new pod while the old pod terminates: the
			// running one wins, whichever slice comes first.
			name: "non-terminating copy wins (terminating first)",
			objs: []any{svc("web"),
				slice("web", "web-1", httpPort, ep("old", "10.0.1.1", "n1", terminating)),
				slice("web", "web-2", httpPort, ep("new", "10.0.1.1", "n1"))},
			internal: "new@10.0.1.1:8080", external: "-", local: "-", any: true,
		},
		{
			name: "non-terminating copy wins (terminating last)",
			objs: []any{svc("web"),
				slice("web", "web-2", httpPort, ep("old", "10.0.1.1", "n1", terminating)),
				slice("web", "web-1", httpPort, ep("new", "10.0.1.1", "n1"))},
			internal: "new@10.0.1.1:8080", external: "-", local: "-", any: true,
		},
		{
			name: "same address, different resolved port: two endpoints",
			objs: []any{svc("web"),
				slice("web", "web-1", httpPort, ep("a", "10.0.1.1", "n1")),
				slice("web", "web-2", []sp{{"http", 9090, ""}}, ep("a", "10.0.1.1", "n1"))},
			internal: "a@10.0.1.1:8080 a@10.0.1.1:9090", external: "-", local: "-", any: true,
		},
		{
			name: "slices of other Services and namespaces are ignored",
			objs: []any{svc("web"),
				slice("web", "web-1", httpPort, ep("a", "10.0.1.1", "n1")),
				slice("other", "other-1", httpPort, ep("x", "10.0.9.1", "n1")),
				func() *discoveryv1.EndpointSlice {
					es := slice("web", "web-x", httpPort, ep("y", "10.0.9.2", "n1"))
					es.Namespace = "elsewhere"
					return es
				}()},
			internal: "a@10.0.1.1:8080", external: "-", local: "-", any: true,
		},
	})
}

func TestDualStack(t *testing.T) {
	s := svc("web", withDualStack, withType(corev1.ServiceTypeLoadBalancer, 30080), func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{"203.0.113.7", "2001:db8::7"}
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", " 2001:db8:1::/48 ", "10.1.2.3/8"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "198.51.100.1"}, {IP: "2001:db8:2::1"}, {Hostname: "lb.example"},
			{IP: "198.51.100.2", IPMode: to(corev1.LoadBalancerIPModeProxy)},
		}
	})
	m := Build(snapshot(s,
		slice("web", "web-v4", httpPort, ep("a", "10.0.1.1", "n1"), ep("b", "10.0.2.1", "n2")),
		slice("web", "web-v6", httpPort, ep("a", "fd00:1::1", "n1")),
		// FQDN slices are not proxied.
		func() *discoveryv1.EndpointSlice {
			es := slice("web", "web-fqdn", httpPort, ep("f", "db.example", "n1"))
			es.AddressType = discoveryv1.AddressTypeFQDN
			return es
		}(),
	), thisNode, Options{})
	noErrors(t, m)
	if len(m.Services) != 2 || m.Services[0].Family != v4 || m.Services[1].Family != v6 {
		t.Fatalf("want an IPv4 then an IPv6 ServicePort, got %v", m.Services)
	}
	p4, p6 := m.Services[0], m.Services[1]
	check := func(what string, got, want any) {
		t.Helper()
		if !equal(got, want) {
			t.Errorf("%s: got %v, want %v", what, got, want)
		}
	}
	check("v4 cluster IP", p4.ClusterIP, netip.MustParseAddr("10.96.0.10"))
	check("v6 cluster IP", p6.ClusterIP, netip.MustParseAddr("fd00:96::10"))
	check("v4 external IPs", p4.ExternalIPs, addrs("203.0.113.7"))
	check("v6 external IPs", p6.ExternalIPs, addrs("2001:db8::7"))
	check("v4 LB IPs (VIP mode only)", p4.LoadBalancerIPs, addrs("198.51.100.1"))
	check("v6 LB IPs", p6.LoadBalancerIPs, addrs("2001:db8:2::1"))
	check("v4 source ranges", p4.LoadBalancerSourceRanges, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.0.0.0/8")})
	check("v6 source ranges", p6.LoadBalancerSourceRanges, []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48")})
	check("v4 endpoints", names(p4.ClusterEndpoints), "a@10.0.1.1:8080 b@10.0.2.1:8080")
	check("v6 endpoints", names(p6.ClusterEndpoints), "a@[fd00:1::1]:8080")
	check("node ports", []int32{p4.NodePort, p6.NodePort}, []int32{30080, 30080})

	t.Run("single-stack IPv6", func(t *testing.T) {
		s := svc("web", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "fd00:96::10", []string{"fd00:96::10"}, []corev1.IPFamily{v6}
		})
		m := Build(snapshot(s,
			slice("web", "web-v4", httpPort, ep("a", "10.0.1.1", "n1")),
			slice("web", "web-v6", httpPort, ep("a", "fd00:1::1", "n1"))), thisNode, Options{})
		noErrors(t, m)
		if len(m.Services) != 1 || names(port(t, m, "web", "http", v6).ClusterEndpoints) != "a@[fd00:1::1]:8080" {
			t.Errorf("got %v", m.Services)
		}
	})
	t.Run("no ipFamilies: family from clusterIP", func(t *testing.T) {
		s := svc("web", func(s *corev1.Service) { s.Spec.ClusterIPs, s.Spec.IPFamilies = nil, nil })
		m := Build(snapshot(s, slice("web", "web-v4", httpPort, ep("a", "10.0.1.1", "n1"))), thisNode, Options{})
		noErrors(t, m)
		if names(port(t, m, "web", "http", v4).ClusterEndpoints) != "a@10.0.1.1:8080" {
			t.Errorf("got %v", m.Services)
		}
	})
	t.Run("a 0.0.0.0/0 source range allows everything", func(t *testing.T) {
		s := svc("web", withDualStack, withType(corev1.ServiceTypeLoadBalancer, 30080), func(s *corev1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "0.0.0.0/0", "2001:db8:1::/48"}
		})
		m := Build(snapshot(s), thisNode, Options{})
		if len(port(t, m, "web", "http", v4).LoadBalancerSourceRanges) != 0 || len(port(t, m, "web", "http", v6).LoadBalancerSourceRanges) != 1 {
			t.Errorf("got %v / %v", port(t, m, "web", "http", v4).LoadBalancerSourceRanges, port(t, m, "web", "http", v6).LoadBalancerSourceRanges)
		}
	})
}

func equal(a, b any) bool {
	switch a := a.(type) {
	case []netip.Addr:
		return slices.Equal(a, b.([]netip.Addr))
	case []netip.Prefix:
		return slices.Equal(a, b.([]netip.Prefix))
	case []int32:
		return slices.Equal(a, b.([]int32))
	}
	return a == b
}

func TestSkippedServices(t *testing.T) {
	m := Build(snapshot(
		svc("extname", func(s *corev1.Service) {
			s.Spec.Type, s.Spec.ExternalName = corev1.ServiceTypeExternalName, "db.example"
		}),
		svc("headless", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
		}),
		svc("noip", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil }),
		slice("extname", "extname-1", httpPort, ep("a", "10.0.1.1", "n1")),
		slice("headless", "headless-1", httpPort, ep("a", "10.0.1.1", "n1")),
		// A Service without selector, with a hand-written slice.
		svc("manual", func(s *corev1.Service) { s.Spec.Selector = nil }),
		func() *discoveryv1.EndpointSlice {
			es := slice("manual", "manual-1", httpPort, discoveryv1.Endpoint{Addresses: []string{"172.16.0.5"}})
			es.Ports[0].Protocol = nil // API default TCP
			return es
		}(),
	), thisNode, Options{})
	noErrors(t, m)
	if len(m.Services) != 1 || m.Services[0].Name != "manual" {
		t.Fatalf("want only the manual Service, got %v", m.Services)
	}
	p := m.Services[0]
	if got := names(p.ClusterEndpoints); got != "@172.16.0.5:8080" {
		t.Errorf("manual endpoints %q", got)
	}
	if e := p.ClusterEndpoints[0]; !e.Ready || !e.Serving || e.Terminating || e.Local || e.NodeName != "" {
		t.Errorf("manual endpoint %+v", e)
	}
}

// TestProxyLabels: what kube-proxy's informers select out is not proxied:
// a Service labelled service.kubernetes.io/service-proxy-name (another
// proxy's), and slices labelled with it or service.kubernetes.io/headless
// (upstream e2e: "should implement service.kubernetes.io/headless" and
// "... service-proxy-name").
func TestProxyLabels(t *testing.T) {
	labelled := func(es *discoveryv1.EndpointSlice, key string) *discoveryv1.EndpointSlice {
		es.Labels[key] = ""
		return es
	}
	m := Build(snapshot(
		svc("other-proxy", func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "foo-bar"} }),
		slice("other-proxy", "other-proxy-1", httpPort, ep("a", "10.0.1.1", "n1")),
		svc("headless-slice"),
		labelled(slice("headless-slice", "headless-slice-1", httpPort, ep("a", "10.0.1.2", "n1")), corev1.IsHeadlessService),
		svc("proxy-name-slice"),
		labelled(slice("proxy-name-slice", "proxy-name-slice-1", httpPort, ep("a", "10.0.1.3", "n1")), LabelServiceProxyName),
		slice("proxy-name-slice", "proxy-name-slice-2", httpPort, ep("b", "10.0.1.4", "n1")),
	), thisNode, Options{})
	noErrors(t, m)
	got := map[string]string{}
	for _, p := range m.Services {
		got[p.Name] = names(p.ClusterEndpoints)
	}
	want := map[string]string{"headless-slice": "", "proxy-name-slice": "b@10.0.1.4:8080"}
	if !maps.Equal(got, want) {
		t.Errorf("Services and endpoints %v, want %v", got, want)
	}
}

func TestServiceFields(t *testing.T) {
	m := Build(snapshot(
		svc("plain"),
		svc("sticky", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
		svc("sticky60", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: to(int32(60))}}
		}),
		slice("plain", "plain-1", httpPort, ep("a", "10.0.1.1", "n1", zoneHints("z1"), nodeHints("n1"))),
	), thisNode, Options{})
	noErrors(t, m)
	for name, want := range map[string]int32{"plain": 0, "sticky": DefaultAffinityTimeout, "sticky60": 60} {
		if got := port(t, m, name, "http", v4).AffinityTimeout; got != want {
			t.Errorf("%s affinity timeout %d, want %d", name, got, want)
		}
	}
	got := port(t, m, "plain", "http", v4).ClusterEndpoints[0]
	want := Endpoint{
		Address: netip.MustParseAddr("10.0.1.1"), Port: 8080, PodNamespace: "ns", PodName: "a", NodeName: "n1", Zone: "z1",
		Local: true, Ready: true, Serving: true, Hints: &EndpointHints{Zones: []string{"z1"}, Nodes: []string{"n1"}},
	}
	if got.String() != want.String() || got.PodNamespace != want.PodNamespace || got.PodName != want.PodName ||
		got.NodeName != want.NodeName || got.Zone != want.Zone || got.Local != want.Local || got.Ready != want.Ready ||
		got.Serving != want.Serving || got.Terminating != want.Terminating ||
		!slices.Equal(got.ZoneHints(), want.ZoneHints()) || !slices.Equal(got.NodeHints(), want.NodeHints()) {
		t.Errorf("endpoint:\n got %+v\nwant %+v", got, want)
	}
}

func TestNodeAndOptions(t *testing.T) {
	n := node("n1", "z1", "192.168.0.1", "203.0.113.1", "fd00::1")
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.0.1"})
	s := &snapshotT{Nodes: []*corev1.Node{n}}
	m := Build(s, "n1", Options{})
	noErrors(t, m)
	if m.Zone != "z1" || !slices.Equal(m.NodePortAddresses, addrs("192.168.0.1", "203.0.113.1", "fd00::1")) {
		t.Errorf("zone %q node-port addresses %v", m.Zone, m.NodePortAddresses)
	}
	m = Build(s, "n1", Options{NodePortAddresses: addrs("10.9.9.9")})
	if !slices.Equal(m.NodePortAddresses, addrs("10.9.9.9")) {
		t.Errorf("node-port addresses %v", m.NodePortAddresses)
	}
	m = Build(s, "unknown", Options{})
	if m.Zone != "" || len(m.NodePortAddresses) != 0 || len(m.Errors) != 0 {
		t.Errorf("unknown node: %+v", m)
	}
	if m := Build(nil, "n1", Options{}); len(m.Services) != 0 || len(m.Errors) != 0 {
		t.Errorf("nil snapshot: %+v", m)
	}
}

func TestErrors(t *testing.T) {
	badNode := node("n1", "z1", "not-an-ip")
	m := Build(snapshot(
		svc("noproto", func(s *corev1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "bad", Port: 81}) // no protocol
		}),
		svc("badproto", func(s *corev1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }),
		svc("badport", func(s *corev1.Service) { s.Spec.Ports[0].Port = 0 }),
		svc("badip", func(s *corev1.Service) { withDualStack(s); s.Spec.ClusterIPs[1] = "fd00::zz" }),
		svc("famip", func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{v6} }),
		svc("badext", withType(corev1.ServiceTypeLoadBalancer, 30080), func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"1.2.3", "203.0.113.9"}
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/33"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "lb!"}}
		}),
		svc("nohc", withType(corev1.ServiceTypeLoadBalancer, 30080), withETPLocal(0)),
		slice("noproto", "noproto-1", httpPort,
			ep("a", "10.0.1.1", "n1"), ep("b", "10.0.300.1", "n2"), ep("c", "fd00::1", "n2"),
			discoveryv1.Endpoint{}),
		func() *discoveryv1.EndpointSlice {
			es := slice("noproto", "nolabel", httpPort, ep("x", "10.0.9.9", "n1"))
			es.Labels = nil
			return es
		}(),
		func() *discoveryv1.EndpointSlice {
			es := slice("noproto", "noname", httpPort, ep("y", "10.0.9.8", "n1"))
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Port: to(int32(1))}, discoveryv1.EndpointPort{Name: to("p")})
			es.Ports[0].Name = nil
			return es
		}(),
	), thisNode, Options{})
	m2 := Build(&snapshotT{Nodes: []*corev1.Node{badNode}}, "n1", Options{})
	errs := append(m.Errors, m2.Errors...)
	want := []string{
		`Service ns/badproto: spec.ports[0].protocol: unsupported protocol "ICMP"`,
		"Service ns/badport: spec.ports[0].port: 0 out of range",
		`Service ns/badip: spec.clusterIPs[1]: invalid IP "fd00::zz"`,
		"Service ns/famip: spec.clusterIPs[0]: 10.96.0.10 does not match spec.ipFamilies[0] IPv6",
		`Service ns/badext: spec.externalIPs[0]: invalid IP "1.2.3"`,
		`Service ns/badext: status.loadBalancer.ingress[0].ip: invalid IP "lb!"`,
		`Service ns/badext: spec.loadBalancerSourceRanges[0]: invalid CIDR "10.0.0.0/33"`,
		"Service ns/nohc: spec.healthCheckNodePort: unset for a LoadBalancer with externalTrafficPolicy Local",
		`EndpointSlice ns/noproto-1: endpoints[1].addresses[0]: invalid IP "10.0.300.1"`,
		"EndpointSlice ns/noproto-1: endpoints[2].addresses[0]: fd00::1 is not of address type IPv4",
		"EndpointSlice ns/noproto-1: endpoints[3].addresses: empty",
		"EndpointSlice ns/nolabel: metadata.labels[kubernetes.io/service-name]: missing: the slice belongs to no Service",
		`EndpointSlice ns/noname: ports[0].name: unset (use "" for an unnamed port)`,
		`EndpointSlice ns/noname: ports[1].name: unset (use "" for an unnamed port)`,
		"EndpointSlice ns/noname: ports[2].port: missing or out of range",
		`Node n1: status.addresses[0].address: invalid IP "not-an-ip"`,
	}
	var got []string
	for _, err := range errs {
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field == "" || fe.Object.Name == "" {
			t.Errorf("not a FieldError naming object and field: %v", err)
		}
		got = append(got, err.Error())
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("missing error %q", w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("unexpected error %q", g)
		}
	}

	// A port without a protocol is TCP, as the API server defaults it.
	if p := port(t, m, "noproto", "bad", v4); p.Protocol != corev1.ProtocolTCP {
		t.Errorf("noproto port without a protocol: %q, want TCP", p.Protocol)
	}
	// The rest is still built.
	if got := names(port(t, m, "noproto", "http", v4).ClusterEndpoints); got != "a@10.0.1.1:8080" {
		t.Errorf("noproto http endpoints %q", got)
	}
	if p := port(t, m, "badip", "http", v4); p.ClusterIP != netip.MustParseAddr("10.96.0.10") {
		t.Errorf("badip IPv4 port %v", p)
	}
	if p := port(t, m, "badext", "http", v4); !slices.Equal(p.ExternalIPs, addrs("203.0.113.9")) || p.NodePort != 30080 {
		t.Errorf("badext port %+v", p)
	}
	if p := port(t, m, "nohc", "http", v4); p.HealthCheckNodePort != 0 || !p.ExternalPolicyLocal {
		t.Errorf("nohc port %+v", p)
	}
	for _, name := range []string{"badproto", "badport", "famip"} {
		for _, p := range m.Services {
			if p.Name == name {
				t.Errorf("%s should have no ServicePort, got %v", name, p)
			}
		}
	}
}

func TestSortedAndDeterministic(t *testing.T) {
	objs := []any{
		svc("b", withDualStack), svc("a", func(s *corev1.Service) {
			s.Spec.Ports = append([]corev1.ServicePort{{Name: "z", Protocol: corev1.ProtocolUDP, Port: 1}}, s.Spec.Ports...)
		}),
		slice("a", "a-2", httpPort, ep("q", "10.0.2.9", "n2"), ep("p", "10.0.1.9", "n1")),
		slice("a", "a-1", httpPort, ep("r", "10.0.1.10", "n1")),
	}
	m := Build(snapshot(objs...), thisNode, Options{})
	var got []string
	for _, p := range m.Services {
		got = append(got, p.String())
	}
	want := []string{"ns/a:http/TCP/IPv4", "ns/a:z/UDP/IPv4", "ns/b:http/TCP/IPv4", "ns/b:http/TCP/IPv6"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if got := names(m.Services[0].ClusterEndpoints); got != "p@10.0.1.9:8080 r@10.0.1.10:8080 q@10.0.2.9:8080" {
		t.Errorf("endpoint order %q", got)
	}
	// Reversed input order gives the same model.
	slices.Reverse(objs)
	m2 := Build(snapshot(objs...), thisNode, Options{})
	for i := range m.Services {
		if m.Services[i].String() != m2.Services[i].String() || names(m.Services[i].ClusterEndpoints) != names(m2.Services[i].ClusterEndpoints) {
			t.Errorf("differs at %d: %v vs %v", i, m.Services[i], m2.Services[i])
		}
	}
}

// TestEndpointLists covers the list helpers the builder and the compiler
// share: de-duplication (which copy of an address and port is kept) and
// the union of cluster and local endpoints (which may be one of them).
func TestEndpointLists(t *testing.T) {
	mk := func(pod, addr string, port int32, terminating bool) Endpoint {
		return Endpoint{Address: netip.MustParseAddr(addr), Port: port, PodName: pod, Ready: !terminating,
			Serving: true, Terminating: terminating}
	}
	a, b, c := mk("a", "10.0.0.1", 80, false), mk("b", "10.0.0.2", 80, false), mk("c", "10.0.0.3", 80, false)
	aOld, aNew, aOther := mk("a-old", "10.0.0.1", 80, true), mk("a-new", "10.0.0.1", 80, false), mk("a-other", "10.0.0.1", 80, false)
	a8080 := mk("a", "10.0.0.1", 8080, false)
	for _, tc := range []struct {
		name string
		in   []Endpoint
		want string
	}{
		{"sorted by address, then port", []Endpoint{c, a8080, b, a}, "a@10.0.0.1:80 a@10.0.0.1:8080 b@10.0.0.2:80 c@10.0.0.3:80"},
		{"terminating copies only: the first", []Endpoint{aOld, mk("a-older", "10.0.0.1", 80, true)}, "a-old@10.0.0.1:80~"},
		{"a running copy wins over a terminating one before it", []Endpoint{aOld, aNew}, "a-new@10.0.0.1:80"},
		{"a running copy wins over a terminating one after it", []Endpoint{aNew, aOld}, "a-new@10.0.0.1:80"},
		{"of several running copies, the last", []Endpoint{aNew, aOld, aOther, b}, "a-other@10.0.0.1:80 b@10.0.0.2:80"},
		{"empty", nil, ""},
	} {
		if got := names(dedupSorted(slices.Clone(tc.in))); got != tc.want {
			t.Errorf("dedupSorted, %s: %q, want %q", tc.name, got, tc.want)
		}
	}

	for _, tc := range []struct {
		name           string
		cluster, local []Endpoint
		want           string
		shares         string // "cluster" or "local": the result is that list itself
	}{
		{"local among the cluster's", []Endpoint{a, b, c}, []Endpoint{b}, "a@10.0.0.1:80 b@10.0.0.2:80 c@10.0.0.3:80", "cluster"},
		{"no local endpoints", []Endpoint{a, b}, nil, "a@10.0.0.1:80 b@10.0.0.2:80", "cluster"},
		{"no cluster endpoints", nil, []Endpoint{a}, "a@10.0.0.1:80", "local"},
		{"cluster among the local ones", []Endpoint{b}, []Endpoint{a, b}, "a@10.0.0.1:80 b@10.0.0.2:80", "local"},
		{"disjoint: merged and sorted", []Endpoint{c}, []Endpoint{a}, "a@10.0.0.1:80 c@10.0.0.3:80", ""},
		{"same address and port, another copy: cluster's", []Endpoint{aNew, b}, []Endpoint{aOld}, "a-new@10.0.0.1:80 b@10.0.0.2:80", ""},
		{"unsorted lists (not from the builder)", []Endpoint{c, a}, []Endpoint{b, a}, "a@10.0.0.1:80 b@10.0.0.2:80 c@10.0.0.3:80", ""},
		{"neither", nil, nil, "", ""},
	} {
		p := &ServicePort{ClusterEndpoints: tc.cluster, LocalEndpoints: tc.local}
		got := p.ReachableEndpoints()
		if names(got) != tc.want {
			t.Errorf("ReachableEndpoints, %s: %q, want %q", tc.name, names(got), tc.want)
		}
		shared := map[string][]Endpoint{"cluster": tc.cluster, "local": tc.local}[tc.shares]
		if tc.shares != "" && (len(got) == 0 || &got[0] != &shared[0]) {
			t.Errorf("ReachableEndpoints, %s: a copy, want the %s list itself", tc.name, tc.shares)
		}
	}
}

func TestReachableEndpoints(t *testing.T) {
	m := Build(snapshot(
		svc("web", withType(corev1.ServiceTypeNodePort, 30080), withETPLocal(0)),
		slice("web", "web-1", httpPort,
			ep("a", "10.0.1.1", "n1", terminating, zoneHints("z1")),
			ep("b", "10.0.2.1", "n2", zoneHints("z1")),
			ep("c", "10.0.3.1", "n3", zoneHints("z3"))),
	), thisNode, Options{})
	p := port(t, m, "web", "http", v4)
	// Cluster: b (zone z1); local: a (terminating fallback).
	if got := names(p.ReachableEndpoints()); got != "a@10.0.1.1:8080~ b@10.0.2.1:8080" {
		t.Errorf("reachable %q", got)
	}
}

func TestServiceCIDRs(t *testing.T) {
	serviceCIDR := func(name string, cidrs ...string) *networkingv1.ServiceCIDR {
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	cases := []struct {
		name   string
		objs   []*networkingv1.ServiceCIDR
		option []netip.Prefix
		want   []netip.Prefix
		errs   []string
	}{
		{name: "none"},
		{name: "the option alone", option: prefixes("fd00:96::/108", "10.96.0.0/16"), want: prefixes("10.96.0.0/16", "fd00:96::/108")},
		{name: "the objects alone", objs: []*networkingv1.ServiceCIDR{
			serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:96::/108"), serviceCIDR("extra", "10.97.0.0/24")},
			want: prefixes("10.96.0.0/16", "10.97.0.0/24", "fd00:96::/108")},
		{name: "both, each range once", option: prefixes("10.96.0.0/16"),
			objs: []*networkingv1.ServiceCIDR{serviceCIDR("kubernetes", "10.96.0.0/16"), serviceCIDR("same", "10.96.0.0/16")},
			want: prefixes("10.96.0.0/16")},
		{name: "host bits masked", objs: []*networkingv1.ServiceCIDR{serviceCIDR("loose", "10.96.0.1/16")},
			want: prefixes("10.96.0.0/16")},
		{name: "a bad range is an error, the rest kept", objs: []*networkingv1.ServiceCIDR{
			serviceCIDR("bad", "10.96.0.0/33", "fd00:96::/108"), nil},
			want: prefixes("fd00:96::/108"), errs: []string{`ServiceCIDR bad: spec.cidrs[0]: invalid CIDR "10.96.0.0/33"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := Build(&snapshotT{ServiceCIDRs: c.objs}, thisNode, Options{ServiceCIDRs: c.option})
			if !slices.Equal(m.ServiceCIDRs, c.want) {
				t.Errorf("service CIDRs %v, want %v", m.ServiceCIDRs, c.want)
			}
			var errs []string
			for _, err := range m.Errors {
				errs = append(errs, err.Error())
			}
			if !slices.Equal(errs, c.errs) {
				t.Errorf("errors %q, want %q", errs, c.errs)
			}
		})
	}
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}
