package compiler_test

import (
	"testing"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
)

// BenchmarkCompile is model + resolution + compile for one node (no kernel).
func BenchmarkCompile(b *testing.B) {
	snap, err := synth.Snapshot(synth.NodeScale)
	if err != nil {
		b.Fatal(err)
	}
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
	}
}
