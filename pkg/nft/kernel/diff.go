package kernel

import (
	"bytes"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/google/nftables/expr"

	"github.com/netpol/netpol/pkg/nft"
)

// Diff returns the operations that turn current into desired. It is pure:
// no kernel access. A nil current means the table is absent (an empty
// current is treated the same way when desired has content); a nil desired
// means an empty table.
//
// The order of the operations makes one batch valid in the kernel:
//
//  1. add table (if absent)
//  2. add new chains (empty), update base chain policies
//  3. delete elements of kept sets (stale entries, changed vmap verdicts)
//  4. flush rewritten, recreated and removed chains
//  5. delete removed and changed-spec sets and removed counters (their
//     users were flushed in 4)
//  6. delete removed chains, delete and re-add recreated chains (nothing
//     references them any more after 3-5)
//  7. add new counters, new and changed-spec sets, then the sets' elements
//  8. add elements to kept sets
//  9. add the rules of new, rewritten and recreated chains
func Diff(current, desired *nft.Table) *Plan { return diff(stateOf(current), desired) }

// diff is Diff from a state (nil: the table is absent).
func diff(current *state, desired *nft.Table) *Plan {
	if desired == nil {
		desired = &nft.Table{}
	}
	name := desired.Name
	if name == "" && current != nil {
		name = current.name
	}
	p := &Plan{Table: name}
	cur := current
	if cur == nil {
		cur = &state{name: name}
	}
	p.unhooked = !hasBaseChain(cur.chains)
	if current == nil || (current.empty() && !isEmpty(desired)) {
		p.add(Op{Kind: OpAddTable})
	}

	sets := diffSets(cur, desired)
	p.fingerprints = sets.fingerprints
	p.revisions = sets.revisions
	chains := diffChains(cur, desired, sets.respec)

	// 2
	for _, c := range chains.added {
		p.add(Op{Kind: OpAddChain, Chain: c})
	}
	for _, c := range chains.policy {
		p.add(Op{Kind: OpAddChain, Chain: c})
	}
	// 3
	for _, k := range sets.kept {
		p.addElements(OpDeleteElements, k.set, k.del)
	}
	// 4
	for _, c := range chains.flush {
		p.add(Op{Kind: OpFlushChain, Chain: c})
	}
	// 5
	for _, s := range sets.deleted {
		p.add(Op{Kind: OpDeleteSet, Set: s})
		p.Stats.SetsDeleted++
	}
	for _, name := range cur.counterNames() {
		if desired.Counters[name] == nil {
			p.add(Op{Kind: OpDeleteCounter, Counter: cur.counters[name]})
			p.Stats.CountersDeleted++
		}
	}
	// 6
	for _, c := range chains.deleted {
		p.add(Op{Kind: OpDeleteChain, Chain: c})
		p.Stats.ChainsDeleted++
	}
	for _, c := range chains.recreated {
		p.add(Op{Kind: OpAddChain, Chain: c})
	}
	p.Stats.ChainsAdded = len(chains.added) + len(chains.recreated)
	p.Stats.ChainsRewritten = chains.rewritten
	// 7: the sets, then their elements, so that a staged plan's
	// element operations come in transactions of their own (elementWire)
	for _, name := range desired.CounterNames() {
		if cur.counters[name] == nil {
			p.add(Op{Kind: OpAddCounter, Counter: desired.Counters[name]})
			p.Stats.CountersAdded++
		}
	}
	p.indexes = make(map[string]*setIndex, len(sets.added))
	for _, s := range sets.added {
		p.add(Op{Kind: OpAddSet, Set: s})
		p.Stats.SetsAdded++
	}
	for _, s := range sets.added {
		idx := newSetIndex(s) // made here: the cache may keep it
		p.indexes[s.Name] = idx
		p.addElements(OpAddElements, s, idx.normal(s))
	}
	// 8
	for _, k := range sets.kept {
		p.addElements(OpAddElements, k.set, k.add)
	}
	// 9
	for _, c := range chains.write {
		for _, r := range c.Rules {
			p.add(Op{Kind: OpAddRule, Chain: c, Rule: r})
			p.Stats.RulesWritten++
		}
	}
	return p
}

