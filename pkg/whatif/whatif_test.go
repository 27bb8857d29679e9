package whatif_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/whatif"
)

const testdata = "../../testdata"

// tableChanges are the cells (of pods in both) whose verdicts differ
// between the evaluator's two whole tables: what Compare must find.
func tableChanges(before, after whatif.State, opts eval.TruthTableOptions) (changes []string, compared int) {
	tb, ta := before.Evaluator.TruthTable(opts), after.Evaluator.TruthTable(opts)
	was := map[string]bool{}
	for _, r := range tb.Results {
		was[cellKey(r.From, r.To, r.Protocol, r.Port)] = r.Allowed
	}
	for _, r := range ta.Results {
		k := cellKey(r.From, r.To, r.Protocol, r.Port)
		allowed, ok := was[k]
		if !ok {
			continue
		}
		compared++
		if allowed != r.Allowed {
			changes = append(changes, fmt.Sprintf("%s: %v -> %v", k, allowed, r.Allowed))
		}
	}
	slices.Sort(changes)
	return changes, compared
}

func cellKey[P ~string](from, to string, protocol P, port int32) string {
	return fmt.Sprintf("%s -> %s %s/%d", from, to, protocol, port)
}

// check compares Compare's result with the two whole tables, and each
// change's decisions with its verdicts.
func check(t *testing.T, what string, before, after whatif.State, opts eval.TruthTableOptions, explain bool) *whatif.Result {
	t.Helper()
	res := whatif.Compare(before, after, whatif.Options{TruthTableOptions: opts, Explain: explain})
	var probes []l4.Port
	for _, p := range res.Ports {
		pr, err := l4.ParsePort(p)
		if err != nil {
			t.Fatal(err)
		}
		probes = append(probes, pr)
	}
	opts.Probes = probes
	want, compared := tableChanges(before, after, opts)
	var got []string
	for _, c := range res.Changes {
		got = append(got, fmt.Sprintf("%s: %v -> %v", cellKey(c.From, c.To, c.Protocol, c.Port), c.Before, c.After))
		if c.BeforeDecision == nil || c.AfterDecision == nil || c.BeforeDecision.Allowed == c.AfterDecision.Allowed {
			t.Errorf("%s: %s: the decisions of the side that flipped: %+v, %+v", what, got[len(got)-1], c.BeforeDecision, c.AfterDecision)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("%s: changes\n  %v\nthe two tables differ in\n  %v", what, got, want)
	}
	if res.CellsCompared != compared || res.Unchanged != compared-len(want) {
		t.Errorf("%s: %d cells compared, %d unchanged; the tables share %d, %d unchanged", what, res.CellsCompared, res.Unchanged, compared, compared-len(want))
	}
	return res
}

// TestCompareCorpus: on every pair of consecutive steps of every corpus
// case, the cells Compare says flip are exactly those where the
// evaluator's whole tables of the two states differ (the evaluator run
// twice), on the steps' ports; changes of policies alone are compared by
// evaluating again only the cells a changed policy can touch.
func TestCompareCorpus(t *testing.T) {
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	pairs, policyOnly, flips, evaluated, cells := 0, 0, 0, 0, 0
	for _, c := range cases {
		snap, err := c.BaseSnapshot(testdata)
		if err != nil {
			t.Fatal(err)
		}
		family, err := c.AddressFamily()
		if err != nil {
			t.Fatal(err)
		}
		prev := snap.Copy()
		for i := range c.Steps {
			if err := c.ApplyStep(snap, i); err != nil {
				t.Fatal(err)
			}
			var probes []l4.Port
			for _, x := range c.Steps[i].Expect {
				ps, err := l4.ParsePorts(x.Ports)
				if err != nil {
					t.Fatal(err)
				}
				probes = append(probes, ps...)
			}
			cur := snap.Copy()
			opts := eval.TruthTableOptions{Probes: probes, Family: family}
			res := check(t, fmt.Sprintf("%s/%s step %d", c.Suite, c.Name, i), whatif.NewState(prev), whatif.NewState(cur), opts, i%2 == 0)
			pairs++
			flips += len(res.Changes)
			if !res.PodsChanged {
				policyOnly++
				evaluated += res.Evaluated
				cells += res.CellsCompared
			}
			prev = cur
		}
	}
	t.Logf("%d pairs of steps, %d flipped cells; %d changed policies only, where %d of %d cells were evaluated again", pairs, flips, policyOnly, evaluated, cells)
	if pairs < 200 || policyOnly < 100 || flips < 500 || evaluated >= cells {
		t.Fatalf("too little compared")
	}
}

// FuzzCompare: a base snapshot and fuzzed objects applied on a copy of it
// (replacing what is there, as `netpol diff --apply` does); Compare, both
// ways, finds exactly the cells where the two whole tables differ.
func FuzzCompare(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join(testdata, "base", "*.yaml"))
	slices.Sort(files)
	var bases []*cluster.Snapshot
	for _, file := range files {
		snap, report := cluster.LoadPaths([]string{file}, nil)
		if len(report.Errors) > 0 {
			f.Fatal(report.Errors)
		}
		bases = append(bases, snap)
	}
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		f.Fatal(err)
	}
	for i, c := range cases {
		if docs := c.AppliedYAML(); docs != "" {
			f.Add([]byte(docs), uint8(slices.Index(files, filepath.Join(testdata, "base", c.Base+".yaml"))), uint8(i), uint16(80+i%2))
		}
	}
	f.Fuzz(func(t *testing.T, change []byte, base, protoFamily uint8, port uint16) {
		before := bases[int(base)%len(bases)]
		after := before.Copy()
		after.AddDocuments(change, "change.yaml", true)
		if len(after.Pods) > 32 {
			return
		}
		opts := eval.TruthTableOptions{Probes: []l4.Port{{Protocol: fuzzProtocols[int(protoFamily)%3], Port: int32(port)%65535 + 1}},
			Family: fuzzFamilies[int(protoFamily/3)%3]}
		b, a := whatif.NewState(before), whatif.NewState(after)
		check(t, "before -> after", b, a, opts, true)
		check(t, "after -> before", a, b, opts, false)
	})
}

var fuzzProtocols = [...]corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
var fuzzFamilies = [...]ipfamily.Family{ipfamily.Any, ipfamily.IPv4, ipfamily.IPv6}
