package conformance_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

// The suite must catch a broken data plane: an extra nftables table in the
// node of y/b drops TCP 81 to y/b (in forward and output, so pods, the
// host-network pod and the outside are all hit). The report must name
// exactly the cells the fault breaks, with the probe result, explain's
// reason and the trace, and nothing else; in a case whose NetworkPolicy
// already denies ingress to y/b on TCP 81, only the one cell policy still
// allows (from the host-network pod of y/b's node) is reported.
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
	probes := []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 81}}
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
		a, err := kernel.NewApplier(int(n.Handle), "fault")
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
	// pod's traffic to itself never crosses the node) or the outside,
	// where the evaluator allows it.
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
		// allow-all: every other pod and the outside; with the policy,
		// only the host-network pod on y/b's node (ingress from the pod's
		// own node is always allowed).
		if wantN := []int{len(pods) - 1 + 1, 1}[i]; len(want) != wantN {
			t.Errorf("case %s: %d broken cells, want %d", c.Name, len(want), wantN)
		}
		total += len(want)
	}
	// Per case and port: every pod pair, every pod to the outside and back.
	if probes := 2 * 2 * (len(pods)*len(pods) + 2*len(pods)); rep.Summary.Mismatches != total || rep.Summary.Probes != probes {
		t.Errorf("summary %+v, want %d mismatches and %d probes", rep.Summary, total, probes)
	}
}

// The outside is a peer of every step: an extra nftables table on node-2
// drops TCP 80 to the outside address (forward and output), one on node-1
// drops UDP 81 from it (forward and input, so the host-network pod is hit
// too). The report must name exactly those outside cells that policy
// allows, each with explain's text and a trace through the compiled
// tables; a NetworkPolicy that cuts namespace y off from the outside
// removes y's cells from the list.
func TestConformanceCatchesAnOutsideFault(t *testing.T) {
	requireRoot(t)
	outside := netip.MustParseAddr(generator.OutsideAddr)
	cases := []generator.Case{
		{Name: "fault/outside/allow-all", Tags: []string{"fault"}, Steps: []generator.Step{{Name: "no policy"}}},
		{Name: "fault/outside/y-inside-only", Tags: []string{"fault"}, Steps: []generator.Step{{Name: "y talks to pods only", Apply: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: pods-only, namespace: "y"}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress: [{from: [{ipBlock: {cidr: 10.244.0.0/16}}]}]
  egress: [{to: [{ipBlock: {cidr: 10.244.0.0/16}}]}]
`}}},
	}
	faults := []struct {
		node  string
		side  nft.Side // the outside's address in the packet
		proto uint8
		port  uint16
		hooks []string
	}{
		{"node-2", nft.Dst, 6, 80, []string{nft.HookForward, nft.HookOutput}},
		{"node-1", nft.Src, 17, 81, []string{nft.HookForward, nft.HookInput}},
	}
	inject := func(l *lab.Lab) error {
		for i, f := range faults {
			n := l.Node(f.node)
			if n == nil {
				return fmt.Errorf("no node %s in the lab", f.node)
			}
			a, err := kernel.NewApplier(int(n.Handle), "fault")
			if err != nil {
				return err
			}
			fam := nft.FamilyOf(outside)
			tab := nft.NewTable("fault")
			tab.AddSet(&nft.Set{Name: "outside", Fields: []nft.FieldType{fam.Field, nft.FieldProto, nft.FieldPort},
				Elements: []nft.Element{{Key: nft.Key(fam.AddrBytes(outside), nft.ProtoBytes(f.proto), nft.PortBytes(f.port))}}})
			for _, hook := range f.hooks {
				ch := tab.AddChain(&nft.Chain{Name: hook, Base: &nft.Hook{Type: "filter", Hook: hook, Priority: -5, Policy: "accept"}})
				ch.Rules = []*nft.Rule{nft.NewRule().In(fam, "outside", nft.AddrOf(fam, f.side), nft.L4Proto(), nft.DstPort()).Verdict(nft.Verdict{Kind: nft.Drop})}
			}
			_, err = a.Apply(tab)
			a.Close()
			if err != nil {
				return fmt.Errorf("fault %d: %w", i, err)
			}
		}
		return nil
	}
	probes := []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 81}}
	rep, err := conformance.RunLab(t.Context(), cases, conformance.LabOptions{Probes: probes, Prefix: "netpol-confout", AfterUp: inject})
	if err != nil {
		t.Fatal(err)
	}
	if left, err := lab.List("netpol-confout-"); err != nil || len(left) > 0 {
		t.Errorf("lab namespaces left behind: %v %v", left, err)
	}
	// The base's pods: x/b, y/a, y/c, z/b on node-2; the others and h/h on
	// node-1.
	o := generator.OutsideAddr
	toOutside := func(pods ...string) []string {
		var out []string
		for _, p := range pods {
			out = append(out, p+" -> "+o+" TCP/80")
		}
		return out
	}
	fromOutside := func(pods ...string) []string {
		var out []string
		for _, p := range pods {
			out = append(out, o+" -> "+p+" UDP/81")
		}
		return out
	}
	want := [][]string{
		append(toOutside("x/b", "y/a", "y/c", "z/b"), fromOutside("h/h", "x/a", "x/c", "y/b", "z/a", "z/c")...),
		append(toOutside("x/b", "z/b"), fromOutside("h/h", "x/a", "x/c", "z/a", "z/c")...),
	}
	if len(rep.Cases) != len(want) {
		t.Fatalf("%d cases, want %d: %+v", len(rep.Cases), len(want), rep.Summary)
	}
	total := 0
	for i, c := range rep.Cases {
		if c.Passed || len(c.Steps) != 1 {
			t.Fatalf("case %s with the fault passed or has no step: %+v", c.Name, c)
		}
		var got []string
		for _, m := range c.Steps[0].Mismatches {
			got = append(got, fmt.Sprintf("%s -> %s %s/%d", m.From, m.To, m.Protocol, m.Port))
			if !m.Expected || m.Observed || m.Result != lab.ResultTimeout {
				t.Errorf("mismatch %+v: want expected allowed, observed denied by a timeout", m)
			}
			// Explain and the trace resolve the address endpoint.
			if m.Explain == "" || strings.HasPrefix(m.Explain, "explain:") || m.Trace == "" || strings.Contains(m.Trace, "trace:") {
				t.Errorf("mismatch %s -> %s: explain %q, trace %q", m.From, m.To, m.Explain, m.Trace)
			}
		}
		slices.Sort(got)
		slices.Sort(want[i])
		if !slices.Equal(got, want[i]) {
			t.Errorf("case %s: mismatches\n%v\nwant\n%v", c.Name, got, want[i])
		}
		if pods := c.Steps[0].Expected.Pods; pods[len(pods)-1] != o {
			t.Errorf("case %s: the table's last pod is %s, want the outside %s", c.Name, pods[len(pods)-1], o)
		}
		total += len(want[i])
	}
	pods := 10 // nine pods and h/h
	if probes := 2 * 2 * (pods*pods + 2*pods); rep.Summary.Mismatches != total || rep.Summary.Probes != probes {
		t.Errorf("summary %+v, want %d mismatches and %d probes", rep.Summary, total, probes)
	}
}
