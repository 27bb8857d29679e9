// Package trace is an exact userspace interpreter of nft tables: it runs
// a packet through the google/nftables expressions a Builder emitted (the
// values sent to the kernel, not the rule text), with the kernel's
// register layout, lookup semantics, chain stack and hook order. It is
// how netpol proves, without root, that what the kernel is given decides
// what the evaluator says. An expression it does not model is an error
// when the Tracer is built, never a guess.
package trace

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// Packet is one packet as the tracer sees it. Ports are in host order.
// For ICMP and ICMPv6 the first two transport bytes are type and code:
// set SrcPort to type<<8|code (th dport then reads the checksum, as in the
// kernel: DstPort holds it, normally 0).
type Packet struct {
	Family           *nft.Family
	Src, Dst         netip.Addr
	L4Proto          uint8
	SrcPort, DstPort uint16
	// CtState is the conntrack state bits (expr.CtStateBit*); 0 means new.
	CtState uint32
	// CtStatus is the conntrack status bits (IPS_*); dnat sets IPS_DST_NAT.
	CtStatus uint32
	// CtMark is the connection's mark (ct mark), Mark the packet's.
	CtMark uint32
	Mark   uint32
	// SrcLocal says the source address is one of this host's (fib saddr
	// type local).
	SrcLocal bool
	// IIF and OIF are the input and output interface names (meta iifname,
	// oifname; IFNAMSIZ, zero-padded as the kernel loads them); empty
	// where the hook has none. netpol's own rules match no interface.
	IIF, OIF string
	// MasqueradeTo is the address masquerade rewrites the source to (the
	// outgoing interface's).
	MasqueradeTo netip.Addr
	// OrigSrc, OrigDst and OrigDstPort are the conntrack original tuple;
	// left zero, the first hook takes them from the packet.
	OrigSrc, OrigDst netip.Addr
	OrigDstPort      uint16
	// NATDone says the connection's NAT is already set up in this network
	// namespace (a packet looped back to its own host after output): NAT
	// chains are not run again.
	NATDone bool
}

func (p *Packet) ctState() uint32 {
	if p.CtState == 0 {
		return expr.CtStateBitNEW
	}
	return p.CtState
}

// Verdict is what a hook did with a packet.
type Verdict string

const (
	Accept Verdict = "accept"
	Drop   Verdict = "drop"
	Reject Verdict = "reject"
)

// Step is one rule the packet was evaluated against, or the base
// chain policy that decided (Rule -1).
type Step struct {
	Table   string `json:"table"`
	Chain   string `json:"chain"`
	Rule    int    `json:"rule"`
	Text    string `json:"text"`
	Comment string `json:"comment,omitempty"`
	// Matched is true when every match of the rule held.
	Matched bool `json:"matched"`
	// Verdict is what the rule did when it matched: accept, drop, jump X,
	// dnat to A:P ...; empty when it matched and evaluation went on.
	Verdict string `json:"verdict,omitempty"`
	// Element is the set or map element that matched (each, comma
	// separated, when the rule has several lookups), in nft syntax.
	Element string `json:"element,omitempty"`
	// RuleID is the rule's ID (the kernel's comment of it): what a
	// trace of the kernel names it by.
	RuleID string `json:"-"`
}

// Result is one way a packet crossed a hook: with numgen in the path,
// one result per alternative.
type Result struct {
	Verdict Verdict
	// Packet is the packet after the hook (NAT applied).
	Packet Packet
	Steps  []Step
	// Choices are the numgen values this alternative took, in order.
	Choices []uint32
}

// Tracer evaluates packets against a fixed set of tables.
type Tracer struct {
	hooks map[string][]*tChain // base chains per hook, by priority
}

type tTable struct {
	name   string
	chains map[string]*tChain
	sets   map[string]*tSet
}

type tChain struct {
	table *tTable
	name  string
	base  *nft.Hook
	rules []*tRule
}

type tRule struct {
	index int
	rule  *nft.Rule
	ops   []op
	// nfproto, when not 0, is the family the rule's first match requires
	// (meta nfproto == X): a packet of another family fails that match
	// with no other effect, so the rule is skipped without evaluating it.
	nfproto byte
	// never: the rule looks up an empty set before it does anything but
	// load and compare, so no packet matches it (most of a table without
	// Services, for one); it is skipped without evaluating it.
	never bool
}

// op is one expression, with the objects it names resolved and its
// registers turned into byte offsets (checked once, when the Tracer is
// built).
type op struct {
	e     expr.Any
	set   *tSet   // lookups
	chain *tChain // jump/goto verdicts
	reg   int     // the register read, or written by a load
	reg2  int     // a second register: bitwise/lookup/dnat destination or port
	n     int     // bytes read or loaded
}

type tSet struct {
	s       *nft.Set
	keyLen  int
	fields  []int // field lengths, unpadded
	dataLen int   // a data map's value, padded as a key
	hash    map[string]int
	sorted  []int // interval sets of one field: element indexes by Key
	// Concatenated interval sets: element indexes by their first field's
	// start (byFirst), and the greatest first-field end among
	// byFirst[:i+1] (firstEnds[i]), so that a lookup looks only at the
	// elements whose first field can hold the key.
	byFirst   []int
	firstEnds [][]byte
	targets   []*tChain
	interval  bool
	// all: a dynamic set traced as holding every key (Options).
	all bool
}

