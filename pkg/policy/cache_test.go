package policy_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

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
	if n := len(snap.NetworkPolicies); n > 0 {
		i := r.IntN(n)
		np := snap.NetworkPolicies[i].DeepCopy()
		switch r.IntN(3) {
		case 0:
			snap.NetworkPolicies = slices.Delete(snap.NetworkPolicies, i, i+1)
		case 1:
			np.Name = fmt.Sprintf("%s-%d", np.Name, step)
			snap.NetworkPolicies = append(snap.NetworkPolicies, np)
		default:
			snap.NetworkPolicies[i] = np // changed: a new object
		}
		for j, p := range snap.NetworkPolicies {
			if p != np && j != i {
				kept["NetworkPolicy "+p.Namespace+"/"+p.Name] = true
			}
		}
	}
	if n := len(snap.ClusterPolicies); n > 0 {
		i := r.IntN(n)
		cnp := snap.ClusterPolicies[i].DeepCopy()
		cnp.Spec.Priority = int32(r.IntN(30))
		switch r.IntN(3) {
		case 0:
			snap.ClusterPolicies = slices.Delete(snap.ClusterPolicies, i, i+1)
		case 1:
			cnp.Name = fmt.Sprintf("%s-%d", cnp.Name, step)
			snap.ClusterPolicies = append(snap.ClusterPolicies, cnp)
		default:
			snap.ClusterPolicies[i] = cnp
		}
		for _, p := range snap.ClusterPolicies {
			if p != cnp && p.Name != cnp.Name {
				kept["ClusterNetworkPolicy "+p.Name] = true
			}
		}
	}
	for _, p := range snap.AdminPolicies {
		kept["AdminNetworkPolicy "+p.Name] = true
	}
	return kept
}

func sortedStrings(errs []error) []string {
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	sort.Strings(out)
	return out
}
