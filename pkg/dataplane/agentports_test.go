package dataplane_test

import (
	"net/netip"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// With the agent's ports protected (here TCP 81, as if the agent listened
// there), the evaluator given the same guard and the traced tables agree
// on every cell, host-network pods (their node's address) included, with
// and without an egress policy and an allowed network.
func TestAgentPortsTracedEqualsEvaluator(t *testing.T) {
	guards := []struct {
		name string
		ap   *compiler.AgentPorts
		// denied is how many cells to host-network pods on TCP 81 the
		// guard must deny (so the test cannot pass with no effect)
		minDenied int
	}{
		{"nobody else", &compiler.AgentPorts{Ports: []uint16{81}}, 1},
		{"pods of node-1 allowed", &compiler.AgentPorts{Ports: []uint16{81}, Allowed: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}, 1},
	}
	policies := []string{"", `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: no-egress, namespace: "x"}
spec:
  podSelector: {}
  policyTypes: [Egress]
`}
	probes := []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 81}, {Protocol: "UDP", Port: 81}}
	for _, g := range guards {
		for pi, extra := range policies {
			snap, rep := cluster.LoadPaths([]string{testdata + "/base/hostnet.yaml"}, nil)
			if len(rep.Errors) > 0 {
				t.Fatal(rep.Errors)
			}
			if extra != "" {
				if r := snap.AddDocuments([]byte(extra), "test", true); len(r.Errors) > 0 {
					t.Fatal(r.Errors)
				}
			}
			ev := eval.New(snap, policy.Build(snap))
			plain := ev.TruthTable(eval.TruthTableOptions{Probes: probes})
			ev.GuardNodes(g.ap)
			want := ev.TruthTable(eval.TruthTableOptions{Probes: probes})
			for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
				dp, err := dataplane.NewWith(snap, ev, dataplane.Options{AgentPorts: g.ap, Layout: layout})
				if err != nil {
					t.Fatal(err)
				}
				got, err := dp.TruthTable(eval.TruthTableOptions{Probes: probes})
				if err != nil {
					t.Fatal(err)
				}
				changed := 0
				for i, w := range want.Results {
					if got.Results[i] != w {
						t.Errorf("%s, policies %d, layout %d: %s -> %s %s/%d: traced %v, evaluator %v", g.name, pi, layout, w.From, w.To, w.Protocol, w.Port, got.Results[i].Allowed, w.Allowed)
					}
					if plain.Results[i].Allowed && !w.Allowed {
						changed++
						if w.Protocol != "TCP" || w.Port != 81 {
							t.Errorf("%s: the guard denied %s -> %s %s/%d, not an agent port", g.name, w.From, w.To, w.Protocol, w.Port)
						}
					}
				}
				if changed < g.minDenied {
					t.Errorf("%s, policies %d: the guard denied %d cells, want at least %d", g.name, pi, changed, g.minDenied)
				}
			}
		}
	}
}