// NewTracer prepares tables for tracing. It fails on any expression, set
// or chain reference it cannot evaluate exactly.
func NewTracer(tables ...*nft.Table) (*Tracer, error) {
	return NewTracerWith(Options{}, tables...)
}

// Options change what a Tracer assumes of what the tables do not say.
type Options struct {
	// DynamicSetsHoldAll traces each dynamic set that is not a map (the
	// kernel fills it from packets or the agent's DNS learning; the table
	// leaves it empty) as holding every key, instead of none: a packet
	// then passes every rule that only such a set could let it pass.
	// Strict mode asks it: a flow that no learned address could admit.
	DynamicSetsHoldAll bool
}

// NewTracerWith is NewTracer with opts.
func NewTracerWith(opts Options, tables ...*nft.Table) (*Tracer, error) {
	tr := &Tracer{hooks: map[string][]*tChain{}}
	for _, t := range tables {
		tt := &tTable{name: t.Name, chains: map[string]*tChain{}, sets: map[string]*tSet{}}
		for name, s := range t.Sets {
			ts, err := newTSet(s)
			if err != nil {
				return nil, fmt.Errorf("table %s: %w", t.Name, err)
			}
			ts.all = opts.DynamicSetsHoldAll && s.Dynamic && len(s.Data) == 0 && !s.Verdict
			tt.sets[name] = ts
		}
		for name, c := range t.Chains {
			tt.chains[name] = &tChain{table: tt, name: name, base: c.Base}
		}
		for name, c := range t.Chains {
			tc := tt.chains[name]
			for i, r := range c.Rules {
				ops, err := tt.resolve(r)
				if err != nil {
					return nil, fmt.Errorf("table %s chain %s rule %d (%s): %w", t.Name, name, i, r.Text, err)
				}
				tc.rules = append(tc.rules, &tRule{index: i, rule: r, ops: ops, nfproto: familyMatch(ops), never: neverMatches(ops)})
			}
			if c.Base != nil {
				tr.hooks[c.Base.Hook] = append(tr.hooks[c.Base.Hook], tc)
			}
		}
		for _, ts := range tt.sets {
			if !ts.s.Verdict {
				continue
			}
			ts.targets = make([]*tChain, len(ts.s.Elements))
			for i, e := range ts.s.Elements {
				if e.Verdict == nil {
					return nil, fmt.Errorf("table %s: verdict map %s: element %x has no verdict", t.Name, ts.s.Name, e.Key)
				}
				if e.Verdict.Kind == nft.Jump || e.Verdict.Kind == nft.Goto {
					if ts.targets[i] = tt.chains[e.Verdict.Chain]; ts.targets[i] == nil {
						return nil, fmt.Errorf("table %s: verdict map %s: no chain %s", t.Name, ts.s.Name, e.Verdict.Chain)
					}
				}
			}
		}
	}
	for _, cs := range tr.hooks {
		// The kernel runs a hook's base chains by priority; ties have no
		// defined order, so take one deterministic order.
		sort.SliceStable(cs, func(i, j int) bool {
			if cs[i].base.Priority != cs[j].base.Priority {
				return cs[i].base.Priority < cs[j].base.Priority
			}
			if cs[i].table.name != cs[j].table.name {
				return cs[i].table.name < cs[j].table.name
			}
			return cs[i].name < cs[j].name
		})
	}
	return tr, nil
}

func newTSet(s *nft.Set) (*tSet, error) {
	ts := &tSet{s: s, interval: s.Interval}
	for _, f := range s.Fields {
		ts.fields = append(ts.fields, f.Len())
		n := f.Len()
		if len(s.Fields) > 1 {
			n = (n + 3) &^ 3
		}
		ts.keyLen += n
	}
	for _, f := range s.Data {
		n := f.Len()
		if len(s.Data) > 1 {
			n = (n + 3) &^ 3
		}
		ts.dataLen += n
	}
	if s.Dynamic {
		// Filled by the kernel from packets (affinity): the tracer models
		// a client the kernel has not seen yet, so the set is empty.
		return ts, nil
	}
	switch {
	case !s.Interval:
		ts.hash = make(map[string]int, len(s.Elements))
		for i, e := range s.Elements {
			if len(e.Key) != ts.keyLen {
				return nil, fmt.Errorf("set %s: element %x: key of %d bytes, want %d", s.Name, e.Key, len(e.Key), ts.keyLen)
			}
			ts.hash[string(e.Key)] = i
		}
	case len(s.Fields) == 1:
		ts.sorted = make([]int, len(s.Elements))
		for i := range ts.sorted {
			ts.sorted[i] = i
		}
		sort.Slice(ts.sorted, func(a, b int) bool {
			return bytes.Compare(s.Elements[ts.sorted[a]].Key, s.Elements[ts.sorted[b]].Key) < 0
		})
	default:
		ts.indexFirstField()
	}
	return ts, nil
}

