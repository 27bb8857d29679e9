package eval_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

const testdata = "../../testdata"

// TestCorpus runs every case of testdata/cases against the evaluator: after
// each step, every expected cell must equal the evaluator's table, and the
// traced Explain must agree with the table cell by cell.
func TestCorpus(t *testing.T) {
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases found")
	}
	counts := map[string][2]int{}
	for _, c := range cases {
		t.Run(c.Suite+"/"+c.Name, func(t *testing.T) {
			cells := runCase(t, c)
			n := counts[c.Suite]
			n[0]++
			n[1] += cells
			counts[c.Suite] = n
		})
	}
	for suite, n := range counts {
		t.Logf("suite %s: %d cases, %d cells checked", suite, n[0], n[1])
	}
}

func runCase(t *testing.T, c *corpus.Case) int {
	checked := 0
	err := c.Replay(testdata, func(i int, snap *cluster.Snapshot, family ipfamily.Family) {
		st := c.Steps[i]
		if len(st.Expect) == 0 {
			return
		}
		model := policy.Build(snap)
		for _, e := range model.Errors {
			t.Errorf("step %d: unexpected policy error: %v", i, e)
		}
		ev := eval.New(snap, model)
		for _, x := range st.Expect {
			probes, err := l4.ParsePorts(x.Ports)
			if err != nil {
				t.Fatal(err)
			}
			table := ev.TruthTable(eval.TruthTableOptions{Probes: probes, Family: family})
			want, err := x.Expected(table.Pods)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			got := map[corpus.Key]bool{}
			for _, r := range table.Results {
				got[corpus.Key{From: r.From, To: r.To, Probe: l4.Port{Protocol: r.Protocol, Port: r.Port}}] = r.Allowed
			}
			var diffs []string
			for k, w := range want {
				checked++
				if g, ok := got[k]; !ok || g != w {
					v, _ := ev.Explain(k.From, k.To, k.Probe, family)
					diffs = append(diffs, fmt.Sprintf("  %s -> %s %s: want allowed=%v, got %v\n%s", k.From, k.To, k.Probe, w, g, describe(v)))
				}
			}
			sort.Strings(diffs)
			if len(diffs) > 0 {
				t.Errorf("step %d %q ports %v: %d cell(s) differ:\n%s", i, st.Name, x.Ports, len(diffs), strings.Join(diffs, "\n"))
			}
			// The traced path and the table's fast path must agree.
			for k, g := range got {
				v, err := ev.Explain(k.From, k.To, k.Probe, family)
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed != g {
					t.Errorf("step %d: Explain(%s, %s, %s) = %v but the table says %v", i, k.From, k.To, k.Probe, v.Allowed, g)
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return checked
}

func describe(v *eval.Verdict) string {
	if v == nil {
		return ""
	}
	var b strings.Builder
	for _, d := range []struct {
		name string
		dv   *eval.DirectionVerdict
	}{{"egress", v.Egress}, {"ingress", v.Ingress}} {
		if d.dv == nil {
			continue
		}
		fmt.Fprintf(&b, "    %s: allowed=%v tier=%s policy=%q rule=%q: %s\n", d.name, d.dv.Allowed, d.dv.Tier, d.dv.Policy, d.dv.Rule, d.dv.Reason)
	}
	return b.String()
}
