package lab

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
)

// Planning the outside needs no root either.

// planService is a LoadBalancer Service in planNodes' cluster: one
// external IP is node b's address (routed already), the other is not.
const planService = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ipFamilies: [IPv4]
  externalIPs: [192.0.2.60, 10.0.0.2]
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.50}]}
`

func addrStrings(as []netip.Addr) string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return strings.Join(out, ", ")
}

func TestPlanOutside(t *testing.T) {
	p := planFor(t, planService)
	for _, c := range []struct{ what, got, want string }{
		{"external addresses", addrStrings(p.external), "10.0.0.254"},
		{"service addresses", addrStrings(p.vips), "10.96.0.10, 192.0.2.50, 192.0.2.60"},
		{"uplink routes beyond routesFor on b", routeStrings(p.outsideRoutes(p.node("b"))),
			"10.0.0.254/32, 10.96.0.10/32, 192.0.2.50/32, 192.0.2.60/32"},
		{"underlay routes", routeStrings(p.underlayRoutes()),
			"10.0.0.1/32, 10.0.0.2/32, 203.0.113.2/32, 10.244.0.0/16 via 10.0.0.1, 10.244.1.0/24 via 10.0.0.2, " +
				"192.0.2.50/32 via 10.0.0.1, 192.0.2.60/32 via 10.0.0.1"},
		{"node b's NodePort addresses", addrStrings(p.node("b").status), "10.0.0.2, 203.0.113.2"},
	} {
		if c.got != c.want {
			t.Errorf("%s:\n got  %s\n want %s", c.what, c.got, c.want)
		}
	}
	if len(p.services) != 1 || p.primary["x/web"] != "IPv4" {
		t.Errorf("services %v, primary %v; want x/web's one port, IPv4", p.services, p.primary)
	}
}

// The underlay's address is the highest free one but one of the first
// node's /24 (/64), or of the synthetic range for a family no node has;
// Update keeps it while it stays free.
func TestPlanExternalAddress(t *testing.T) {
	taken := podYAML("x", "taker", "a", false, "80", "81", "10.0.0.254")
	vip := strings.NewReplacer("10.96.0.10", "10.0.0.253").Replace(planService)
	six := podYAML("x", "six", "a", false, "80", "81", "fd00::6")
	for _, c := range []struct {
		name     string
		docs     []string
		previous []netip.Addr
		want     string
	}{
		{"first free from the top", []string{taken, vip}, nil, "10.0.0.252"},
		{"a family only synthetic addresses have", []string{six}, nil, "10.0.0.254, fd6c:6162::ffff:ffff:ffff:fffe"},
		{"previous kept", nil, []netip.Addr{netip.MustParseAddr("10.0.0.7")}, "10.0.0.7"},
		{"previous taken now", []string{taken}, []netip.Addr{netip.MustParseAddr("10.0.0.254")}, "10.0.0.253"},
		{"previous outside the prefix", nil, []netip.Addr{netip.MustParseAddr("10.9.0.7")}, "10.0.0.254"},
	} {
		t.Run(c.name, func(t *testing.T) {
			snap := cluster.New()
			addYAML(t, snap, strings.Join(append([]string{planNodes}, c.docs...), "\n---\n"))
			p, err := makePlan(snap, Options{}, &plan{external: c.previous})
			if err != nil {
				t.Fatal(err)
			}
			if got := addrStrings(p.external); got != c.want {
				t.Errorf("external %s, want %s", got, c.want)
			}
		})
	}
}

// Options.Outside pins the outside's address of its family, anywhere
// (host routes reach it); other families keep the automatic choice, and
// synthetic node addresses go around pinned ones. A pinned address no
// other lab address may have.
func TestPlanPinnedOutside(t *testing.T) {
	six := podYAML("x", "six", "a", false, "80", "81", "fd00::6")
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	for _, c := range []struct {
		name      string
		docs      []string
		outside   []netip.Addr
		want      string // external addresses, or the error
		synthetic string // node a's
	}{
		{"IPv4 pinned", nil, addrs("192.0.2.10"), "192.0.2.10", ""},
		{"IPv6 pinned, IPv4 chosen", nil, addrs("2001:db8::10"), "10.0.0.254, 2001:db8::10", ""},
		{"both, IPv4 first", []string{six}, addrs("2001:db8::10", "192.0.2.10"), "192.0.2.10, 2001:db8::10", "fd6c:6162::1"},
		{"listed twice", nil, addrs("192.0.2.10", "192.0.2.10"), "192.0.2.10", ""},
		{"a would-be synthetic address", []string{six}, addrs("fd6c:6162::1"), "10.0.0.254, fd6c:6162::1", "fd6c:6162::2"},
		{"a node's", nil, addrs("10.0.0.1"), "error: the outside's address 10.0.0.1 belongs to node a too", ""},
		{"a pod's", []string{six}, addrs("fd00::6"), "error: the outside's address fd00::6 belongs to pod x/six too", ""},
		{"two of a family", nil, addrs("192.0.2.10", "192.0.2.11"), "error: the outside gets at most one IPv4 address, not 192.0.2.10 and 192.0.2.11", ""},
		{"link-local", nil, addrs("fe80::10"), "error: outside address fe80::10 is a link-local address, which the lab cannot give the outside", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			snap := cluster.New()
			addYAML(t, snap, strings.Join(append([]string{planNodes}, c.docs...), "\n---\n"))
			p, err := makePlan(snap, Options{Outside: c.outside}, nil)
			if err != nil {
				if got := "error: " + err.Error(); got != c.want {
					t.Errorf("%s, want %s", got, c.want)
				}
				return
			}
			if got := addrStrings(p.external); got != c.want {
				t.Errorf("external %s, want %s", got, c.want)
			}
			if got := addrStrings(p.node("a").synthetic); got != c.synthetic {
				t.Errorf("node a's synthetic addresses %s, want %s", got, c.synthetic)
			}
			// Every node reaches every outside address of its families.
			for _, n := range p.nodes {
				routes := routeStrings(p.outsideRoutes(n))
				for _, a := range p.external {
					if _, ok := n.addrOf(familyOf(a)); ok && !strings.Contains(routes, hostPrefix(a).String()) {
						t.Errorf("node %s has no route to the outside's %s: %s", n.name, a, routes)
					}
				}
			}
		})
	}
}

// The outside serves OutsidePorts once each, sorted, on every address.
func TestPlanOutsideServes(t *testing.T) {
	snap := cluster.New()
	addYAML(t, snap, planNodes)
	p, err := makePlan(snap, Options{OutsidePorts: mustProbes(t, "udp/81", "tcp/80", "tcp/80")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(p.outsideServes); got != "[tcp/80 udp/81]" {
		t.Errorf("the outside serves %s, want [tcp/80 udp/81]", got)
	}
}

const planSlices = `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: x, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- addresses: [10.244.0.5]
  targetRef: {kind: Pod, name: a}
