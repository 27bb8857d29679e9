package dataplane_test

import (
	"testing"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

const testdata = "../../testdata"

// TestCorpusTracedEqualsEvaluator is the proof without root: for every
// step of every corpus case, every cell of the truth table traced through
// the compiled tables of every node equals the evaluator's, in each
// layout of the policy tables.
func TestCorpusTracedEqualsEvaluator(t *testing.T) {
	for _, layout := range []struct {
		name   string
		layout compiler.Layout
	}{{"addresses", compiler.LayoutAddresses}, {"identities", compiler.LayoutIdentities}} {
		t.Run(layout.name, func(t *testing.T) { corpusTraced(t, dataplane.Options{Layout: layout.layout}) })
	}
}

func corpusTraced(t *testing.T, opts dataplane.Options) {
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases found")
	}
	total, steps := 0, 0
	for _, c := range cases {
		t.Run(c.Suite+"/"+c.Name, func(t *testing.T) {
			err := c.Replay(testdata, func(i int, snap *cluster.Snapshot, family ipfamily.Family) {
				st := c.Steps[i]
				if len(st.Expect) == 0 {
					return
				}
				steps++
				ev := eval.New(snap, policy.Build(snap))
				dp, err := dataplane.NewWith(snap, ev, opts)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				for _, x := range st.Expect {
					probes, err := l4.ParsePorts(x.Ports)
					if err != nil {
						t.Fatal(err)
					}
					opts := eval.TruthTableOptions{Probes: probes, Family: family}
					want := ev.TruthTable(opts)
					got, err := dp.TruthTable(opts)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if len(got.Results) != len(want.Results) {
						t.Fatalf("step %d: %d cells traced, %d evaluated", i, len(got.Results), len(want.Results))
					}
					bad := 0
					for k, w := range want.Results {
						total++
						if g := got.Results[k]; g != w {
							bad++
							if bad <= 5 {
								t.Errorf("step %d: %s -> %s %s/%d: traced %v, evaluator %v", i, w.From, w.To, w.Protocol, w.Port, g.Allowed, w.Allowed)
							}
						}
					}
					if bad > 5 {
						t.Errorf("step %d: %d cells differ in all", i, bad)
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Logf("%d cases, %d steps, %d cells: traced == evaluator", len(cases), steps, total)
}
