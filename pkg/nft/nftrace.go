package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file is the kernel's own trace (nftrace): a small table that sets
// `meta nftrace set 1` on the packets of one tuple, before every other
// chain, and a netlink listener for the trace events the kernel then sends
// for every chain and rule those packets go through (NFT_MSG_TRACE on the
// NFNLGRP_NFTRACE group), grouped into one path per packet with each rule
// handle mapped to the rule netpol programmed (its ID, the rule comment).
// google/nftables v0.3.0 has no trace support. Findings on how the kernel
// reports: docs/nft-notes.md, "nftrace".

// TraceTableName is the inet table that arms nftrace.
const TraceTableName = "netpol-trace"

// TracePriority is the trace table's base chain priority: before raw
// (-300), conntrack (-200), DNAT (-100) and filter (0), so every chain of
// every table sees the flag set.
const TracePriority = -350

// Netlink constants that golang.org/x/sys/unix (v0.48.0) does not define,
// from the kernel's include/uapi/linux/netfilter/nfnetlink.h and
// include/uapi/linux/netfilter.h.
const (
	nfnlgrpNFTrace = 9 // NFNLGRP_NFTRACE
	// NF_DROP and NF_ACCEPT are nfDrop and nfAccept (elements.go).
	nfStolen      = 2 // NF_STOLEN
	nfQueue       = 3 // NF_QUEUE
	nfRepeat      = 4 // NF_REPEAT
	nfVerdictMask = 0xff
)

// TraceMatch selects packets to trace; a zero field matches anything.
// Src or Dst sets the family; with neither, Family must (IPv4 or IPv6).
type TraceMatch struct {
	Family   *Family
	Src, Dst netip.Addr
	L4Proto  uint8
	DstPort  uint16
}

func (m TraceMatch) family() (*Family, error) {
	var f *Family
	for _, a := range []netip.Addr{m.Src, m.Dst} {
		if !a.IsValid() {
			continue
		}
		af := FamilyOf(a)
		if f != nil && f != af {
			return nil, fmt.Errorf("nftrace: %s and %s are of different families", m.Src, m.Dst)
		}
		f = af
	}
	if m.Family != nil {
		if f != nil && f != m.Family {
			return nil, fmt.Errorf("nftrace: family %s does not match the addresses", m.Family.Name)
		}
		f = m.Family
	}
	if f == nil {
		return nil, errors.New("nftrace: a match needs an address or a family")
	}
	return f, nil
}

func (m TraceMatch) String() string {
	var w []string
	if m.Src.IsValid() {
		w = append(w, "saddr "+m.Src.Unmap().String())
	}
	if m.Dst.IsValid() {
		w = append(w, "daddr "+m.Dst.Unmap().String())
	}
	if m.L4Proto != 0 {
		w = append(w, protoName(m.L4Proto))
	}
	if m.DstPort != 0 {
		w = append(w, fmt.Sprintf("dport %d", m.DstPort))
	}
	if len(w) == 0 && m.Family != nil {
		w = append(w, m.Family.Name)
	}
	return strings.Join(w, " ")
}

// TraceTable is the table that sets nftrace on packets matching any of the
// matches: base chains on prerouting (packets from pods and other hosts)
// and output (the host's own), one rule per match in each.
func TraceTable(matches ...TraceMatch) (*Table, error) {
	if len(matches) == 0 {
		return nil, errors.New("nftrace: nothing to match")
	}
	t := NewTable(TraceTableName)
	for _, hook := range []string{HookPrerouting, HookOutput} {
		c := t.AddChain(&Chain{Name: hook, Base: &Hook{Type: "filter", Hook: hook, Priority: TracePriority, Policy: "accept"}})
		for _, m := range matches {
			f, err := m.family()
			if err != nil {
				return nil, err
			}
			b := NewRule()
			if !m.Src.IsValid() && !m.Dst.IsValid() {
				b.MatchFamily(f)
			}
			if m.Src.IsValid() {
				b.addrIs(f, Src, m.Src)
			}
			if m.Dst.IsValid() {
				b.addrIs(f, Dst, m.Dst)
			}
			if m.L4Proto != 0 {
				b.L4ProtoIs(m.L4Proto)
			}
			if m.DstPort != 0 {
				if m.L4Proto == 0 {
					return nil, errors.New("nftrace: a port match needs a protocol")
				}
				b.dstPortIs(m.DstPort)
			}
			r := b.nftraceSet().Done()
			r.Comment = "netpol trace: " + m.String()
			c.Rules = append(c.Rules, r)
		}
	}
	return t, nil
}