func isEmpty(t *nft.Table) bool {
	return len(t.Chains) == 0 && len(t.Sets) == 0 && len(t.Counters) == 0
}

func hasBaseChain(chains map[string]*nft.Chain) bool {
	for _, c := range chains {
		if c.Base != nil {
			return true
		}
	}
	return false
}

// addElements adds one operation per message-sized chunk.
func (p *Plan) addElements(kind OpKind, s *nft.Set, elems []nft.Element) {
	for _, chunk := range chunkElements(s, elems) {
		p.add(Op{Kind: kind, Set: s, Elements: chunk})
	}
	if kind == OpAddElements {
		p.Stats.ElementsAdded += len(elems)
	} else {
		p.Stats.ElementsDeleted += len(elems)
	}
}

type keptSet struct {
	set      *nft.Set // desired
	del, add []nft.Element
}

type setDiff struct {
	fingerprints map[string]uint64 // of desired sets (0: not computed)
	revisions    map[string]uint64 // of desired sets
	added        []*nft.Set        // new and changed-spec (desired)
	deleted      []*nft.Set        // removed and changed-spec (current's spec)
	respec       map[string]bool
	kept         []keptSet
}

func diffSets(cur *state, desired *nft.Table) setDiff {
	d := setDiff{respec: map[string]bool{}, fingerprints: make(map[string]uint64, len(desired.Sets)),
		revisions: make(map[string]uint64, len(desired.Sets))}
	for _, name := range desired.SetNames() {
		ds, cs := desired.Sets[name], cur.sets[name]
		d.revisions[name] = ds.Revision
		switch {
		case cs == nil:
			d.fingerprints[name] = elementsFingerprint(ds)
			d.added = append(d.added, ds)
			continue
		case !sameSpec(cs, ds):
			d.fingerprints[name] = elementsFingerprint(ds)
			d.respec[name] = true
			d.deleted = append(d.deleted, cs.set)
			d.added = append(d.added, ds)
			continue
		case ds.Dynamic:
			continue // rules own the elements
		case ds.Revision != 0 && cs.revision == ds.Revision:
			// The caller says: the same list as last applied.
			d.fingerprints[name] = cs.fingerprint
			continue
		case ds.Changes != nil && cs.revision != 0 && ds.Changes.From == cs.revision && cs.index != nil:
			// Only the changes: the cost of a sync follows the change,
			// not the size of the set.
			del, add := changesAgainst(cs, ds)
			if len(del) > 0 || len(add) > 0 {
				d.kept = append(d.kept, keptSet{set: ds, del: del, add: add})
			}
			continue
		}
		fp := elementsFingerprint(ds)
		d.fingerprints[name] = fp
		switch {
		case cs.fingerprint == fp:
			// The same elements, in the same order, as last applied: an
			// unchanged set costs a hash, not a lookup per element.
		default:
			del, add := elementDiff(cs, ds)
			if ds.Interval && ds.Concat() && recreateCheaper(len(del), len(ds.Elements)) {
				d.respec[name] = true
				d.deleted = append(d.deleted, cs.set)
				d.added = append(d.added, ds)
				continue
			}
			if len(del) > 0 || len(add) > 0 {
				d.kept = append(d.kept, keptSet{set: ds, del: del, add: add})
			}
		}
	}
	for _, name := range cur.setNames() {
		if desired.Sets[name] == nil {
			d.deleted = append(d.deleted, cur.sets[name].set)
		}
	}
	return d
}

