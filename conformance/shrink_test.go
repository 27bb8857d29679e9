package conformance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

// A failing case is shrunk for real, each candidate run on one lab: with a
// fault that drops x/a -> y/b on TCP 81 whatever the policies, the
// 1-minimal failing case is one step with no object left, and its YAML
// loads on its own.
func TestShrinkOnLab(t *testing.T) {
	requireRoot(t)
	inject := func(l *lab.Lab) error {
		pods := map[string]*lab.Pod{}
		for _, p := range l.Pods() {
			pods[p.Name] = p
		}
		src, dst := pods["x/a"], pods["y/b"]
		if src == nil || dst == nil {
			return fmt.Errorf("no x/a or y/b in the lab")
		}
		a, err := kernel.NewApplier(int(l.Node(src.Node).Handle), "fault")
		if err != nil {
			return err
		}
		defer a.Close()
		f := nft.FamilyOf(dst.Addrs[0])
		tab := nft.NewTable("fault")
		tab.AddSet(&nft.Set{Name: "victim", Fields: []nft.FieldType{f.Field, f.Field, nft.FieldProto, nft.FieldPort},
			Elements: []nft.Element{{Key: nft.Key(f.AddrBytes(src.Addrs[0]), f.AddrBytes(dst.Addrs[0]), nft.ProtoBytes(6), nft.PortBytes(81))}}})
		ch := tab.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: nft.HookForward, Priority: -5, Policy: "accept"}})
		ch.Rules = []*nft.Rule{nft.NewRule().In(f, "victim", nft.AddrOf(f, nft.Src), nft.AddrOf(f, nft.Dst), nft.L4Proto(), nft.DstPort()).Verdict(nft.Verdict{Kind: nft.Drop})}
		_, err = a.Apply(tab)
		return err
	}
	lr, err := conformance.NewLabRunner(context.Background(), conformance.LabOptions{
		Probes: []l4.Port{{Protocol: "TCP", Port: 81}}, Prefix: "netpol-confshrink", AfterUp: inject})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lr.Close(); err != nil {
			t.Error(err)
		}
		if left, err := lab.List("netpol-confshrink-"); err != nil || len(left) > 0 {
			t.Errorf("lab namespaces left behind: %v %v", left, err)
		}
	}()
	c := generator.Case{Name: "random/shrink-me", Tags: []string{"random"}, Steps: []generator.Step{
		{Name: "x isolated, a from b", Apply: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-from-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]
`},
		{Name: "z's egress denied on 80", Apply: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: z-no-80}
spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {matchLabels: {ns: z}}}
  egress: [{name: no-80, action: Deny, to: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 80}}}]}]
`},
		{Name: "nothing new"},
	}}
	if err := generator.Check(c); err != nil {
		t.Fatal(err)
	}
	runs := 0
	fails := func(try generator.Case) bool {
		runs++
		res := lr.Run(try)
		if res.Error != "" {
			t.Fatalf("%s: %s", try.Name, res.Error)
		}
		return !res.Passed
	}
	if !fails(c) {
		t.Fatal("the case passes despite the fault")
	}
	small := generator.Shrink(c, fails)
	t.Logf("shrunk in %d runs: %d steps", runs, len(small.Steps))
	if len(small.Steps) != 1 || small.Steps[0].Apply != "" || len(small.Steps[0].Delete) != 0 {
		t.Errorf("not minimal: %+v", small.Steps)
	}
	if res := lr.Run(small); res.Passed {
		t.Error("the shrunk case passes")
	}
	yaml := generator.CaseYAML(small)
	snap := cluster.New()
	if rep := snap.AddDocuments([]byte(yaml), "shrunk", true); len(rep.Errors) > 0 || len(snap.Pods) == 0 {
		t.Errorf("the shrunk case's YAML does not load: %v (%d pods)", rep.Errors, len(snap.Pods))
	}
	if strings.Contains(yaml, "a-from-b") || strings.Contains(yaml, "z-no-80") {
		t.Errorf("the shrunk state still has a policy:\n%s", yaml)
	}
}