// addrIs matches `ip saddr A` (or daddr, or ip6).
func (b *Builder) addrIs(f *Family, side Side, a netip.Addr) *Builder {
	b.family(f)
	b.exprs = append(b.exprs, AddrOf(f, side).load(1)...)
	b.exprs = append(b.exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: f.AddrBytes(a)})
	b.words = append(b.words, fmt.Sprintf("%s %s %s", f.Name, side, a.Unmap()))
	return b
}

// dstPortIs matches `th dport P`.
func (b *Builder) dstPortIs(p uint16) *Builder {
	b.exprs = append(b.exprs, DstPort().load(1)...)
	b.exprs = append(b.exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: PortBytes(p)})
	b.words = append(b.words, fmt.Sprintf("th dport %d", p))
	return b
}

// nftraceSet is `meta nftrace set 1`.
func (b *Builder) nftraceSet() *Builder {
	b.exprs = append(b.exprs,
		&expr.Immediate{Register: 1, Data: []byte{1}},
		&expr.Meta{Key: expr.MetaKeyNFTRACE, SourceRegister: true, Register: 1})
	b.words = append(b.words, "meta nftrace set 1")
	return b
}

// ArmedTrace is the trace table in one network namespace.
type ArmedTrace struct {
	mu sync.Mutex
	a  *Applier
}

// ArmTrace creates (or replaces the rules of) the trace table in the
// network namespace netnsFd (< 0: the current one). Disarm removes it;
// call it on every exit path.
func ArmTrace(netnsFd int, matches ...TraceMatch) (*ArmedTrace, error) {
	t, err := TraceTable(matches...)
	if err != nil {
		return nil, err
	}
	a, err := NewApplier(netnsFd, TraceTableName)
	if err != nil {
		return nil, err
	}
	if _, err := a.Apply(t); err != nil {
		a.Delete()
		a.Close()
		return nil, fmt.Errorf("nftrace: arming: %w", err)
	}
	return &ArmedTrace{a: a}, nil
}

// Disarm deletes the trace table. It is safe to call more than once.
func (t *ArmedTrace) Disarm() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.a == nil {
		return nil
	}
	err := t.a.Delete()
	if cerr := t.a.Close(); err == nil {
		err = cerr
	}
	t.a = nil
	return err
}

// DisarmTrace deletes the trace table from the namespace if it is there
// (e.g. left by a process that was killed).
func DisarmTrace(netnsFd int) error {
	a, err := NewApplier(netnsFd, TraceTableName)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Delete()
}

// TraceEventType is what a trace event reports.
type TraceEventType string

const (
	// TraceRule: a rule matched (its verdict, or continue).
	TraceRule TraceEventType = "rule"
	// TraceReturn: the end of a regular chain was reached (the packet
	// goes back to the calling chain).
	TraceReturn TraceEventType = "return"
	// TracePolicy: the end of a base chain; its policy decided.
	TracePolicy TraceEventType = "policy"
)

// TraceEvent is one NFT_MSG_TRACE message.
type TraceEvent struct {
	// ID is the kernel's trace ID: the same for every event of one
	// packet in one network namespace.
	ID uint32 `json:"id"`
	// Family is the table's family (NFPROTO_INET for inet tables),
	// NFProto the packet's (NFPROTO_IPV4 or NFPROTO_IPV6).
	Family  byte           `json:"family"`
	NFProto byte           `json:"nfproto"`
	Type    TraceEventType `json:"type"`
	Table   string         `json:"table"`
	Chain   string         `json:"chain"`
	// Hook is the base chain's hook (prerouting, input, ...), filled in
	// by the listener; empty for a regular chain.
	Hook string `json:"hook,omitempty"`
	// Handle is the rule's handle; 0 for return and policy events.
	Handle uint64 `json:"handle,omitempty"`
	// Verdict: accept, drop, continue, return, jump X, goto X, ...; for
	// policy events the chain's policy.
	Verdict string `json:"verdict"`
	// RuleID is the rule's comment in the kernel: netpol's rule ID
	// (Rule.ID) for the rules netpol programmed. Empty if the rule has
	// none or could not be read.
	RuleID string `json:"rule_id,omitempty"`
	// RuleText is an nft-like text of the kernel rule's expressions.
	RuleText string `json:"rule_text,omitempty"`
	// Network and Transport are the start of the packet's headers, in the
	// first event of a packet in each base chain.
	Network   []byte `json:"-"`
	Transport []byte `json:"-"`
	Iif, Oif  uint32 `json:"-"`
	Mark      uint32 `json:"mark,omitempty"`
}