// changesAgainst turns a desired set's Changes into the deletes and adds
// the kernel needs, checked against the cached elements (a delete of an
// absent element or an add of a present one would fail the transaction).
func changesAgainst(cur *cachedSet, desired *nft.Set) (del, add []nft.Element) {
	buf := make([]byte, 0, 256)
	for _, e := range desired.Changes.Delete {
		e = normalElement(desired, e)
		if cur.index.has(e, buf) {
			del = append(del, e)
		}
	}
	for _, e := range desired.Changes.Add {
		e = normalElement(desired, e)
		if !cur.index.has(e, buf) {
			add = append(add, e)
		}
	}
	return del, add
}

// recreateCheaper reports whether deleting and re-adding a concatenated
// interval (pipapo) set beats deleting del of its elements. Measured on the
// test VM (kernel 6.18): each pipapo element delete costs 0.2-0.6 ms, even
// within one transaction (1000 deletes: 210-560 ms), while adding costs
// ~6 us per element and deleting the whole set is instant. So recreate
// (which also rewrites the chains that use the set) once the deletes
// outnumber 1/50 of the desired elements.
func recreateCheaper(del, desired int) bool {
	return del > 4 && del*50 > desired
}

// sameSpec reports whether the kernel set can be updated in place.
func sameSpec(cs *cachedSet, desired *nft.Set) bool {
	if cs.mismatch != "" {
		return false
	}
	cur := cs.set
	return cur.Interval == desired.Interval && cur.Verdict == desired.Verdict &&
		cur.Dynamic == desired.Dynamic && cur.Timeout == desired.Timeout && cur.KernelSize() == desired.KernelSize() &&
		slices.Equal(cur.Fields, desired.Fields) && slices.Equal(cur.Data, desired.Data) &&
		(cur.Data == nil) == (desired.Data == nil)
}

// elementDiff returns the current elements that are not desired and the
// desired ones that are not current; a vmap key whose verdict changed is
// in both.
func elementDiff(cur *cachedSet, desired *nft.Set) (del, add []nft.Element) {
	idx := cur.indexed()
	seen := make([]bool, idx.len())
	buf := make([]byte, 0, 256)
	var adding map[string]bool // desired duplicates
	for _, e := range desired.Elements {
		e = normalElement(desired, e)
		if i, ok := idx.find(e, buf); ok {
			seen[i] = true
			continue
		}
		buf = appendElementID(buf[:0], e)
		if adding == nil {
			adding = map[string]bool{}
		}
		if !adding[string(buf)] {
			adding[string(buf)] = true
			add = append(add, e)
		}
	}
	for i, ok := range seen {
		if !ok {
			del = append(del, idx.element(int32(i)))
		}
	}
	return del, add
}

// normalElements returns the set's elements in canonical form (see
// Element), without duplicates, in their original order: s.Elements
// itself when it is that already (the compiler's and the proxy's sets
// are), else made from an index.
func normalElements(s *nft.Set) []nft.Element { return newSetIndex(s).normal(s) }

// normal is normalElements(s) where idx indexes s.
func (idx *setIndex) normal(s *nft.Set) []nft.Element {
	if idx.len() == len(s.Elements) && !slices.ContainsFunc(s.Elements, func(e nft.Element) bool {
		return s.Interval && e.KeyEnd != nil && bytes.Equal(e.Key, e.KeyEnd)
	}) {
		return s.Elements
	}
	return idx.elements()
}

func normalElement(s *nft.Set, e nft.Element) nft.Element {
	if s.Interval && e.KeyEnd != nil && bytes.Equal(e.Key, e.KeyEnd) {
		e.KeyEnd = nil
	}
	return e
}

type chainDiff struct {
	added     []*nft.Chain // new chains (desired)
	policy    []*nft.Chain // base chains whose policy changes in place (desired)
	flush     []*nft.Chain // chains whose current rules go (current or desired)
	deleted   []*nft.Chain // removed and recreated (current)
	recreated []*nft.Chain // hook changed: deleted, then added again (desired)
	write     []*nft.Chain // chains whose desired rules are all added (desired)
	rewritten int
}

