package kernel

import (
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// Fake is an Applier whose kernel is in memory (as knftables' Fake): the
// Applier's own diffing, caching and Verify run unchanged, and each plan is
// executed operation by operation on the in-memory table, rejected as a
// whole where the kernel would reject it (a missing chain, set or element).
// Tests change the "kernel" behind the Applier's back with Tamper and make
// transactions fail with FailWith. It needs no privileges.
type Fake struct {
	*Applier
	mem *memKernel
}

// NewFake returns a Fake managing the inet table named table, absent at
// first.
func NewFake(table string) *Fake {
	m := &memKernel{name: table}
	return &Fake{Applier: &Applier{table: table, nsFd: -1, mem: m}, mem: m}
}

// Kernel returns a copy of the table the fake kernel holds (nil: absent),
// in read-back form.
func (f *Fake) Kernel() *nft.Table { return f.mem.read() }

// Tamper changes the kernel's table as another program would (fn gets a
// copy, nil when absent, and returns the new table, nil to delete it); the
// generation moves, as for any commit.
func (f *Fake) Tamper(fn func(*nft.Table) *nft.Table) {
	f.mem.mu.Lock()
	defer f.mem.mu.Unlock()
	f.mem.table = fn(copyTable(f.mem.table))
	f.mem.index = nil
	f.mem.gen++
}

// FailWith makes every transaction fail with what fn returns (nil: the
// transaction goes through); nil fn turns failures off. fn runs with the
// fake locked and may block (to hold a sync).
func (f *Fake) FailWith(fn func(*Plan) error) {
	f.mem.mu.Lock()
	defer f.mem.mu.Unlock()
	f.mem.fail = fn
}

// Transactions counts the transactions committed.
func (f *Fake) Transactions() int {
	f.mem.mu.Lock()
	defer f.mem.mu.Unlock()
	return f.mem.commits
}

// memKernel is one table of an in-memory kernel.
type memKernel struct {
	mu    sync.Mutex
	name  string
	table *nft.Table // nil: absent
	// index finds the committed table's elements by key (elementKey),
	// per set, made on first use: a transaction costs what it changes,
	// not the size of the table (a first sync adds hundreds of thousands
	// of elements to one set, in many messages).
	index   map[string]map[string]int
	gen     uint32
	commits int
	fail    func(*Plan) error
}

func (m *memKernel) generation() uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

func (m *memKernel) read() *nft.Table {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copyTable(m.table)
}

func (m *memKernel) deleteTable() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.table != nil {
		m.table, m.index = nil, nil
		m.gen++
	}
}

// exec runs the plan on the table, operation by operation, and undoes
// every one of them if one fails: one atomic transaction.
func (m *memKernel) exec(p *Plan) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		if err := m.fail(p); err != nil {
			return err
		}
	}
	if m.index == nil {
		m.index = map[string]map[string]int{}
	}
	var undo []func()
	for _, op := range p.Ops {
		if err := m.execOp(op, &undo); err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			return fmt.Errorf("table %s: transaction of %d messages failed: %s: %w", m.name, len(p.Ops), p.opText(op), err)
		}
	}
	m.gen++
	m.commits++
	return nil
}

// elementsOf returns the index of a set's elements.
func (m *memKernel) elementsOf(s *nft.Set) map[string]int {
	at, ok := m.index[s.Name]
	if !ok {
		at = make(map[string]int, len(s.Elements))
		for i, e := range s.Elements {
			at[elementKey(e)] = i
		}
		m.index[s.Name] = at
	}
	return at
}

// removeElement deletes element i of s (the last one takes its place).
func (m *memKernel) removeElement(s *nft.Set, at map[string]int, i int) {
	delete(at, elementKey(s.Elements[i]))
	last := len(s.Elements) - 1
	if i != last {
		s.Elements[i] = s.Elements[last]
		at[elementKey(s.Elements[i])] = i
	}
	s.Elements = s.Elements[:last]
}

