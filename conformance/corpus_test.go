package conformance_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
)

const testdata = "../testdata"

func requireRoot(t testing.TB) {
	t.Helper()
	kerneltest.Require(t, "the real-packet tests create network namespaces and program nftables")
}

// TestCorpusInKernel runs every case of the policy corpus against the real
// kernel: one lab per base snapshot, re-synced (not rebuilt) from case to
// case and step to step; after every step with expectations, the probed
// matrix must equal the evaluator's table cell by cell.
func TestCorpusInKernel(t *testing.T) {
	requireRoot(t)
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	byBase := map[string][]*corpus.Case{}
	for _, c := range cases {
		byBase[c.Base] = append(byBase[c.Base], c)
	}
	bases := make([]string, 0, len(byBase))
	for b := range byBase {
		bases = append(bases, b)
	}
	sort.Strings(bases)
	if ok, why := lab.SCTPSupported(); !ok {
		t.Logf("SCTP probes are skipped: %s", why)
	}
	// Both layouts of the policy table: the agent's (addresses, synced
	// incrementally) and the identity layout (compiled in full each sync;
	// the Applier still sends only the difference).
	for _, layout := range []struct {
		name   string
		layout compiler.Layout
	}{{"addresses", compiler.LayoutAddresses}, {"identities", compiler.LayoutIdentities}} {
		t.Run(layout.name, func(t *testing.T) {
			totals := map[string]*tally{}
			for _, base := range bases {
				t.Run(base, func(t *testing.T) {
					runBase(t, base, byBase[base], layout.layout, totals)
				})
			}
			suites := make([]string, 0, len(totals))
			for s := range totals {
				suites = append(suites, s)
			}
			sort.Strings(suites)
			for _, s := range suites {
				n := totals[s]
				t.Logf("suite %s: %d cases, %d steps probed, %d cells, %d disagreements; %d node syncs after the first: %d netlink messages, %d chains rewritten, %d set elements changed",
					s, n.cases, n.steps, n.cells, n.diffs, n.syncs, n.messages, n.chainsRewritten, n.elements)
			}
		})
	}
}

type tally struct {
	cases, steps, cells, diffs int
	// syncs counts node transactions after a lab's first sync, and what
	// they carried: the re-syncs are incremental.
	syncs, messages, chainsRewritten, elements int
}

func runBase(t *testing.T, base string, cases []*corpus.Case, layout compiler.Layout, totals map[string]*tally) {
	full := baseSnapshot(t, base)
	ctx := context.Background()
	start := time.Now()
	// Upstream's servers answer on every port the cases probe, declared
	// or not (e.g. conformance probes tcp/8080 on pods declaring only 80).
	l := labtest.Up(t, full, lab.Options{ExtraPorts: casePorts(t, cases)})
	enf := conformance.NewEnforcer(l)
	enf.Layout = layout
	t.Cleanup(enf.Close)
	// The first sync creates the tables; every later one sends only the
	// difference.
	if _, err := enf.Sync(full); err != nil {
		t.Fatal(err)
	}
	t.Logf("lab for base %s up and programmed in %v", base, time.Since(start).Round(time.Millisecond))
	for _, c := range cases {
		t.Run(c.Suite+"/"+c.Name, func(t *testing.T) {
			n := totals[c.Suite]
			if n == nil {
				n = &tally{}
				totals[c.Suite] = n
			}
			n.cases++
			runCase(t, ctx, l, enf, c, n)
		})
	}
}

// baseSnapshot is the whole base, every pod included.
func baseSnapshot(t *testing.T, base string) *cluster.Snapshot {
	t.Helper()
	snap, report := cluster.LoadPaths([]string{testdata + "/base/" + base + ".yaml"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	return snap
}

func runCase(t *testing.T, ctx context.Context, l *lab.Lab, enf *conformance.Enforcer, c *corpus.Case, n *tally) {
	err := c.Replay(testdata, func(i int, snap *cluster.Snapshot, family ipfamily.Family) {
		if err := l.Update(ctx, snap); err != nil {
			t.Fatalf("step %d: lab update: %v", i, err)
		}
		rep, err := enf.Sync(snap)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		for _, ns := range rep.Nodes {
			n.syncs++
			n.messages += ns.Stats.Messages
			n.chainsRewritten += ns.Stats.ChainsRewritten
			n.elements += ns.Stats.ElementsAdded + ns.Stats.ElementsDeleted
		}
		st := c.Steps[i]
		if len(st.Expect) == 0 {
			return
		}
		n.steps++
		// One probe round per step, over every port the step's
		// expectations name: denied cells cost a timeout, so rounds count.
		probes := expectedProbes(t, st.Expect)
		if len(probes) == 0 {
			return
		}
		// The matrix asks what policy allows new connections now.
		if err := l.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		want := eval.New(snap, rep.Model).TruthTable(eval.TruthTableOptions{Probes: probes, Family: family})
		got, _, err := l.Probe(ctx, lab.ProbeOptions{Probes: probes, Family: family, Timeout: probeTimeout, RetryTimeout: retryTimeout})
		if err != nil {
			t.Fatalf("step %d: probe: %v", i, err)
		}
		diffs, err := conformance.Compare(want, got)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		n.cells += len(want.Results)
		n.diffs += len(diffs)
		for _, d := range diffs {
			t.Errorf("step %d %q: %s", i, st.Name, d)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// supported drops SCTP probes when the kernel has no SCTP.
func supported(probes []l4.Port) []l4.Port {
	if ok, _ := lab.SCTPSupported(); ok {
		return probes
	}
	var out []l4.Port
	for _, p := range probes {
		if p.Protocol != "SCTP" {
			out = append(out, p)
		}
	}
	return out
}

// casePorts is every probe the cases of a base use.
func casePorts(t *testing.T, cases []*corpus.Case) []l4.Port {
	var all []corpus.Expect
	for _, c := range cases {
		for _, st := range c.Steps {
			all = append(all, st.Expect...)
		}
	}
	return expectedProbes(t, all)
}

// expectedProbes is every probe the expectations name, once each, in
// order; SCTP ones are left out where the kernel has no SCTP.
func expectedProbes(t *testing.T, expects []corpus.Expect) []l4.Port {
	seen := map[l4.Port]bool{}
	var out []l4.Port
	for _, x := range expects {
		probes, err := l4.ParsePorts(x.Ports)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range supported(probes) {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// A denied cell costs probeTimeout plus retryTimeout (it is retried once
// before it counts as denied); an allowed one answers in microseconds.
const (
	probeTimeout = 250 * time.Millisecond
	retryTimeout = time.Second
)
