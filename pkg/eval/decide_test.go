package eval_test

import (
	"net/netip"
	"testing"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// TestDecideIsExplainsDecision: on every cell of every corpus step,
// Decide's verdict and each direction's decision (tier, policy, rule,
// action, reason, the policies selecting the subject) are Explain's, with
// none of the rules that did not decide.
func TestDecideIsExplainsDecision(t *testing.T) {
	cases, err := corpus.LoadDir(fuzzTestdata)
	if err != nil {
		t.Fatal(err)
	}
	cells := 0
	for _, c := range cases {
		err := c.Replay(fuzzTestdata, func(i int, snap *cluster.Snapshot, family ipfamily.Family) {
			ev := eval.New(snap, policy.Build(snap))
			for _, x := range c.Steps[i].Expect {
				probes, err := l4.ParsePorts(x.Ports)
				if err != nil {
					t.Fatal(err)
				}
				for _, res := range ev.TruthTable(eval.TruthTableOptions{Probes: probes, Family: family}).Results {
					src, err1 := ev.Endpoint(res.From, family, netip.Addr{})
					dst, err2 := ev.Endpoint(res.To, family, src.Addr)
					if err1 != nil || err2 != nil {
						continue
					}
					probe := l4.Port{Protocol: res.Protocol, Port: res.Port}
					full, brief := ev.Evaluate(src, dst, probe, true), ev.Decide(src, dst, probe)
					cells++
					if full.Allowed != brief.Allowed || (full.Egress == nil) != (brief.Egress == nil) {
						t.Fatalf("%s/%s step %d %s -> %s %s: Decide %v, Explain %v", c.Suite, c.Name, i, res.From, res.To, probe, brief.Allowed, full.Allowed)
					}
					if full.Egress == nil {
						continue
					}
					for _, pair := range [][2]*eval.DirectionVerdict{{full.Egress, brief.Egress}, {full.Ingress, brief.Ingress}} {
						f, b := pair[0], pair[1]
						if f.Allowed != b.Allowed || f.Tier != b.Tier || f.Policy != b.Policy || f.Rule != b.Rule || f.Action != b.Action || f.Reason != b.Reason ||
							f.Applies != b.Applies || len(f.SelectedBy) != len(b.SelectedBy) || len(b.Skipped) > 0 || len(b.Ambiguous) > 0 {
							t.Fatalf("%s/%s step %d %s -> %s %s:\nDecide  %+v\nExplain %+v", c.Suite, c.Name, i, res.From, res.To, probe, b, f)
						}
					}
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d cells: Decide decides as Explain", cells)
}
