package conformance_test

import (
	"io"
	"slices"
	"testing"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

// BenchmarkConnRateAudit is what the verdict log costs allowed traffic:
// TCP connections/s between two pods of node-001 that policy lets talk,
// through node-001's identity table of the realistic 10,000-pod cluster,
// with the verdict log at `all` (every connection's decision copied to
// NFLOG and read by a Logger writing to io.Discard at its default rate:
// nearly all lines are over it, and counted) against the same table
// without it, NETPOL_CONNRATE_ROUNDS rounds (default 5) in turn, 3 s
// each; the median of each and of the rounds' ratios, and their spread.
func BenchmarkConnRateAudit(b *testing.B) {
	const node = "node-001"
	rounds, snap, ev := realisticConnRate(b)
	all := &compiler.Audit{Mode: policy.AuditAll, Group: compiler.DefaultAuditGroup}
	tables := offOn(b, ev, func(audited bool) compiler.Options {
		opts := compiler.Options{Node: node, Layout: compiler.LayoutIdentities}
		if audited {
			opts.Audit = all
		}
		return opts
	})
	from, to, probe := dispatchedAllowedPairPort(b, snap, ev, tables[false], node, declaredTCP)
	b.Logf("%s -> %s on %s", from, to, probe)
	l := nodeOnlyLabOf(b, snap, node, from, to)
	a := nodeApplierOf(b, l, node)
	logger := audit.NewLogger(io.Discard, audit.LoggerOptions{})
	attributions := compiler.AuditAttributions(tables[true])
	reader, err := audit.Open(audit.ReaderConfig{NetNS: int(l.Node(node).Handle), Group: all.Group, Node: node,
		Attribution: func(prefix string) (nft.Attribution, bool) { at, ok := attributions[prefix]; return at, ok }}, logger)
	if err != nil {
		b.Fatal(err)
	}
	defer reader.Close()
	off, on, ratio := alternateRates(b, a, tables, rounds, func() float64 { return probeRate(b, l, from, to, probe) })
	logger.Close()
	reportRates(b, off, on, ratio, "audit-off", "audit-all")
	b.ReportMetric(float64(logger.Stats.Written.Load()), "lines-written")
	b.ReportMetric(float64(logger.Stats.Dropped.Load()+logger.Stats.Folded.Load()), "lines-dropped-or-folded")
}

// offOn compiles the table of opts(false) and of opts(true).
func offOn(b *testing.B, ev *eval.Evaluator, opts func(on bool) compiler.Options) map[bool]*nft.Table {
	tables := map[bool]*nft.Table{}
	for _, on := range []bool{false, true} {
		t, err := compiler.Compile(ev.Resolved(), opts(on))
		if err != nil {
			b.Fatal(err)
		}
		tables[on] = t
	}
	return tables
}

// alternateRates measures rate (connections/s) with tables[false]
// applied, then tables[true], rounds times, in each b.Loop, and gives
// each round's rates and their ratio (on / off).
func alternateRates(b *testing.B, a kernel.Table, tables map[bool]*nft.Table, rounds int, rate func() float64) (off, on, ratio []float64) {
	for b.Loop() {
		for range rounds {
			if _, err := a.Apply(tables[false]); err != nil {
				b.Fatal(err)
			}
			r0 := rate()
			if _, err := a.Apply(tables[true]); err != nil {
				b.Fatal(err)
			}
			r1 := rate()
			off, on, ratio = append(off, r0), append(on, r1), append(ratio, r1/r0)
		}
	}
	return off, on, ratio
}

// reportRates reports the medians of off and on (conn/s-OFF,
// conn/s-ON) and of their ratios, with the ratios' spread.
func reportRates(b *testing.B, off, on, ratio []float64, offName, onName string) {
	median := func(xs []float64) float64 { s := slices.Sorted(slices.Values(xs)); return s[len(s)/2] }
	b.ReportMetric(median(off), "conn/s-"+offName)
	b.ReportMetric(median(on), "conn/s-"+onName)
	b.ReportMetric(median(ratio), "ratio")
	b.ReportMetric(slices.Min(ratio), "ratio-min")
	b.ReportMetric(slices.Max(ratio), "ratio-max")
}

// BenchmarkConnRateCounters is what the per-rule counters cost allowed
// traffic: as BenchmarkConnRateAudit, node-001's identity table of the
// realistic 10,000-pod cluster with the agent's per-rule counters against
// the same table without them (its NetworkPolicy tier laid out a rule at
// a time, as counters need).
func BenchmarkConnRateCounters(b *testing.B) {
	const node = "node-001"
	rounds, snap, ev := realisticConnRate(b)
	tables := offOn(b, ev, func(counted bool) compiler.Options {
		return compiler.Options{Node: node, Layout: compiler.LayoutIdentities, RuleCounters: counted}
	})
	b.Logf("%d counters", len(tables[true].Counters))
	from, to, probe := dispatchedAllowedPairPort(b, snap, ev, tables[false], node, declaredTCP)
	b.Logf("%s -> %s on %s", from, to, probe)
	l := nodeOnlyLabOf(b, snap, node, from, to)
	a := nodeApplierOf(b, l, node)
	off, on, ratio := alternateRates(b, a, tables, rounds, func() float64 { return probeRate(b, l, from, to, probe) })
	reportRates(b, off, on, ratio, "counters-off", "counters-on")
}

// BenchmarkConnRateStaged is what the staged policies' shadow evaluation
// costs allowed traffic: as BenchmarkConnRateAudit, node-001's identity
// table of the realistic 10,000-pod cluster with a staged copy of a
// NetworkPolicy that isolates the destination (the shadow evaluation of
// every connection of the node, and each final verdict compared with its
// verdict; the copy changes no verdict, so no line is logged) against the
// same table with nothing staged.
func BenchmarkConnRateStaged(b *testing.B) {
	const node = "node-001"
	rounds, snap, ev := realisticConnRate(b)
	plain, err := compiler.Compile(ev.Resolved(), compiler.Options{Node: node, Layout: compiler.LayoutIdentities})
	if err != nil {
		b.Fatal(err)
	}
	from, to, probe := dispatchedAllowedPairPort(b, snap, ev, plain, node, declaredTCP)
	b.Logf("%s -> %s on %s", from, to, probe)
	r := ev.Resolved()
	var copied *policy.Policy
	for i := 0; i < r.NumPods() && copied == nil; i++ {
		if plan := r.Plan(i, policy.Ingress); r.Pod(i).Key == to && plan != nil && len(plan.Isolating) > 0 {
			p := r.Policies()[plan.Isolating[0]]
			copied = p.Renamed(p.Name + "-staged")
			copied.Staged = true
		}
	}
	if copied == nil {
		b.Fatalf("no NetworkPolicy isolates %s", to)
	}
	staged, err := compiler.Compile(r, compiler.Options{Node: node, Layout: compiler.LayoutIdentities, Staged: []*policy.Policy{copied}})
	if err != nil {
		b.Fatal(err)
	}
	np, ns := plain.Count(), staged.Count()
	b.Logf("staged %s: %d chains, %d rules, %d sets, %d elements; nothing staged: %d, %d, %d, %d",
		copied.Ref(), ns.Chains, ns.Rules, ns.Sets, ns.Elements, np.Chains, np.Rules, np.Sets, np.Elements)
	l := nodeOnlyLabOf(b, snap, node, from, to)
	a := nodeApplierOf(b, l, node)
	tables := map[bool]*nft.Table{false: plain, true: staged}
	off, on, ratio := alternateRates(b, a, tables, rounds, func() float64 { return probeRate(b, l, from, to, probe) })
	reportRates(b, off, on, ratio, "nothing-staged", "staged")
}
