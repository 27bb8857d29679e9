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
// mean "unchanged" (compiler.Live.Rebase). Not safe for concurrent use.
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

// Source is one policy object. ID identifies its current version: the
// caller gives a new ID when the object changes (the informer's pointer:
// an update replaces it). Load returns a snapshot holding the object
// alone, and the problems met reading it.
type Source struct {
	ID   any
	Load func() (*cluster.Snapshot, []error)
}

// Build is Build over the objects of sources, from the shares of the last
// call where their IDs are the same (shares of objects no longer given are
// dropped), and the problems Load met.
func (c *Cache) Build(sources []Source) (*Model, []error) {
	if c.shares == nil {
		c.shares = make(map[any]*share, len(sources))
	}
	c.gen++
	var added []*Policy
	for _, s := range sources {
		sh, ok := c.shares[s.ID]
		if !ok {
			snap, problems := s.Load()
			sh = &share{model: Build(snap), problems: problems}
			c.shares[s.ID] = sh
			added = append(added, sh.model.Policies...)
		}
		sh.gen = c.gen
	}
	removed := map[*Policy]bool{}
	for id, sh := range c.shares {
		if sh.gen != c.gen {
			for _, p := range sh.model.Policies {
				removed[p] = true
			}
			delete(c.shares, id)
		}
	}
	c.sorted = merge(c.sorted, removed, added)
	out := &Model{Policies: c.sorted, ObjectWarnings: map[cluster.ObjectKey][]string{}}
	var problems []error
	for _, s := range sources {
		sh := c.shares[s.ID]
		out.Errors = append(out.Errors, sh.model.Errors...)
		out.Warnings = append(out.Warnings, sh.model.Warnings...)
		maps.Copy(out.ObjectWarnings, sh.model.ObjectWarnings)
		problems = append(problems, sh.problems...)
	}
	return out, problems
}

// merge is sorted (in evaluation order) without removed and with added,
// in a new slice (a model's Policies are never changed once given out).
func merge(sorted []*Policy, removed map[*Policy]bool, added []*Policy) []*Policy {
	slices.SortFunc(added, compare)
	out := make([]*Policy, 0, len(sorted)-len(removed)+len(added))
	for _, p := range sorted {
		if removed[p] {
			continue
		}
		for len(added) > 0 && Less(added[0], p) {
			out = append(out, added[0])
			added = added[1:]
		}
		out = append(out, p)
	}
	return append(out, added...)
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
