package conformance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

// dropTCP81Everywhere adds to every node of l a table that drops TCP
// packets to port 81 on input, forward and output: every cell on TCP 81
// that crosses a node (all but a pod-network pod's traffic to itself)
// times out.
func dropTCP81Everywhere(l *lab.Lab) error {
	nodes := map[string]bool{}
	for _, p := range l.Pods() {
		nodes[p.Node] = true
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range nodes {
			if !yield(n) {
				return
			}
		}
	}) {
		a, err := kernel.NewApplier(int(l.Node(name).Handle), "fault")
		if err != nil {
			return err
		}
		tab := nft.NewTable("fault")
		for _, hook := range []string{nft.HookInput, nft.HookForward, nft.HookOutput} {
			ch := tab.AddChain(&nft.Chain{Name: hook, Base: &nft.Hook{Type: "filter", Hook: hook, Priority: -5, Policy: "accept"}})
			ch.Rules = []*nft.Rule{nft.NewRule().L4ProtoIs(6).DstPortIs(81).Verdict(nft.Verdict{Kind: nft.Drop})}
		}
		_, err = a.Apply(tab)
		a.Close()
		if err != nil {
			return fmt.Errorf("node %s: %w", name, err)
		}
	}
	return nil
}

// BenchmarkConformanceUnderFault runs the endport cases of the generated
// suite (netpol conformance run --include endport) on a clean lab and on
// one whose every node drops TCP 81, and reports both wall times and
// their ratio: a broken data plane must cost a run at most about twice a
// clean one, and the report must still name exactly the broken cells
// (checked here: the evaluator's allowed TCP 81 cells that cross a node,
// and nothing else).
func BenchmarkConformanceUnderFault(b *testing.B) {
	requireRoot(b)
	cases := generator.Select(generator.All(), []string{"endport"}, nil)
	run := func(inject func(*lab.Lab) error) (*conformance.Report, map[string]bool, time.Duration) {
		hostNet := map[string]bool{}
		after := func(l *lab.Lab) error {
			for _, p := range l.Pods() {
				hostNet[p.Name] = p.HostNetwork
			}
			if inject == nil {
				return nil
			}
			return inject(l)
		}
		start := time.Now()
		rep, err := conformance.RunLab(context.Background(), cases, conformance.LabOptions{Prefix: "netpol-benchfault", AfterUp: after})
		if err != nil {
			b.Fatal(err)
		}
		return rep, hostNet, time.Since(start)
	}
	var clean, faulty time.Duration
	var broken int
	for b.Loop() {
		rep, _, d := run(nil)
		if rep.Summary.Mismatches != 0 {
			b.Fatalf("the clean run has %d mismatches", rep.Summary.Mismatches)
		}
		clean = d
		rep, hostNet, d := run(dropTCP81Everywhere)
		faulty = d
		broken = 0
		for _, c := range rep.Cases {
			if c.Error != "" {
				b.Fatalf("case %s: %s", c.Name, c.Error)
			}
			for _, st := range c.Steps {
				var want, got []string
				for _, r := range st.Expected.Results {
					if r.Allowed && r.Protocol == "TCP" && r.Port == 81 && (r.From != r.To || hostNet[r.From]) {
						want = append(want, r.From+" -> "+r.To)
					}
				}
				for _, m := range st.Mismatches {
					got = append(got, m.From+" -> "+m.To)
					if m.Protocol != "TCP" || m.Port != 81 || !m.Expected || m.Observed {
						b.Errorf("case %s step %d: mismatch %+v is not the fault's", c.Name, st.Step, m)
					}
				}
				slices.Sort(want)
				slices.Sort(got)
				if !slices.Equal(got, want) {
					b.Fatalf("case %s step %d: mismatches\n%v\nwant the broken cells\n%v", c.Name, st.Step, got, want)
				}
				broken += len(got)
			}
		}
	}
	if left, err := lab.List("netpol-benchfault-"); err != nil || len(left) > 0 {
		b.Errorf("lab namespaces left behind: %v %v", left, err)
	}
	b.ReportMetric(clean.Seconds(), "clean-s")
	b.ReportMetric(faulty.Seconds(), "fault-s")
	b.ReportMetric(faulty.Seconds()/clean.Seconds(), "ratio")
	b.ReportMetric(float64(broken), "broken-cells")
}
