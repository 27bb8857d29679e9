package kernel

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/netpol/netpol/pkg/nft"
)

// TestSetIndexCollisions runs random adds and removes against the index
// with a hash that collides often (long probes, and removals that move
// entries back), and checks every element is found where it is, and
// nothing else is, after each step.
func TestSetIndexCollisions(t *testing.T) {
	for _, hash := range []struct {
		name string
		fn   func([]byte) uint64
	}{
		{"maphash", elementHash},
		{"colliding", func(id []byte) uint64 { return uint64(id[0] % 3) }},
		// Homes in the table's last slots: probes wrap around to the first.
		{"wrapping", func(id []byte) uint64 { return ^uint64(0) - uint64(id[0]%3) }},
	} {
		t.Run(hash.name, func(t *testing.T) {
			saved := elementHash
			elementHash = hash.fn
			defer func() { elementHash = saved }()
			idx := newSetIndex(&nft.Set{Fields: []nft.FieldType{nft.FieldPort}})
			want := map[string]bool{}
			r := rand.New(rand.NewPCG(1, 2))
			elem := func(n int) nft.Element {
				e := nft.Element{Key: []byte{byte(n), byte(n >> 8), 0, 0}}
				if n%4 == 0 {
					e.Verdict = &nft.Verdict{Kind: nft.Jump, Chain: fmt.Sprint("c", n%7)}
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
				if idx.len() != len(want) {
					t.Fatalf("step %d: %d elements, want %d", step, idx.len(), len(want))
				}
				for i, e := range idx.elements() {
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
		})
	}
}

// TestElementIDRoundTrip: an identity decodes to the element it was made
// of, nil and empty parts apart.
func TestElementIDRoundTrip(t *testing.T) {
	for _, e := range []nft.Element{
		{Key: []byte{10, 0, 0, 1}},
		{Key: []byte{10, 0, 0, 0}, KeyEnd: []byte{10, 0, 0, 255}},
		{Key: []byte{1, 2}, KeyEnd: []byte{}},
		{Key: []byte{0, 80}, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "svc-abc"}},
		{Key: []byte{0, 80}, Verdict: &nft.Verdict{Kind: nft.Accept}},
		{Key: []byte{10, 0, 0, 1, 0, 0, 0, 80}, Data: []byte{10, 1, 1, 1, 0, 0, 31, 144}},
		{Key: []byte{1}, Data: []byte{}},
		{Key: []byte{}},
	} {
		id := appendElementID(nil, e)
		got := decodeElementID(id)
		if !reflect.DeepEqual(got, e) {
			t.Errorf("%+v: decoded as %+v", e, got)
		}
		if again := appendElementID(nil, got); !bytes.Equal(again, id) {
			t.Errorf("%+v: identity %x, then %x", e, id, again)
		}
	}
}

// TestSetIndexCompacts: removals leave dead bytes until the index copies
// its live records to a new arena; Elements made before keep their
// bytes, and every element is still found.
func TestSetIndexCompacts(t *testing.T) {
	elem := func(n int) nft.Element {
		return nft.Element{Key: []byte{10, byte(n >> 16), byte(n >> 8), byte(n)}, Verdict: &nft.Verdict{Kind: nft.Jump, Chain: fmt.Sprint("chain-", n%3)}}
	}
	idx := newSetIndex(&nft.Set{Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true})
	buf := make([]byte, 0, 64)
	for n := range 10000 {
		buf = idx.insert(elem(n), buf)
	}
	before := idx.elements()
	arena := len(idx.ids)
	for n := range 9000 {
		buf = idx.remove(elem(n), buf)
	}
	if idx.len() != 1000 {
		t.Fatalf("%d elements, want 1000", idx.len())
	}
	if len(idx.ids) >= arena/2 || idx.dead > len(idx.ids) {
		t.Errorf("arena %d bytes (%d dead) after removing 9/10 of %d bytes: not compacted", len(idx.ids), idx.dead, arena)
	}
	for n, e := range before {
		if !reflect.DeepEqual(e, elem(n)) {
			t.Fatalf("element %d made before the removals is now %+v", n, e)
		}
	}
	for n := range 10000 {
		if got := idx.has(elem(n), buf); got != (n >= 9000) {
			t.Fatalf("has(%d) = %v", n, got)
		}
	}
}
