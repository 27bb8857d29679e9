package proxy

import (
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"

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
	elems    []nft.Element
	pos      map[string]int // element ID -> index in elems
	refs     map[string]int
	revision uint64
	// before holds, for each element touched since the last table, what
	// the set held then (nil: absent).
	before map[string]*nft.Element
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
		s = &setState{spec: setSpec(name), pos: map[string]int{}, refs: map[string]int{}}
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

func elementID(e nft.Element) string {
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
	if s.before == nil {
		s.before = map[string]*nft.Element{}
	}
	if _, seen := s.before[id]; seen {
		return
	}
	var was *nft.Element
	if i, ok := s.pos[id]; ok {
		e := s.elems[i]
		was = &e
	}
	s.before[id] = was
}

func (s *setState) add(e nft.Element) {
	id := elementID(e)
	s.refs[id]++
	if s.refs[id] > 1 {
		return
	}
	s.touch(id)
	s.pos[id] = len(s.elems)
	s.elems = append(s.elems, e)
}

func (s *setState) remove(e nft.Element) {
	id := elementID(e)
	if s.refs[id] == 0 {
		return
	}
	s.refs[id]--
	if s.refs[id] > 0 {
		return
	}
	delete(s.refs, id)
	s.touch(id)
	i := s.pos[id]
	last := len(s.elems) - 1
	if i != last {
		s.elems[i] = s.elems[last]
		s.pos[elementID(s.elems[i])] = i
	}
	s.elems = s.elems[:last]
	delete(s.pos, id)
}

// finish closes a round of changes: the set's new revision and what
// changed since the previous one (nil when nothing did).
func (s *setState) finish(next func() uint64) *nft.SetChanges {
	if len(s.before) == 0 {
		return nil
	}
	ch := &nft.SetChanges{From: s.revision}
	for id, was := range s.before {
		var now *nft.Element
		if i, ok := s.pos[id]; ok {
			now = &s.elems[i]
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
	if ch.From == 0 {
		return nil // a new set: no revision to change from
	}
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
		if len(s.elems) == 0 && isCountSet(name) {
			continue
		}
		set := *s.spec
		set.Elements, set.Revision, set.Changes = s.elems, s.revision, changes
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
