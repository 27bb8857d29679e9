package lab

import (
	"fmt"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
)

// Planning needs no root: these check routes and synthetic addresses for
// awkward address layouts without building anything.

const planNodes = `
apiVersion: v1
kind: Node
metadata: {name: a}
spec: {podCIDR: 10.244.0.0/16}
status: {addresses: [{type: InternalIP, address: 10.0.0.1}]}
---
apiVersion: v1
kind: Node
metadata: {name: b}
spec: {podCIDR: 10.244.1.0/24}
status: {addresses: [{type: InternalIP, address: 10.0.0.2}, {type: ExternalIP, address: 203.0.113.2}]}
`

func planFor(t *testing.T, docs ...string) *plan {
	t.Helper()
	snap := cluster.New()
	addYAML(t, snap, strings.Join(append([]string{planNodes}, docs...), "\n---\n"))
	p, err := makePlan(snap, Options{}, nil)
	if err != nil {
		t.Fatalf("makePlan: %v", err)
	}
	return p
}

func routeStrings(rs []route) string {
	var out []string
	for _, r := range rs {
		if r.via.IsValid() {
			out = append(out, fmt.Sprintf("%s via %s", r.dst, r.via))
		} else {
			out = append(out, r.dst.String())
		}
	}
	return strings.Join(out, ", ")
}

func TestPlanRoutesOverlappingCIDRs(t *testing.T) {
	p := planFor(t,
		// In b's /24, but on a: a's /16 already leads b there, and b's
		// /24 would lead a's traffic to b, but a has it locally.
		podYAML("x", "on-a", "a", false, "80", "81", "10.244.1.5"),
		// In a's /16 only, but on b: a needs a host route to b.
		podYAML("x", "on-b", "b", false, "80", "81", "10.244.9.9"),
		// Outside every CIDR, on b.
		podYAML("x", "odd", "b", false, "80", "81", "192.168.7.7"),
	)
	if got, want := routeStrings(p.routesFor(p.node("a"))),
		"10.0.0.2/32, 203.0.113.2/32, 192.168.7.7/32 via 10.0.0.2, 10.244.9.9/32 via 10.0.0.2, 10.244.1.0/24 via 10.0.0.2"; got != want {
		t.Errorf("routes on a:\n got  %s\n want %s", got, want)
	}
	if got, want := routeStrings(p.routesFor(p.node("b"))), "10.0.0.1/32, 10.244.0.0/16 via 10.0.0.1"; got != want {
		t.Errorf("routes on b:\n got  %s\n want %s", got, want)
	}
}

func TestPlanSyntheticAddresses(t *testing.T) {
	p := planFor(t,
		podYAML("x", "six", "a", false, "80", "81", "fd6c:6162::1"), // takes the first synthetic candidate
	)
	for _, n := range p.nodes {
		if len(n.synthetic) != 1 || !n.synthetic[0].Is6() || n.synthetic[0].String() == "fd6c:6162::1" {
			t.Errorf("node %s: synthetic %v, want one free IPv6 address", n.name, n.synthetic)
		}
	}
	if a, b := p.node("a").synthetic, p.node("b").synthetic; len(a) == 1 && len(b) == 1 && a[0] == b[0] {
		t.Errorf("nodes a and b share synthetic address %s", a[0])
	}
	// b's pods are reached through b's synthetic IPv6 address.
	if got := routeStrings(p.routesFor(p.node("b"))); !strings.Contains(got, "fd6c:6162::1/128 via "+p.node("a").synthetic[0].String()) {
		t.Errorf("routes on b: %s; want the IPv6 pod through a's synthetic address", got)
	}
	if !strings.Contains(strings.Join(p.notes, "\n"), "synthetic") {
		t.Errorf("notes %v do not mention the synthetic addresses", p.notes)
	}
}

func TestPlanLeavesOutUnbuildablePods(t *testing.T) {
	p := planFor(t,
		podYAML("x", "lost", "nowhere", false, "80", "81", "10.244.0.7"),
		strings.Replace(podYAML("x", "noip", "a", false, "80", "81"), "podIPs: []", "podIPs: null", 1),
	)
	if len(p.pods) != 0 || !strings.Contains(p.left["x/lost"], `node "nowhere"`) || p.left["x/noip"] == "" {
		t.Errorf("pods %v, left %v; want both left out with reasons", p.pods, p.left)
	}
}