// indexFirstField makes byFirst and firstEnds.
func (s *tSet) indexFirstField() {
	els, n := s.s.Elements, s.fields[0]
	for i := range els {
		if len(els[i].Key) < n || len(elementEnd(&els[i])) < n {
			return // fieldsWithin refuses such an element: no index, the scan says so
		}
	}
	s.byFirst = make([]int, len(els))
	for i := range s.byFirst {
		s.byFirst[i] = i
	}
	sort.SliceStable(s.byFirst, func(a, b int) bool {
		return bytes.Compare(els[s.byFirst[a]].Key[:n], els[s.byFirst[b]].Key[:n]) < 0
	})
	s.firstEnds = make([][]byte, len(els))
	for j, i := range s.byFirst {
		end := elementEnd(&els[i])[:n]
		if j > 0 && bytes.Compare(s.firstEnds[j-1], end) > 0 {
			end = s.firstEnds[j-1]
		}
		s.firstEnds[j] = end
	}
}

// resolve checks every expression of r, resolves the sets and chains it
// names and the registers it uses.
func (tt *tTable) resolve(r *nft.Rule) ([]op, error) {
	ops := make([]op, len(r.Exprs))
	for i, e := range r.Exprs {
		if err := tt.resolveOp(&ops[i], e); err != nil {
			return nil, err
		}
	}
	return ops, nil
}

func pad4(n int) int { return (n + 3) &^ 3 }

// neverMatches reports whether a rule fails on a lookup in an empty set
// before any expression with an effect (a statement, a verdict, numgen).
func neverMatches(ops []op) bool {
	for _, o := range ops {
		switch e := o.e.(type) {
		case *expr.Meta:
			if e.SourceRegister {
				return false
			}
		case *expr.Ct:
			if e.SourceRegister {
				return false
			}
		case *expr.Cmp, *expr.Range, *expr.Bitwise, *expr.Byteorder, *expr.Payload, *expr.Immediate, *expr.Fib:
		case *expr.Lookup:
			if !e.Invert && !o.set.s.Dynamic && len(o.set.s.Elements) == 0 {
				return true
			}
		default:
			return false
		}
	}
	return false
}

// familyMatch is the family a rule's leading `meta nfproto == X` requires,
// or 0.
func familyMatch(ops []op) byte {
	if len(ops) < 2 {
		return 0
	}
	m, ok := ops[0].e.(*expr.Meta)
	c, ok2 := ops[1].e.(*expr.Cmp)
	if !ok || !ok2 || m.SourceRegister || m.Key != expr.MetaKeyNFPROTO || c.Op != expr.CmpOpEq || len(c.Data) != 1 || ops[1].reg != ops[0].reg {
		return 0
	}
	return c.Data[0]
}

