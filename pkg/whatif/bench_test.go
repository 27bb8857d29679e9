package whatif_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/whatif"
)

// diffScale is issue 39's size: 1,000 pods of the realistic shape, 550
// policies (500 NetworkPolicies, 50 Admin and Baseline), two ports.
var diffScale = synth.Spec{Shape: synth.ShapeRealistic, Namespaces: 10, Pods: 1000, Nodes: 10, NetworkPolicies: 500, AdminPolicies: 50, Seed: 1}

var diffPorts = []l4.Port{{Protocol: corev1.ProtocolTCP, Port: 8080}, {Protocol: corev1.ProtocolTCP, Port: 5432}}

// BenchmarkCompare is `netpol diff` with one policy changed (a
// NetworkPolicy's ingress rules removed; an Admin policy's first rule
// removed): the state after built (its model and evaluator) and compared
// with the state before, whose evaluator the command has loaded anyway,
// each flip with what decided it (text output) or explain's whole
// decisions (JSON); beside it, in the same run, one whole table of the
// state before.
func BenchmarkCompare(b *testing.B) {
	before, err := synth.Snapshot(diffScale)
	if err != nil {
		b.Fatal(err)
	}
	opts := whatif.Options{TruthTableOptions: eval.TruthTableOptions{Probes: diffPorts}}
	sb := whatif.NewState(before)
	changes := map[string]func(*cluster.Snapshot){
		"networkpolicy": func(s *cluster.Snapshot) {
			// The first whose change flips cells on the two ports.
			for i, np := range s.NetworkPolicies {
				if len(np.Spec.Ingress) == 0 {
					continue
				}
				c := np.DeepCopy()
				c.Spec.Ingress = nil // its pods take no connection
				s.NetworkPolicies[i] = c
				if len(whatif.Compare(sb, whatif.NewState(s), opts).Changes) > 0 {
					return
				}
				s.NetworkPolicies[i] = np
			}
			b.Fatal("no NetworkPolicy whose change flips a cell")
		},
		"admin": func(s *cluster.Snapshot) {
			for i, p := range s.ClusterPolicies {
				if p.Spec.Tier == "Admin" && len(p.Spec.Ingress) > 1 {
					c := p.DeepCopy()
					c.Spec.Ingress = c.Spec.Ingress[1:]
					s.ClusterPolicies[i] = c
					return
				}
			}
			b.Fatal("no Admin policy with two ingress rules")
		},
	}
	for _, name := range []string{"networkpolicy", "admin"} {
		after := before.Copy()
		changes[name](after)
		for _, explain := range []bool{false, true} {
			o := opts
			o.Explain = explain
			output := "text"
			if explain {
				output = "json"
			}
			b.Run("change="+name+"/output="+output, func(b *testing.B) {
				var res *whatif.Result
				for b.Loop() {
					res = whatif.Compare(sb, whatif.NewState(after), o)
				}
				b.ReportMetric(float64(res.Evaluated), "cells-evaluated")
				b.ReportMetric(float64(res.CellsCompared), "cells")
				b.ReportMetric(float64(len(res.Changes)), "flips")
			})
		}
	}
	b.Run("whole-table", func(b *testing.B) {
		for b.Loop() {
			sb.Evaluator.TruthTable(opts.TruthTableOptions)
		}
	})
}
