package proxy

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/netpol/netpol/internal/slots"
	"github.com/netpol/netpol/pkg/nft"
)

// tableBuilder assembles the NAT table from ServicePort fragments and keeps
// the shared sets between syncs: a changed Service changes the elements it
// contributes, and each set then carries its new revision and the changes
// from the previous one, so the Applier sends them without comparing every
// element (the cost of a sync follows the change, not the table).
type tableBuilder struct {
	name  string
	sets  map[string]*setState
	frags map[*fragment]bool
}

// lastRevision numbers set contents process-wide, so that two builders
// (a Syncer that started over) never hand out the same revision for
// different contents to one Applier.
var lastRevision atomic.Uint64

// setState is one shared set's elements, reference-counted (several ports
// may contribute the same element: a ClusterIP, a hairpin pair).
type setState struct {
	spec  *nft.Set // name and type only
	elems elemStore
	// table finds an element's position by identity (key and key end):
	// 4 bytes a slot, where a map from element ID to position took about
	// 40 bytes an element, and as much again in garbage as it grew
	// through a first sync.
	table slots.Table
	// shared counts, by element ID, the contributions of an element
	// beyond its first (most elements have one).
	shared   map[string]int32
	revision uint64 // 0 until the set first has elements
	// before holds, by element ID, each element touched since the last
	// table and what the set held then. A set without a revision keeps
	// none: it has no earlier revision to change from (changed says
	// whether it was touched).
	before  map[string]touched
	changed bool
}

// touched is an element's identity and the element the set held before
// it changed (nil: none).
type touched struct {
	identity nft.Element
	was      *nft.Element
}

func newTableBuilder(opts CompileOptions) *tableBuilder {
	if opts.Table == "" {
		opts.Table = DefaultTable
	}
	tb := &tableBuilder{name: opts.Table, sets: map[string]*setState{}, frags: map[*fragment]bool{}}
	for _, f := range nft.Families {
		for _, base := range []string{setClusterIPs, setFrontends, setNoEndpoints, setNoLocal, setFirewall, setFirewallAllow,
			setHairpin, setMasqExternal, setLocalExternal, setBackends, setClusterBackend, setAffinity, setClusterAff} {
			tb.state(base + "." + f.Suffix)
		}
	}
	return tb
}

func (tb *tableBuilder) state(name string) *setState {
	s := tb.sets[name]
	if s == nil {
		s = &setState{spec: setSpec(name)}
		tb.sets[name] = s
	}
	return s
}

// setSpec is the type of the shared set with this name.
func setSpec(name string) *nft.Set {
	base, suffix, _ := strings.Cut(name, ".")
	f := nft.IPv4
	if suffix == nft.IPv6.Suffix {
		f = nft.IPv6
	}
	frontend := []nft.FieldType{f.Field, nft.FieldProto, nft.FieldPort}
	s := &nft.Set{Name: name, Fields: frontend}
	switch base {
	case setClusterIPs:
		s.Fields = []nft.FieldType{f.Field}
	case setClusterCIDRs:
		s.Fields, s.Interval = []nft.FieldType{f.Field}, true
	case setFirewallAllow:
		s.Fields, s.Interval = append(frontend, f.Field), true
	case setHairpin:
		s.Fields = []nft.FieldType{f.Field, f.Field}
	case setBackends, setClusterBackend:
		s.Fields = append(frontend, nft.FieldInteger)
		s.Data = []nft.FieldType{f.Field, nft.FieldPort}
		s.Typeof = fmt.Sprintf("%s daddr . meta l4proto . th dport . numgen random mod 1 : %s daddr . th dport", f.Name, f.Name)
	case setAffinity, setClusterAff:
		s.Verdict = true
	}
	return s
}

// elementID identifies an element in its set: its key, and its key's end
// for an interval. Without an end it is the key's own bytes, not a copy
// of every key: element bytes are never written once made (the Applier
// shares them too).
func elementID(e nft.Element) string {
	if len(e.KeyEnd) == 0 {
		return unsafe.String(unsafe.SliceData(e.Key), len(e.Key))
	}
	return string(e.Key) + "|" + string(e.KeyEnd)
}

// change removes the contributions of old fragments and adds those of new
// ones (removals first, so a replaced port's elements are not counted twice).
func (tb *tableBuilder) change(removed, added []*fragment) {
	for _, fr := range removed {
		delete(tb.frags, fr)
		for _, c := range fr.elems {
			tb.state(c.set).remove(c.elem)
		}
	}
	for _, fr := range added {
		tb.frags[fr] = true
		for _, c := range fr.elems {
			tb.state(c.set).add(c.elem)
		}
	}
}

// elementHash hashes an element's identity (key and key end).
func elementHash(e nft.Element) uint64 {
	h := maphash.Bytes(hashSeed, e.Key)
	if len(e.KeyEnd) > 0 {
		h = h*31 + maphash.Bytes(hashSeed, e.KeyEnd)
	}
	return h
}

var hashSeed = maphash.MakeSeed()

func sameIdentity(a, b nft.Element) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.KeyEnd, b.KeyEnd)
}

// find returns the slot of e's identity, whose hash is h: the one holding
// its position when ok.
func (s *setState) find(e nft.Element, h uint64) (slot int, ok bool) {
	return s.table.Lookup(h, func(i int32) bool { return sameIdentity(*s.elems.at(int(i)), e) })
}

func (s *setState) hashAt(i int32) uint64 { return elementHash(*s.elems.at(int(i))) }