// execOp does what the kernel does with one message, and notes how to
// undo it.
func (m *memKernel) execOp(op Op, undo *[]func()) error {
	do := func(f func()) { *undo = append(*undo, f) }
	if op.Kind == OpAddTable {
		if m.table == nil {
			m.table = nft.NewTable(m.name)
			do(func() { m.table = nil })
		}
		return nil
	}
	t := m.table
	if t == nil {
		return unix.ENOENT
	}
	switch op.Kind {
	case OpAddChain:
		c := t.Chains[op.Chain.Name]
		if c == nil {
			c = &nft.Chain{Name: op.Chain.Name}
			t.Chains[c.Name] = c
			do(func() { delete(t.Chains, c.Name) })
		}
		base := c.Base
		do(func() { c.Base = base })
		c.Base = copyHook(op.Chain.Base)
	case OpFlushChain, OpDeleteChain, OpAddRule:
		c := t.Chains[op.Chain.Name]
		if c == nil {
			return unix.ENOENT
		}
		rules := c.Rules
		switch op.Kind {
		case OpFlushChain:
			c.Rules = nil
			do(func() { c.Rules = rules })
		case OpDeleteChain:
			if len(c.Rules) > 0 {
				return unix.EBUSY
			}
			delete(t.Chains, c.Name)
			do(func() { t.Chains[c.Name] = c })
		default:
			for _, name := range op.Rule.CounterNames() {
				if t.Counters[name] == nil {
					return unix.ENOENT
				}
			}
			c.Rules = append(c.Rules, nft.RuleWithID(op.Rule.ID(), nil))
			do(func() { c.Rules = c.Rules[:len(rules)] })
		}
	case OpAddSet:
		if t.Sets[op.Set.Name] == nil {
			s := heldSpec(op.Set)
			t.Sets[s.Name] = s
			do(func() { delete(t.Sets, s.Name); delete(m.index, s.Name) })
		}
	case OpDeleteSet:
		s := t.Sets[op.Set.Name]
		if s == nil {
			return unix.ENOENT
		}
		at, indexed := m.index[s.Name]
		delete(t.Sets, s.Name)
		delete(m.index, s.Name)
		do(func() {
			t.Sets[s.Name] = s
			if indexed {
				m.index[s.Name] = at
			}
		})
	case OpAddElements, OpDeleteElements:
		s := t.Sets[op.Set.Name]
		if s == nil {
			return unix.ENOENT
		}
		at := m.elementsOf(s)
		for _, e := range op.Elements {
			e = normalElement(s, e)
			k := elementKey(e)
			i, found := at[k]
			switch {
			case op.Kind == OpAddElements && !found:
				at[k] = len(s.Elements)
				s.Elements = append(s.Elements, copyElement(e))
				do(func() { m.removeElement(s, at, at[k]) })
			case op.Kind == OpAddElements:
				old := s.Elements[i]
				s.Elements[i] = copyElement(e)
				do(func() { s.Elements[at[k]] = old })
			case !found:
				return unix.ENOENT
			default:
				old := s.Elements[i]
				m.removeElement(s, at, i)
				do(func() {
					at[k] = len(s.Elements)
					s.Elements = append(s.Elements, old)
				})
			}
		}
	case OpAddCounter:
		if t.Counters[op.Counter.Name] != nil {
			return unix.EEXIST
		}
		t.AddCounter(&nft.Counter{Name: op.Counter.Name})
		do(func() { delete(t.Counters, op.Counter.Name) })
	case OpDeleteCounter:
		c := t.Counters[op.Counter.Name]
		if c == nil {
			return unix.ENOENT
		}
		delete(t.Counters, c.Name)
		do(func() { t.Counters[c.Name] = c })
	default:
		return fmt.Errorf("unknown plan operation %d", op.Kind)
	}
	return nil
}

// elementKey is what the kernel finds an element by: its key and key end.
func elementKey(e nft.Element) string {
	return strconv.Itoa(len(e.Key)) + ":" + string(e.Key) + string(e.KeyEnd)
}

// copyTable copies a table in read-back form: rules by ID, sets with
// their spec and elements (none for dynamic sets, as Read skips them).
func copyTable(t *nft.Table) *nft.Table {
	if t == nil {
		return nil
	}
	c := nft.NewTable(t.Name)
	for name, ch := range t.Chains {
		cc := &nft.Chain{Name: ch.Name, Base: copyHook(ch.Base)}
		for _, r := range ch.Rules {
			cc.Rules = append(cc.Rules, nft.RuleWithID(r.ID(), nil))
		}
		c.Chains[name] = cc
	}
	for name := range t.Counters {
		c.AddCounter(&nft.Counter{Name: name})
	}
	for name, s := range t.Sets {
		cs := heldSpec(s)
		if !s.Dynamic {
			for _, e := range s.Elements {
				cs.Elements = append(cs.Elements, copyElement(normalElement(s, e)))
			}
		}
		c.Sets[name] = cs
	}
	return c
}

func copyHook(h *nft.Hook) *nft.Hook {
	if h == nil {
		return nil
	}
	c := *h
	return &c
}
