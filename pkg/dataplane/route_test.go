package dataplane_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// TestRouteAgreesWithTracedTables holds proxy.Route, the one statement of
// what the NAT rules do (explain, the lab's reasons and the conformance
// suite ask it), to the compiled tables traced packet by packet: from every
// pod, every node and an outside address to every frontend of every
// Service port (ClusterIP, each node's NodePort, load-balancer and
// external IPs), the endpoints the traced paths reach are the endpoints
// Route gives, and at each the source policy sees is the client or, where
// Route says NodeSource, the DNATing node. Policies are left out: what is
// compared is the NAT, and every path Route routes must arrive.
func TestRouteAgreesWithTracedTables(t *testing.T) {
	fixtures := [][]string{
		{"../../conformance/testdata/services.yaml"},
		{"../../examples/demo"},
		{"../../examples/demo", "../../cmd/netpol/testdata/nodeports.yaml"},
	}
	const outside = "203.0.113.200"
	for _, paths := range fixtures {
		t.Run(strings.Join(paths, "+"), func(t *testing.T) {
			snap, rep := cluster.LoadPaths(paths, nil)
			if len(rep.Errors) > 0 {
				t.Fatal(rep.Errors)
			}
			snap.NetworkPolicies, snap.AdminPolicies, snap.BaselinePolicies, snap.ClusterPolicies = nil, nil, nil, nil
			ev := eval.New(snap, policy.Build(snap))
			dp, err := dataplane.New(snap, ev, false)
			if err != nil {
				t.Fatal(err)
			}
			nodeAddr := map[string]map[*nft.Family]netip.Addr{}
			entry := ""
			for _, n := range dp.Nodes() {
				nodeAddr[n.Name] = map[*nft.Family]netip.Addr{}
				for _, a := range n.Addrs {
					if _, ok := nodeAddr[n.Name][nft.FamilyOf(a)]; !ok {
						nodeAddr[n.Name][nft.FamilyOf(a)] = a
					}
				}
				if entry == "" || n.Name < entry {
					entry = n.Name
				}
			}
			// Clients: every pod, every node (by its first address), and
			// one address outside the cluster.
			type client struct {
				name, node string
				hostNet    bool
			}
			var clients []client
			for _, p := range snap.Pods {
				clients = append(clients, client{p.Namespace + "/" + p.Name, p.Spec.NodeName, p.Spec.HostNetwork})
			}
			for _, n := range dp.Nodes() {
				clients = append(clients, client{n.Addrs[0].String(), n.Name, true})
			}
			clients = append(clients, client{name: outside})
			models := map[string]*proxy.Model{}
			model := func(node string) *proxy.Model {
				if models[node] == nil {
					models[node] = proxy.Build(snap, node, proxy.Options{})
				}
				return models[node]
			}
			compared := map[proxy.Outcome]int{}
			nodeSources := 0
			for _, p := range model(entry).Services {
				f := nft.FamilyOf(p.ClusterIP)
				type frontend struct {
					kind   proxy.FrontendKind
					addr   netip.Addr
					port   int32
					dialed string // NodePort: the node dialed
				}
				fronts := []frontend{{proxy.FrontendClusterIP, p.ClusterIP, p.Port, ""}}
				if p.NodePort != 0 {
					for _, n := range dp.Nodes() {
						if a := nodeAddr[n.Name][f]; a.IsValid() {
							fronts = append(fronts, frontend{proxy.FrontendNodePort, a, p.NodePort, n.Name})
						}
					}
				}
				for _, a := range p.LoadBalancerIPs {
					fronts = append(fronts, frontend{proxy.FrontendLoadBalancer, a, p.Port, ""})
				}
				for _, a := range p.ExternalIPs {
					fronts = append(fronts, frontend{proxy.FrontendExternalIP, a, p.Port, ""})
				}
				for _, c := range clients {
					for _, fe := range fronts {
						if c.node == "" && fe.kind == proxy.FrontendClusterIP {
							continue // reached from inside the cluster only
						}
						src, err := ev.Endpoint(c.name, ipfamily.Of(fe.addr), fe.addr)
						if err != nil {
							continue // no address of the family
						}
						dnat := proxy.DNATNode(fe.kind, c.node, fe.dialed, entry)
						m := model(dnat)
						i := slices.IndexFunc(m.Services, func(q *proxy.ServicePort) bool { return q.String() == p.String() })
						if i < 0 {
							t.Fatalf("%s: not in node %s's model", p, dnat)
						}
						route := m.Route(m.Services[i], fe.kind, proxy.Client{Addr: src.Addr, NodeLocal: c.hostNet && c.node == dnat})
						what := c.name + " -> " + p.String() + " " + fe.kind.String() + " " + fe.addr.String()
						traced, err := dp.Paths(src, ev.Resolved().EndpointOf(fe.addr), l4.Port{Protocol: p.Protocol, Port: fe.port})
						if err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						compared[route.Outcome]++
						want := map[string]netip.Addr{} // endpoint -> the source policy sees there
						for _, ep := range route.Endpoints {
							name := ep.Address.String()
							if ep.PodName != "" {
								name = ep.PodNamespace + "/" + ep.PodName
							}
							want[name] = src.Addr
							if ep.NodeSource {
								want[name] = nodeAddr[dnat][f]
								nodeSources++
							}
						}
						for _, path := range traced {
							if path.Delivered == "" {
								if route.Outcome == proxy.Routed {
									t.Errorf("%s: a traced path ends undelivered; Route: %v", what, route.Endpoints)
								}
								continue
							}
							seen, ok := want[path.Delivered]
							if !ok {
								t.Errorf("%s: traced to %s, which Route does not give (%v: %v)", what, path.Delivered, route.Outcome, route.Endpoints)
								continue
							}
							delete(want, path.Delivered)
							if got := policySource(path); got != seen {
								t.Errorf("%s: at %s policy sees %s, Route says %s", what, path.Delivered, got, seen)
							}
						}
						if len(want) > 0 {
							t.Errorf("%s: Route gives endpoints no traced path reaches: %v", what, want)
						}
					}
				}
			}
			t.Logf("connections compared by outcome: %v; endpoints seeing the node: %d", compared, nodeSources)
			if compared[proxy.Routed] == 0 {
				t.Fatal("no routed connection compared")
			}
		})
	}
}

// policySource is the source address of the packet at the last policy
// hook (forward, input, output) of the node where the path ends.
func policySource(p dataplane.Path) netip.Addr {
	last := p.Hops[len(p.Hops)-1].Node
	for i := len(p.Hops) - 1; i >= 0; i-- {
		h := p.Hops[i]
		if h.Node == last && (h.Hook == nft.HookForward || h.Hook == nft.HookInput || h.Hook == nft.HookOutput) {
			return h.Result.Packet.Src
		}
	}
	return netip.Addr{}
}
