package compiler_test

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
)

// BenchmarkCompile is model + resolution + compile for one node (no kernel),
// on the easy synthetic cluster and on the realistic one of the same size
// (internal/synth: policies as teams write them, namespace-wide peers).
func BenchmarkCompile(b *testing.B) {
	for _, c := range []struct {
		spec synth.Spec
		node string
	}{{synth.NodeScale, "node-0"}, {synth.RealisticScale, "node-001"}} {
		snap, err := synth.Snapshot(c.spec)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("shape="+cmp.Or(c.spec.Shape, synth.ShapeEasy), func(b *testing.B) {
			for b.Loop() {
				model := policy.Build(snap)
				t, err := compiler.Compile(eval.New(snap, model).Resolved(), compiler.Options{Node: c.node})
				if err != nil {
					b.Fatal(err)
				}
				n := t.Count()
				b.ReportMetric(float64(n.Rules), "rules")
				b.ReportMetric(float64(n.Elements), "elements")
				b.ReportMetric(float64(n.Chains), "chains")
				b.ReportMetric(float64(n.Sets), "sets")
			}
		})
	}
}

// BenchmarkNodeTable is the agent's full policy compile of one node in
// the address layout, the model given (the agent's policy.Cache keeps it):
// resolved (the evaluator of every pod for the classes, then
// NewIncremental, which fills the pod-address sets pod by pod: what the
// agent does) against from-pods (NewIncrementalFromPods, a test helper:
// the evaluator of the node's pods alone, the sets filled the same way, as
// a rebase fills a new one). The cluster is the agent scale harness's at
// NETPOL_BENCH_PODS pods (default 10,000): one namespace and one node per
// 100 pods, a NetworkPolicy per 10, an admin policy per 100. resolved also
// reports the largest live heap one compile holds over what was live
// before (peak-live-MB, from a separate run: sampling slows it) and what
// the Incremental keeps once it is made (kept-MB).
func BenchmarkNodeTable(b *testing.B) {
	sizes, err := benchstat.EnvInts("NETPOL_BENCH_PODS", []int{10000})
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		spec := synth.Spec{Namespaces: n / 100, Pods: n, Nodes: n / 100, NetworkPolicies: n / 10, AdminPolicies: n / 100, Seed: 1}
		snap, err := synth.Snapshot(spec)
		if err != nil {
			b.Fatal(err)
		}
		model := policy.Build(snap)
		opts := compiler.Options{Node: "node-1"}
		nsLabels := map[string]labels.Set{}
		for _, ns := range snap.Namespaces {
			nsLabels[ns.Name] = compiler.NamespaceLabelsOf(ns.Name, ns)
		}
		b.Run(fmt.Sprintf("pods=%d/resolved", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := compiler.NewIncremental(eval.New(snap, model).Resolved(), opts); err != nil {
					b.Fatal(err)
				}
			}
			// Once more, untimed: the largest live heap it holds over
			// what was live before (the agent's first sync's share).
			runtime.GC()
			before := benchstat.LiveHeap()
			peak := benchstat.WatchPeakLive()
			live, err := compiler.NewIncremental(eval.New(snap, model).Resolved(), opts)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(peak()-before)/1e6, "peak-live-MB")
			runtime.GC()
			b.ReportMetric(float64(benchstat.LiveHeap()-before)/1e6, "kept-MB")
			runtime.KeepAlive(live)
		})
		b.Run(fmt.Sprintf("pods=%d/from-pods", n), func(b *testing.B) {
			for b.Loop() {
				pods := make([]*compiler.PodState, 0, len(snap.Pods))
				for _, p := range snap.Pods {
					if st := compiler.PodStateOf(p); st != nil {
						pods = append(pods, st)
					}
				}
				l, err := compiler.NewIncrementalFromPods(pods, func(ns string) labels.Set { return nsLabels[ns] }, snap.Nodes, model, opts)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(l.Table().Count().Elements), "elements")
			}
		})
	}
}