- addresses: [10.244.0.6]
- addresses: [10.0.0.1]
  targetRef: {kind: Pod, namespace: x, name: host}
- addresses: [10.244.0.9]
  targetRef: {kind: Pod, namespace: x, name: gone}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: x, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{name: http, port: 7070, protocol: TCP}]
endpoints:
- addresses: [a.example]
  targetRef: {kind: Pod, name: a}
`

// Pods serve the ports EndpointSlices send them: by targetRef, or by
// address for pod-network pods.
func TestPlanServesEndpointSlicePorts(t *testing.T) {
	p := planFor(t, planSlices,
		podYAML("x", "a", "a", false, "80", "81", "10.244.0.5"),
		podYAML("x", "c", "a", false, "80", "81", "10.244.0.6"),
		podYAML("x", "host", "a", true, "80", "81", "10.0.0.1"),
		podYAML("x", "other", "b", false, "80", "81", "10.244.1.7"),
	)
	want := map[string]string{
		"x/a":     "[tcp/80 udp/81 udp/5353 tcp/8080]",
		"x/c":     "[tcp/80 udp/81 udp/5353 tcp/8080]",
		"x/host":  "[tcp/80 udp/81 udp/5353 tcp/8080]",
		"x/other": "[tcp/80 udp/81]",
	}
	for _, pp := range p.pods {
		if got := fmt.Sprint(pp.serves); got != want[pp.key] {
			t.Errorf("%s serves %s, want %s", pp.key, got, want[pp.key])
		}
	}
}
