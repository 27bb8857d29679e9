package kernel

import (
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/google/nftables/expr"

	"github.com/netpol/netpol/pkg/nft"
)

// OpKind is what one plan operation does. Each operation is one netlink
// message in the batch.
type OpKind int

const (
	OpAddTable OpKind = iota
	OpAddChain        // a new chain, or an existing base chain's new policy
	OpFlushChain
	OpDeleteChain
	OpAddRule // appends Rule to Chain
	OpAddSet  // the set without elements; OpAddElements follow
	OpDeleteSet
	OpAddElements
	OpDeleteElements
	OpAddCounter // a named counter object
	OpDeleteCounter
)

// Op is one operation of a Plan.
type Op struct {
	Kind     OpKind
	Chain    *nft.Chain    // chain operations and OpAddRule
	Rule     *nft.Rule     // OpAddRule
	Set      *nft.Set      // set and element operations (the spec; not its Elements)
	Elements []nft.Element // OpAddElements, OpDeleteElements: one message worth
	Counter  *nft.Counter  // OpAddCounter, OpDeleteCounter
}

// Stats counts what a plan changes. Elements count Element values (one
// range is one element), not kernel elements.
type Stats struct {
	SetsAdded, SetsDeleted int
	// CountersAdded and CountersDeleted are named counter objects.
	CountersAdded, CountersDeleted int
	// ChainsRewritten are existing chains changed in place: rules
	// replaced (flush + add) and/or base chain policy updated.
	ChainsAdded, ChainsRewritten, ChainsDeleted int
	RulesWritten                                int
	ElementsAdded, ElementsDeleted              int
	// Messages is the number of netlink messages in the batch.
	Messages int
	// Transactions is how many kernel transactions Apply committed: 0
	// when nothing changed; up to 3 for a table packets reach (what it
	// adds first, what it deletes last: Plan.inPhases); more for a staged plan
	// (Plan.stages), 1 otherwise. Plan leaves it 0.
	Transactions int
}

// Plan is the ordered list of operations that turns one table state into
// another; Applier sends the change as one transaction, what it adds in
// one before it and the maps and chains it deletes in one after it (or,
// for a large plan for a table no packet reaches yet, in stages: see
// stages).
type Plan struct {
	Table string
	Ops   []Op
	Stats Stats
	// fingerprints of the desired sets' elements, for the cache.
	fingerprints map[string]uint64
	// revisions of the desired sets, for the cache.
	revisions map[string]uint64
	// indexes of the added sets' elements, for the cache.
	indexes map[string]*setIndex
	// unhooked: the table the plan starts from has no base chain, so no
	// packet reaches it (see stages).
	unhooked bool
	// phase names a transaction of inPhases in errors ("" for the others);
	// undo, on the change's, deletes what the transaction before it
	// added, should the change fail.
	phase string
	undo  *Plan
}

// stages splits the plan into the transactions Apply sends. For a table
// packets reach, every change of a verdict is in one transaction, so that
// they land together, what it adds in one before it and the maps and
// chains it deletes in one after it (inPhases). For a table whose start
// has no base chain (it is absent, or a staged Apply stopped part way), a
// plan over limit bytes is cut. No packet reaches such a table: packets enter a table only through its base chains. So the plan
// goes as everything but the base chains (in Diff's order, in which each
// operation finds what it needs made or cleared by those before it), cut
// into transactions of at most limit bytes (or one operation), and where
// element operations start or stop (the Applier encodes element-only
// transactions itself: elementWire); then the base chains with their
// rules, last and whole. Rules and map verdicts never name a base chain,
// so nothing before them needs one.
func (p *Plan) stages(limit int) []*Plan {
	if len(p.Ops) == 0 {
		return nil
	}
	if !p.unhooked {
		if p.elementsOnly() { // a pod's event: nothing added or deleted
			return []*Plan{p}
		}
		return p.inPhases()
	}
	if planBytes(p) <= limit {
		return []*Plan{p}
	}
	var stages []*Plan
	var base []Op
	cur, size := &Plan{Table: p.Table}, 0
	for _, op := range p.Ops {
		if (op.Kind == OpAddChain || op.Kind == OpAddRule) && op.Chain.Base != nil {
			base = append(base, op)
			continue
		}
		n := opBytes(op)
		if len(cur.Ops) > 0 && (size+n > limit || isElementOp(op) != isElementOp(cur.Ops[len(cur.Ops)-1])) {
			stages = append(stages, cur)
			cur, size = &Plan{Table: p.Table}, 0
		}
		cur.Ops = append(cur.Ops, op)
		size += n
	}
	if len(cur.Ops) > 0 {
		stages = append(stages, cur)
	}
	if len(base) > 0 {
		stages = append(stages, &Plan{Table: p.Table, Ops: base})
	}
	for _, s := range stages {
		s.Stats.Messages = len(s.Ops)
	}
	return stages
}