// touch notes that e's identity changes; at is its position, -1 when the
// set lacks it.
func (s *setState) touch(e nft.Element, at int32) {
	s.changed = true
	if s.revision == 0 {
		return
	}
	if s.before == nil {
		s.before = map[string]touched{}
	}
	id := elementID(e)
	if _, seen := s.before[id]; seen {
		return
	}
	t := touched{identity: nft.Element{Key: e.Key, KeyEnd: e.KeyEnd}}
	if at >= 0 {
		was := *s.elems.at(int(at))
		t.was = &was
	}
	s.before[id] = t
}

func (s *setState) add(e nft.Element) {
	h := elementHash(e)
	if _, ok := s.find(e, h); ok {
		if s.shared == nil {
			s.shared = map[string]int32{}
		}
		s.shared[elementID(e)]++
		return
	}
	s.touch(e, -1)
	s.table.Add(h, int32(s.elems.len()), s.hashAt)
	s.elems.push(e)
}

func (s *setState) remove(e nft.Element) {
	slot, ok := s.find(e, elementHash(e))
	if !ok {
		return
	}
	if len(s.shared) > 0 {
		if id := elementID(e); s.shared[id] > 0 {
			if s.shared[id]--; s.shared[id] == 0 {
				delete(s.shared, id)
			}
			return
		}
	}
	pos := s.table.At(slot)
	s.touch(e, pos)
	last := int32(s.elems.len() - 1)
	s.table.Remove(slot, last, s.hashAt)
	*s.elems.at(int(pos)) = *s.elems.at(int(last)) // the last element moves to pos
	s.elems.pop()
}

// finish closes a round of changes: the set's new revision and what
// changed since the previous one (nil when nothing did, or when the set
// had no revision yet).
func (s *setState) finish(next func() uint64) *nft.SetChanges {
	if !s.changed {
		return nil
	}
	s.changed = false
	if s.revision == 0 {
		if s.elems.len() > 0 {
			s.revision = next()
		}
		return nil
	}
	ch := &nft.SetChanges{From: s.revision}
	for _, t := range s.before {
		was := t.was
		var now *nft.Element
		if slot, ok := s.find(t.identity, elementHash(t.identity)); ok {
			now = s.elems.at(int(s.table.At(slot)))
		}
		switch {
		case was == nil && now != nil:
			ch.Add = append(ch.Add, *now)
		case was != nil && now == nil:
			ch.Delete = append(ch.Delete, *was)
		case was != nil && now != nil && !sameElement(*was, *now):
			ch.Delete = append(ch.Delete, *was)
			ch.Add = append(ch.Add, *now)
		}
	}
	s.before = nil
	if len(ch.Add) == 0 && len(ch.Delete) == 0 {
		return nil
	}
	s.revision = next()
	return ch
}

func sameElement(a, b nft.Element) bool {
	return bytes.Equal(a.Data, b.Data) && (a.Verdict == nil) == (b.Verdict == nil) &&
		(a.Verdict == nil || *a.Verdict == *b.Verdict)
}

// table closes the round and returns the table: shared sets (count sets
// only while they have elements), the fragments' own chains and sets, and
// the fixed chains. The shared sets' Elements are the builder's own: the
// table is valid until the next change (copying 100k-element lists on
// every sync would cost more than the sync).
func (tb *tableBuilder) table(clusterCIDRs, serviceCIDRs []netip.Prefix) *nft.Table {
	t := nft.NewTable(tb.name)
	next := func() uint64 { return lastRevision.Add(1) }
	for name, s := range tb.sets {
		changes := s.finish(next)
		if s.elems.len() == 0 && isCountSet(name) {
			continue
		}
		set := *s.spec
		set.Elements, set.Revision, set.Changes = s.elems.list(), s.revision, changes
		t.AddSet(&set)
	}
	for _, f := range nft.Families {
		for _, s := range []struct {
			name     string
			prefixes []netip.Prefix
		}{{setClusterCIDRs, clusterCIDRs}, {setServiceCIDRs, serviceCIDRs}} {
			cidrs := &nft.Set{Name: s.name + "." + f.Suffix, Fields: []nft.FieldType{f.Field}, Interval: true}
			for _, p := range s.prefixes {
				if nft.FamilyOf(p.Addr()) == f {
					cidrs.Elements = append(cidrs.Elements,
						nft.Element{Key: f.AddrBytes(p.Masked().Addr()), KeyEnd: f.AddrBytes(nft.LastAddr(p))})
				}
			}
			t.AddSet(cidrs)
		}
	}
	for fr := range tb.frags {
		for _, c := range fr.chains {
			t.AddChain(c)
		}
		for _, s := range fr.sets {
			t.AddSet(s)
		}
	}
	for _, f := range nft.Families {
		familyChains(t, f)
	}
	baseChains(t)
	return t
}

// isCountSet reports whether name is an n<N> or cluster-n<N> set.
func isCountSet(name string) bool {
	_, ok := countOf(name)
	return ok
}

// countOf is N of an n<N>.F or cluster-n<N>.F set name.
func countOf(name string) (int, bool) {
	base, _, _ := strings.Cut(name, ".")
	for _, prefix := range []string{prefixClusterCnt, prefixCount} {
		if rest, ok := strings.CutPrefix(base, prefix); ok {
			n, err := strconv.Atoi(rest)
			return n, err == nil && n > 0
		}
	}
	return 0, false
}