func (tt *tTable) resolveOp(o *op, e expr.Any) error {
	o.e = e
	var err error
	at := func(reg uint32, n int) int {
		off, e := regOffset(reg, n)
		if e != nil && err == nil {
			err = e
		}
		return off
	}
	switch e := e.(type) {
	case *expr.Meta:
		switch e.Key {
		case expr.MetaKeyNFPROTO, expr.MetaKeyL4PROTO:
			if e.SourceRegister {
				return fmt.Errorf("meta set of key %d is not modelled", e.Key)
			}
			o.n = 1
		case expr.MetaKeyMARK:
			o.n = 4
		case expr.MetaKeyNFTRACE:
			if !e.SourceRegister {
				return fmt.Errorf("meta nftrace load is not modelled")
			}
			o.n = 1
		case expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME:
			if e.SourceRegister {
				return fmt.Errorf("meta set of key %d is not modelled", e.Key)
			}
			o.n = unix.IFNAMSIZ
		default:
			return fmt.Errorf("meta key %d is not modelled", e.Key)
		}
		o.reg = at(e.Register, pad4(o.n))
	case *expr.Cmp:
		switch e.Op {
		case expr.CmpOpEq, expr.CmpOpNeq, expr.CmpOpLt, expr.CmpOpLte, expr.CmpOpGt, expr.CmpOpGte:
		default:
			return fmt.Errorf("cmp op %d is not modelled", e.Op)
		}
		o.n = len(e.Data)
		o.reg = at(e.Register, o.n)
	case *expr.Range:
		if e.Op != expr.CmpOpEq && e.Op != expr.CmpOpNeq {
			return fmt.Errorf("range op %d is not modelled", e.Op)
		}
		if len(e.FromData) != len(e.ToData) {
			return fmt.Errorf("range bounds of different lengths")
		}
		o.n = len(e.FromData)
		o.reg = at(e.Register, o.n)
	case *expr.Counter, *expr.Log, *expr.Limit, *expr.Objref:
	case *expr.Immediate:
		if e.Register == 0 {
			return fmt.Errorf("immediate verdicts are not modelled")
		}
		o.n = len(e.Data)
		o.reg = at(e.Register, pad4(o.n))
	case *expr.Bitwise:
		if len(e.Mask) != int(e.Len) || len(e.Xor) != int(e.Len) {
			return fmt.Errorf("bitwise: mask/xor length differs from %d", e.Len)
		}
		o.n = int(e.Len)
		o.reg, o.reg2 = at(e.SourceRegister, o.n), at(e.DestRegister, pad4(o.n))
	case *expr.Byteorder:
		if e.Size != 2 && e.Size != 4 && e.Size != 8 || e.Len%e.Size != 0 {
			return fmt.Errorf("byteorder: size %d, length %d is not modelled", e.Size, e.Len)
		}
		o.n = int(e.Len)
		o.reg, o.reg2 = at(e.SourceRegister, pad4(o.n)), at(e.DestRegister, pad4(o.n))
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad {
			return fmt.Errorf("payload write is not modelled")
		}
		if e.Base != expr.PayloadBaseNetworkHeader && e.Base != expr.PayloadBaseTransportHeader {
			return fmt.Errorf("payload base %d is not modelled", e.Base)
		}
		o.n = int(e.Len)
		o.reg = at(e.DestRegister, pad4(o.n))
	case *expr.Ct:
		if e.SourceRegister && e.Key != expr.CtKeyMARK || e.Direction != 0 {
			return fmt.Errorf("ct set of a key other than mark, or a reply-direction key, is not modelled")
		}
		switch e.Key {
		case expr.CtKeySTATE, expr.CtKeySTATUS, expr.CtKeyMARK, unix.NFT_CT_SRC_IP, unix.NFT_CT_DST_IP:
			o.n = 4
		case unix.NFT_CT_SRC_IP6, unix.NFT_CT_DST_IP6:
			o.n = 16
		case expr.CtKeyPROTODST:
			o.n = 2
		default:
			return fmt.Errorf("ct key %d is not modelled", e.Key)
		}
		o.reg = at(e.Register, pad4(o.n))
	case *expr.Lookup:
		s := tt.sets[e.SetName]
		if s == nil {
			return fmt.Errorf("lookup in missing set %s", e.SetName)
		}
		o.set, o.n = s, s.keyLen
		o.reg = at(e.SourceRegister, s.keyLen)
		if e.IsDestRegSet {
			switch {
			case e.DestRegister == 0 && !s.s.Verdict:
				return fmt.Errorf("verdict lookup in %s, which is not a verdict map", e.SetName)
			case e.DestRegister != 0 && s.s.Data == nil:
				return fmt.Errorf("data lookup in %s, which is not a data map", e.SetName)
			case e.DestRegister != 0:
				o.reg2 = at(e.DestRegister, pad4(s.dataLen))
			}
		}
	case *expr.Dynset:
		s := tt.sets[e.SetName]
		if s == nil || !s.s.Dynamic {
			return fmt.Errorf("update of %s, which is not a dynamic set", e.SetName)
		}
		o.set = s
	case *expr.Verdict:
		switch e.Kind {
		case expr.VerdictAccept, expr.VerdictDrop, expr.VerdictReturn, expr.VerdictContinue, expr.VerdictBreak:
		case expr.VerdictJump, expr.VerdictGoto:
			if o.chain = tt.chains[e.Chain]; o.chain == nil {
				return fmt.Errorf("%s to missing chain %s", verdictWord(e.Kind), e.Chain)
			}
		default:
			return fmt.Errorf("verdict %d is not modelled", e.Kind)
		}
	case *expr.Numgen:
		if e.Modulus == 0 {
			return fmt.Errorf("numgen with modulus 0")
		}
		o.reg = at(e.Register, 4)
	case *expr.NAT:
		if e.Type != expr.NATTypeDestNAT || e.RegAddrMin == 0 || e.RegProtoMin == 0 {
			return fmt.Errorf("only dnat to an address and port is modelled")
		}
		switch e.Family {
		case unix.NFPROTO_IPV4:
			o.n = 4
		case unix.NFPROTO_IPV6:
			o.n = 16
		default:
			return fmt.Errorf("dnat of family %d is not modelled", e.Family)
		}
		o.reg, o.reg2 = at(e.RegAddrMin, o.n), at(e.RegProtoMin, 2)
	case *expr.Masq, *expr.Reject:
	case *expr.Queue, *expr.Target:
		if _, ok := nft.QueueNum(e); !ok {
			return fmt.Errorf("xtables target %v is not modelled (only NFQUEUE with its info)", e)
		}
	case *expr.Fib:
		if !e.FlagSADDR || !e.ResultADDRTYPE || e.FlagDADDR || e.FlagIIF || e.FlagOIF || e.FlagMARK {
			return fmt.Errorf("only fib saddr type is modelled")
		}
		o.reg = at(e.Register, 4)
	default:
		return fmt.Errorf("expression %T is not modelled", e)
	}
	return err
}

func verdictWord(k expr.VerdictKind) string {
	if k == expr.VerdictJump {
		return "jump"
	}
	return "goto"
}

// Trace runs pkt through hook, one result per numgen alternative, with
// every rule visited.
func (t *Tracer) Trace(hook string, pkt Packet) ([]Result, error) {
	var out []Result
	err := t.alternatives(hook, pkt, true, func(r Result) bool {
		out = append(out, r)
		return true
	})
	return out, err
}

// Verdicts runs pkt through hook and calls each with the outcome of every
// numgen alternative, without recording steps, until each returns false.
func (t *Tracer) Verdicts(hook string, pkt Packet, each func(Result) bool) error {
	return t.alternatives(hook, pkt, false, each)
}

// maxAlternatives bounds the numgen enumeration of one packet.
const maxAlternatives = 1 << 16

// evaluations are reused: a truth table traces millions of packets.
var evaluations = sync.Pool{New: func() any { return new(evaluation) }}

