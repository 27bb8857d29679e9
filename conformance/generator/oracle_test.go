package generator

import (
	"fmt"
	"testing"

	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/policy"
)

// tracedDiffs applies every step of c and compares, cell by cell, the
// tables traced through the compiled nftables tables with the evaluator's.
func tracedDiffs(c Case) ([]string, int, error) {
	snap := Base()
	opts := eval.TruthTableOptions{Probes: Probes(), Family: ipfamily.IPv4}
	var diffs []string
	cells := 0
	for i, st := range c.Steps {
		if err := ApplyStep(snap, st, fmt.Sprintf("%s step %d", c.Name, i)); err != nil {
			return nil, cells, err
		}
		ev := eval.New(snap, policy.Build(snap))
		dp, err := dataplane.New(snap, ev, false)
		if err != nil {
			return nil, cells, fmt.Errorf("step %d: %w", i, err)
		}
		want := ev.TruthTable(opts)
		got, err := dp.TruthTable(opts)
		if err != nil {
			return nil, cells, fmt.Errorf("step %d: %w", i, err)
		}
		if len(got.Results) != len(want.Results) {
			return nil, cells, fmt.Errorf("step %d: %d cells traced, %d evaluated", i, len(got.Results), len(want.Results))
		}
		for k, w := range want.Results {
			cells++
			if g := got.Results[k]; g != w {
				diffs = append(diffs, fmt.Sprintf("step %d: %s -> %s %s/%d: traced %v, evaluator %v", i, w.From, w.To, w.Protocol, w.Port, g.Allowed, w.Allowed))
			}
		}
	}
	return diffs, cells, nil
}

// TestTracedEqualsEvaluator is the no-root oracle on the whole suite: the
// compiled tables of every node, traced, give the evaluator's table.
func TestTracedEqualsEvaluator(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	cells, bad := 0, 0
	for _, c := range All() {
		diffs, n, err := tracedDiffs(c)
		cells += n
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if len(diffs) > 0 {
			bad++
			for i, d := range diffs {
				if i == 5 {
					t.Errorf("%s: %d cells differ in all", c.Name, len(diffs))
					break
				}
				t.Errorf("%s: %s", c.Name, d)
			}
		}
	}
	t.Logf("%d cells traced; %d cases disagree", cells, bad)
}
