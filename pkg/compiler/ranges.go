package compiler

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/netpol/netpol/pkg/nft"
)

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ lo, hi netip.Addr }

func singleAddr(a netip.Addr) addrRange { return addrRange{a, a} }

func prefixRange(p netip.Prefix) addrRange {
	return addrRange{p.Masked().Addr(), nft.LastAddr(p)}
}

// fullRange is every address of a family.
func fullRange(f *nft.Family) addrRange {
	if f == nft.IPv4 {
		return prefixRange(netip.MustParsePrefix("0.0.0.0/0"))
	}
	return prefixRange(netip.MustParsePrefix("::/0"))
}

func inFamily(a netip.Addr, f *nft.Family) bool { return nft.FamilyOf(a) == f }

// blockRanges is an ipBlock's CIDRs minus its excepts, in family f.
func blockRanges(cidrs, except []netip.Prefix, f *nft.Family) []addrRange {
	var out []addrRange
	for _, c := range cidrs {
		if inFamily(c.Addr(), f) {
			out = append(out, prefixRange(c))
		}
	}
	for _, e := range except {
		if inFamily(e.Addr(), f) {
			out = subtract(out, prefixRange(e))
		}
	}
	return out
}

// subtract removes ex from every range.
func subtract(rs []addrRange, ex addrRange) []addrRange {
	var out []addrRange
	for _, r := range rs {
		if ex.hi.Less(r.lo) || r.hi.Less(ex.lo) {
			out = append(out, r)
			continue
		}
		if r.lo.Less(ex.lo) {
			out = append(out, addrRange{r.lo, ex.lo.Prev()})
		}
		if ex.hi.Less(r.hi) {
			out = append(out, addrRange{ex.hi.Next(), r.hi})
		}
	}
	return out
}

// union sorts ranges and merges overlapping and adjacent ones.
func union(rs []addrRange) []addrRange {
	if len(rs) == 0 {
		return nil
	}
	rs = append([]addrRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo.Less(rs[j].lo) })
	out := []addrRange{rs[0]}
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		// Merge when r starts at or before the address after last.
		if next := last.hi.Next(); !next.IsValid() || !next.Less(r.lo) {
			if last.hi.Less(r.hi) {
				last.hi = r.hi
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func containsAddr(rs []addrRange, a netip.Addr) bool {
	for _, r := range rs {
		if !a.Less(r.lo) && !r.hi.Less(a) {
			return true
		}
	}
	return false
}

// rangeElements turns ranges of family f into interval set elements.
func rangeElements(rs []addrRange, f *nft.Family) []nft.Element {
	rs = union(rs)
	out := make([]nft.Element, 0, len(rs))
	for _, r := range rs {
		out = append(out, intervalElement(f.AddrBytes(r.lo), f.AddrBytes(r.hi)))
	}
	return out
}

// intervalElement is the canonical interval element: KeyEnd only for a
// real range.
func intervalElement(lo, hi []byte) nft.Element {
	if string(lo) == string(hi) {
		return nft.Element{Key: lo}
	}
	return nft.Element{Key: lo, KeyEnd: hi}
}

// portBox is protocols x destination ports.
type portBox struct {
	protoLo, protoHi uint8
	portLo, portHi   uint16
}

var allProtocolsAndPorts = portBox{0, 255, 0, 65535}

// canonicalPorts returns disjoint, sorted boxes covering the same
// connections as boxes.
func canonicalPorts(boxes []portBox) []portBox {
	byProto := map[uint8][]portBox{}
	for _, b := range boxes {
		if b == allProtocolsAndPorts {
			return []portBox{allProtocolsAndPorts}
		}
		for p := int(b.protoLo); p <= int(b.protoHi); p++ {
			byProto[uint8(p)] = append(byProto[uint8(p)], portBox{uint8(p), uint8(p), b.portLo, b.portHi})
		}
	}
	var out []portBox
	for _, bs := range byProto {
		sort.Slice(bs, func(i, j int) bool { return bs[i].portLo < bs[j].portLo })
		cur := bs[0]
		for _, b := range bs[1:] {
			if int(b.portLo) <= int(cur.portHi)+1 {
				if b.portHi > cur.portHi {
					cur.portHi = b.portHi
				}
				continue
			}
			out = append(out, cur)
			cur = b
		}
		out = append(out, cur)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].protoLo != out[j].protoLo {
			return out[i].protoLo < out[j].protoLo
		}
		return out[i].portLo < out[j].portLo
	})
	return out
}