// PacketTrace is the path of one packet through one network namespace:
// every event with its trace ID, in order.
type PacketTrace struct {
	ID uint32
	// The packet's tuple, from the first headers reported (zero if none).
	Src, Dst         netip.Addr
	L4Proto          uint8
	SrcPort, DstPort uint16
	// TCPFlags are a TCP packet's flags (0x02 SYN, 0x10 ACK, ...).
	TCPFlags byte
	Events   []TraceEvent
}

// Opens reports whether the packet can be a connection's first: a TCP
// SYN without ACK, or any packet of another protocol.
func (p *PacketTrace) Opens() bool {
	return p.L4Proto != unix.IPPROTO_TCP || p.TCPFlags&0x12 == 0x02
}

// Verdict is the packet's last verdict in this namespace: the last
// accept, drop or policy event ("" when the trace ended otherwise).
func (p *PacketTrace) Verdict() string {
	for i := len(p.Events) - 1; i >= 0; i-- {
		switch v := p.Events[i].Verdict; v {
		case "accept", "drop", "stolen", "queue":
			return v
		}
	}
	return ""
}

// GroupTraces groups events into packets, in order of each packet's first
// event. Events are grouped by trace ID, but the ID is not unique over
// time: the kernel derives it from the skb's address, flow hash and input
// interface, so the next packet of the same flow often gets the same ID
// (the freed skb's memory is reused). A packet enters a namespace through
// the trace table's chains (priority TracePriority, before all others),
// so an event of the trace table's rule after events of other tables
// starts a new packet. The tuple comes from each packet's first headers.
func GroupTraces(events []TraceEvent) []*PacketTrace {
	var out []*PacketTrace
	cur := map[uint32]*PacketTrace{}
	for _, e := range events {
		p := cur[e.ID]
		if p != nil && e.Table == TraceTableName && e.Type == TraceRule && p.leftTraceTable() {
			p = nil
		}
		if p == nil {
			p = &PacketTrace{ID: e.ID}
			cur[e.ID] = p
			out = append(out, p)
		}
		if !p.Src.IsValid() && len(e.Network) > 0 {
			p.Src, p.Dst, p.L4Proto, p.SrcPort, p.DstPort = parseHeaders(e.NFProto, e.Network, e.Transport)
			if p.L4Proto == unix.IPPROTO_TCP && len(e.Transport) >= 14 {
				p.TCPFlags = e.Transport[13]
			}
		}
		p.Events = append(p.Events, e)
	}
	return out
}

// leftTraceTable reports whether the packet has events of other tables.
func (p *PacketTrace) leftTraceTable() bool {
	for _, e := range p.Events {
		if e.Table != TraceTableName {
			return true
		}
	}
	return false
}

// parseHeaders reads addresses, protocol and ports from the reported
// headers (IPv6 extension headers are not followed).
func parseHeaders(nfproto byte, network, transport []byte) (src, dst netip.Addr, proto uint8, sport, dport uint16) {
	switch {
	case nfproto == unix.NFPROTO_IPV4 && len(network) >= 20:
		src = netip.AddrFrom4([4]byte(network[12:16]))
		dst = netip.AddrFrom4([4]byte(network[16:20]))
		proto = network[9]
	case nfproto == unix.NFPROTO_IPV6 && len(network) >= 40:
		src = netip.AddrFrom16([16]byte(network[8:24]))
		dst = netip.AddrFrom16([16]byte(network[24:40]))
		proto = network[6]
	default:
		return
	}
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_UDPLITE:
		if len(transport) >= 4 {
			sport = binary.BigEndian.Uint16(transport[0:2])
			dport = binary.BigEndian.Uint16(transport[2:4])
		}
	}
	return
}

// ErrNoTraceSupport says the kernel cannot trace (nf_tables without
// NFNLGRP_NFTRACE).
var ErrNoTraceSupport = errors.New("nftrace: the kernel does not support nf_tables tracing")

