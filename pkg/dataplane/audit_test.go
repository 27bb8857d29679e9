package dataplane_test

import (
	"fmt"
	"iter"
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

var auditAll = &compiler.Audit{Mode: policy.AuditAll, Group: compiler.DefaultAuditGroup}

// TestCorpusAuditedTracedEqualsEvaluator: the verdict log's statements,
// and the NetworkPolicy tier laid out a rule at a time for them, change no
// verdict: every cell of every corpus step traced through tables that log
// every decision equals the evaluator's.
func TestCorpusAuditedTracedEqualsEvaluator(t *testing.T) {
	corpusTraced(t, dataplane.Options{Layout: compiler.LayoutIdentities, Audit: auditAll})
}

// TestCorpusAuditAttribution: for every cell of every corpus step, the
// rules that log as the first packet crosses the nodes' tables name what
// explain names: one line per side the tables decide (the source's egress,
// then, if it allowed, the destination's ingress), with explain's tier,
// policy, rule and action and the side's verdict; none for a side no
// policy selects. At `deny`, the same lines but the allows.
func TestCorpusAuditAttribution(t *testing.T) {
	for _, mode := range []string{policy.AuditAll, policy.AuditDeny} {
		t.Run(mode, func(t *testing.T) {
			corpusAuditAttribution(t, &compiler.Audit{Mode: mode, Group: compiler.DefaultAuditGroup})
		})
	}
}

func corpusAuditAttribution(t *testing.T, a *compiler.Audit) {
	lines := 0
	cells := corpusCells(t, dataplane.Options{Layout: compiler.LayoutIdentities, Audit: a}, func(t *testing.T, c cell) {
		attributions := map[string]nft.Attribution{}
		for _, n := range c.dp.Nodes() {
			maps.Copy(attributions, compiler.AuditAttributions(n.Policy))
		}
		want := expectedLines(c.v, c.egress, c.ingress)
		if a.Mode == policy.AuditDeny {
			want = slices.DeleteFunc(want, func(l string) bool { return strings.Contains(l, " allow: ") })
		}
		for _, p := range c.paths {
			got := loggedLines(p, attributions)
			lines += len(got)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s: logged\n  %s\nexplain\n  %s", c, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		}
	})
	t.Logf("%d cells, %d lines logged: each as explain names it", cells, lines)
}

// cell is one cell of a corpus step: explain's verdict (v), whether a
// policy polices each side (egress, ingress: its plan is not empty, so it
// has a class chain), and the paths of its first packet through the
// step's tables (dp).
type cell struct {
	step            int
	res             eval.Result
	v               *eval.Verdict
	egress, ingress bool
	paths           []dataplane.Path
	dp              *dataplane.Cluster
}

func (c cell) String() string {
	return fmt.Sprintf("step %d: %s -> %s %s/%d", c.step, c.res.From, c.res.To, c.res.Protocol, c.res.Port)
}

// corpusCells runs check on every cell (but a pod's to itself) of every
// step of every corpus case that expects something, with the tables opts
// makes, and returns how many.
func corpusCells(t *testing.T, opts dataplane.Options, check func(*testing.T, cell)) int {
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	cells := 0
	for _, c := range cases {
		t.Run(c.Suite+"/"+c.Name, func(t *testing.T) {
			err := c.Replay(testdata, func(i int, snap *cluster.Snapshot, family ipfamily.Family) {
				st := c.Steps[i]
				if len(st.Expect) == 0 {
					return
				}
				ev := eval.New(snap, policy.Build(snap))
				dp, err := dataplane.NewWith(snap, ev, opts)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				r := ev.Resolved()
				policed := func(ep eval.Endpoint, d policy.Direction) bool {
					if ep.Pod < 0 || r.Pod(ep.Pod).HostNetwork {
						return false
					}
					plan := r.Plan(ep.Pod, d)
					return plan != nil && !plan.Empty()
				}
				for _, x := range st.Expect {
					probes, err := l4.ParsePorts(x.Ports)
					if err != nil {
						t.Fatal(err)
					}
					for _, res := range ev.TruthTable(eval.TruthTableOptions{Probes: probes, Family: family}).Results {
						if res.From == res.To {
							continue // a pod to itself: never policed
						}
						cells++
						probe := l4.Port{Protocol: res.Protocol, Port: res.Port}
						src, err1 := ev.Endpoint(res.From, family, netip.Addr{})
						dst, err2 := ev.Endpoint(res.To, family, src.Addr)
						if err1 != nil || err2 != nil {
							t.Fatalf("%v %v", err1, err2)
						}
						paths, err := dp.Paths(src, dst, probe)
						if err != nil {
							t.Fatal(err)
						}
						check(t, cell{step: i, res: res, v: ev.Evaluate(src, dst, probe, true),
							egress: policed(src, policy.Egress), ingress: policed(dst, policy.Ingress), paths: paths, dp: dp})
					}
				}
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	return cells
}

// expectedLines are the lines explain's verdict says the tables log: a
// side whose pod some rule polices (its plan is not empty: it has a class
// chain), egress first, ingress only when egress let the packet on.
func expectedLines(v *eval.Verdict, egress, ingress bool) []string {
	var out []string
	for d, dv := range decidingSides(v, egress, ingress) {
		verdict := "deny"
		if dv.Allowed {
			verdict = "allow"
		}
		out = append(out, line(nft.Attribution{Verdict: verdict, Direction: d, Tier: dv.Tier, Policy: dv.Policy, Rule: dv.Rule, Action: dv.Action}))
	}
	return out
}

// decidingSides are the directions of v the tables decide, in the order
// the packet meets them: egress, then ingress if egress let it on; each
// only where its pod is policed (egress, ingress).
func decidingSides(v *eval.Verdict, egress, ingress bool) iter.Seq2[string, *eval.DirectionVerdict] {
	return func(yield func(string, *eval.DirectionVerdict) bool) {
		for i, dv := range []*eval.DirectionVerdict{v.Egress, v.Ingress} {
			policed := i == 0 && egress || i == 1 && ingress
			if dv != nil && dv.Applies && policed && !yield([...]string{"egress", "ingress"}[i], dv) {
				return
			}
			if dv != nil && !dv.Allowed {
				return
			}
		}
	}
}

// loggedLines are the attributions of the logging rules a path's packet
// matched, in the order it met them.
func loggedLines(p dataplane.Path, attributions map[string]nft.Attribution) []string {
	var out []string
	for _, h := range p.Hops {
		for _, s := range h.Result.Steps {
			prefix := logPrefixOf(s.Text)
			if !s.Matched || prefix == "" {
				continue
			}
			at, ok := attributions[prefix]
			if !ok {
				out = append(out, "unknown prefix "+prefix)
				continue
			}
			out = append(out, line(at))
		}
	}
	return out
}

func line(at nft.Attribution) string {
	return fmt.Sprintf("%s %s: %s %q %q %s", at.Direction, at.Verdict, at.Tier, at.Policy, at.Rule, at.Action)
}
