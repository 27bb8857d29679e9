package conformance_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

var benchScale = synth.NodeScale

const benchNode = "node-0"

func synthSnapshot(b testing.TB, spec synth.Spec) *cluster.Snapshot {
	snap, err := synth.Snapshot(spec)
	if err != nil {
		b.Fatal(err)
	}
	return snap
}

func compileNode(b testing.TB, snap *cluster.Snapshot) *nft.Table {
	t, err := compiler.Compile(eval.New(snap, policy.Build(snap)).Resolved(), compiler.Options{Node: benchNode})
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// nodeOnlyLab is a lab with the benchmark node and no pods: a network
// namespace to program.
func nodeOnlyLab(b testing.TB, snap *cluster.Snapshot, pods ...string) *lab.Lab {
	return nodeOnlyLabOf(b, snap, benchNode, pods...)
}

// nodeOnlyLabOf is nodeOnlyLab for another node.
func nodeOnlyLabOf(b testing.TB, snap *cluster.Snapshot, node string, pods ...string) *lab.Lab {
	small := cluster.New()
	for _, n := range snap.Nodes {
		if n.Name == node {
			small.Nodes = append(small.Nodes, n)
		}
	}
	small.Namespaces = snap.Namespaces
	for _, p := range snap.Pods {
		for _, want := range pods {
			if p.Namespace+"/"+p.Name == want {
				small.Pods = append(small.Pods, p)
			}
		}
	}
	l := labtest.Up(b, small, lab.Options{})
	return l
}

func nodeApplier(b testing.TB, l *lab.Lab) *kernel.Applier { return nodeApplierOf(b, l, benchNode) }

func nodeApplierOf(b testing.TB, l *lab.Lab, node string) *kernel.Applier {
	a, err := kernel.NewApplier(int(l.Node(node).Handle), compiler.DefaultTable)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}

// BenchmarkCompileApply is a node's first sync at scale: model, resolution
// and compile for one node, then the whole table applied as one kernel
// transaction into an empty namespace. The baseline is the same pods with
// no policies, in the same run.
func BenchmarkCompileApply(b *testing.B) {
	requireRoot(b)
	noPolicies := benchScale
	noPolicies.NetworkPolicies, noPolicies.AdminPolicies = 0, 0
	for _, c := range []struct {
		name string
		spec synth.Spec
	}{{"policies", benchScale}, {"baseline-no-policies", noPolicies}} {
		b.Run(c.name, func(b *testing.B) {
			snap := synthSnapshot(b, c.spec)
			l := nodeOnlyLab(b, snap)
			var compileTime, applyTime time.Duration
			var counts nft.Counts
			for b.Loop() {
				b.StopTimer()
				a := nodeApplier(b, l)
				if err := a.Delete(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				t := compileNode(b, snap)
				compiled := time.Now()
				if _, err := a.Apply(t); err != nil {
					b.Fatal(err)
				}
				compileTime += compiled.Sub(start)
				applyTime += time.Since(compiled)
				counts = t.Count()
			}
			n := float64(b.N)
			b.ReportMetric(compileTime.Seconds()*1000/n, "compile-ms/op")
			b.ReportMetric(applyTime.Seconds()*1000/n, "apply-ms/op")
			b.ReportMetric(float64(counts.Chains), "chains")
			b.ReportMetric(float64(counts.Rules), "rules")
			b.ReportMetric(float64(counts.Sets), "sets")
			b.ReportMetric(float64(counts.Elements), "elements")
		})
	}
}

// BenchmarkPodAddRemove is one pod appearing and then going away on a node
// whose table holds the whole cluster: two incremental transactions per
// op. The pod lands in a namespace and with labels that policies select,
// so it joins peer sets, named-port sets and the allow-lists of classes.
// Run at two cluster sizes: the transaction must not grow with the
// cluster.
func BenchmarkPodAddRemove(b *testing.B) {
	requireRoot(b)
	for _, spec := range []synth.Spec{
		{Namespaces: 10, Pods: 1000, Nodes: 9, NetworkPolicies: 100, AdminPolicies: 10, Seed: 1},
		benchScale,
	} {
		b.Run(fmt.Sprintf("pods=%d", spec.Pods), func(b *testing.B) {
			snap := synthSnapshot(b, spec)
			l := nodeOnlyLab(b, snap)
			a := nodeApplier(b, l)
			base := compileNode(b, snap)
			if _, err := a.Apply(base); err != nil {
				b.Fatal(err)
			}
			// The new pod is a copy of pod-1 (a remote pod) with a fresh IP.
			extra := snap.Pods[1].DeepCopy()
			extra.Name = "bench-extra"
			extra.Status.PodIP = "10.127.255.1"
			extra.Status.PodIPs = nil
			snap.Pods = append(snap.Pods, extra)
			withPod := compileNode(b, snap)
			var txTime time.Duration
			var stats kernel.Stats
			for b.Loop() {
				start := time.Now()
				s, err := a.Apply(withPod)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := a.Apply(base); err != nil {
					b.Fatal(err)
				}
				txTime += time.Since(start)
				stats = s
			}
			b.ReportMetric(txTime.Seconds()*1000/float64(b.N)/2, "ms/transaction")
			b.ReportMetric(float64(stats.ElementsAdded+stats.ElementsDeleted), "elements/transaction")
			b.ReportMetric(float64(stats.Messages), "messages/transaction")
		})
	}
}

// BenchmarkConnRate is the data-plane cost: TCP connections per second
// between two pods on the benchmark node, through its forward hook, with
// the node's full-scale ruleset and with no ruleset, in the same run. Both
// pods are selected by policies, so each packet goes through dispatch,
// class chains and set lookups.
func BenchmarkConnRate(b *testing.B) {
	requireRoot(b)
	snap := synthSnapshot(b, benchScale)
	table := compileNode(b, snap)
	ev := eval.New(snap, policy.Build(snap))
	from, to := dispatchedAllowedPair(b, snap, ev, table)
	l := nodeOnlyLab(b, snap, from, to)
	a := nodeApplier(b, l)
	probe := l4.Port{Protocol: "TCP", Port: 80}
	rate := func() float64 { return probeRate(b, l, from, to, probe) }
	var with, without float64
	for b.Loop() {
		if err := a.Delete(); err != nil {
			b.Fatal(err)
		}
		without = rate()
		if _, err := a.Apply(table); err != nil {
			b.Fatal(err)
		}
		with = rate()
	}
	b.ReportMetric(without, "conn/s-no-ruleset")
	b.ReportMetric(with, "conn/s-ruleset")
	b.ReportMetric(with/without, "ratio")
}

// realisticConnRate is what a connections-per-second benchmark of
// node-001's table of the realistic 10,000-pod cluster starts from (as
// root): its rounds (NETPOL_CONNRATE_ROUNDS, default 5), the cluster and
// its evaluator.
func realisticConnRate(b *testing.B) (rounds int, snap *cluster.Snapshot, ev *eval.Evaluator) {
	requireRoot(b)
	r, err := benchstat.EnvInts("NETPOL_CONNRATE_ROUNDS", []int{5})
	if err != nil {
		b.Fatal(err)
	}
	snap = synthSnapshot(b, synth.RealisticScale)
	return r[0], snap, eval.New(snap, policy.Build(snap))
}

// BenchmarkConnRateRealistic is TCP connections/s between two pods of
// node-001 that policy lets talk (both dispatched into class chains),
// through node-001's table of the realistic 10,000-pod cluster
// (synth.RealisticScale) in each layout, against the same node without a
// table, with the identity table's chains but nobody dispatched (the
// cost of the base chains alone), and with one forward chain, empty or
// with the conntrack rule alone: NETPOL_CONNRATE_ROUNDS rounds (default 5)
// of the six, in turn,
// each 3 s. It reports the median of each and of each round's ratio, and
// the ratios' spread (lowest and highest): one pair is noise on this
// machine. The -vs-conntrack ratios are each layout against the
// conntrack-only chain of the same round: what policy costs on a node
// that tracks connections anyway.
func BenchmarkConnRateRealistic(b *testing.B) {
	const node = "node-001"
	rounds, snap, ev := realisticConnRate(b)
	tables := map[compiler.Layout]*nft.Table{}
	for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
		t, err := compiler.Compile(ev.Resolved(), compiler.Options{Node: node, Layout: layout})
		if err != nil {
			b.Fatal(err)
		}
		tables[layout] = t
	}
	from, to, probe := dispatchedAllowedPairPort(b, snap, ev, tables[compiler.LayoutIdentities], node, declaredTCP)
	b.Logf("%s -> %s on %s", from, to, probe)
	l := nodeOnlyLabOf(b, snap, node, from, to)
	a := nodeApplierOf(b, l, node)
	rate := func() float64 { return probeRate(b, l, from, to, probe) }
	// The identity table with nobody dispatched: every chain and set is
	// there, the connection crosses only the base chains' first rules
	// (what a table costs before any policy rule).
	undispatched := *tables[compiler.LayoutIdentities]
	undispatched.Sets = maps.Clone(undispatched.Sets)
	for _, name := range []string{"egress-pods4", "egress-pods6", "ingress-pods4", "ingress-pods6"} {
		s := *undispatched.Sets[name]
		s.Elements = nil
		undispatched.Sets[name] = &s
	}
	const baseOnly = compiler.Layout(-1)
	tables[baseOnly] = &undispatched
	// Two tables of one forward base chain: empty (the cost of a hook),
	// and holding only `ct state established,related accept` (which turns
	// connection tracking on in the namespace).
	const hookOnly, ctOnly = compiler.Layout(-2), compiler.Layout(-3)
	for _, v := range []struct {
		layout compiler.Layout
		rules  []*nft.Rule
	}{{hookOnly, nil}, {ctOnly, []*nft.Rule{nft.NewRule().CtEstablishedRelated().Verdict(nft.Verdict{Kind: nft.Accept})}}} {
		t := nft.NewTable(compiler.DefaultTable)
		t.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: nft.HookForward, Policy: "accept"}, Rules: v.rules})
		tables[v.layout] = t
	}
	var none, addrs, ids, base, addrRatio, idRatio, baseRatio []float64
	var hook, ct, hookRatio, ctRatio []float64
	for b.Loop() {
		for range rounds {
			if err := a.Delete(); err != nil {
				b.Fatal(err)
			}
			n := rate()
			for _, layout := range []compiler.Layout{compiler.LayoutIdentities, compiler.LayoutAddresses, baseOnly, hookOnly, ctOnly} {
				if err := a.Delete(); err != nil {
					b.Fatal(err)
				}
				if _, err := a.Apply(tables[layout]); err != nil {
					b.Fatal(err)
				}
				r := rate()
				switch layout {
				case compiler.LayoutIdentities:
					ids, idRatio = append(ids, r), append(idRatio, r/n)
				case compiler.LayoutAddresses:
					addrs, addrRatio = append(addrs, r), append(addrRatio, r/n)
				case baseOnly:
					base, baseRatio = append(base, r), append(baseRatio, r/n)
				case hookOnly:
					hook, hookRatio = append(hook, r), append(hookRatio, r/n)
				default:
					ct, ctRatio = append(ct, r), append(ctRatio, r/n)
				}
			}
			none = append(none, n)
		}
	}
	median := func(xs []float64) float64 { s := slices.Sorted(slices.Values(xs)); return s[len(s)/2] }
	// spread reports the median of xs as unit, their least and greatest
	// as unit-min and unit-max.
	spread := func(xs []float64, unit string) {
		b.ReportMetric(median(xs), unit)
		b.ReportMetric(slices.Min(xs), unit+"-min")
		b.ReportMetric(slices.Max(xs), unit+"-max")
	}
	b.ReportMetric(median(none), "conn/s-no-table")
	b.ReportMetric(median(ids), "conn/s-identities")
	b.ReportMetric(median(addrs), "conn/s-addresses")
	spread(idRatio, "ratio-identities")
	b.ReportMetric(median(hook), "conn/s-empty-chain")
	b.ReportMetric(median(hookRatio), "ratio-empty-chain")
	b.ReportMetric(median(ct), "conn/s-ct-state-only")
	b.ReportMetric(median(ctRatio), "ratio-ct-state-only")
	b.ReportMetric(median(base), "conn/s-base-chains-only")
	b.ReportMetric(median(baseRatio), "ratio-base-chains-only")
	spread(addrRatio, "ratio-addresses")
	// Against conntrack on (a Kubernetes node always tracks connections:
	// Service NAT needs it), each round's pair.
	var idCt, addrCt []float64
	for i := range ct {
		idCt, addrCt = append(idCt, ids[i]/ct[i]), append(addrCt, addrs[i]/ct[i])
	}
	spread(idCt, "ratio-identities-vs-conntrack")
	b.ReportMetric(median(addrCt), "ratio-addresses-vs-conntrack")
}

