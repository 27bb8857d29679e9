package kernel

import (
	"fmt"
	"maps"
	"math/rand"
	"testing"

	"github.com/netpol/netpol/pkg/nft"
)

// Random small updates to every kind of set: after each Apply the
// incrementally updated cache, the kernel and desired must all agree.
func TestRandomUpdatesKeepCacheExact(t *testing.T) {
	a, fd := newTestApplier(t)
	rng := rand.New(rand.NewSource(1))

	// Pools of disjoint candidates; each step toggles a few of them.
	var ranges, tuples, hosts []nft.Element
	for i := 0; i < 64; i++ {
		ranges = append(ranges, cidr(fmt.Sprintf("10.%d.0.0/16", i)))
		tuples = append(tuples, tuple(fmt.Sprintf("10.%d.0.0/16", i), tcp, 80, 90))
		hosts = append(hosts, single(fmt.Sprintf("10.200.0.%d", i)))
	}
	verdicts := []nft.Verdict{jump("class-a"), gotoV("class-b"), {Kind: nft.Drop}}
	in := map[string]map[int]int{"ranges": {}, "tuples": {}, "hosts": {}, "pods": {}} // index -> verdict

	build := func() *nft.Table {
		d := fullTable()
		d.Sets["peers4"].Elements = nil
		d.Sets["allow4"].Elements = nil
		d.Sets["hosts4"].Elements = nil
		d.Sets["pods4"].Elements = nil
		for i := range in["ranges"] {
			d.Sets["peers4"].Elements = append(d.Sets["peers4"].Elements, ranges[i])
		}
		for i := range in["tuples"] {
			d.Sets["allow4"].Elements = append(d.Sets["allow4"].Elements, tuples[i])
		}
		for i := range in["hosts"] {
			d.Sets["hosts4"].Elements = append(d.Sets["hosts4"].Elements, hosts[i])
		}
		for i, v := range in["pods"] {
			d.Sets["pods4"].Elements = append(d.Sets["pods4"].Elements, to(hosts[i], verdicts[v]))
		}
		return d
	}
	for step := 0; step < 40; step++ {
		for _, m := range in {
			for n := rng.Intn(6); n > 0; n-- {
				i := rng.Intn(64)
				if _, ok := m[i]; ok && rng.Intn(3) > 0 {
					delete(m, i)
				} else {
					m[i] = rng.Intn(len(verdicts))
				}
			}
		}
		desired := build()
		if _, err := a.Apply(desired); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if p := diff(a.cache, desired); !p.Empty() {
			t.Fatalf("step %d: cache differs from desired:\n%s", step, p)
		}
		got := checkKernel(t, fd, desired)
		if p := Diff(got, withElements(a.cache)); !p.Empty() {
			t.Fatalf("step %d: kernel differs from cache:\n%s", step, p)
		}
	}
}

// withElements is the cache as a table whose sets list their elements
// (a cache set keeps them in its index only).
func withElements(cache *state) *nft.Table {
	t := nft.NewTable(cache.name)
	maps.Copy(t.Chains, cache.chains)
	t.Counters = cache.counters
	for name, cs := range cache.sets {
		t.Sets[name] = cs.set.WithElements(cs.index.elements())
	}
	return t
}