// TraceListener receives trace events in one network namespace.
type TraceListener struct {
	nl    *netlink.Conn
	nsFd  int
	conn  *nftables.Conn // for rule comments; opened on first use
	rules map[ruleKey]kernelRule
	read  map[chainKey]bool
	hooks map[chainKey]string // base chains' hooks, per table read
	seen  map[chainKey]bool   // tables (chain "") whose chains were read
	// Lost counts events the kernel dropped because the socket buffer
	// was full (ENOBUFS).
	Lost int
}

type chainKey struct {
	family       byte
	table, chain string
}

type ruleKey struct {
	family byte
	table  string
	handle uint64
}

type kernelRule struct {
	id, text string
}

// ListenTrace subscribes to the trace events of the network namespace
// netnsFd (< 0: the current one). Subscribe before the packets are sent:
// the kernel sends events only while someone listens.
func ListenTrace(netnsFd int) (*TraceListener, error) {
	fd, err := dupNetNS(netnsFd)
	if err != nil {
		return nil, err
	}
	l := &TraceListener{nsFd: fd, rules: map[ruleKey]kernelRule{}, read: map[chainKey]bool{},
		hooks: map[chainKey]string{}, seen: map[chainKey]bool{}}
	nl, err := dialNetfilter(fd)
	if err != nil {
		l.Close()
		return nil, err
	}
	l.nl = nl
	if err := setBuffers(nl, sockBuf); err != nil {
		l.Close()
		return nil, fmt.Errorf("nftrace: socket buffers: %w", err)
	}
	if err := nl.JoinGroup(nfnlgrpNFTrace); err != nil {
		l.Close()
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("%w (joining group NFNLGRP_NFTRACE: %v)", ErrNoTraceSupport, err)
		}
		return nil, fmt.Errorf("nftrace: joining group NFNLGRP_NFTRACE: %w", err)
	}
	return l, nil
}

// Close releases the sockets.
func (l *TraceListener) Close() error {
	var err error
	if l.nl != nil {
		err = l.nl.Close()
		l.nl = nil
	}
	if l.conn != nil {
		l.conn.CloseLasting()
		l.conn = nil
	}
	if l.nsFd >= 0 {
		unix.Close(l.nsFd)
		l.nsFd = -1
	}
	return err
}