// inPhases splits a plan for a table packets reach in up to three
// transactions, so that what packets see changes in one:
//  1. what it adds under a new name (sets and maps with their elements,
//     chains with their rules, counters; not base chains, which packets
//     enter at once). Nothing reads them until the next transaction makes
//     an existing chain or map name them, so this one changes no verdict;
//  2. the rest: the change;
//  3. the maps and chains it deletes for good, which nothing reads since
//     the change.
//
// Why, on kernel 6.18 (BenchmarkNewSetLookups; docs/nft-notes.md): a
// lookup in a set or map created and filled in the transaction that makes
// a rule read it can miss for a moment after the commit (an interval set
// switched in one transaction: 841 datagrams lost across 50,958 switches;
// none across 70,101 with the set made before), and so can a lookup in a
// map deleted in the transaction that stops a rule reading it, by a
// packet that met the rule before the commit (the kernel deactivates a
// deleted map's elements; a verdict map: 584 lost across 56,908; none
// across 53,469 in phases). Sets named by content are new whenever a
// peer's content changes, so without this a policy change could drop a
// new connection that both tables allow. A new object that names one the
// plan deletes and makes again under its name (a set or chain whose spec
// changed, a pipapo set cheaper to refill) stays in the change, as does
// that object: the window remains for those. Should the change fail, what
// the first transaction added is deleted again (Plan.undo).
func (p *Plan) inPhases() []*Plan {
	type ref struct {
		kind byte // 's'et, 'c'hain, counter 'o'bject
		name string
	}
	// What the plan deletes (made again when it also adds it, or when
	// something new names it) and adds.
	deleted, added := map[ref]bool{}, map[ref]bool{}
	for _, op := range p.Ops {
		switch op.Kind {
		case OpDeleteSet:
			deleted[ref{'s', op.Set.Name}] = true
		case OpDeleteChain:
			deleted[ref{'c', op.Chain.Name}] = true
		case OpDeleteCounter:
			deleted[ref{'o', op.Counter.Name}] = true
		case OpAddSet:
			added[ref{'s', op.Set.Name}] = true
		case OpAddChain:
			added[ref{'c', op.Chain.Name}] = true
		}
	}
	// The new objects and what each names.
	isNew, names := map[ref]bool{}, map[ref][]ref{}
	for _, op := range p.Ops {
		switch {
		case op.Kind == OpAddSet && !deleted[ref{'s', op.Set.Name}]:
			isNew[ref{'s', op.Set.Name}] = true
		case op.Kind == OpAddChain && op.Chain.Base == nil && !deleted[ref{'c', op.Chain.Name}]:
			isNew[ref{'c', op.Chain.Name}] = true
		case op.Kind == OpAddCounter && !deleted[ref{'o', op.Counter.Name}]:
			isNew[ref{'o', op.Counter.Name}] = true
		}
	}
	for _, op := range p.Ops {
		switch {
		case op.Kind == OpAddElements:
			if k := (ref{'s', op.Set.Name}); isNew[k] {
				for _, e := range op.Elements {
					if e.Verdict != nil && e.Verdict.Chain != "" {
						names[k] = append(names[k], ref{'c', e.Verdict.Chain})
					}
				}
			}
		case op.Kind == OpAddRule:
			if k := (ref{'c', op.Chain.Name}); isNew[k] {
				for _, e := range op.Rule.Exprs {
					switch e := e.(type) {
					case *expr.Lookup:
						names[k] = append(names[k], ref{'s', e.SetName})
					case *expr.Dynset:
						names[k] = append(names[k], ref{'s', e.SetName})
					case *expr.Verdict:
						if e.Chain != "" {
							names[k] = append(names[k], ref{'c', e.Chain})
						}
					case *expr.Objref:
						names[k] = append(names[k], ref{'o', e.Name})
					}
				}
			}
		}
	}
	// A new object goes first when all it names is there by then: an
	// object the plan leaves alone, or one that goes first too.
	first := maps.Clone(isNew)
	for changed := true; changed; {
		changed = false
		for k := range first {
			if !first[k] {
				continue
			}
			for _, r := range names[k] {
				if deleted[r] || (isNew[r] && !first[r]) {
					first[k], changed = false, true
					break
				}
			}
		}
	}
	early, rest, late := &Plan{Table: p.Table}, &Plan{Table: p.Table}, &Plan{Table: p.Table}
	for _, op := range p.Ops {
		var k ref
		switch op.Kind {
		case OpAddSet, OpAddElements:
			k = ref{'s', op.Set.Name}
		case OpAddChain, OpAddRule:
			k = ref{'c', op.Chain.Name}
		case OpAddCounter:
			k = ref{'o', op.Counter.Name}
		}
		switch {
		case first[k]: // never a base chain
			early.Ops = append(early.Ops, op)
		case op.Kind == OpDeleteSet && op.Set.IsMap() && !added[ref{'s', op.Set.Name}],
			op.Kind == OpDeleteChain && !added[ref{'c', op.Chain.Name}]:
			late.Ops = append(late.Ops, op)
		default:
			rest.Ops = append(rest.Ops, op)
		}
	}
	early.phase = "adding the new sets, maps and chains (nothing enforced changed)"
	rest.phase = "the change"
	late.phase = "deleting the maps and chains the change no longer reads (the change is applied; the next apply deletes them)"
	if len(early.Ops) > 0 {
		rest.undo = early.undoAdds()
	}
	var out []*Plan
	for _, s := range []*Plan{early, rest, late} {
		if len(s.Ops) > 0 {
			s.Stats.Messages = len(s.Ops)
			out = append(out, s)
		}
	}
	if len(out) == 1 {
		return []*Plan{p}
	}
	return out
}

