package nft

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
)

// setIndex holds a set's elements (canonical, distinct) and finds them by
// identity (key, key end, verdict, data). The Applier's cache keeps one
// per set and updates it with each applied plan, so that a diff costs one
// map lookup per desired element and no allocation for unchanged ones.
//
// The elements are kept as their identities, packed back to back in one
// byte arena (appendElementID: a few bytes of lengths, then the bytes):
// an address element takes 7 bytes there and 4 in at, where an Element
// value took 80 plus its key (at 100,000 pods the cache's Elements were
// the agent's largest single holding). Element values are made from the
// arena on demand and share its bytes, which are never written once
// made: a removal only forgets a record, and compact copies the live
// ones to a new arena.
//
// Positions are found through slots, an open-addressing table (linear
// probing) of positions, keyed by a hash of the identity and checked
// against the record a slot points at: 4 bytes a slot at most 3/4 full,
// where a map from hash to position took about 35 bytes an element (16
// of the agent's 23 MB of indexes at 100,000 pods).
type setIndex struct {
	ids  []byte   // the arena: records, each uvarint(length) then the identity
	at   []uint32 // at[i]: where element i's record starts in ids
	dead int      // bytes of ids that no element's record uses any more
	// slots holds element positions plus one (0: empty); its length is
	// a power of two, or 0 before the first insert.
	slots []int32
}

var indexSeed = maphash.MakeSeed()

// elementHash hashes an element identity (a variable for the collision
// test).
var elementHash = func(id []byte) uint64 { return maphash.Bytes(indexSeed, id) }

// newSetIndex indexes the set's elements in canonical form.
func newSetIndex(s *Set) *setIndex {
	idx := &setIndex{at: make([]uint32, 0, len(s.Elements)), slots: make([]int32, slotsFor(len(s.Elements)))}
	buf := make([]byte, 0, 256)
	// The arena made once at its size: grown by appends, a first sync's
	// arenas left as much again in garbage, at the sync's peak.
	size := 0
	var length [binary.MaxVarintLen64]byte
	for _, e := range s.Elements {
		buf = appendElementID(buf[:0], normalElement(s, e))
		size += binary.PutUvarint(length[:], uint64(len(buf))) + len(buf)
	}
	idx.ids = make([]byte, 0, size)
	for _, e := range s.Elements {
		buf = idx.insert(normalElement(s, e), buf)
	}
	return idx
}

// slotsFor is the table length for n elements: a power of two, at most
// 3/4 full.
func slotsFor(n int) int {
	size := 8
	for size*3 < n*4 {
		size *= 2
	}
	return size
}

// indexOf returns the set's persistent index (cache sets) or a temporary one.
func indexOf(s *Set) *setIndex {
	if s.index != nil {
		return s.index
	}
	return newSetIndex(s)
}

// len is the number of elements.
func (idx *setIndex) len() int { return len(idx.at) }

// record is element i's record in the arena: its identity's length,
// then the identity.
func (idx *setIndex) record(i int32) []byte {
	rec := idx.ids[idx.at[i]:]
	n, w := binary.Uvarint(rec)
	return rec[: w+int(n) : w+int(n)]
}

// identity is element i's identity (in the arena).
func (idx *setIndex) identity(i int32) []byte {
	rec := idx.record(i)
	_, w := binary.Uvarint(rec)
	return rec[w:]
}

// element is element i, sharing the arena's bytes.
func (idx *setIndex) element(i int32) Element { return decodeElementID(idx.identity(i)) }

// elements are all the elements, in index order.
func (idx *setIndex) elements() []Element {
	out := make([]Element, idx.len())
	for i := range out {
		out[i] = idx.element(int32(i))
	}
	return out
}

// home is the slot where a probe for identity id starts.
func (idx *setIndex) home(id []byte) int {
	return int(elementHash(id) & uint64(len(idx.slots)-1))
}

// lookup finds the slot of identity id: the one holding its position
// when ok, else the empty slot where it would go.
func (idx *setIndex) lookup(id []byte) (slot int, ok bool) {
	if len(idx.slots) == 0 {
		return -1, false
	}
	mask := len(idx.slots) - 1
	for slot = idx.home(id); ; slot = (slot + 1) & mask {
		p := idx.slots[slot]
		if p == 0 {
			return slot, false
		}
		if bytes.Equal(idx.identity(p-1), id) {
			return slot, true
		}
	}
}

// find returns the position of e (canonical); buf is scratch space.
func (idx *setIndex) find(e Element, buf []byte) (int32, bool) {
	slot, ok := idx.lookup(appendElementID(buf[:0], e))
	if !ok {
		return -1, false
	}
	return idx.slots[slot] - 1, true
}

// has reports whether e (canonical) is in the index.
func (idx *setIndex) has(e Element, buf []byte) bool {
	_, ok := idx.find(e, buf)
	return ok
}

