package proxy

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/netpol/netpol/pkg/nft"
)

// TestElemStore runs random pushes, pops and overwrites on an elemStore
// and on a plain list side by side, across chunk boundaries and before
// and after the store is first made one list.
func TestElemStore(t *testing.T) {
	type phase struct{ ops, pushShare int } // pushShare: per cent of ops that push
	for _, tc := range []struct {
		name      string
		phases    []phase
		flattenAt int // the op after which list() is first called; -1 never
	}{
		{"small, built only", []phase{{300, 70}}, -1},
		{"over several chunks, built only", []phase{{5 * chunkLen, 80}}, -1},
		{"emptied and refilled", []phase{{3*chunkLen + 5, 100}, {3*chunkLen + 5, 0}, {2 * chunkLen, 90}}, -1},
		{"made one list midway", []phase{{6 * chunkLen, 75}}, 3 * chunkLen},
		{"made one list at once", []phase{{2 * chunkLen, 60}}, 0},
		{"emptied after one list", []phase{{chunkLen, 100}, {chunkLen, 0}, {chunkLen, 70}}, chunkLen / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(len(tc.name))))
			var st elemStore
			var want []nft.Element
			op := 0
			for _, ph := range tc.phases {
				for end := op + ph.ops; op < end; op++ {
					switch r := rng.IntN(100); {
					case r < ph.pushShare || (len(want) == 0 && ph.pushShare > 0):
						e := nft.Element{Key: []byte{byte(op), byte(op >> 8)}}
						st.push(e)
						want = append(want, e)
					case len(want) == 0:
						t.Fatalf("op %d: the script pops an empty store", op)
					case r < ph.pushShare+10 && ph.pushShare > 0:
						i := rng.IntN(len(want))
						e := nft.Element{Key: []byte{0xff, byte(op), byte(op >> 8)}}
						*st.at(i) = e
						want[i] = e
					default:
						st.pop()
						want = want[:len(want)-1]
					}
					if op == tc.flattenAt {
						if got := st.list(); !sameKeys(got, want) {
							t.Fatalf("op %d: list() = %d elements, want %d", op, len(got), len(want))
						}
					}
					if st.len() != len(want) {
						t.Fatalf("op %d: len %d, want %d", op, st.len(), len(want))
					}
				}
			}
			for i := range want {
				if string(st.at(i).Key) != string(want[i].Key) {
					t.Fatalf("at(%d) = %x, want %x", i, st.at(i).Key, want[i].Key)
				}
			}
			if got := st.list(); !sameKeys(got, want) {
				t.Fatalf("list() differs from the plain list: %d against %d elements", len(got), len(want))
			}
			if st.chunks != nil {
				t.Fatal("the chunks are still held once the store is one list")
			}
		})
	}
}

func sameKeys(a, b []nft.Element) bool {
	return slices.EqualFunc(a, b, func(x, y nft.Element) bool { return string(x.Key) == string(y.Key) })
}
