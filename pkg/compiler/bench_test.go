package compiler_test

import (
	"testing"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
)

// Scale is the benchmark cluster: 10,000 pods on 99 nodes (about 100
// local pods per node), 1,000 NetworkPolicies, 100 Admin/Baseline policies.
var Scale = synth.Spec{Namespaces: 100, Pods: 10000, Nodes: 99, NetworkPolicies: 1000, AdminPolicies: 100, Seed: 1}

func scaleSnapshot(b testing.TB) *cluster.Snapshot {
	snap := cluster.New()
	if r := snap.AddDocuments([]byte(synth.YAML(Scale)), "synth", false); len(r.Errors) > 0 {
		b.Fatal(r.Errors)
	}
	return snap
}

// BenchmarkCompile is model + resolution + compile for one node (no kernel).
func BenchmarkCompile(b *testing.B) {
	snap := scaleSnapshot(b)
	var counts string
	for b.Loop() {
		model := policy.Build(snap)
		t, err := compiler.Compile(eval.New(snap, model).Resolved(), compiler.Options{Node: "node-0"})
		if err != nil {
			b.Fatal(err)
		}
		n := t.Count()
		b.ReportMetric(float64(n.Rules), "rules")
		b.ReportMetric(float64(n.Elements), "elements")
		b.ReportMetric(float64(n.Chains), "chains")
		b.ReportMetric(float64(n.Sets), "sets")
		_ = counts
	}
}