// insert appends e (canonical) unless present; it returns buf for reuse.
func (idx *setIndex) insert(e Element, buf []byte) []byte {
	id := appendElementID(buf[:0], e)
	slot, ok := idx.lookup(id)
	if ok {
		return id
	}
	if (len(idx.at)+1)*4 > len(idx.slots)*3 {
		idx.grow()
		slot, _ = idx.lookup(id) // the empty slot in the new table
	}
	n := int32(len(idx.at))
	idx.at = append(idx.at, uint32(len(idx.ids)))
	idx.ids = binary.AppendUvarint(idx.ids, uint64(len(id)))
	idx.ids = append(idx.ids, id...)
	idx.slots[slot] = n + 1
	return id
}

// grow doubles the table and places every element again.
func (idx *setIndex) grow() {
	idx.slots = make([]int32, max(8, 2*len(idx.slots)))
	mask := len(idx.slots) - 1
	for i := range int32(len(idx.at)) {
		slot := idx.home(idx.identity(i))
		for idx.slots[slot] != 0 {
			slot = (slot + 1) & mask
		}
		idx.slots[slot] = i + 1
	}
}

// remove drops an element (its position goes to the last one); it
// returns buf for reuse.
func (idx *setIndex) remove(e Element, buf []byte) []byte {
	id := appendElementID(buf[:0], e)
	slot, ok := idx.lookup(id)
	if !ok {
		return id
	}
	i := idx.slots[slot] - 1
	idx.emptySlot(slot)
	idx.dead += len(idx.record(i))
	last := int32(len(idx.at) - 1)
	if i != last {
		// The last element moves to i: its slot points there.
		moved, _ := idx.lookup(idx.identity(last))
		idx.slots[moved] = i + 1
		idx.at[i] = idx.at[last]
	}
	idx.at = idx.at[:last]
	if idx.dead > 4096 && idx.dead > len(idx.ids)/2 {
		idx.compact()
	}
	return id
}

// emptySlot empties a slot and moves back the entries after it that a
// probe would no longer reach (backward-shift deletion: the table keeps
// no tombstones).
func (idx *setIndex) emptySlot(hole int) {
	mask := len(idx.slots) - 1
	for j := (hole + 1) & mask; idx.slots[j] != 0; j = (j + 1) & mask {
		home := idx.home(idx.identity(idx.slots[j] - 1))
		// The entry at j stays unless its home is outside (hole, j],
		// cyclically: a probe from there would stop at the hole.
		if (j-home)&mask >= (j-hole)&mask {
			idx.slots[hole] = idx.slots[j]
			hole = j
		}
	}
	idx.slots[hole] = 0
}

// compact copies the live records to a new arena (the old one stays as
// it is for the Elements made from it); positions do not change.
func (idx *setIndex) compact() {
	ids := make([]byte, 0, len(idx.ids)-idx.dead)
	for i := range idx.at {
		rec := idx.record(int32(i))
		idx.at[i] = uint32(len(ids))
		ids = append(ids, rec...)
	}
	idx.ids, idx.dead = ids, 0
}

// Identity flags: which optional parts follow the key.
const (
	idKeyEnd = 1 << iota
	idVerdict
	idData
)

// appendElementID appends the element's identity, which
// decodeElementID reads back: a flags byte, the key (length, bytes),
// then the parts the flags name (key end; verdict kind and chain; data),
// each with its length.
func appendElementID(b []byte, e Element) []byte {
	var flags byte
	if e.KeyEnd != nil {
		flags |= idKeyEnd
	}
	if e.Verdict != nil {
		flags |= idVerdict
	}
	if e.Data != nil {
		flags |= idData
	}
	b = append(b, flags)
	b = appendPart(b, e.Key)
	if e.KeyEnd != nil {
		b = appendPart(b, e.KeyEnd)
	}
	if v := e.Verdict; v != nil {
		b = append(b, byte(v.Kind))
		b = appendPart(b, v.Chain)
	}
	if e.Data != nil {
		b = appendPart(b, e.Data)
	}
	return b
}

func appendPart[T []byte | string](b []byte, part T) []byte {
	b = binary.AppendUvarint(b, uint64(len(part)))
	return append(b, part...)
}

// decodeElementID is the element whose identity id is (appendElementID);
// its byte slices share id's bytes.
func decodeElementID(id []byte) Element {
	flags := id[0]
	id = id[1:]
	part := func() []byte {
		n, w := binary.Uvarint(id)
		p := id[w : w+int(n) : w+int(n)]
		id = id[w+int(n):]
		return p
	}
	e := Element{Key: part()}
	if flags&idKeyEnd != 0 {
		e.KeyEnd = part()
	}
	if flags&idVerdict != 0 {
		kind := VerdictKind(id[0])
		id = id[1:]
		e.Verdict = &Verdict{Kind: kind, Chain: string(part())}
	}
	if flags&idData != 0 {
		e.Data = part()
	}
	return e
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