// undoAdds deletes what p, a plan of additions alone, added: its chains
// emptied first (their rules name the rest), then its sets and maps (maps
// name chains), its chains and its counters.
func (p *Plan) undoAdds() *Plan {
	u := &Plan{Table: p.Table}
	var sets, chains, counters []Op
	for _, op := range p.Ops {
		switch op.Kind {
		case OpAddChain:
			u.add(Op{Kind: OpFlushChain, Chain: op.Chain})
			chains = append(chains, Op{Kind: OpDeleteChain, Chain: op.Chain})
		case OpAddSet:
			sets = append(sets, Op{Kind: OpDeleteSet, Set: op.Set})
		case OpAddCounter:
			counters = append(counters, Op{Kind: OpDeleteCounter, Counter: op.Counter})
		}
	}
	for _, ops := range [][]Op{sets, chains, counters} {
		for _, op := range ops {
			u.add(op)
		}
	}
	return u
}

// Empty reports whether the plan changes nothing.
func (p *Plan) Empty() bool { return len(p.Ops) == 0 }

func (p *Plan) add(op Op) {
	p.Ops = append(p.Ops, op)
	p.Stats.Messages++
}

// String renders the plan one operation per line in nft syntax.
func (p *Plan) String() string {
	var b strings.Builder
	for _, op := range p.Ops {
		b.WriteString(p.opText(op))
		b.WriteByte('\n')
	}
	return b.String()
}

func (p *Plan) opText(op Op) string {
	where := "inet " + p.Table
	switch op.Kind {
	case OpAddTable:
		return "add table " + where
	case OpAddChain:
		s := fmt.Sprintf("add chain %s %s", where, op.Chain.Name)
		if h := op.Chain.Base; h != nil {
			s += " { " + normalHook(h).String() + " }"
		}
		return s
	case OpFlushChain:
		return fmt.Sprintf("flush chain %s %s", where, op.Chain.Name)
	case OpDeleteChain:
		return fmt.Sprintf("delete chain %s %s", where, op.Chain.Name)
	case OpAddRule:
		text := op.Rule.Text
		if text == "" {
			text = "# rule " + op.Rule.ID()
		}
		return fmt.Sprintf("add rule %s %s %s", where, op.Chain.Name, text)
	case OpAddSet:
		kind := "set"
		if op.Set.IsMap() {
			kind = "map"
		}
		extra := ""
		if flags := op.Set.FlagNames(); len(flags) > 0 {
			extra += " flags " + strings.Join(flags, ",") + ";"
		}
		if op.Set.Timeout > 0 {
			extra += fmt.Sprintf(" timeout %ds;", int64(op.Set.Timeout/time.Second))
		}
		return fmt.Sprintf("add %s %s %s { %s;%s }", kind, where, op.Set.Name, op.Set.TypeText(), extra)
	case OpDeleteSet:
		kind := "set"
		if op.Set.IsMap() {
			kind = "map"
		}
		return fmt.Sprintf("delete %s %s %s", kind, where, op.Set.Name)
	case OpAddCounter:
		return fmt.Sprintf("add counter %s %s", where, op.Counter.Name)
	case OpDeleteCounter:
		return fmt.Sprintf("delete counter %s %s", where, op.Counter.Name)
	case OpAddElements, OpDeleteElements:
		verb := "add"
		if op.Kind == OpDeleteElements {
			verb = "delete"
		}
		texts := make([]string, len(op.Elements))
		for i, e := range op.Elements {
			if op.Kind == OpDeleteElements {
				e.Verdict, e.Data = nil, nil // a delete names the key only
			}
			texts[i] = op.Set.ElementText(e)
		}
		return fmt.Sprintf("%s element %s %s { %s }", verb, where, op.Set.Name, strings.Join(texts, ", "))
	}
	return fmt.Sprintf("# unknown op %d", op.Kind)
}