// Receive returns the next batch of trace events, waiting until one
// arrives, ctx ends (ctx.Err()) or the deadline passes (no events, nil
// error). Rule handles are mapped to the rules' comments and texts as the
// kernel holds them now.
func (l *TraceListener) Receive(ctx context.Context, deadline time.Time) ([]TraceEvent, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Wake up now and then to see ctx.
		wake := time.Now().Add(100 * time.Millisecond)
		if !deadline.IsZero() && deadline.Before(wake) {
			wake = deadline
		}
		if err := l.nl.SetReadDeadline(wake); err != nil {
			return nil, err
		}
		msgs, err := l.nl.Receive()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if !deadline.IsZero() && !time.Now().Before(deadline) {
					return nil, nil
				}
				continue
			}
			if errors.Is(err, unix.ENOBUFS) {
				l.Lost++
				continue
			}
			return nil, fmt.Errorf("nftrace: receive: %w", err)
		}
		var out []TraceEvent
		for _, m := range msgs {
			e, ok, err := parseTraceMessage(m)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			l.resolve(&e)
			out = append(out, e)
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// Collect receives events until ctx ends, until done (if not nil)
// returns true for the events so far, or until idle (if > 0) passes
// without an event. It returns what it received; a ctx end is not an
// error.
func (l *TraceListener) Collect(ctx context.Context, idle time.Duration, done func([]TraceEvent) bool) ([]TraceEvent, error) {
	var all []TraceEvent
	for {
		var deadline time.Time
		if idle > 0 {
			deadline = time.Now().Add(idle)
		}
		evs, err := l.Receive(ctx, deadline)
		if err != nil {
			if ctx.Err() != nil {
				return all, nil
			}
			return all, err
		}
		if len(evs) == 0 {
			return all, nil
		}
		all = append(all, evs...)
		if done != nil && done(all) {
			return all, nil
		}
	}
}

// resolve fills in the rule's comment and text from the kernel.
func (l *TraceListener) resolve(e *TraceEvent) {
	e.Hook = l.hook(chainKey{e.Family, e.Table, e.Chain})
	if e.Handle == 0 {
		return
	}
	rk := ruleKey{e.Family, e.Table, e.Handle}
	if r, ok := l.rules[rk]; ok {
		e.RuleID, e.RuleText = r.id, r.text
		return
	}
	ck := chainKey{e.Family, e.Table, e.Chain}
	if l.read[ck] {
		// Read already: the rule is newer (or gone); read again once.
		delete(l.read, ck)
	}
	if err := l.readChain(ck); err != nil {
		return
	}
	r := l.rules[rk]
	e.RuleID, e.RuleText = r.id, r.text
}

// hook is a base chain's hook, "" for a regular chain (or one that could
// not be read).
func (l *TraceListener) hook(ck chainKey) string {
	tk := chainKey{family: ck.family, table: ck.table}
	if h, ok := l.hooks[ck]; ok || l.seen[tk] {
		return h
	}
	if l.ensureConn() != nil {
		return ""
	}
	chains, err := l.conn.ListChainsOfTableFamily(nftables.TableFamily(ck.family))
	if err != nil {
		l.conn.CloseLasting()
		l.conn = nil
		return ""
	}
	l.seen[tk] = true
	for _, kc := range chains {
		if kc.Table == nil || kc.Table.Name != ck.table {
			continue
		}
		if h := hookFromKernel(kc); h != nil {
			l.hooks[chainKey{ck.family, ck.table, kc.Name}] = h.Hook
		}
	}
	return l.hooks[ck]
}

func (l *TraceListener) ensureConn() error {
	if l.conn != nil {
		return nil
	}
	c, err := newConn(l.nsFd, true)
	if err != nil {
		return err
	}
	l.conn = c
	return nil
}

func (l *TraceListener) readChain(ck chainKey) error {
	if err := l.ensureConn(); err != nil {
		return err
	}
	kt := &nftables.Table{Name: ck.table, Family: nftables.TableFamily(ck.family)}
	krules, err := l.conn.GetRules(kt, &nftables.Chain{Name: ck.chain, Table: kt})
	if err != nil {
		l.conn.CloseLasting()
		l.conn = nil
		return err
	}
	l.read[ck] = true
	for _, kr := range krules {
		id, _ := ruleComment(kr.UserData)
		l.rules[ruleKey{ck.family, ck.table, kr.Handle}] = kernelRule{id: id, text: DescribeExprs(kr.Exprs)}
	}
	return nil
}

// parseTraceMessage decodes one NFT_MSG_TRACE message; ok is false for
// other messages.
func parseTraceMessage(m netlink.Message) (TraceEvent, bool, error) {
	var e TraceEvent
	if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_TRACE) || len(m.Data) < 4 {
		return e, false, nil
	}
	e.Family = m.Data[0] // nfgenmsg: family, version, resource id
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return e, false, fmt.Errorf("nftrace: decode: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	var typ, policy uint32
	hasPolicy := false
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_TRACE_TABLE:
			e.Table = ad.String()
		case unix.NFTA_TRACE_CHAIN:
			e.Chain = ad.String()
		case unix.NFTA_TRACE_RULE_HANDLE:
			e.Handle = ad.Uint64()
		case unix.NFTA_TRACE_TYPE:
			typ = ad.Uint32()
		case unix.NFTA_TRACE_VERDICT:
			ad.Nested(func(nad *netlink.AttributeDecoder) error {
				var code int32
				var chain string
				for nad.Next() {
					switch nad.Type() {
					case unix.NFTA_VERDICT_CODE:
						code = int32(nad.Uint32())
					case unix.NFTA_VERDICT_CHAIN:
						chain = nad.String()
					}
				}
				e.Verdict = verdictCodeText(code, chain)
				return nil
			})
		case unix.NFTA_TRACE_ID:
			e.ID = ad.Uint32()
		case unix.NFTA_TRACE_NETWORK_HEADER:
			e.Network = append([]byte(nil), ad.Bytes()...)
		case unix.NFTA_TRACE_TRANSPORT_HEADER:
			e.Transport = append([]byte(nil), ad.Bytes()...)
		case unix.NFTA_TRACE_IIF:
			e.Iif = ad.Uint32()
		case unix.NFTA_TRACE_OIF:
			e.Oif = ad.Uint32()
		case unix.NFTA_TRACE_MARK:
			e.Mark = ad.Uint32()
		case unix.NFTA_TRACE_NFPROTO:
			e.NFProto = byte(ad.Uint32())
		case unix.NFTA_TRACE_POLICY:
			policy, hasPolicy = ad.Uint32(), true
		}
	}
	if err := ad.Err(); err != nil {
		return e, false, fmt.Errorf("nftrace: decode: %w", err)
	}
	switch typ {
	case unix.NFT_TRACETYPE_RULE:
		e.Type = TraceRule
		if e.Handle == 0 {
			// The end of a chain: kernels since about 6.4 report it as
			// a rule event without a handle, verdict continue.
			e.Type = TraceReturn
		}
	case unix.NFT_TRACETYPE_RETURN:
		e.Type = TraceReturn
	case unix.NFT_TRACETYPE_POLICY:
		e.Type = TracePolicy
		if hasPolicy {
			e.Verdict = verdictCodeText(int32(policy), "")
		}
	default:
		e.Type = TraceEventType(fmt.Sprintf("type %d", typ))
	}
	return e, true, nil
}

