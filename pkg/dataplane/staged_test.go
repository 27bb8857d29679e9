package dataplane_test

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// TestCorpusStagedVerdicts is the shadow evaluation's proof without root:
// for every step of every corpus case, each of its policies staged in turn
// (and the step's own staged policies as they are), every cell traced
// through the nodes' tables
//   - is decided as the evaluator decides without the staged policy:
//     staging changes no enforced verdict;
//   - logs a staged line on a node exactly where the node's verdict would
//     differ with the staged policies enforced (each node compares the
//     sides it decides: the source's egress, the destination's ingress),
//     with the would-be and the enforced verdicts, and the staged policy;
//     where the staged policy's rule decides that side, explain's tier,
//     rule and action.
func TestCorpusStagedVerdicts(t *testing.T) {
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	cells, lines, models := 0, 0, 0
	exact := 0
	for _, c := range cases {
		t.Run(c.Suite+"/"+c.Name, func(t *testing.T) {
			err := c.Replay(testdata, func(i int, snap *cluster.Snapshot, family ipfamily.Family) {
				st := c.Steps[i]
				if len(st.Expect) == 0 {
					return
				}
				for _, m := range stagedModels(policy.Build(snap)) {
					models++
					n, l := stagedCells(t, fmt.Sprintf("step %d", i), snap, m, st.Expect, family, &exact)
					cells, lines = cells+n, lines+l
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if lines == 0 {
		t.Fatal("no staged line at all")
	}
	t.Logf("%d models, %d cells: enforced verdicts unchanged, %d staged lines where the verdicts differ (%d of them a staged rule that decides, named as explain names it)",
		models, cells, lines, exact)
}

// stagedModels are m with each of its policies staged in turn, and m
// itself when it stages some.
func stagedModels(m *policy.Model) []*policy.Model {
	var out []*policy.Model
	if len(m.Staged) > 0 {
		out = append(out, m)
	}
	for k, p := range m.Policies {
		staged := *p
		staged.Staged = true
		mk := *m
		mk.Policies = slices.Delete(slices.Clone(m.Policies), k, k+1)
		mk.Staged = append(slices.Clone(m.Staged), &staged)
		out = append(out, &mk)
	}
	return out
}

// stagedCells checks every cell of one model (see TestCorpusStagedVerdicts)
// and returns the cells and the staged lines.
func stagedCells(t *testing.T, name string, snap *cluster.Snapshot, m *policy.Model, expect []corpus.Expect, family ipfamily.Family, exact *int) (int, int) {
	t.Helper()
	enforced := eval.New(snap, m)
	promoted := eval.New(snap, policy.Promoted(m))
	dp, err := dataplane.NewWith(snap, enforced, dataplane.Options{Layout: compiler.LayoutIdentities, Staged: m.Staged})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	attributions := map[string]nft.Attribution{}
	for _, n := range dp.Nodes() {
		maps.Copy(attributions, compiler.AuditAttributions(n.Policy))
	}
	staged := map[string]bool{}
	for _, p := range m.Staged {
		staged[p.Ref()] = true
	}
	r := enforced.Resolved()
	nodeOf := func(ep eval.Endpoint) string {
		if ep.Pod < 0 || r.Pod(ep.Pod).Node < 0 {
			return ""
		}
		return r.NodeName(r.Pod(ep.Pod).Node)
	}
	cells, lines := 0, 0
	for _, x := range expect {
		probes, err := l4.ParsePorts(x.Ports)
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range enforced.TruthTable(eval.TruthTableOptions{Probes: probes, Family: family}).Results {
			if res.From == res.To {
				continue
			}
			cells++
			probe := l4.Port{Protocol: res.Protocol, Port: res.Port}
			src, err1 := enforced.Endpoint(res.From, family, netip.Addr{})
			dst, err2 := enforced.Endpoint(res.To, family, src.Addr)
			if err1 != nil || err2 != nil {
				t.Fatalf("%v %v", err1, err2)
			}
			vE, vS := enforced.Evaluate(src, dst, probe, true), promoted.Evaluate(src, dst, probe, true)
			want := expectedStaged(vE, vS, nodeOf(src), nodeOf(dst))
			paths, err := dp.Paths(src, dst, probe)
			if err != nil {
				t.Fatal(err)
			}
			cell := fmt.Sprintf("%s, %s staged: %s -> %s %s/%d", name, strings.Join(slices.Sorted(maps.Keys(staged)), ", "), res.From, res.To, res.Protocol, res.Port)
			for _, p := range paths {
				if p.Allowed != vE.Allowed {
					t.Errorf("%s: traced %v, the evaluator without the staged policies %v", cell, p.Allowed, vE.Allowed)
				}
				var got []string
				for _, h := range p.Hops {
					for _, s := range h.Result.Steps {
						prefix := logPrefixOf(s.Text)
						at, ok := attributions[prefix]
						if !s.Matched || prefix == "" || !ok || !at.Staged {
							continue
						}
						lines++
						got = append(got, fmt.Sprintf("%s: would %s, enforced %s", h.Node, at.Verdict, at.Enforced))
						if !staged[strings.Split(at.Policy, ", ")[0]] {
							t.Errorf("%s: the staged line on %s names %s, which is not staged", cell, h.Node, at.Policy)
						}
						side := vS.Egress
						if at.Direction == policy.Ingress.String() {
							side = vS.Ingress
						}
						if side.Policy != at.Policy || at.Action == policy.Pass.String() {
							continue
						}
						*exact++
						if side.Tier != at.Tier || side.Rule != at.Rule || side.Action != at.Action {
							t.Errorf("%s: the staged line names %s %q %s (%s), explain %s %q %s (%s)", cell, at.Policy, at.Rule, at.Action, at.Tier,
								side.Policy, side.Rule, side.Action, side.Tier)
						}
					}
				}
				if strings.Join(got, "; ") != strings.Join(want, "; ") {
					t.Errorf("%s: staged lines\n  %s\nwant\n  %s", cell, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
				}
			}
		}
	}
	return cells, lines
}

// expectedStaged are the staged lines of a cell: on the source's node, if
// the sides it decides (egress; ingress too when the destination is there)
// would decide otherwise; on the destination's, if the packet gets there
// and its ingress would.
func expectedStaged(vE, vS *eval.Verdict, srcNode, dstNode string) []string {
	allowed := func(dv *eval.DirectionVerdict) bool { return dv == nil || !dv.Applies || dv.Allowed }
	word := func(ok bool) string {
		if ok {
			return "allow"
		}
		return "deny"
	}
	var out []string
	eE, eS, iE, iS := allowed(vE.Egress), allowed(vS.Egress), allowed(vE.Ingress), allowed(vS.Ingress)
	if srcNode == dstNode {
		if e, s := eE && iE, eS && iS; e != s {
			out = append(out, fmt.Sprintf("%s: would %s, enforced %s", srcNode, word(s), word(e)))
		}
		return out
	}
	if eE != eS {
		out = append(out, fmt.Sprintf("%s: would %s, enforced %s", srcNode, word(eS), word(eE)))
	}
	if eE && iE != iS {
		out = append(out, fmt.Sprintf("%s: would %s, enforced %s", dstNode, word(iS), word(iE)))
	}
	return out
}

// logPrefixOf is the log prefix of a traced rule's text ("" without one).
func logPrefixOf(text string) string {
	_, after, ok := strings.Cut(text, `log prefix "`)
	if !ok {
		return ""
	}
	prefix, _, _ := strings.Cut(after, `"`)
	return prefix
}