func diffChains(cur *state, desired *nft.Table, respec map[string]bool) chainDiff {
	var d chainDiff
	for _, name := range desired.ChainNames() {
		dc, cc := desired.Chains[name], cur.chains[name]
		switch {
		case cc == nil:
			d.added = append(d.added, dc)
			d.write = append(d.write, dc)
		case !sameHookPlace(cc.Base, dc.Base):
			if len(cc.Rules) > 0 {
				d.flush = append(d.flush, cc)
			}
			d.deleted = append(d.deleted, cc)
			d.recreated = append(d.recreated, dc)
			d.write = append(d.write, dc)
		default:
			policy := dc.Base != nil && normalHook(cc.Base).Policy != normalHook(dc.Base).Policy
			rules := !sameRules(cc, dc) || usesAny(cc, respec) || usesAny(dc, respec)
			if policy {
				d.policy = append(d.policy, dc)
			}
			if rules {
				if len(cc.Rules) > 0 {
					d.flush = append(d.flush, cc)
				}
				d.write = append(d.write, dc)
			}
			if policy || rules {
				d.rewritten++
			}
		}
	}
	for _, name := range cur.chainNames() {
		if cc := cur.chains[name]; desired.Chains[name] == nil {
			if len(cc.Rules) > 0 {
				d.flush = append(d.flush, cc)
			}
			d.deleted = append(d.deleted, cc)
		}
	}
	return d
}

// normalHook fills the defaults: type filter, policy accept.
func normalHook(h *nft.Hook) nft.Hook {
	if h == nil {
		return nft.Hook{}
	}
	n := *h
	if n.Type == "" {
		n.Type = "filter"
	}
	if n.Policy == "" {
		n.Policy = "accept"
	}
	return n
}

// sameHookPlace reports whether a chain can stay: both regular, or base
// chains with the same type, hook and priority (the kernel cannot change
// those in place; the policy it can).
func sameHookPlace(a, b *nft.Hook) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	na, nb := normalHook(a), normalHook(b)
	return na.Type == nb.Type && na.Hook == nb.Hook && na.Priority == nb.Priority
}

func sameRules(a, b *nft.Chain) bool {
	if len(a.Rules) != len(b.Rules) {
		return false
	}
	for i := range a.Rules {
		if a.Rules[i].ID() != b.Rules[i].ID() {
			return false
		}
	}
	return true
}

// usesAny reports whether a rule of the chain looks up one of the sets,
// by its text ("@name") or its expressions.
func usesAny(c *nft.Chain, sets map[string]bool) bool {
	if len(sets) == 0 {
		return false
	}
	for _, r := range c.Rules {
		for _, w := range strings.Fields(r.Text) {
			if strings.HasPrefix(w, "@") && sets[w[1:]] {
				return true
			}
		}
		for _, e := range r.Exprs {
			if l, ok := e.(*expr.Lookup); ok && sets[l.SetName] {
				return true
			}
		}
	}
	return false
}

// fingerprintSeed is fixed for the process: fingerprints only compare
// within one Applier's life.
var fingerprintSeed = maphash.MakeSeed()

// elementsFingerprint hashes a set's elements in their given order (never
// 0, which means unknown). The compiler emits elements in a stable order,
// so an unchanged set has an unchanged fingerprint. It streams: a buffer
// of the whole set's bytes, kept for reuse, would be as large as the
// largest set.
func elementsFingerprint(s *nft.Set) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	for _, e := range s.Elements {
		h.Write(e.Key)
		if e.KeyEnd != nil && !(s.Interval && bytes.Equal(e.Key, e.KeyEnd)) {
			h.WriteByte('-')
			h.Write(e.KeyEnd)
		}
		if v := e.Verdict; v != nil {
			h.WriteByte(':')
			h.WriteByte(byte(v.Kind))
			h.WriteString(v.Chain)
		}
		if e.Data != nil {
			h.WriteByte(':')
			h.Write(e.Data)
		}
		h.WriteByte(0)
	}
	if fp := h.Sum64(); fp != 0 {
		return fp
	}
	return 1
}
