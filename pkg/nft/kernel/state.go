package kernel

import (
	"maps"
	"slices"

	"github.com/netpol/netpol/pkg/nft"
)

// state is a table as Diff starts from it: the Applier's cache, a table
// read back from the kernel, or a caller's table (Diff). Beside each set
// it keeps what the kernel side knows of it beyond its spec.
type state struct {
	name   string
	chains map[string]*nft.Chain
	sets   map[string]*cachedSet
	// counters are the named counter objects (values not kept).
	counters map[string]*nft.Counter
}

// cachedSet is one set of a state.
type cachedSet struct {
	// set is the spec; in the Applier's cache (and a table read back for
	// it) without Elements, which index holds.
	set *nft.Set
	// index holds the elements (see setIndex); nil where none is kept
	// (Diff of a caller's table makes a temporary one).
	index *setIndex
	// fingerprint is that of the desired elements last applied (0:
	// unknown); see elementsFingerprint.
	fingerprint uint64
	// revision is the Revision last applied (0: none).
	revision uint64
	// mismatch, on a read-back set, says why the kernel set cannot be
	// updated in place (foreign flags or types, malformed intervals);
	// Diff then deletes and re-adds it.
	mismatch string
}

// stateOf is a caller's table as Diff starts from it (nil: absent).
func stateOf(t *nft.Table) *state {
	if t == nil {
		return nil
	}
	st := &state{name: t.Name, chains: t.Chains, sets: make(map[string]*cachedSet, len(t.Sets)), counters: t.Counters}
	for name, s := range t.Sets {
		st.sets[name] = &cachedSet{set: s}
	}
	return st
}

// table is the state as a Table (nil: absent); sets whose index holds
// their elements have none listed.
func (st *state) table() *nft.Table {
	if st == nil {
		return nil
	}
	t := &nft.Table{Name: st.name, Chains: st.chains, Sets: make(map[string]*nft.Set, len(st.sets)), Counters: st.counters}
	for name, cs := range st.sets {
		t.Sets[name] = cs.set
	}
	return t
}

// chainNames are the chain names in Table.ChainNames' order.
func (st *state) chainNames() []string { return (&nft.Table{Chains: st.chains}).ChainNames() }

// counterNames are the counter names in order.
func (st *state) counterNames() []string { return slices.Sorted(maps.Keys(st.counters)) }

// setNames are the set names in order.
func (st *state) setNames() []string { return slices.Sorted(maps.Keys(st.sets)) }

func (st *state) empty() bool {
	return len(st.chains) == 0 && len(st.sets) == 0 && len(st.counters) == 0
}

// indexed returns the set's index, or a temporary one.
func (cs *cachedSet) indexed() *setIndex {
	if cs.index != nil {
		return cs.index
	}
	return newSetIndex(cs.set)
}
