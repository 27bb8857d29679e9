package eval

import (
	"slices"
	"testing"
)

// A selection keeps the words from its first member's to its last
// member's; every operation reads it as the set it is.
func TestBitsetKeepsItsSpan(t *testing.T) {
	const n = 1000
	for _, tc := range []struct {
		name      string
		members   []int
		wantWords int
	}{
		{"empty", nil, 0},
		{"one, in the first word", []int{3}, 1},
		{"one, far in", []int{700}, 1},
		{"a namespace's run", []int{640, 641, 700, 767}, 2},
		{"first and last", []int{0, n - 1}, (n + 63) / 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scratch := newBitset(n)
			for _, m := range tc.members {
				scratch.set(m)
			}
			b := scratch.take()
			if len(b.words) != tc.wantWords {
				t.Errorf("kept %d words, want %d", len(b.words), tc.wantWords)
			}
			if got := slices.Collect(b.members()); !slices.Equal(got, tc.members) {
				t.Errorf("members %v, want %v", got, tc.members)
			}
			for i := -1; i <= n+64; i++ {
				if b.has(i) != slices.Contains(tc.members, i) {
					t.Errorf("has(%d) = %v", i, b.has(i))
				}
			}
			if got := slices.Collect(scratch.members()); len(got) != 0 {
				t.Errorf("the scratch set still holds %v after take", got)
			}
		})
	}
}

func TestBitsetUnion(t *testing.T) {
	const n = 1000
	of := func(members ...int) bitset {
		s := newBitset(n)
		for _, m := range members {
			s.set(m)
		}
		return s.take()
	}
	for _, tc := range []struct {
		name string
		sets []bitset
		want []int
	}{
		{"none", nil, nil},
		{"empty ones", []bitset{of(), of()}, nil},
		{"apart", []bitset{of(900, 901), of(5)}, []int{5, 900, 901}},
		{"overlapping", []bitset{of(64, 130), of(130, 200), of()}, []int{64, 130, 200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := union(tc.sets)
			if got := slices.Collect(u.members()); !slices.Equal(got, tc.want) {
				t.Errorf("members %v, want %v", got, tc.want)
			}
			for _, m := range tc.want {
				if !u.has(m) {
					t.Errorf("has(%d) = false", m)
				}
			}
		})
	}
}