// verdictCodeText is a verdict code (NFTA_VERDICT_CODE) as nft writes it.
func verdictCodeText(code int32, chain string) string {
	switch code {
	case unix.NFT_CONTINUE:
		return "continue"
	case unix.NFT_BREAK:
		return "break"
	case unix.NFT_JUMP:
		return "jump " + chain
	case unix.NFT_GOTO:
		return "goto " + chain
	case unix.NFT_RETURN:
		return "return"
	}
	switch code & nfVerdictMask { // NF_DROP_ERR and NF_QUEUE_NR carry more bits
	case nfDrop:
		return "drop"
	case nfAccept:
		return "accept"
	case nfStolen:
		return "stolen"
	case nfQueue:
		return "queue"
	case nfRepeat:
		return "repeat"
	}
	return fmt.Sprintf("verdict %d", code)
}

// DescribeExprs is an nft-like text of kernel rule expressions (for rules
// read back, whose Text is not kept): not always nft's exact syntax, but
// every expression shows.
func DescribeExprs(exprs []expr.Any) string {
	var w []string
	hint := ""        // what the last load put in a register
	lastLoad := false // the previous expression loaded a key field
	load := func(text string) {
		if lastLoad && len(w) > 0 {
			w[len(w)-1] += " . " + text // a concatenated key
		} else {
			w = append(w, text)
		}
		hint, lastLoad = text, true
	}
	for i, e := range exprs {
		isLoad := false
		switch e := e.(type) {
		case *expr.Meta:
			name := metaName(e.Key)
			switch {
			case e.SourceRegister && i > 0 && isImmediate(exprs[i-1]) && len(w) > 0:
				w[len(w)-1] = "meta " + name + " set " + w[len(w)-1]
			case e.SourceRegister:
				w = append(w, "meta "+name+" set")
			case name == "nfproto" && i == 0 && loadsNetworkHeader(exprs):
				hint = "nfproto" // the implicit family match before ip/ip6 payload
			default:
				load("meta " + name)
				isLoad = true
			}
		case *expr.Cmp:
			if hint == "nfproto" {
				break
			}
			op := map[expr.CmpOp]string{expr.CmpOpEq: "", expr.CmpOpNeq: "!= ", expr.CmpOpLt: "< ",
				expr.CmpOpLte: "<= ", expr.CmpOpGt: "> ", expr.CmpOpGte: ">= "}[e.Op]
			if bw, ok := prevBitwise(exprs, i); ok && (hint == "ct state" || hint == "ct status") && e.Op == expr.CmpOpNeq && allZero(e.Data) && allZero(bw.Xor) && len(bw.Mask) == 4 {
				w[len(w)-1] = ctBitNames(hint, binary.NativeEndian.Uint32(bw.Mask)) // `ct state new,established`
				break
			}
			w = append(w, op+dataText(hint, e.Data))
		case *expr.Payload:
			load(payloadText(e))
			isLoad = true
		case *expr.Immediate:
			h := hint
			if i+1 < len(exprs) {
				if m, ok := exprs[i+1].(*expr.Meta); ok && m.SourceRegister {
					h = metaName(m.Key)
				}
			}
			w = append(w, dataText(h, e.Data))
		case *expr.Byteorder:
			isLoad = lastLoad // nft's conversion of the key just loaded: no words
		case *expr.Ct:
			if e.SourceRegister {
				w = append(w, "ct "+ctName(e.Key)+" set")
				break
			}
			load("ct " + ctName(e.Key))
			isLoad = true
		case *expr.Bitwise:
			w = append(w, "& "+dataText("", e.Mask)+" ^ "+dataText("", e.Xor))
		case *expr.Lookup:
			switch {
			case e.IsDestRegSet && e.DestRegister == 0:
				w = append(w, "vmap @"+e.SetName)
			case e.IsDestRegSet:
				w = append(w, "map @"+e.SetName)
			case e.Invert:
				w = append(w, "!= @"+e.SetName)
			default:
				w = append(w, "@"+e.SetName)
			}
		case *expr.Range:
			w = append(w, dataText(hint, e.FromData)+"-"+dataText(hint, e.ToData))
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictJump:
				w = append(w, "jump "+e.Chain)
			case expr.VerdictGoto:
				w = append(w, "goto "+e.Chain)
			default:
				w = append(w, verdictCodeText(int32(e.Kind), ""))
			}
		case *expr.NAT:
			if e.Type == expr.NATTypeSourceNAT {
				w = append(w, "snat")
			} else {
				w = append(w, "dnat")
			}
		case *expr.Masq:
			w = append(w, "masquerade")
		case *expr.Reject:
			w = append(w, "reject")
		case *expr.Counter:
			w = append(w, "counter")
		case *expr.Numgen:
			load(fmt.Sprintf("numgen random mod %d", e.Modulus))
			isLoad = true
		case *expr.Dynset:
			w = append(w, "update @"+e.SetName)
		case *expr.Fib:
			hint = "fib"
			w = append(w, "fib saddr type")
		default:
			w = append(w, fmt.Sprintf("%T", e))
		}
		lastLoad = isLoad
	}
	return strings.Join(w, " ")
}

