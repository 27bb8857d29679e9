package policy_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// TestCache: over random sequences of objects dropped, added and replaced
// by changed copies, Cache.Build gives what Build gives for the same
// objects (policies in the same order, the same errors and warnings), and
// an object given again unchanged keeps its *Policy.
func TestCache(t *testing.T) {
	base, r := cluster.LoadPaths([]string{"testdata/mixed.yaml"}, nil)
	if len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	for seed := range 20 {
		rnd := rand.New(rand.NewPCG(uint64(seed), 1))
		snap := *base
		snap.NetworkPolicies = slices.Clone(base.NetworkPolicies)
		snap.AdminPolicies = slices.Clone(base.AdminPolicies)
		snap.ClusterPolicies = slices.Clone(base.ClusterPolicies)
		var c policy.Cache
		var last *policy.Model
		for step := range 30 {
			kept := map[any]bool{}
			if step > 0 {
				kept = mutateObjects(&snap, rnd, step)
			}
			got, problems := c.Build(snap.PolicyObjects(), func(id any) (*cluster.Snapshot, []error) { return snap.PolicyAlone(id), nil })
			want := policy.Build(&snap)
			if len(problems) != 0 {
				t.Fatalf("seed %d step %d: problems %v", seed, step, problems)
			}
			if g, w := refs(got), refs(want); !slices.Equal(g, w) {
				t.Fatalf("seed %d step %d: policies\n got %q\nwant %q", seed, step, g, w)
			}
			if g, w := sortedStrings(got.Errors), sortedStrings(want.Errors); !slices.Equal(g, w) {
				t.Fatalf("seed %d step %d: errors\n got %q\nwant %q", seed, step, g, w)
			}
			if g, w := slices.Sorted(slices.Values(got.Warnings)), slices.Sorted(slices.Values(want.Warnings)); !slices.Equal(g, w) {
				t.Fatalf("seed %d step %d: warnings\n got %q\nwant %q", seed, step, g, w)
			}
			if last != nil {
				for _, p := range got.Policies {
					if old := find(last, p.Ref()); old != nil && kept[p.Ref()] && old != p {
						t.Fatalf("seed %d step %d: %s was given again unchanged but was built again", seed, step, p.Ref())
					}
				}
			}
			last = got
		}
	}
}

// mutateObjects drops, copies (under a new name and priority) or
// replaces (with a new priority) one object of each kind at random, and
// returns the refs of the objects it left alone.
func mutateObjects(snap *cluster.Snapshot, r *rand.Rand, step int) map[any]bool {
	kept := map[any]bool{}
	mutateOne(&snap.NetworkPolicies, "NetworkPolicy", r, step, nil, kept)
	mutateOne(&snap.ClusterPolicies, "ClusterNetworkPolicy", r, step, func(cnp *cnpv1beta1.ClusterNetworkPolicy) {
		cnp.Spec.Priority = int32(r.IntN(30))
	}, kept)
	for _, p := range snap.AdminPolicies {
		kept["AdminNetworkPolicy "+p.Name] = true
	}
	return kept
}

// mutateOne drops, copies under a new name or replaces by a copy one of
// *objs, of kind, at random (the copy changed by change first, if given),
// and adds the refs of the objects it left alone to kept.
func mutateOne[T interface {
	metav1.Object
	DeepCopy() T
}](objs *[]T, kind string, r *rand.Rand, step int, change func(T), kept map[any]bool) {
	n := len(*objs)
	if n == 0 {
		return
	}
	i := r.IntN(n)
	c := (*objs)[i].DeepCopy()
	if change != nil {
		change(c)
	}
	switch r.IntN(3) {
	case 0:
		*objs = slices.Delete(*objs, i, i+1)
	case 1:
		c.SetName(fmt.Sprintf("%s-%d", c.GetName(), step))
		*objs = append(*objs, c)
	default:
		(*objs)[i] = c // changed: a new object
	}
	ref := func(o T) string {
		if ns := o.GetNamespace(); ns != "" {
			return kind + " " + ns + "/" + o.GetName()
		}
		return kind + " " + o.GetName()
	}
	for _, o := range *objs {
		if any(o) != any(c) && ref(o) != ref(c) {
			kept[ref(o)] = true
		}
	}
}

func sortedStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	sort.Strings(out)
	return out
}
