package kernel

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"

	"github.com/netpol/netpol/internal/slots"
	"github.com/netpol/netpol/pkg/nft"
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
// Positions are found through an open-addressing table (internal/slots)
// keyed by a hash of the identity and checked against the record a slot
// points at: 4 bytes a slot at most 3/4 full, where a map from hash to
// position takes about 35 bytes an element.
type setIndex struct {
	ids  []byte   // the arena: records, each uvarint(length) then the identity
	at   []uint32 // at[i]: where element i's record starts in ids
	dead int      // bytes of ids that no element's record uses any more
	// table finds an identity's position (internal/slots).
	table slots.Table
}

var indexSeed = maphash.MakeSeed()

// elementHash hashes an element identity (a variable for the collision
// test).
var elementHash = func(id []byte) uint64 { return maphash.Bytes(indexSeed, id) }

// newSetIndex indexes the set's elements in canonical form.
func newSetIndex(s *nft.Set) *setIndex {
	idx := &setIndex{at: make([]uint32, 0, len(s.Elements)), table: slots.Sized(len(s.Elements))}
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
func (idx *setIndex) element(i int32) nft.Element { return decodeElementID(idx.identity(i)) }

// elements are all the elements, in index order.
func (idx *setIndex) elements() []nft.Element {
	out := make([]nft.Element, idx.len())
	for i := range out {
		out[i] = idx.element(int32(i))
	}
	return out
}

// hashAt is the hash of element i's identity.
func (idx *setIndex) hashAt(i int32) uint64 { return elementHash(idx.identity(i)) }

// lookup finds the slot of identity id, whose hash is h: the one holding
// its position when ok.
func (idx *setIndex) lookup(id []byte, h uint64) (slot int, ok bool) {
	return idx.table.Lookup(h, func(i int32) bool { return bytes.Equal(idx.identity(i), id) })
}

// find returns the position of e (canonical); buf is scratch space.
func (idx *setIndex) find(e nft.Element, buf []byte) (int32, bool) {
	id := appendElementID(buf[:0], e)
	slot, ok := idx.lookup(id, elementHash(id))
	if !ok {
		return -1, false
	}
	return idx.table.At(slot), true
}

// has reports whether e (canonical) is in the index.
func (idx *setIndex) has(e nft.Element, buf []byte) bool {
	_, ok := idx.find(e, buf)
	return ok
}

// insert appends e (canonical) unless present; it returns buf for reuse.
func (idx *setIndex) insert(e nft.Element, buf []byte) []byte {
	id := appendElementID(buf[:0], e)
	h := elementHash(id)
	if _, ok := idx.lookup(id, h); ok {
		return id
	}
	idx.table.Add(h, int32(len(idx.at)), idx.hashAt)
	idx.at = append(idx.at, uint32(len(idx.ids)))
	idx.ids = binary.AppendUvarint(idx.ids, uint64(len(id)))
	idx.ids = append(idx.ids, id...)
	return id
}

// remove drops an element (its position goes to the last one); it
// returns buf for reuse.
func (idx *setIndex) remove(e nft.Element, buf []byte) []byte {
	id := appendElementID(buf[:0], e)
	slot, ok := idx.lookup(id, elementHash(id))
	if !ok {
		return id
	}
	i := idx.table.At(slot)
	idx.dead += len(idx.record(i))
	last := int32(len(idx.at) - 1)
	idx.table.Remove(slot, last, idx.hashAt)
	idx.at[i] = idx.at[last] // the last element moves to i
	idx.at = idx.at[:last]
	if idx.dead > 4096 && idx.dead > len(idx.ids)/2 {
		idx.compact()
	}
	return id
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
func appendElementID(b []byte, e nft.Element) []byte {
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
func decodeElementID(id []byte) nft.Element {
	flags := id[0]
	id = id[1:]
	part := func() []byte {
		n, w := binary.Uvarint(id)
		p := id[w : w+int(n) : w+int(n)]
		id = id[w+int(n):]
		return p
	}
	e := nft.Element{Key: part()}
	if flags&idKeyEnd != 0 {
		e.KeyEnd = part()
	}
	if flags&idVerdict != 0 {
		kind := nft.VerdictKind(id[0])
		id = id[1:]
		e.Verdict = &nft.Verdict{Kind: kind, Chain: string(part())}
	}
	if flags&idData != 0 {
		e.Data = part()
	}
	return e
}

func copyElement(e nft.Element) nft.Element {
	c := nft.Element{Key: append([]byte(nil), e.Key...)}
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
