package policy

import (
	"maps"
	"slices"

	"github.com/netpol/netpol/pkg/cluster"
)

// Cache builds models one policy object at a time and keeps each
// object's share: a model of objects that differ from the last call's in
// a few costs those few and a sort, not 11,000 conversions. An unchanged
// object keeps its *Policy values, which the incremental compiler takes to
// mean "unchanged" (compiler.Incremental.Rebase). Not safe for concurrent use.
type Cache struct {
	shares map[any]*share
	// sorted are the last model's policies in evaluation order: the next
	// model drops and inserts the policies of the objects that changed.
	sorted []*Policy
	gen    uint64
}

type share struct {
	model    *Model
	problems []error
	gen      uint64 // the last Build that was given the object
}

// Build is Build over the objects ids name, from the shares of the last
// call where the ids are the same, and the problems met reading them. An
// id identifies an object's current version: the caller gives a new one
// when the object changes (the informer's pointer: an update replaces
// it). load returns a snapshot holding the object alone, and the problems
// met reading it; it is called for ids the last call was not given.
// Shares of objects no longer given are dropped.
func (c *Cache) Build(ids []any, load func(id any) (*cluster.Snapshot, []error)) (*Model, []error) {
	if c.shares == nil {
		c.shares = make(map[any]*share, len(ids))
	}
	c.gen++
	var added []*Policy
	seen := 0 // distinct shares given
	given := make([]*share, len(ids))
	for i, id := range ids {
		sh, ok := c.shares[id]
		if !ok {
			snap, problems := load(id)
			sh = &share{model: Build(snap), problems: problems}
			c.shares[id] = sh
			added = append(added, sh.model.Policies...)
		}
		if sh.gen != c.gen {
			seen++
		}
		sh.gen = c.gen
		given[i] = sh
	}
	removed := map[*Policy]bool{}
	if seen < len(c.shares) { // some were not given: drop them
		for id, sh := range c.shares {
			if sh.gen != c.gen {
				for _, p := range sh.model.Policies {
					removed[p] = true
				}
				delete(c.shares, id)
			}
		}
	}
	c.sorted = merge(c.sorted, removed, added)
	out := &Model{Policies: c.sorted, ObjectWarnings: map[cluster.ObjectKey][]string{}}
	var problems []error
	for _, sh := range given {
		out.Staged = append(out.Staged, sh.model.Staged...)
		out.Errors = append(out.Errors, sh.model.Errors...)
		out.Warnings = append(out.Warnings, sh.model.Warnings...)
		if len(sh.model.ObjectWarnings) > 0 {
			maps.Copy(out.ObjectWarnings, sh.model.ObjectWarnings)
		}
		problems = append(problems, sh.problems...)
	}
	slices.SortFunc(out.Staged, compare)
	return out, problems
}

// merge is sorted (in evaluation order) without removed and with added,
// in a new slice (a model's Policies are never changed once given out).
// Each added policy is placed by binary search: a change is a few.
func merge(sorted []*Policy, removed map[*Policy]bool, added []*Policy) []*Policy {
	out := make([]*Policy, 0, len(sorted)-len(removed)+len(added))
	if len(removed) == 0 {
		out = append(out, sorted...)
	} else {
		for _, p := range sorted {
			if !removed[p] {
				out = append(out, p)
			}
		}
	}
	if len(added) > len(out) {
		out = append(out, added...)
		slices.SortFunc(out, compare)
		return out
	}
	for _, p := range added {
		i, _ := slices.BinarySearchFunc(out, p, compare)
		out = slices.Insert(out, i, p)
	}
	return out
}

// compare is Less as a three-way comparison.
func compare(a, b *Policy) int {
	switch {
	case Less(a, b):
		return -1
	case Less(b, a):
		return 1
	}
	return 0
}