func loadsNetworkHeader(exprs []expr.Any) bool {
	for _, e := range exprs {
		if p, ok := e.(*expr.Payload); ok && p.Base == expr.PayloadBaseNetworkHeader {
			return true
		}
	}
	return false
}

func prevBitwise(exprs []expr.Any, i int) (*expr.Bitwise, bool) {
	if i == 0 {
		return nil, false
	}
	bw, ok := exprs[i-1].(*expr.Bitwise)
	return bw, ok
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// ctBitNames names the bits of a ct state (or status) mask tested against
// zero: `new,established`.
func ctBitNames(what string, mask uint32) string {
	names := map[uint32]string{expr.CtStateBitINVALID: "invalid", expr.CtStateBitESTABLISHED: "established",
		expr.CtStateBitRELATED: "related", expr.CtStateBitNEW: "new", expr.CtStateBitUNTRACKED: "untracked"}
	if what == "ct status" {
		names = map[uint32]string{1: "expected", 2: "seen-reply", 4: "assured", 8: "confirmed", 16: "snat", 32: "dnat", 512: "dying"}
	}
	var w []string
	for bit := uint32(1); bit != 0; bit <<= 1 {
		if mask&bit == 0 {
			continue
		}
		if n, ok := names[bit]; ok {
			w = append(w, n)
		} else {
			w = append(w, fmt.Sprintf("0x%x", bit))
		}
	}
	return strings.Join(w, ",")
}

func isImmediate(e expr.Any) bool {
	_, ok := e.(*expr.Immediate)
	return ok
}

func metaName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyMARK:
		return "mark"
	case expr.MetaKeyNFTRACE:
		return "nftrace"
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	}
	return fmt.Sprintf("key%d", k)
}

func ctName(k expr.CtKey) string {
	switch k {
	case expr.CtKeySTATE:
		return "state"
	case expr.CtKeySTATUS:
		return "status"
	case expr.CtKeyMARK:
		return "mark"
	case expr.CtKeyPROTODST:
		return "original proto-dst"
	case unix.NFT_CT_SRC_IP, unix.NFT_CT_SRC_IP6:
		return "original saddr"
	case unix.NFT_CT_DST_IP, unix.NFT_CT_DST_IP6:
		return "original daddr"
	}
	return fmt.Sprintf("key%d", k)
}

func payloadText(p *expr.Payload) string {
	if p.Base == expr.PayloadBaseNetworkHeader {
		switch {
		case p.Offset == 12 && p.Len == 4:
			return "ip saddr"
		case p.Offset == 16 && p.Len == 4:
			return "ip daddr"
		case p.Offset == 8 && p.Len == 16:
			return "ip6 saddr"
		case p.Offset == 24 && p.Len == 16:
			return "ip6 daddr"
		}
	}
	if p.Base == expr.PayloadBaseTransportHeader {
		switch {
		case p.Offset == 0 && p.Len == 2:
			return "th sport"
		case p.Offset == 2 && p.Len == 2:
			return "th dport"
		}
	}
	return fmt.Sprintf("@base%d,%d,%d", p.Base, p.Offset*8, p.Len*8)
}