func (t *Tracer) alternatives(hook string, pkt Packet, record bool, each func(Result) bool) error {
	ev := evaluations.Get().(*evaluation)
	ev.record, ev.c.values, ev.c.moduli, ev.steps = record, ev.c.values[:0], ev.c.moduli[:0], nil
	defer evaluations.Put(ev)
	for n := 0; ; n++ {
		if n == maxAlternatives {
			return fmt.Errorf("more than %d numgen alternatives", maxAlternatives)
		}
		ev.c.pos = 0
		r, err := t.run(hook, pkt, ev)
		if err != nil {
			return err
		}
		if len(ev.c.values) > 0 {
			r.Choices = append([]uint32(nil), ev.c.values...)
		}
		if !each(r) || !ev.c.next() {
			return nil
		}
	}
}

// choices walks every combination of the numgen values a packet meets.
type choices struct {
	values, moduli []uint32
	pos            int
}

func (c *choices) take(mod uint32) uint32 {
	if c.pos == len(c.values) {
		c.values, c.moduli = append(c.values, 0), append(c.moduli, mod)
	}
	v := c.values[c.pos]
	c.pos++
	return v
}

// next advances to the next combination; false when all were taken. Later
// choices depend on earlier ones, so they are dropped and rediscovered.
func (c *choices) next() bool {
	c.values, c.moduli = c.values[:c.pos], c.moduli[:c.pos]
	for i := len(c.values) - 1; i >= 0; i-- {
		if c.values[i]+1 < c.moduli[i] {
			c.values[i]++
			c.values, c.moduli = c.values[:i+1], c.moduli[:i+1]
			return true
		}
	}
	return false
}

// run is one pass of the packet through hook's base chains.
func (t *Tracer) run(hook string, pkt Packet, ev *evaluation) (Result, error) {
	if !pkt.OrigDst.IsValid() {
		pkt.OrigSrc, pkt.OrigDst, pkt.OrigDstPort = pkt.Src, pkt.Dst, pkt.DstPort
	}
	ev.pkt, ev.steps = &pkt, nil
	for _, bc := range t.hooks[hook] {
		if bc.base.Type == "nat" && (pkt.ctState()&expr.CtStateBitNEW == 0 || pkt.NATDone) {
			continue // NAT chains see only a connection's first packet
		}
		v, err := ev.chain(bc)
		if err != nil {
			return Result{}, fmt.Errorf("table %s chain %s: %w", bc.table.name, bc.name, err)
		}
		if v != Accept {
			return Result{Verdict: v, Packet: pkt, Steps: ev.steps}, nil
		}
	}
	return Result{Verdict: Accept, Packet: pkt, Steps: ev.steps}, nil
}

// evaluation is the state of one packet in one hook.
type evaluation struct {
	pkt    *Packet
	regs   [80]byte // NFT_REG_VERDICT..NFT_REG_4 = NFT_REG32_00..15, as the kernel lays them out
	record bool
	steps  []Step
	c      choices
	stack  []frame
	// element is the text of the element the current rule's last lookup
	// matched (recording only).
	element string
}

// regOffset is the byte offset of a register in regs.
func regOffset(r uint32, n int) (int, error) {
	var off int
	switch {
	case r >= 1 && r <= 4:
		off = int(r) * 16
	case r >= unix.NFT_REG32_00 && r <= unix.NFT_REG32_15:
		off = (int(r) - unix.NFT_REG32_00 + 4) * 4
	default:
		return 0, fmt.Errorf("register %d is not a data register", r)
	}
	if off+n > 80 {
		return 0, fmt.Errorf("%d bytes from register %d overrun the registers", n, r)
	}
	return off, nil
}

// store writes data at a register offset, zeroing the rest of its last
// 32-bit word as the kernel's loads do.
func (ev *evaluation) store(off int, data []byte) {
	dst := ev.regs[off : off+pad4(len(data))]
	clear(dst)
	copy(dst, data)
}

func (ev *evaluation) storeUint32(off int, v uint32) {
	binary.NativeEndian.PutUint32(ev.regs[off:off+4], v)
}

func (ev *evaluation) storeAddr(off int, f *nft.Family, a netip.Addr) {
	if f.AddrLen == 4 {
		b := a.Unmap().As4()
		copy(ev.regs[off:off+4], b[:])
		return
	}
	b := a.As16()
	copy(ev.regs[off:off+16], b[:])
}

type frame struct {
	c    *tChain
	next int
}

// chain runs a base chain and the chains it jumps to.
func (ev *evaluation) chain(base *tChain) (Verdict, error) {
	stack := ev.stack[:0]
	cur, ri := base, 0
	for {
		if ri >= len(cur.rules) {
			if len(stack) == 0 {
				return ev.policy(base), nil
			}
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			cur, ri = top.c, top.next
			continue
		}
		rule := cur.rules[ri]
		ri++
		ev.element = ""
		var res ruleResult
		if !rule.never && (rule.nfproto == 0 || rule.nfproto == ev.pkt.Family.NFProto) {
			var err error
			if res, err = ev.rule(rule); err != nil {
				return "", fmt.Errorf("rule %d (%s): %w", rule.index, rule.rule.Text, err)
			}
		}
		if ev.record {
			step := Step{Table: cur.table.name, Chain: cur.name, Rule: rule.index, Text: rule.rule.Text, RuleID: rule.rule.ID(),
				Comment: rule.rule.Comment, Matched: res.matched, Element: ev.element}
			if res.matched {
				step.Verdict = res.text()
			}
			ev.steps = append(ev.steps, step)
		}
		if !res.matched {
			continue
		}
		switch res.kind {
		case resContinue:
		case resAccept:
			return Accept, nil
		case resDrop:
			return Drop, nil
		case resReject:
			return Reject, nil
		case resReturn:
			if len(stack) == 0 {
				return ev.policy(base), nil
			}
			top := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			cur, ri = top.c, top.next
		case resJump:
			if len(stack) == 16 {
				return "", fmt.Errorf("jump stack exceeds 16 chains (the kernel's limit)")
			}
			stack = append(stack, frame{cur, ri})
			ev.stack = stack // keep the grown array for the next packet
			cur, ri = res.chain, 0
		case resGoto:
			cur, ri = res.chain, 0
		}
	}
}

