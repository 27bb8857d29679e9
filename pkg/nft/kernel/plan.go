package kernel

import (
	"fmt"
	"strings"
	"time"

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
	// when nothing changed, 2 when it added sets to a table packets
	// reach (the sets first: Plan.setsFirst), more for a staged plan
	// (Plan.stages), 1 otherwise. Plan leaves it 0.
	Transactions int
}

// Plan is the ordered list of operations that turns one table state into
// another; Applier sends it as one transaction, with the sets it adds in
// one before it (or, for a large plan for a table no packet reaches yet,
// in stages: see stages).
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
}

// stages splits the plan into the transactions Apply sends. For a table
// packets reach, every change of a verdict is in one transaction, so that
// they land together; the sets it adds go in one before it (setsFirst).
// For a table whose start has no base chain (it is absent, or a staged
// Apply stopped part way), a plan over limit bytes is cut. No packet reaches such a
// table: packets enter a table only through its base chains. So the plan
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
		return p.setsFirst()
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

// setsFirst splits a plan for a table packets reach: the sets it adds
// under a new name, with their elements, go in a transaction of their own
// before the rest. No rule reads them yet, so that transaction changes no
// verdict: the rest, one transaction, is still the whole change. Why: on
// kernel 6.18, a lookup in an interval set (rbtree or pipapo) that was
// created and filled in the transaction that made a rule read it can
// miss for a moment after the commit, while lookups in sets made before
// do not (BenchmarkNewSetLookups: 851 datagrams lost across 59,547 such
// commits, none across 80,776 that made the set in the transaction
// before). Without this, a policy change that gives a rule a set of new
// content could drop a new connection that both tables allow. Verdict
// maps stay with the rest (their elements may name chains the rest
// adds), as do sets recreated under their name (a change of spec, a
// pipapo set cheaper to refill): the window remains for those.
func (p *Plan) setsFirst() []*Plan {
	recreated := map[string]bool{}
	for _, op := range p.Ops {
		if op.Kind == OpDeleteSet {
			recreated[op.Set.Name] = true
		}
	}
	fresh := map[string]bool{}
	for _, op := range p.Ops {
		if op.Kind == OpAddSet && !op.Set.Verdict && !recreated[op.Set.Name] {
			fresh[op.Set.Name] = true
		}
	}
	first, rest := &Plan{Table: p.Table}, &Plan{Table: p.Table}
	for _, op := range p.Ops {
		if (op.Kind == OpAddSet || op.Kind == OpAddElements) && fresh[op.Set.Name] {
			first.Ops = append(first.Ops, op)
		} else {
			rest.Ops = append(rest.Ops, op)
		}
	}
	if len(first.Ops) == 0 || len(rest.Ops) == 0 {
		return []*Plan{p}
	}
	first.Stats.Messages, rest.Stats.Messages = len(first.Ops), len(rest.Ops)
	return []*Plan{first, rest}
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