// BenchmarkIdentityFullCompile is the agent's full compile in the identity
// layout on the realistic shape (synth.RealisticScale, node-001), the model
// given: from every pod (the evaluator resolves all of them, then
// NewIdentityIncremental) against from representatives (NewIdentityIncrementalFromPods:
// one pod of each identity resolved), the numbering kept as the agent
// keeps it.
func BenchmarkIdentityFullCompile(b *testing.B) {
	snap := realisticSnapshot(b)
	model := policy.Build(snap)
	opts := compiler.Options{Node: "node-001", Layout: compiler.LayoutIdentities, Identities: &compiler.Identities{}}
	b.Run("every-pod", func(b *testing.B) {
		for b.Loop() {
			if _, err := compiler.NewIdentityIncremental(eval.NewFromPods(snap, model, slices.Values(snap.Pods), len(snap.Pods)).Resolved(), opts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("representatives", func(b *testing.B) {
		for b.Loop() {
			l, err := compiler.NewIdentityIncrementalFromPods(snap, model, slices.Values(snap.Pods), len(snap.Pods), opts)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(l.ResolvedPods()), "pods-resolved")
		}
	})
}

// BenchmarkIdentityRebase is a policy that applies to pods of the node
// (an Admin ClusterNetworkPolicy whose subjects are one team's
// namespaces, the team of a pod of the node) added and deleted in turn,
// each followed by IdentityIncremental.Rebase, against the full compile the
// agent ran for it before (NewIdentityIncrementalFromPods), on the realistic
// cluster (NETPOL_BENCH_PODS, default synth.RealisticScale) at node-001.
// The model comes from a policy.Cache, as in the agent.
func BenchmarkIdentityRebase(b *testing.B) {
	snap := realisticSnapshot(b)
	const node = "node-001"
	team := ""
	for _, p := range snap.Pods {
		if p.Spec.NodeName == node && !p.Spec.HostNetwork {
			team = snap.Namespace(p.Namespace).Labels["team"]
			break
		}
	}
	if team == "" {
		b.Fatal("no pod of node-001 in a team's namespace")
	}
	extra := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bench-team-deny"},
		Spec: cnpv1beta1.ClusterNetworkPolicySpec{Tier: cnpv1beta1.AdminTier, Priority: 5,
			Subject: cnpv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}},
			Ingress: []cnpv1beta1.ClusterNetworkPolicyIngressRule{{Name: "deny-from-dev", Action: cnpv1beta1.ClusterNetworkPolicyRuleActionDeny,
				From: []cnpv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "dev"}}}}}}}}
	base := snap.ClusterPolicies
	var cache policy.Cache
	model := func(with bool) *policy.Model {
		snap.ClusterPolicies = base
		if with {
			snap.ClusterPolicies = append(slices.Clone(base), extra)
		}
		m, problems := cache.Build(snap.PolicyObjects(), func(obj any) (*cluster.Snapshot, []error) { return snap.PolicyAlone(obj), nil })
		if len(problems) > 0 {
			b.Fatal(problems)
		}
		return m
	}
	opts := compiler.Options{Node: node, Layout: compiler.LayoutIdentities, Identities: &compiler.Identities{}}
	full := func(with bool) *compiler.IdentityIncremental {
		l, err := compiler.NewIdentityIncrementalFromPods(snap, model(with), slices.Values(snap.Pods), len(snap.Pods), opts)
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	b.Run("full", func(b *testing.B) {
		with := false
		for b.Loop() {
			with = !with
			full(with)
		}
	})
	b.Run("rebase", func(b *testing.B) {
		live := full(false)
		with := false
		for b.Loop() {
			with = !with
			if _, err := live.Rebase(compiler.Changes{}, model(with), snap.Nodes); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(live.ReusedChains()), "chains-reused")
		// What the table's state holds after the rebases (a rebase that
		// kept the compile before it grew this with every rebase).
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		b.ReportMetric(float64(m.HeapAlloc)/1e6, "live-MB")
		runtime.KeepAlive(live)
	})
}

// realisticSnapshot is the realistic shape at NETPOL_BENCH_PODS pods
// (default synth.RealisticScale's), its counts scaled with them, without
// Services.
func realisticSnapshot(b *testing.B) *cluster.Snapshot {
	spec := synth.RealisticScale
	n, err := benchstat.EnvInts("NETPOL_BENCH_PODS", []int{spec.Pods})
	if err != nil {
		b.Fatal(err)
	}
	snap, err := synth.Snapshot(spec.WithPods(n[0]))
	if err != nil {
		b.Fatal(err)
	}
	return snap
}
