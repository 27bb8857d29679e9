// Package slots finds entries of a list by their identity through an
// open-addressing table of positions: linear probing, at most 3/4 full,
// and backward-shift deletion (no tombstones). A slot is 4 bytes, where a
// Go map from an identity to a position takes about 30 bytes an entry
// besides its key; the list and the identities stay the caller's, which
// says how to hash an entry and whether one is the entry sought.
package slots

// Table holds list positions plus one (0: an empty slot). Its length is a
// power of two, or 0 before the first Add.
type Table struct {
	slots []int32
}

// lenFor is the table length for n entries: a power of two, at most 3/4
// full.
func lenFor(n int) int {
	size := 8
	for size*3 < n*4 {
		size *= 2
	}
	return size
}

// Sized is an empty table for n entries.
func Sized(n int) Table { return Table{slots: make([]int32, lenFor(n))} }

// fits reports whether n entries fit without growing.
func (t *Table) fits(n int) bool { return n*4 <= len(t.slots)*3 }

// Lookup finds the entry with this hash that is reports as the one
// sought: its slot when ok, else the empty slot where it would go (-1 in
// an empty table).
func (t *Table) Lookup(hash uint64, is func(pos int32) bool) (slot int, ok bool) {
	if len(t.slots) == 0 {
		return -1, false
	}
	mask := len(t.slots) - 1
	for slot = int(hash) & mask; ; slot = (slot + 1) & mask {
		p := t.slots[slot]
		if p == 0 {
			return slot, false
		}
		if is(p - 1) {
			return slot, true
		}
	}
}

// At is the position in a full slot.
func (t *Table) At(slot int) int32 { return t.slots[slot] - 1 }

// Add indexes the entry at position n, appended to a list of n entries
// (positions 0..n-1, all indexed) and not in it before: hash is its hash,
// hashAt gives the others' when the table grows.
func (t *Table) Add(hash uint64, n int32, hashAt func(pos int32) uint64) {
	if !t.fits(int(n) + 1) {
		t.grow(int(n), hashAt)
	}
	t.slots[t.empty(hash)] = n + 1
}

// empty is the first empty slot of a probe from hash's home.
func (t *Table) empty(hash uint64) int {
	mask := len(t.slots) - 1
	slot := int(hash) & mask
	for t.slots[slot] != 0 {
		slot = (slot + 1) & mask
	}
	return slot
}

// grow doubles the table (or makes its first) and places the positions
// 0..n-1 again.
func (t *Table) grow(n int, hashAt func(pos int32) uint64) {
	t.slots = make([]int32, max(lenFor(n), 2*len(t.slots)))
	for i := range int32(n) {
		t.slots[t.empty(hashAt(i))] = i + 1
	}
}

// Remove forgets the entry in a full slot, for a list that fills the hole
// with its last entry (at position last, which moves to the removed
// one's unless it is the one removed): call it before the list moves
// that entry, as hashAt reads the list.
func (t *Table) Remove(slot int, last int32, hashAt func(pos int32) uint64) {
	pos := t.At(slot)
	t.delete(slot, hashAt)
	if pos == last {
		return
	}
	mask := len(t.slots) - 1
	moved := int(hashAt(last)) & mask
	for t.slots[moved] != last+1 {
		moved = (moved + 1) & mask
	}
	t.slots[moved] = pos + 1
}

// delete empties a full slot and moves back the entries after it that a
// probe would no longer reach.
func (t *Table) delete(hole int, hashAt func(pos int32) uint64) {
	mask := len(t.slots) - 1
	for j := (hole + 1) & mask; t.slots[j] != 0; j = (j + 1) & mask {
		home := int(hashAt(t.slots[j]-1)) & mask
		// The entry at j stays unless its home is outside (hole, j],
		// cyclically: a probe from there would stop at the hole.
		if (j-home)&mask >= (j-hole)&mask {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = 0
}