func (ev *evaluation) policy(base *tChain) Verdict {
	v := Accept
	if base.base.Policy == "drop" {
		v = Drop
	}
	if ev.record {
		ev.steps = append(ev.steps, Step{Table: base.table.name, Chain: base.name, Rule: -1,
			Text: "policy " + string(v), Matched: true, Verdict: string(v)})
	}
	return v
}

type resultKind int

const (
	resContinue resultKind = iota
	resAccept
	resDrop
	resReject
	resReturn
	resJump
	resGoto
)

type ruleResult struct {
	matched bool
	kind    resultKind
	chain   *tChain
	nat     string // what a NAT or queue statement did
}

func (r ruleResult) text() string {
	switch r.kind {
	case resAccept:
		if r.nat != "" {
			return r.nat
		}
		return "accept"
	case resDrop:
		return "drop"
	case resReject:
		return "reject"
	case resReturn:
		return "return"
	case resJump:
		return "jump " + r.chain.name
	case resGoto:
		return "goto " + r.chain.name
	}
	return ""
}

var noMatch = ruleResult{}

// rule evaluates one rule's expressions in order.
func (ev *evaluation) rule(r *tRule) (ruleResult, error) {
	p := ev.pkt
	regs := &ev.regs
	for i := range r.ops {
		o := &r.ops[i]
		switch e := o.e.(type) {
		case *expr.Meta:
			switch {
			case e.SourceRegister && e.Key == expr.MetaKeyMARK:
				p.Mark = binary.NativeEndian.Uint32(regs[o.reg : o.reg+4])
			case e.SourceRegister:
				// nftrace set: no effect on the verdict
			case e.Key == expr.MetaKeyNFPROTO:
				ev.storeUint32(o.reg, 0)
				regs[o.reg] = p.Family.NFProto
			case e.Key == expr.MetaKeyL4PROTO:
				ev.storeUint32(o.reg, 0)
				regs[o.reg] = p.L4Proto
			case e.Key == expr.MetaKeyIIFNAME || e.Key == expr.MetaKeyOIFNAME:
				name := p.IIF
				if e.Key == expr.MetaKeyOIFNAME {
					name = p.OIF
				}
				dst := regs[o.reg : o.reg+unix.IFNAMSIZ]
				clear(dst)
				copy(dst[:unix.IFNAMSIZ-1], name)
			default:
				ev.storeUint32(o.reg, p.Mark)
			}
		case *expr.Cmp:
			b := regs[o.reg : o.reg+o.n]
			var ok bool
			switch e.Op {
			case expr.CmpOpEq:
				ok = o.n == 1 && b[0] == e.Data[0] || o.n != 1 && bytes.Equal(b, e.Data)
			case expr.CmpOpNeq:
				ok = o.n == 1 && b[0] != e.Data[0] || o.n != 1 && !bytes.Equal(b, e.Data)
			}
			c := 0
			if e.Op != expr.CmpOpEq && e.Op != expr.CmpOpNeq {
				c = bytes.Compare(b, e.Data)
			}
			switch e.Op {
			case expr.CmpOpLt:
				ok = c < 0
			case expr.CmpOpLte:
				ok = c <= 0
			case expr.CmpOpGt:
				ok = c > 0
			case expr.CmpOpGte:
				ok = c >= 0
			}
			if !ok {
				return noMatch, nil
			}
		case *expr.Range:
			b := regs[o.reg : o.reg+o.n]
			in := bytes.Compare(b, e.FromData) >= 0 && bytes.Compare(b, e.ToData) <= 0
			if in == (e.Op == expr.CmpOpNeq) {
				return noMatch, nil
			}
		case *expr.Bitwise:
			var out [64]byte
			for k := 0; k < o.n; k++ {
				out[k] = regs[o.reg+k]&e.Mask[k] ^ e.Xor[k]
			}
			ev.store(o.reg2, out[:o.n])
		case *expr.Byteorder:
			// Each Size-byte word between host order and network order
			// (the same reversal either way on a little-endian host).
			var out [64]byte
			copy(out[:o.n], regs[o.reg:o.reg+o.n])
			for w := 0; w < o.n; w += int(e.Size) {
				word := out[w : w+int(e.Size)]
				switch e.Size {
				case 2:
					binary.BigEndian.PutUint16(word, binary.NativeEndian.Uint16(word))
				case 4:
					binary.BigEndian.PutUint32(word, binary.NativeEndian.Uint32(word))
				case 8:
					binary.BigEndian.PutUint64(word, binary.NativeEndian.Uint64(word))
				}
			}
			ev.store(o.reg2, out[:o.n])
		case *expr.Payload:
			if err := ev.payload(o, e); err != nil {
				return noMatch, err
			}
		case *expr.Ct:
			switch e.Key {
			case expr.CtKeyMARK:
				if e.SourceRegister {
					p.CtMark = binary.NativeEndian.Uint32(regs[o.reg : o.reg+4])
				} else {
					ev.storeUint32(o.reg, p.CtMark)
				}
			case expr.CtKeySTATE:
				ev.storeUint32(o.reg, p.ctState())
			case expr.CtKeySTATUS:
				ev.storeUint32(o.reg, p.CtStatus)
			case unix.NFT_CT_SRC_IP, unix.NFT_CT_SRC_IP6:
				if err := ev.ctAddr(o, p.OrigSrc); err != nil {
					return noMatch, err
				}
			case unix.NFT_CT_DST_IP, unix.NFT_CT_DST_IP6:
				if err := ev.ctAddr(o, p.OrigDst); err != nil {
					return noMatch, err
				}
			case expr.CtKeyPROTODST:
				ev.storeUint32(o.reg, 0)
				binary.BigEndian.PutUint16(regs[o.reg:o.reg+2], p.OrigDstPort)
			}
		case *expr.Lookup:
			res, matched := ev.lookup(o, e)
			if !matched {
				return noMatch, nil
			}
			if res.kind != resContinue {
				return res, nil
			}
		case *expr.Dynset:
			// update @set: the tracer keeps no per-client state.
		case *expr.Immediate:
			ev.store(o.reg, e.Data)
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictAccept:
				return ruleResult{matched: true, kind: resAccept}, nil
			case expr.VerdictDrop:
				return ruleResult{matched: true, kind: resDrop}, nil
			case expr.VerdictReturn:
				return ruleResult{matched: true, kind: resReturn}, nil
			case expr.VerdictJump:
				return ruleResult{matched: true, kind: resJump, chain: o.chain}, nil
			case expr.VerdictGoto:
				return ruleResult{matched: true, kind: resGoto, chain: o.chain}, nil
			case expr.VerdictBreak:
				return noMatch, nil
			}
			// continue: the kernel goes on with the rule's next expression.
		case *expr.Numgen:
			ev.storeUint32(o.reg, ev.c.take(e.Modulus)+e.Offset)
		case *expr.NAT:
			if uint32(p.Family.NFProto) != e.Family {
				return noMatch, fmt.Errorf("dnat of family %d on a packet of family %d", e.Family, p.Family.NFProto)
			}
			a, _ := netip.AddrFromSlice(regs[o.reg : o.reg+o.n])
			p.Dst, p.DstPort = a, binary.BigEndian.Uint16(regs[o.reg2:o.reg2+2])
			p.CtStatus |= nft.IPSDstNAT
			res := ruleResult{matched: true, kind: resAccept}
			if ev.record {
				res.nat = "dnat to " + netip.AddrPortFrom(p.Dst, p.DstPort).String()
			}
			return res, nil
		case *expr.Masq:
			if !p.MasqueradeTo.IsValid() {
				return noMatch, fmt.Errorf("masquerade, but the packet has no outgoing address (MasqueradeTo)")
			}
			p.Src = p.MasqueradeTo
			p.CtStatus |= ipsSrcNAT
			res := ruleResult{matched: true, kind: resAccept}
			if ev.record {
				res.nat = "masquerade to " + p.Src.String()
			}
			return res, nil
		case *expr.Reject:
			return ruleResult{matched: true, kind: resReject}, nil
		case *expr.Queue, *expr.Target:
			// The reader (the agent) learns and accepts; with no reader,
			// bypass accepts. Either way the hook's next chain goes on.
			res := ruleResult{matched: true, kind: resAccept}
			if ev.record {
				num, _ := nft.QueueNum(e)
				res.nat = fmt.Sprintf("queue to %d (the agent learns from the packet and accepts it)", num)
			}
			return res, nil
		case *expr.Fib:
			t := uint32(unix.RTN_UNICAST)
			if p.SrcLocal {
				t = unix.RTN_LOCAL
			}
			ev.storeUint32(o.reg, t)
		case *expr.Limit:
			// One packet is within any rate: `limit rate` matches,
			// `limit rate over` does not.
			if e.Over {
				return noMatch, nil
			}
		case *expr.Counter, *expr.Log, *expr.Objref:
		}
	}
	return ruleResult{matched: true}, nil
}

