package eval_test

import (
	"runtime"
	"testing"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// The scale: 1,000 pods in 50 namespaces, 500 NetworkPolicies and
// 50 Admin/Baseline policies, full table on 2 ports.
var scale = synth.Spec{Namespaces: 50, Pods: 1000, Nodes: 10, NetworkPolicies: 500, AdminPolicies: 50, Seed: 1}

func benchTable(b *testing.B, spec synth.Spec) {
	snap, err := synth.Snapshot(spec)
	if err != nil {
		b.Fatal(err)
	}
	probes := []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}
	b.ResetTimer()
	var allowed int
	for b.Loop() {
		model := policy.Build(snap)
		if len(model.Errors) > 0 {
			b.Fatal(model.Errors)
		}
		t := eval.New(snap, model).TruthTable(eval.TruthTableOptions{Probes: probes})
		allowed = 0
		for _, r := range t.Results {
			if r.Allowed {
				allowed++
			}
		}
		if len(t.Results) != 2*spec.Pods*spec.Pods {
			b.Fatalf("got %d cells, want %d", len(t.Results), 2*spec.Pods*spec.Pods)
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapSys)/(1<<20), "MB-heap-sys")
	b.ReportMetric(float64(allowed)/float64(2*spec.Pods*spec.Pods), "allowed-fraction")
}

// BenchmarkTable is the model build + evaluator index + full table at scale.
func BenchmarkTable(b *testing.B) { benchTable(b, scale) }

// BenchmarkTableNoPolicies is the same cluster without any policy: the
// baseline the policy cost is measured against, in the same run.
func BenchmarkTableNoPolicies(b *testing.B) {
	s := scale
	s.NetworkPolicies, s.AdminPolicies = 0, 0
	benchTable(b, s)
}
