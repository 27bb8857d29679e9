package compiler

import (
	"net/netip"
	"slices"
	"testing"
)

// TestAddrIndex: the pods holding an address come back in the order they
// came, whichever of them goes, and an address no pod holds leaves
// nothing behind.
func TestAddrIndex(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	p := []*PodState{{Key: "x/0"}, {Key: "x/1"}, {Key: "x/2"}}
	keys := func(x addrIndex, at netip.Addr) []string {
		var out []string
		for _, q := range x.at(at, nil) {
			out = append(out, q.Key)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		add     []int // pods holding a, in order
		remove  []int
		want    []string
		restSet bool // whether a still has pods after the first
	}{
		{"one", []int{0}, nil, []string{"x/0"}, false},
		{"three in order", []int{0, 1, 2}, nil, []string{"x/0", "x/1", "x/2"}, true},
		{"the first goes", []int{0, 1, 2}, []int{0}, []string{"x/1", "x/2"}, true},
		{"the middle goes", []int{0, 1, 2}, []int{1}, []string{"x/0", "x/2"}, true},
		{"the last goes", []int{0, 1}, []int{1}, []string{"x/0"}, false},
		{"the first of two goes", []int{0, 1}, []int{0}, []string{"x/1"}, false},
		{"all go", []int{0, 1, 2}, []int{1, 0, 2}, nil, false},
		{"one not there", []int{0}, []int{2}, []string{"x/0"}, false},
	} {
		x := newAddrIndex(0)
		x.add(b, p[2]) // another address, untouched
		for _, i := range tc.add {
			x.add(a, p[i])
		}
		for _, i := range tc.remove {
			x.remove(a, p[i])
		}
		if got := keys(x, a); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if _, ok := x.rest[a]; ok != tc.restSet {
			t.Errorf("%s: a list of further pods: %v, want %v", tc.name, ok, tc.restSet)
		}
		if _, ok := x.first[a]; ok != (len(tc.want) > 0) {
			t.Errorf("%s: an entry for the address: %v with %d pods", tc.name, ok, len(tc.want))
		}
		if got := keys(x, b); !slices.Equal(got, []string{"x/2"}) {
			t.Errorf("%s: the other address: %v", tc.name, got)
		}
	}
}
