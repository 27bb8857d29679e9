package eval_test

import (
	"cmp"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/policy"
)

// TestPodLookups: explain's lookups find every pod by its namespace/name
// and every pod-network pod by its address, whether the evaluator was
// given the pods in (namespace, name) order (a binary search) or not (a
// map), and find nothing for a pod that is not there.
func TestPodLookups(t *testing.T) {
	snap, report := cluster.LoadPaths([]string{testdata + "/base/e2e.yaml"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	model := policy.Build(snap)
	sorted := slices.Clone(snap.Pods)
	slices.SortFunc(sorted, func(a, b *corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	reversed := slices.Clone(sorted)
	slices.Reverse(reversed)
	if len(sorted) < 3 {
		t.Fatalf("%d pods in the fixture: too few to tell an order", len(sorted))
	}
	for _, tc := range []struct {
		name string
		ev   *eval.Evaluator
	}{
		{"New", eval.New(snap, model)},
		{"in order", eval.NewFromPods(snap, model, slices.Values(sorted), len(sorted))},
		{"reversed", eval.NewFromPods(snap, model, slices.Values(reversed), len(reversed))},
	} {
		for _, p := range sorted {
			key := p.Namespace + "/" + p.Name
			ep, err := tc.ev.Endpoint(key, ipfamily.Any, netip.Addr{})
			if err != nil {
				t.Errorf("%s: %s: %v", tc.name, key, err)
				continue
			}
			if got := tc.ev.Name(ep); got != key {
				t.Errorf("%s: %s found as %s", tc.name, key, got)
			}
			if p.Spec.HostNetwork {
				continue // its address is its node's
			}
			byAddr, err := tc.ev.Endpoint(ep.Addr.String(), ipfamily.Any, netip.Addr{})
			if err != nil || tc.ev.Name(byAddr) != key {
				t.Errorf("%s: %v found as %s (%v), want %s", tc.name, ep.Addr, tc.ev.Name(byAddr), err, key)
			}
		}
		for _, missing := range []string{"x/nope", "nope/a", "zz/zz", "/"} {
			if ep, err := tc.ev.Endpoint(missing, ipfamily.Any, netip.Addr{}); err == nil {
				t.Errorf("%s: %s found as %s, want an error", tc.name, missing, tc.ev.Name(ep))
			}
		}
	}
}
