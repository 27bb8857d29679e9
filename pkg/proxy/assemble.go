package proxy

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"

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
	spec     *nft.Set // name and type only
	elems    elemStore
	slots    map[string]slot // element ID -> where it is, how many contribute it
	revision uint64          // 0 until the set first has elements
	// before holds, for each element touched since the last table, what
	// the set held then (nil: absent). A set without a revision keeps
	// none: it has no earlier revision to change from (changed says
	// whether it was touched).
	before  map[string]*nft.Element
	changed bool
}

type slot struct{ pos, refs int32 }

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
		s = &setState{spec: setSpec(name), slots: map[string]slot{}}
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

func (s *setState) touch(id string) {
	s.changed = true
	if s.revision == 0 {
		return
	}
	if s.before == nil {
		s.before = map[string]*nft.Element{}
	}
	if _, seen := s.before[id]; seen {
		return
	}
	var was *nft.Element
	if sl, ok := s.slots[id]; ok {
		e := *s.elems.at(int(sl.pos))
		was = &e
	}
	s.before[id] = was
}

func (s *setState) add(e nft.Element) {
	id := elementID(e)
	if sl, ok := s.slots[id]; ok {
		sl.refs++
		s.slots[id] = sl
		return
	}
	s.touch(id)
	s.slots[id] = slot{pos: int32(s.elems.len()), refs: 1}
	s.elems.push(e)
}

func (s *setState) remove(e nft.Element) {
	id := elementID(e)
	sl, ok := s.slots[id]
	if !ok {
		return
	}
	if sl.refs--; sl.refs > 0 {
		s.slots[id] = sl
		return
	}
	s.touch(id)
	if last := int32(s.elems.len() - 1); sl.pos != last {
		moved := s.elems.at(int(sl.pos))
		*moved = *s.elems.at(int(last))
		movedID := elementID(*moved)
		m := s.slots[movedID]
		m.pos = sl.pos
		s.slots[movedID] = m
	}
	s.elems.pop()
	delete(s.slots, id)
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
	for id, was := range s.before {
		var now *nft.Element
		if sl, ok := s.slots[id]; ok {
			now = s.elems.at(int(sl.pos))
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
func (tb *tableBuilder) table(clusterCIDRs []netip.Prefix) *nft.Table {
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
		cidrs := &nft.Set{Name: setClusterCIDRs + "." + f.Suffix, Fields: []nft.FieldType{f.Field}, Interval: true}
		for _, p := range clusterCIDRs {
			if nft.FamilyOf(p.Addr()) == f {
				cidrs.Elements = append(cidrs.Elements,
					nft.Element{Key: f.AddrBytes(p.Masked().Addr()), KeyEnd: f.AddrBytes(nft.LastAddr(p))})
			}
		}
		t.AddSet(cidrs)
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