// declaredTCP are the TCP ports dst declares (the lab serves those).
func declaredTCP(dst *corev1.Pod) []l4.Port {
	var out []l4.Port
	for _, c := range dst.Spec.Containers {
		for _, p := range c.Ports {
			if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
				out = append(out, l4.Port{Protocol: "TCP", Port: p.ContainerPort})
			}
		}
	}
	return out
}

// probeRate is connRate of probes from one lab pod to another, each of
// which must connect.
func probeRate(b *testing.B, l *lab.Lab, from, to string, probe l4.Port) float64 {
	return connRate(b, func() error {
		o, err := l.ProbeOne(context.Background(), from, to, probe, ipfamily.IPv4)
		if err == nil && !o.Allowed {
			err = fmt.Errorf("%s -> %s: %s", from, to, o.Result)
		}
		return err
	})
}

// connRate makes connections with connect from 4 goroutines for 3 s and
// returns how many succeeded per second; a failure fails the benchmark.
func connRate(b *testing.B, connect func() error) float64 {
	const window = 3 * time.Second
	var n atomic.Int64
	deadline := time.Now().Add(window)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if err := connect(); err != nil {
					b.Error(err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(n.Load()) / window.Seconds()
}

// dispatchedAllowedPair finds two pods on the benchmark node that policy
// lets talk on tcp/80 and whose traffic the kernel dispatches into class
// chains in both directions.
func dispatchedAllowedPair(b *testing.B, snap *cluster.Snapshot, ev *eval.Evaluator, t *nft.Table) (string, string) {
	return dispatchedAllowedPairOn(b, snap, ev, t, benchNode)
}

func dispatchedAllowedPairOn(b *testing.B, snap *cluster.Snapshot, ev *eval.Evaluator, t *nft.Table, node string) (string, string) {
	from, to, _ := dispatchedAllowedPairPort(b, snap, ev, t, node, func(*corev1.Pod) []l4.Port {
		return []l4.Port{{Protocol: "TCP", Port: 80}}
	})
	return from, to
}

// dispatchedAllowedPairPort finds two pods on node whose traffic the
// kernel dispatches into class chains in both directions and one of the
// probes (of the destination pod) that policy allows between them.
func dispatchedAllowedPairPort(b *testing.B, snap *cluster.Snapshot, ev *eval.Evaluator, t *nft.Table, node string,
	probes func(dst *corev1.Pod) []l4.Port) (string, string, l4.Port) {
	inMap := func(m string, ip string) bool {
		key := nft.IPv4.AddrBytes(netip.MustParseAddr(ip))
		for _, e := range t.Sets[m].Elements {
			if string(e.Key) == string(key) {
				return true
			}
		}
		return false
	}
	var local []string
	ips := map[string]string{}
	pods := map[string]*corev1.Pod{}
	for _, p := range snap.Pods {
		if p.Spec.NodeName == node && !p.Spec.HostNetwork {
			k := p.Namespace + "/" + p.Name
			local = append(local, k)
			ips[k], pods[k] = p.Status.PodIP, p
		}
	}
	for _, src := range local {
		if !inMap("egress-pods4", ips[src]) {
			continue
		}
		for _, dst := range local {
			if src == dst || !inMap("ingress-pods4", ips[dst]) {
				continue
			}
			for _, probe := range probes(pods[dst]) {
				v, err := ev.Explain(src, dst, probe, ipfamily.IPv4)
				if err == nil && v.Allowed {
					return src, dst, probe
				}
			}
		}
	}
	b.Fatal("no allowed pair of dispatched pods on the node")
	return "", "", l4.Port{}
}
