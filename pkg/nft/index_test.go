package nft

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestSetIndexCollisions runs random adds and removes against the index
// with a hash that collides often (so spill is used), and checks every
// element is found where it is, and nothing else is, after each step.
func TestSetIndexCollisions(t *testing.T) {
	for _, hash := range []struct {
		name string
		fn   func([]byte) uint64
	}{
		{"maphash", elementHash},
		{"colliding", func(id []byte) uint64 { return uint64(id[0] % 3) }},
	} {
		t.Run(hash.name, func(t *testing.T) {
			saved := elementHash
			elementHash = hash.fn
			defer func() { elementHash = saved }()
			idx := newSetIndex(&Set{Fields: []FieldType{FieldPort}})
			want := map[string]bool{}
			r := rand.New(rand.NewPCG(1, 2))
			elem := func(n int) Element {
				e := Element{Key: []byte{byte(n), byte(n >> 8), 0, 0}}
				if n%4 == 0 {
					e.Verdict = &Verdict{Kind: Jump, Chain: fmt.Sprint("c", n%7)}
				}
				return e
			}
			buf := make([]byte, 0, 64)
			for step := range 2000 {
				n := r.IntN(60)
				e := elem(n)
				id := string(appendElementID(nil, e))
				if r.IntN(2) == 0 {
					buf = idx.insert(e, buf)
					want[id] = true
				} else {
					buf = idx.remove(e, buf)
					delete(want, id)
				}
				if len(idx.elems) != len(want) {
					t.Fatalf("step %d: %d elements, want %d", step, len(idx.elems), len(want))
				}
				for i, e := range idx.elems {
					if !want[string(appendElementID(nil, e))] {
						t.Fatalf("step %d: %v is indexed but was removed", step, e)
					}
					if j, ok := idx.find(e, buf); !ok || j != int32(i) {
						t.Fatalf("step %d: %v found at %d (%v), it is at %d", step, e, j, ok, i)
					}
				}
				for m := range 60 {
					if got := idx.has(elem(m), buf); got != want[string(appendElementID(nil, elem(m)))] {
						t.Fatalf("step %d: has(%d) = %v", step, m, got)
					}
				}
			}
			if hash.name == "colliding" && len(idx.spill) == 0 {
				t.Error("the colliding hash never used spill")
			}
		})
	}
}