// ipsSrcNAT is IPS_SRC_NAT.
const ipsSrcNAT = 1 << 4

func (ev *evaluation) ctAddr(o *op, a netip.Addr) error {
	f := ev.pkt.Family
	if int(f.AddrLen) != o.n {
		return fmt.Errorf("ct %d-byte address on an %s packet", o.n, f.Name)
	}
	ev.storeAddr(o.reg, f, a)
	return nil
}

// payload loads a header field of the packet.
func (ev *evaluation) payload(o *op, e *expr.Payload) error {
	p := ev.pkt
	if pad4(o.n) > o.n {
		ev.storeUint32(o.reg+pad4(o.n)-4, 0)
	}
	if e.Base == expr.PayloadBaseTransportHeader {
		th := [4]byte{byte(p.SrcPort >> 8), byte(p.SrcPort), byte(p.DstPort >> 8), byte(p.DstPort)}
		if int(e.Offset)+o.n > len(th) {
			return fmt.Errorf("transport header bytes %d-%d are not modelled", e.Offset, int(e.Offset)+o.n-1)
		}
		copy(ev.regs[o.reg:], th[e.Offset:int(e.Offset)+o.n])
		return nil
	}
	f := p.Family
	switch {
	case e.Offset == f.SrcOffset && uint32(o.n) == f.AddrLen:
		ev.storeAddr(o.reg, f, p.Src)
	case e.Offset == f.DstOffset && uint32(o.n) == f.AddrLen:
		ev.storeAddr(o.reg, f, p.Dst)
	default:
		return fmt.Errorf("%s header bytes %d-%d are not modelled", f.Name, e.Offset, int(e.Offset)+o.n-1)
	}
	return nil
}