// dataText shows a value loaded by hint: an address, a port, a protocol,
// else hex.
func dataText(hint string, b []byte) string {
	switch {
	case strings.HasSuffix(hint, "addr") && len(b) == 4:
		return netip.AddrFrom4([4]byte(b)).String()
	case strings.HasSuffix(hint, "addr") && len(b) == 16:
		return netip.AddrFrom16([16]byte(b)).String()
	case strings.HasSuffix(hint, "port") || strings.HasSuffix(hint, "proto-dst"):
		if len(b) == 2 {
			return fmt.Sprint(binary.BigEndian.Uint16(b))
		}
	case strings.HasSuffix(hint, "l4proto") && len(b) == 1:
		return protoName(b[0])
	case strings.HasSuffix(hint, "nftrace") && len(b) == 1:
		return fmt.Sprint(b[0])
	case strings.HasSuffix(hint, "nfproto") && len(b) == 1 && b[0] == unix.NFPROTO_IPV4:
		return "ipv4"
	case strings.HasSuffix(hint, "nfproto") && len(b) == 1 && b[0] == unix.NFPROTO_IPV6:
		return "ipv6"
	}
	return fmt.Sprintf("0x%x", b)
}

// TracePathStep is one step of a packet's path in the form the kernel's
// trace and the Tracer share: a rule that matched (by its ID) or a base
// chain's policy, and what it did, in the kernel's verdict words.
type TracePathStep struct {
	// Hook is the hook the step ran at: the base chain's, or for a
	// regular chain that of the base chain that jumped to it.
	Hook   string `json:"hook"`
	Table  string `json:"table"`
	Chain  string `json:"chain"`
	RuleID string `json:"rule_id,omitempty"` // empty for a policy
	Policy bool   `json:"policy,omitempty"`
	// Verdict: accept, drop, continue, jump X, goto X, return.
	Verdict string `json:"verdict"`
}

func (s TracePathStep) String() string {
	what := "rule " + s.RuleID
	if s.Policy {
		what = "policy"
	}
	return fmt.Sprintf("%s %s/%s %s -> %s", s.Hook, s.Table, s.Chain, what, s.Verdict)
}

// Path is the packet's path as the kernel reported it: its rule and
// policy events, without return events (the end of a regular chain, which
// the Tracer does not record as a step) and without the tables in skip
// (e.g. TraceTableName, whose rule set the flag).
func (p *PacketTrace) Path(skip ...string) []TracePathStep {
	var out []TracePathStep
	hook := ""
	for _, e := range p.Events {
		if e.Hook != "" {
			hook = e.Hook
		}
		if e.Type == TraceReturn || contains(skip, e.Table) {
			continue
		}
		out = append(out, TracePathStep{Hook: hook, Table: e.Table, Chain: e.Chain, RuleID: e.RuleID,
			Policy: e.Type == TracePolicy, Verdict: e.Verdict})
	}
	return out
}

// TracerPath is a Tracer result at hook in the same form: the rules that matched
// and the policies that decided, the tables in skip left out. What the
// Tracer writes as a NAT statement is an accept to the kernel, a reject a
// drop, a rule that matched without a verdict a continue.
func TracerPath(hook string, r TraceResult, skip ...string) []TracePathStep {
	var out []TracePathStep
	for _, s := range r.Steps {
		if !s.Matched || contains(skip, s.Table) {
			continue
		}
		st := TracePathStep{Hook: hook, Table: s.Table, Chain: s.Chain, Verdict: kernelVerdictWord(s.Verdict)}
		if s.Rule < 0 {
			st.Policy = true
		} else {
			st.RuleID = s.ruleID
		}
		out = append(out, st)
	}
	return out
}

func kernelVerdictWord(v string) string {
	switch {
	case v == "":
		return "continue"
	case strings.HasPrefix(v, "dnat"), strings.HasPrefix(v, "snat"), strings.HasPrefix(v, "masquerade"):
		return "accept"
	case strings.HasPrefix(v, "reject"):
		return "drop"
	}
	return v
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