func portElements(boxes []portBox) []nft.Element {
	var out []nft.Element
	for _, b := range canonicalPorts(boxes) {
		out = append(out, intervalElement(
			nft.Key(nft.ProtoBytes(b.protoLo), nft.PortBytes(b.portLo)),
			nft.Key(nft.ProtoBytes(b.protoHi), nft.PortBytes(b.portHi))))
	}
	return out
}

// allowItem allows connections to or from addrs (networks: ipBlocks,
// node addresses, "every peer", or identity ranges) on ports.
type allowItem struct {
	addrs []addrRange
	ports []portBox
}

// piece is a range of addresses with the ports allowed to or from it.
type piece struct {
	lo, hi netip.Addr
	ports  []portBox // canonical
}

// flatten turns overlapping allow items into disjoint pieces: the address
// line is cut at every range boundary, each piece gets the union of the
// ports of the items covering it, and neighbouring pieces with the same
// ports are merged.
func flatten(items []allowItem, f *nft.Family) []piece {
	type event struct {
		at    netip.Addr // invalid: past the top address
		item  int
		delta int
	}
	items = mergeByPorts(items)
	var events []event
	for i, it := range items {
		for _, r := range it.addrs {
			events = append(events, event{r.lo, i, +1}, event{r.hi.Next(), i, -1})
		}
	}
	less := func(a, b netip.Addr) bool {
		if !a.IsValid() || !b.IsValid() {
			return a.IsValid() && !b.IsValid()
		}
		return a.Less(b)
	}
	sort.Slice(events, func(i, j int) bool { return less(events[i].at, events[j].at) })
	active := make([]int, len(items))
	cache := map[string][]portBox{}
	var pieces []piece
	var keys []string
	for i := 0; i < len(events); {
		at := events[i].at
		if !at.IsValid() {
			break
		}
		for i < len(events) && events[i].at == at {
			active[events[i].item] += events[i].delta
			i++
		}
		var members []string
		var boxes []portBox
		for it, n := range active {
			if n > 0 {
				members = append(members, strconv.Itoa(it))
				boxes = append(boxes, items[it].ports...)
			}
		}
		if len(members) == 0 {
			continue
		}
		key := strings.Join(members, ",")
		if _, ok := cache[key]; !ok {
			cache[key] = canonicalPorts(boxes)
		}
		hi := fullRange(f).hi
		if i < len(events) && events[i].at.IsValid() {
			hi = events[i].at.Prev()
		}
		if n := len(pieces); n > 0 && keys[n-1] == key && pieces[n-1].hi.Next() == at {
			pieces[n-1].hi = hi
			continue
		}
		pieces = append(pieces, piece{at, hi, cache[key]})
		keys = append(keys, key)
	}
	return pieces
}

// mergeByPorts merges items with the same ports into one, so the sweep in
// flatten runs over a handful of items (one per distinct port set) however
// many ranges contribute.
func mergeByPorts(items []allowItem) []allowItem {
	index := map[string]int{}
	var out []allowItem
	for _, it := range items {
		ports := canonicalPorts(it.ports)
		key := fmt.Sprint(ports)
		i, ok := index[key]
		if !ok {
			i = len(out)
			index[key] = i
			out = append(out, allowItem{ports: ports})
		}
		out[i].addrs = append(out[i].addrs, it.addrs...)
	}
	for i := range out {
		out[i].addrs = union(out[i].addrs)
	}
	return out
}