// lookup runs a set or map lookup. For a verdict map the result carries
// the element's verdict; for a data map the value is loaded.
func (ev *evaluation) lookup(o *op, e *expr.Lookup) (ruleResult, bool) {
	s := o.set
	if s.all {
		if ev.record {
			if ev.element != "" {
				ev.element += ", "
			}
			ev.element += "any (dynamic, traced as holding every key)"
		}
		return ruleResult{matched: true}, !e.Invert
	}
	i := s.find(ev.regs[o.reg : o.reg+o.n])
	if e.Invert {
		return ruleResult{matched: true}, i < 0
	}
	if i < 0 {
		return noMatch, false
	}
	el := &s.s.Elements[i]
	if ev.record {
		if ev.element != "" {
			ev.element += ", "
		}
		ev.element += s.s.ElementText(*el)
	}
	if !e.IsDestRegSet {
		return ruleResult{matched: true}, true
	}
	if e.DestRegister != 0 {
		ev.store(o.reg2, el.Data)
		return ruleResult{matched: true}, true
	}
	switch el.Verdict.Kind {
	case nft.Accept:
		return ruleResult{matched: true, kind: resAccept}, true
	case nft.Drop:
		return ruleResult{matched: true, kind: resDrop}, true
	case nft.Return:
		return ruleResult{matched: true, kind: resReturn}, true
	case nft.Jump:
		return ruleResult{matched: true, kind: resJump, chain: s.targets[i]}, true
	}
	return ruleResult{matched: true, kind: resGoto, chain: s.targets[i]}, true
}

// find returns the index of the element that holds key, or -1.
func (s *tSet) find(key []byte) int {
	if s.s.Dynamic {
		return -1
	}
	if !s.interval {
		if i, ok := s.hash[string(key)]; ok {
			return i
		}
		return -1
	}
	els := s.s.Elements
	if s.sorted != nil {
		// Elements do not overlap: the candidate is the last one that
		// starts at or below key.
		lo, hi := 0, len(s.sorted)
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if bytes.Compare(els[s.sorted[mid]].Key, key) > 0 {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		k := lo - 1
		if k < 0 {
			return -1
		}
		i := s.sorted[k]
		if bytes.Compare(key, elementEnd(&els[i])) <= 0 {
			return i
		}
		return -1
	}
	// A concatenation of ranges: every field within its own range. Of
	// several elements that hold the key, the first (a map's data is
	// that element's, as the scan without an index finds it).
	if s.byFirst == nil {
		for i := range els {
			if s.fieldsWithin(key, &els[i]) {
				return i
			}
		}
		return -1
	}
	n := s.fields[0]
	first := key[:n]
	// Candidates start at or below the key's first field, and end at or
	// above it: walk down from the last start until no earlier element
	// reaches it.
	j := sort.Search(len(s.byFirst), func(j int) bool { return bytes.Compare(els[s.byFirst[j]].Key[:n], first) > 0 })
	found := -1
	for j--; j >= 0 && bytes.Compare(s.firstEnds[j], first) >= 0; j-- {
		if i := s.byFirst[j]; (found < 0 || i < found) && s.fieldsWithin(key, &els[i]) {
			found = i
		}
	}
	return found
}

func elementEnd(e *nft.Element) []byte {
	if e.KeyEnd != nil {
		return e.KeyEnd
	}
	return e.Key
}

func (s *tSet) fieldsWithin(key []byte, e *nft.Element) bool {
	end := elementEnd(e)
	off := 0
	for _, n := range s.fields {
		if off+n > len(e.Key) || off+n > len(end) {
			return false
		}
		v := key[off : off+n]
		if bytes.Compare(v, e.Key[off:off+n]) < 0 || bytes.Compare(v, end[off:off+n]) > 0 {
			return false
		}
		off += (n + 3) &^ 3
	}
	return true
}

// String renders a step as one line of a path.
func (s Step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s", s.Table, s.Chain)
	if s.Rule >= 0 {
		fmt.Fprintf(&b, " #%d", s.Rule)
	}
	b.WriteString(": " + s.Text)
	switch {
	case !s.Matched:
		b.WriteString("  (no match)")
	case s.Verdict != "":
		b.WriteString("  -> " + s.Verdict)
	}
	if s.Element != "" {
		b.WriteString("  [element " + s.Element + "]")
	}
	return b.String()
}
