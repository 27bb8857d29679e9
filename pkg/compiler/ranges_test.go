package compiler

import (
	"math/rand"
	"net/netip"
	"slices"
	"testing"

	"github.com/netpol/netpol/pkg/nft"
)

func TestBlockRanges(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		name          string
		cidrs, except []netip.Prefix
		f             *nft.Family
		want          []string
	}{
		{"plain", []netip.Prefix{p("10.0.0.0/24")}, nil, nft.IPv4, []string{"10.0.0.0-10.0.0.255"}},
		{"except in the middle", []netip.Prefix{p("10.0.0.0/24")}, []netip.Prefix{p("10.0.0.64/26")}, nft.IPv4,
			[]string{"10.0.0.0-10.0.0.63", "10.0.0.128-10.0.0.255"}},
		{"except at the start", []netip.Prefix{p("10.0.0.0/24")}, []netip.Prefix{p("10.0.0.0/25")}, nft.IPv4,
			[]string{"10.0.0.128-10.0.0.255"}},
		{"except everything", []netip.Prefix{p("10.0.0.0/24")}, []netip.Prefix{p("10.0.0.0/16")}, nft.IPv4, nil},
		{"other family left out", []netip.Prefix{p("10.0.0.0/24"), p("fd00::/64")}, nil, nft.IPv6,
			[]string{"fd00::-fd00::ffff:ffff:ffff:ffff"}},
		{"top of the space", []netip.Prefix{p("::/0")}, []netip.Prefix{p("::/1")}, nft.IPv6,
			[]string{"8000::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := union(blockRanges(tt.cidrs, tt.except, tt.f))
			var s []string
			for _, r := range got {
				s = append(s, r.lo.String()+"-"+r.hi.String())
			}
			if len(s) != len(tt.want) {
				t.Fatalf("got %v, want %v", s, tt.want)
			}
			for i := range s {
				if s[i] != tt.want[i] {
					t.Fatalf("got %v, want %v", s, tt.want)
				}
			}
		})
	}
}

func TestUnionMergesAdjacentAndOverlapping(t *testing.T) {
	a := netip.MustParseAddr
	got := union([]addrRange{{a("10.0.0.5"), a("10.0.0.9")}, {a("10.0.0.1"), a("10.0.0.4")}, {a("10.0.0.8"), a("10.0.0.12")}, {a("10.0.0.20"), a("10.0.0.20")},
		{a("255.255.255.0"), a("255.255.255.255")}, {a("255.255.255.255"), a("255.255.255.255")}})
	want := []addrRange{{a("10.0.0.1"), a("10.0.0.12")}, {a("10.0.0.20"), a("10.0.0.20")}, {a("255.255.255.0"), a("255.255.255.255")}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// TestFlattenEquivalent checks on random allow-lists that the disjoint
// network pieces allow exactly what the overlapping items allow.
func TestFlattenEquivalent(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	addr := func(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(n)}) }
	protos := []uint8{6, 17, 132}
	for round := 0; round < 300; round++ {
		var items []allowItem
		for i := rng.Intn(6) + 1; i > 0; i-- {
			var it allowItem
			for j := rng.Intn(3) + 1; j > 0; j-- {
				lo := rng.Intn(60)
				if rng.Intn(2) == 0 {
					it.addrs = append(it.addrs, singleAddr(addr(lo)))
					continue
				}
				it.addrs = append(it.addrs, addrRange{addr(lo), addr(lo + rng.Intn(8))})
			}
			if rng.Intn(8) == 0 {
				it.ports = []portBox{allProtocolsAndPorts}
			} else {
				for j := rng.Intn(2) + 1; j > 0; j-- {
					p := protos[rng.Intn(3)]
					lo := uint16(rng.Intn(20))
					it.ports = append(it.ports, portBox{p, p, lo, lo + uint16(rng.Intn(5))})
				}
			}
			items = append(items, it)
		}
		pieces := flatten(items, nft.IPv4)
		for i := 1; i < len(pieces); i++ {
			if !pieces[i-1].hi.Less(pieces[i].lo) {
				t.Fatalf("round %d: network pieces %d and %d overlap or are out of order", round, i-1, i)
			}
		}
		for probe := 0; probe < 300; probe++ {
			a := addr(rng.Intn(70))
			proto := []uint8{6, 17, 132, 1}[rng.Intn(4)]
			port := uint16(rng.Intn(30))
			in := func(boxes []portBox) bool {
				for _, b := range boxes {
					if proto >= b.protoLo && proto <= b.protoHi && port >= b.portLo && port <= b.portHi {
						return true
					}
				}
				return false
			}
			want := false
			for _, it := range items {
				want = want || (containsAddr(it.addrs, a) && in(it.ports))
			}
			got := false
			if i := slices.IndexFunc(pieces, func(p piece) bool { return !a.Less(p.lo) && !p.hi.Less(a) }); i >= 0 {
				got = in(pieces[i].ports)
			}
			if got != want {
				t.Fatalf("round %d: %s proto %d port %d: allow-list says %v, items say %v", round, a, proto, port, got, want)
			}
		}
	}
}
