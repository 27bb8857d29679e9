package nft

import (
	"bytes"
	"hash/maphash"
)

// setIndex finds a set's elements by identity (key, key end, verdict,
// data). The Applier's cache keeps one per set and updates it with each
// applied plan, so that a diff costs one map lookup per desired element
// and no allocation for unchanged ones. Positions are found by a 64-bit
// hash of the identity, checked against the element there: the index
// holds no key strings (at 300,000 elements those were about a third of
// its memory). An identity whose hash another element already holds
// (a collision, about one in 2^64/n) goes to spill, by its bytes.
type setIndex struct {
	elems []Element // canonical, distinct
	pos   map[uint64]int32
	spill map[string]int32
}

var indexSeed = maphash.MakeSeed()

// elementHash hashes an element identity (a variable for the collision
// test).
var elementHash = func(id []byte) uint64 { return maphash.Bytes(indexSeed, id) }

// newSetIndex indexes the set's elements in canonical form. The index
// shares their bytes: element bytes are never written once made (the
// compiler, the proxy and the kernel read-back make new ones), so the
// Applier's cache owns only the Element values and the index, not a third
// copy of every key.
func newSetIndex(s *Set) *setIndex {
	idx := &setIndex{elems: make([]Element, 0, len(s.Elements)), pos: make(map[uint64]int32, len(s.Elements))}
	buf := make([]byte, 0, 256)
	for _, e := range s.Elements {
		buf = idx.insert(normalElement(s, e), buf)
	}
	return idx
}

// indexOf returns the set's persistent index (cache sets) or a temporary one.
func indexOf(s *Set) *setIndex {
	if s.index != nil {
		return s.index
	}
	return newSetIndex(s)
}

// locate looks e (canonical) up: id is its identity (written into buf),
// h its hash, i its position when ok, inPos whether pos (not spill) holds
// it.
func (idx *setIndex) locate(e Element, buf []byte) (id []byte, h uint64, i int32, inPos, ok bool) {
	id = appendElementID(buf[:0], e)
	h = elementHash(id)
	if i, ok := idx.pos[h]; ok && sameIdentity(idx.elems[i], e) {
		return id, h, i, true, true
	}
	i, ok = idx.spill[string(id)]
	return id, h, i, false, ok
}

// find returns the position of e (canonical); buf is scratch space.
func (idx *setIndex) find(e Element, buf []byte) (int32, bool) {
	_, _, i, _, ok := idx.locate(e, buf)
	return i, ok
}

// has reports whether e (canonical) is in the index.
func (idx *setIndex) has(e Element, buf []byte) bool {
	_, ok := idx.find(e, buf)
	return ok
}

// insert appends e (canonical) unless present; it returns buf for reuse.
func (idx *setIndex) insert(e Element, buf []byte) []byte {
	id, h, _, _, ok := idx.locate(e, buf)
	if ok {
		return id
	}
	n := int32(len(idx.elems))
	idx.elems = append(idx.elems, e)
	if _, taken := idx.pos[h]; !taken {
		idx.pos[h] = n
		return id
	}
	if idx.spill == nil {
		idx.spill = map[string]int32{}
	}
	idx.spill[string(id)] = n
	return id
}

// remove drops an element (swap with the last); it returns buf for reuse.
func (idx *setIndex) remove(e Element, buf []byte) []byte {
	id, h, i, inPos, ok := idx.locate(e, buf)
	if !ok {
		return id
	}
	if inPos {
		delete(idx.pos, h)
	} else {
		delete(idx.spill, string(id))
	}
	last := int32(len(idx.elems) - 1)
	if i != last {
		moved := idx.elems[last]
		idx.elems[i] = moved
		// The moved element's entry, in pos or in spill, points at last.
		id = appendElementID(id[:0], moved)
		if h := elementHash(id); idx.posIs(h, last) {
			idx.pos[h] = i
		} else {
			idx.spill[string(id)] = i
		}
	}
	idx.elems[last] = Element{}
	idx.elems = idx.elems[:last]
	return id
}

// posIs reports whether pos maps h to position i.
func (idx *setIndex) posIs(h uint64, i int32) bool {
	j, ok := idx.pos[h]
	return ok && j == i
}

// sameIdentity reports whether two canonical elements have one identity.
func sameIdentity(a, b Element) bool {
	if !bytes.Equal(a.Key, b.Key) || !bytes.Equal(a.KeyEnd, b.KeyEnd) || !bytes.Equal(a.Data, b.Data) ||
		(a.Data == nil) != (b.Data == nil) || (a.Verdict == nil) != (b.Verdict == nil) {
		return false
	}
	return a.Verdict == nil || (a.Verdict.Kind == b.Verdict.Kind && a.Verdict.Chain == b.Verdict.Chain)
}

// appendElementID appends the element's identity: key, key end, verdict.
// Keys of one set have one length, so the lengths keep the parts apart.
func appendElementID(b []byte, e Element) []byte {
	b = append(b, e.Key...)
	b = append(b, '|')
	b = append(b, e.KeyEnd...)
	if v := e.Verdict; v != nil {
		b = append(b, '|', byte(v.Kind))
		b = append(b, v.Chain...)
	}
	if e.Data != nil {
		b = append(b, '|')
		b = append(b, e.Data...)
	}
	return b
}

func copyElement(e Element) Element {
	c := Element{Key: append([]byte(nil), e.Key...)}
	if e.KeyEnd != nil {
		c.KeyEnd = append([]byte(nil), e.KeyEnd...)
	}
	if e.Verdict != nil {
		v := *e.Verdict
		c.Verdict = &v
	}
	if e.Data != nil {
		c.Data = append([]byte(nil), e.Data...)
	}
	return c
}
