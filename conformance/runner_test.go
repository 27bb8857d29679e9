package conformance_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
)

// The suite must catch a broken data plane: an extra nftables table in the
// node of y/b drops TCP 81 to y/b (in forward and output, so pods and the
// host-network pod are both hit). The report must name exactly the cells
// the fault breaks, with the probe result, explain's reason and the trace,
// and nothing else; in a case whose NetworkPolicy already denies ingress to
// y/b on TCP 81, only the one cell policy still allows (from the
// host-network pod of y/b's node) is reported.
func TestConformanceCatchesAFault(t *testing.T) {
	requireRoot(t)
	victim := "y/b"
	cases := []generator.Case{
		{Name: "fault/allow-all", Tags: []string{"fault"}, Steps: []generator.Step{{Name: "no policy"}}},
		{Name: "fault/deny-81-to-b", Tags: []string{"fault"}, Steps: []generator.Step{{Name: "b allows only TCP 80", Apply: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-80-only, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{ports: [{port: 80, protocol: TCP}]}]
`}}},
	}
	probes := []eval.Probe{{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 81}}
	var pods []string
	inject := func(l *lab.Lab) error {
		var target *lab.Pod
		for _, p := range l.Pods() {
			pods = append(pods, p.Name)
			if p.Name == victim {
				target = p
			}
		}
		if target == nil {
			return fmt.Errorf("no pod %s in the lab", victim)
		}
		n := l.Node(target.Node)
		a, err := nft.NewApplier(int(n.Handle), "fault")
		if err != nil {
			return err
		}
		defer a.Close()
		f := nft.FamilyOf(target.Addrs[0])
		tab := nft.NewTable("fault")
		tab.AddSet(&nft.Set{Name: "victim", Fields: []nft.FieldType{f.Field, nft.FieldProto, nft.FieldPort},
			Elements: []nft.Element{{Key: nft.Key(f.AddrBytes(target.Addrs[0]), nft.ProtoBytes(6), nft.PortBytes(81))}}})
		for _, hook := range []string{nft.HookForward, nft.HookOutput} {
			ch := tab.AddChain(&nft.Chain{Name: hook, Base: &nft.Hook{Type: "filter", Hook: hook, Priority: -5, Policy: "accept"}})
			ch.Rules = []*nft.Rule{nft.NewRule().In(f, "victim", nft.AddrOf(f, nft.Dst), nft.L4Proto(), nft.DstPort()).Verdict(nft.Verdict{Kind: nft.Drop})}
		}
		_, err = a.Apply(tab)
		return err
	}
	rep, err := conformance.RunLab(context.Background(), cases, conformance.LabOptions{Probes: probes, Prefix: "netpol-conffault", AfterUp: inject})
	if err != nil {
		t.Fatal(err)
	}
	if left, err := lab.List("netpol-conffault-"); err != nil || len(left) > 0 {
		t.Errorf("lab namespaces left behind: %v %v", left, err)
	}
	if len(rep.Cases) != 2 || rep.Summary.Cases != 2 || rep.Summary.Steps != 2 {
		t.Fatalf("report summary %+v", rep.Summary)
	}
	// The cells the fault breaks: to y/b on TCP 81 from any other pod (a
	// pod's traffic to itself never crosses the node), where the evaluator
	// allows it.
	broken := func(st conformance.StepResult) []string {
		var out []string
		for _, c := range st.Expected.Results {
			if c.To == victim && c.From != victim && c.Protocol == "TCP" && c.Port == 81 && c.Allowed {
				out = append(out, c.From+" -> "+c.To+" TCP/81")
			}
		}
		slices.Sort(out)
		return out
	}
	total := 0
	for i, c := range rep.Cases {
		if c.Passed || len(c.Steps) != 1 {
			t.Fatalf("case %s with the fault passed or has no step: %+v", c.Name, c)
		}
		want := broken(c.Steps[0])
		var got []string
		for _, m := range c.Steps[0].Mismatches {
			got = append(got, fmt.Sprintf("%s -> %s %s/%d", m.From, m.To, m.Protocol, m.Port))
			if !m.Expected || m.Observed || m.Result != lab.ResultTimeout {
				t.Errorf("mismatch %+v: want expected allowed, observed denied by a timeout", m)
			}
			if m.Explain == "" || m.Trace == "" {
				t.Errorf("mismatch %s -> %s without explain or trace", m.From, m.To)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("case %s: mismatches\n%v\nwant\n%v", c.Name, got, want)
		}
		// allow-all: every other pod; with the policy, only the
		// host-network pod on y/b's node (ingress from the pod's own node
		// is always allowed).
		if wantN := []int{len(pods) - 1, 1}[i]; len(want) != wantN {
			t.Errorf("case %s: %d broken cells, want %d", c.Name, len(want), wantN)
		}
		total += len(want)
	}
	if rep.Summary.Mismatches != total || rep.Summary.Probes != 2*2*len(pods)*len(pods) {
		t.Errorf("summary %+v, want %d mismatches and %d probes", rep.Summary, total, 2*2*len(pods)*len(pods))
	}
}
