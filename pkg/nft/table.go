// Package nft describes the desired state of one nftables table (chains,
// rules, sets, maps and their elements): the values, the Builder that
// makes a rule's expressions and its nft text together, and the checks of
// what the kernel would refuse. Render writes a table as nft syntax
// without the nft binary. It has no kernel connection: pkg/nft/kernel
// makes the kernel hold a table, pkg/nft/trace interprets tables, and
// pkg/nft/nftrace reads the kernel's own trace of them.
//
// Callers (the policy compiler, the service proxy) build a *Table;
// kernel.Applier.Apply makes the kernel match it.
package nft

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Table is the desired (or read-back) content of one inet table.
type Table struct {
	Name   string
	Chains map[string]*Chain
	Sets   map[string]*Set
	// Counters are the named counter objects (nil: none).
	Counters map[string]*Counter
}

// NewTable returns an empty table.
func NewTable(name string) *Table {
	return &Table{Name: name, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
}

// AddChain adds (or returns the existing) chain with that name.
func (t *Table) AddChain(c *Chain) *Chain {
	if old, ok := t.Chains[c.Name]; ok {
		return old
	}
	t.Chains[c.Name] = c
	return c
}

// AddSet adds (or returns the existing) set with that name.
func (t *Table) AddSet(s *Set) *Set {
	if old, ok := t.Sets[s.Name]; ok {
		return old
	}
	t.Sets[s.Name] = s
	return s
}

// ChainNames returns the chain names, base chains first, then by name.
func (t *Table) ChainNames() []string {
	// Base chains sort before the others: with their names prefixed by
	// 0 and the others by 1, one string comparison orders both (every
	// sync diffs a node's hundreds of chains; a lookup of each chain
	// per comparison cost more than the rest of the diff).
	keys := make([]string, 0, len(t.Chains))
	for n, c := range t.Chains {
		if c.Base != nil {
			keys = append(keys, "0"+n)
		} else {
			keys = append(keys, "1"+n)
		}
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k[1:]
	}
	return keys
}

// SetNames returns the set names in order.
func (t *Table) SetNames() []string {
	names := make([]string, 0, len(t.Sets))
	for n := range t.Sets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Counts are the kernel objects of a table.
type Counts struct {
	Chains, Rules, Sets, Elements int
}

// Count returns how many objects the table holds.
func (t *Table) Count() Counts {
	c := Counts{Chains: len(t.Chains), Sets: len(t.Sets)}
	for _, ch := range t.Chains {
		c.Rules += len(ch.Rules)
	}
	for _, s := range t.Sets {
		c.Elements += len(s.Elements)
	}
	return c
}

// Hook makes a chain a base chain.
type Hook struct {
	Type     string // "filter" or "nat"
	Hook     string // HookPrerouting, HookInput, ...
	Priority int    // 0 is "filter"
	Policy   string // "accept" or "drop"
}

// Hooks are the netfilter hooks a packet can cross, in no particular order.
const (
	HookPrerouting  = "prerouting"
	HookInput       = "input"
	HookForward     = "forward"
	HookOutput      = "output"
	HookPostrouting = "postrouting"
)

// Chain is an ordered list of rules.
type Chain struct {
	Name  string
	Base  *Hook // nil for a regular chain
	Rules []*Rule
}

// Rule is one rule: its expressions and their nft text (both from one
// Builder). Its ID, stored in the kernel as the rule's comment, is a hash
// of the expressions as they are marshalled for the kernel, not of the
// text: two rules that run differently never share an ID, so a change to
// what a rule does reaches a kernel whose table was adopted after a
// restart even when its text stays the same.
type Rule struct {
	Exprs []expr.Any
	Text  string
	// Comment says, for people, where the rule comes from. Render prints
	// it as a "#" line above the rule (once above consecutive rules of
	// one origin); it is not sent to the kernel and is not part of the
	// rule's identity.
	Comment string
	// Attribution, on a rule that logs to the verdict log, is what its
	// verdict decides (see Attribution).
	Attribution *Attribution

	// id is the rule's ID: made with the rule (Builder), read back from
	// the kernel (its comment) or kept in the Applier's cache (a rule
	// known by its ID only: Text empty).
	id string
}

// RuleWithID is a rule known by its ID (ID returns id) and, if read back
// from the kernel, its expressions; it has no Text.
func RuleWithID(id string, exprs []expr.Any) *Rule { return &Rule{Exprs: exprs, id: id} }

// ID is the hash the rule carries in the kernel as its comment. A rule read
// back from the kernel returns the comment it carries there.
func (r *Rule) ID() string {
	if r.id != "" {
		return r.id
	}
	return exprsID(r.Exprs)
}

// exprsID hashes expressions as they are marshalled for the kernel (inet
// family), each with its length.
func exprsID(exprs []expr.Any) string {
	h := sha256.New()
	var n [4]byte
	for _, e := range exprs {
		b, err := expr.Marshal(byte(nftables.TableFamilyINet), e)
		if err != nil {
			// Not sendable either; still an ID of what it is.
			b = fmt.Appendf(nil, "%T %+v", e, e)
		}
		binary.BigEndian.PutUint32(n[:], uint32(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// FieldType is the type of one field of a set key.
type FieldType int

const (
	FieldIPv4    FieldType = iota // ipv4_addr, 4 bytes
	FieldIPv6                     // ipv6_addr, 16 bytes
	FieldProto                    // inet_proto, 1 byte (padded to 4 in a concatenation)
	FieldPort                     // inet_service, 2 bytes (padded to 4 in a concatenation)
	FieldInteger                  // integer, 4 bytes (e.g. a numgen result)
)

// Set is a named set, or a verdict map when Verdict is set.
type Set struct {
	Name string
	// Fields is the key type; more than one field is a concatenation.
	Fields []FieldType
	// Interval sets hold ranges (Element.KeyEnd).
	Interval bool
	// Verdict makes the set a verdict map (Element.Verdict).
	Verdict bool
	// Data makes the set a data map (Element.Data) with this value type;
	// more than one field is a concatenation (e.g. address . port for NAT).
	Data []FieldType
	// Timeout, when not zero, is the default lifetime of an element.
	Timeout time.Duration
	// Size, when not zero, is the most elements the kernel takes; a
	// Dynamic set without one gets nft's default, 65535 (KernelSize).
	Size uint32
	// Dynamic sets are filled by rules (`update @set`), not by the
	// table's owner: kernel.Diff leaves their elements alone and
	// kernel.Read skips them.
	Dynamic bool
	// Typeof, when set, is what Render writes instead of the type line
	// (`typeof EXPR [: EXPR]`): nft can name some key types only through
	// the expressions that produce them (numgen's integer in a
	// concatenation). It does not change the kernel set.
	Typeof   string
	Elements []Element
	// Revision, when not zero, names this exact element list: a caller
	// that keeps a set's contents across syncs gives an unchanged list the
	// same revision, and kernel.Applier then skips comparing its elements.
	Revision uint64
	// Changes, when set, lists what changed since the element list with
	// revision Changes.From. If the kernel holds that revision (as last
	// applied by the same Applier), the Applier sends these changes
	// without comparing the whole list; otherwise it compares as usual.
	Changes *SetChanges
}

// SetChanges are the elements added and deleted between two revisions of
// a set's element list.
type SetChanges struct {
	From        uint64
	Add, Delete []Element
}

// WithElements returns a set with s's header (name, key and data types,
// flags, timeout, size, Typeof) and the elements els. Revision and
// Changes are left zero: they name s's element list, not els.
func (s *Set) WithElements(els []Element) *Set {
	return &Set{Name: s.Name, Fields: slices.Clone(s.Fields), Interval: s.Interval, Verdict: s.Verdict,
		Data: slices.Clone(s.Data), Timeout: s.Timeout, Size: s.Size, Dynamic: s.Dynamic, Typeof: s.Typeof, Elements: els}
}

// IsMap reports whether the set is a verdict or data map.
func (s *Set) IsMap() bool { return s.Verdict || s.Data != nil }

// Concat reports whether the key is a concatenation.
func (s *Set) Concat() bool { return len(s.Fields) > 1 }

// KeyLen is the width of the set's keys in bytes.
func (s *Set) KeyLen() int { return ValueLen(s.Fields) }

// ValueLen is the width of a key or map value of these fields: one field's
// length, or the sum of the 4-byte-padded lengths of a concatenation.
func ValueLen(fields []FieldType) int {
	if len(fields) == 1 {
		return fields[0].Len()
	}
	n := 0
	for _, f := range fields {
		n += (f.Len() + 3) &^ 3
	}
	return n
}

// KernelSize is the most elements the kernel takes in s (0: no limit):
// Size, or for a Dynamic set without one nft's default for sets that
// rules fill, so that nft lists them alike.
func (s *Set) KernelSize() uint32 {
	if s.Size == 0 && s.Dynamic {
		return 65535
	}
	return s.Size
}

// Element is one set element (or map entry). Key and KeyEnd hold the field
// values in network order, each field padded to 4 bytes when the key is a
// concatenation. KeyEnd, for interval sets, is the inclusive upper bound;
// nil means the single value Key.
//
// Canonical form (what kernel.Read returns, and what kernel.Diff
// compares after normalising desired elements the same way): in an
// interval set KeyEnd is nil when the element is a single value (Key ==
// KeyEnd) and set otherwise; in other sets KeyEnd is always nil. A range
// is one Element, whether the kernel stores it as a start/end pair (plain
// interval sets) or as one element with a key end (concatenations).
type Element struct {
	Key     []byte
	KeyEnd  []byte
	Verdict *Verdict
	// Data is a data map entry's value, fields padded as in a key.
	Data []byte
}

// VerdictKind is what a verdict does.
type VerdictKind int

const (
	Accept VerdictKind = iota
	Drop
	Return
	Jump
	Goto
)

// Verdict ends rule evaluation or moves to another chain.
type Verdict struct {
	Kind  VerdictKind
	Chain string // Jump and Goto
}

func (v Verdict) String() string {
	switch v.Kind {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Return:
		return "return"
	case Jump:
		return "jump " + v.Chain
	}
	return "goto " + v.Chain
}

// Expr is the verdict as an expression.
func (v Verdict) Expr() *expr.Verdict {
	switch v.Kind {
	case Accept:
		return &expr.Verdict{Kind: expr.VerdictAccept}
	case Drop:
		return &expr.Verdict{Kind: expr.VerdictDrop}
	case Return:
		return &expr.Verdict{Kind: expr.VerdictReturn}
	case Jump:
		return &expr.Verdict{Kind: expr.VerdictJump, Chain: v.Chain}
	}
	return &expr.Verdict{Kind: expr.VerdictGoto, Chain: v.Chain}
}
