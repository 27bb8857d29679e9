package node

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/nft/trace"
	"github.com/netpol/netpol/pkg/policy"
)

// BenchmarkStrictDecision is what strict mode pays after a policy sync,
// beside the sync that a pod of the node costs in the same run, on the
// realistic shape (NETPOL_BENCH_PODS, default synth.RealisticScale's) at
// node-001: the tracer of the node's table (built once per check, on the
// first open flow), and the decision for 1,000 open flows between the
// node's pods and any pod (one trace each). The conntrack dump and
// deletes are the kernel's (a netlink message per entry), not measured
// here.
func BenchmarkStrictDecision(b *testing.B) {
	spec := synth.RealisticScale
	n, err := benchstat.EnvInts("NETPOL_BENCH_PODS", []int{spec.Pods})
	if err != nil {
		b.Fatal(err)
	}
	snap, err := synth.Snapshot(spec.WithPods(n[0]))
	if err != nil {
		b.Fatal(err)
	}
	const node = "node-001"
	opts := compiler.Options{Node: node, Layout: compiler.LayoutIdentities, Identities: &compiler.Identities{}}
	live, err := compiler.NewIdentityIncrementalFromPods(snap, policy.Build(snap), slices.Values(snap.Pods), len(snap.Pods), opts)
	if err != nil {
		b.Fatal(err)
	}
	table := live.Table()
	// Flows between a pod of the node and a random pod, TCP to port 80
	// or 5432, either way.
	var here, all []netip.Addr
	for _, p := range snap.Pods {
		if p.Spec.HostNetwork || len(p.Status.PodIPs) == 0 {
			continue
		}
		a := netip.MustParseAddr(p.Status.PodIPs[0].IP)
		all = append(all, a)
		if p.Spec.NodeName == node {
			here = append(here, a)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	flows := make([]conntrack.Flow, 1000)
	for i := range flows {
		src, dst := here[rng.IntN(len(here))], all[rng.IntN(len(all))]
		if i%2 == 1 {
			src, dst = dst, src
		}
		flows[i] = conntrack.Flow{Protocol: unix.IPPROTO_TCP, Src: netip.AddrPortFrom(src, 40000+uint16(i)), Dst: netip.AddrPortFrom(dst, []uint16{80, 5432}[i%2])}
	}
	newTracer := func() *trace.Tracer {
		tr, err := trace.NewTracerWith(trace.Options{DynamicSetsHoldAll: true}, table)
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	b.Run("tracer", func(b *testing.B) {
		for b.Loop() {
			newTracer()
		}
	})
	b.Run("1000-flows", func(b *testing.B) {
		tr := newTracer()
		denied := 0
		for b.Loop() {
			denied = 0
			for _, fl := range flows {
				d, err := deniedFlow(tr, nil, fl)
				if err != nil {
					b.Fatal(err)
				}
				if d {
					denied++
				}
			}
		}
		b.ReportMetric(float64(denied)/float64(len(flows)), "denied-fraction")
	})
	// The baseline: the sync a strict check follows, here the most
	// common one: a pod of another node deleted and added back, in turn
	// (an update of the table).
	b.Run("baseline-pod-sync", func(b *testing.B) {
		var pod *compiler.PodState
		for _, p := range snap.Pods {
			if p.Spec.NodeName != node && !p.Spec.HostNetwork {
				pod = compiler.PodStateOf(p)
				break
			}
		}
		states := []*compiler.PodState{nil, pod}
		i := 0
		for b.Loop() {
			if _, err := live.Update(compiler.Changes{Pods: map[string]*compiler.PodState{pod.Key: states[i%2]}}); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
