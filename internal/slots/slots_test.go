package slots

import (
	"hash/maphash"
	"math/rand/v2"
	"testing"
)

// list is a caller's list of distinct values: a removal moves the last
// value into the hole, as the callers' lists do.
type list struct {
	t      Table
	values []int
	hash   func(v int) uint64
}

func (l *list) hashAt(i int32) uint64 { return l.hash(l.values[i]) }

func (l *list) find(v int) (int, bool) {
	return l.t.Lookup(l.hash(v), func(i int32) bool { return l.values[i] == v })
}

func (l *list) insert(v int) {
	if _, ok := l.find(v); ok {
		return
	}
	l.t.Add(l.hash(v), int32(len(l.values)), l.hashAt)
	l.values = append(l.values, v)
}

func (l *list) remove(v int) {
	slot, ok := l.find(v)
	if !ok {
		return
	}
	i, last := l.t.At(slot), int32(len(l.values)-1)
	l.t.Remove(slot, last, l.hashAt)
	l.values[i] = l.values[last]
	l.values = l.values[:last]
}

// TestTable: random inserts and removals against a map, with the real
// hash, one that sends every value to three homes (long probe runs, every
// deletion shifts), and one whose homes are the table's last slots
// (probes wrap around to the first); every value is found at its
// position, and no removed one is found.
func TestTable(t *testing.T) {
	seed := maphash.MakeSeed()
	for _, hash := range []struct {
		name string
		fn   func(v int) uint64
	}{
		{"maphash", func(v int) uint64 { return maphash.Comparable(seed, v) }},
		{"colliding", func(v int) uint64 { return uint64(v % 3) }},
		{"wrapping", func(v int) uint64 { return ^uint64(0) - uint64(v%3) }},
	} {
		t.Run(hash.name, func(t *testing.T) {
			l := &list{hash: hash.fn}
			if _, ok := l.find(1); ok {
				t.Fatal("found a value in an empty table")
			}
			want := map[int]bool{}
			r := rand.New(rand.NewPCG(1, 2))
			for step := range 3000 {
				v := r.IntN(80)
				if r.IntN(5) < 3 { // more inserts: the table grows
					l.insert(v)
					want[v] = true
				} else {
					l.remove(v)
					delete(want, v)
				}
				if len(l.values) != len(want) {
					t.Fatalf("step %d: %d values, want %d", step, len(l.values), len(want))
				}
				for i, v := range l.values {
					slot, ok := l.find(v)
					if !ok || l.t.At(slot) != int32(i) || !want[v] {
						t.Fatalf("step %d: %d at %d: found %v, in the map %v", step, v, i, ok, want[v])
					}
				}
				for v := range 80 {
					if _, ok := l.find(v); ok != want[v] {
						t.Fatalf("step %d: find(%d) = %v", step, v, ok)
					}
				}
			}
		})
	}
}

// TestSized: a table sized for n takes n entries without growing, and
// is at most 3/4 full.
func TestSized(t *testing.T) {
	for _, n := range []int{0, 1, 6, 7, 100, 1000} {
		tab := Sized(n)
		if !tab.fits(n) || n*4 > len(tab.slots)*3 || len(tab.slots)&(len(tab.slots)-1) != 0 {
			t.Errorf("Sized(%d): %d slots", n, len(tab.slots))
		}
		if len(tab.slots) > 8 && tab.fits(2*n) {
			t.Errorf("Sized(%d): %d slots, room for twice as many", n, len(tab.slots))
		}
	}
}
