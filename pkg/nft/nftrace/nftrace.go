// Package nftrace is the kernel's own trace (nftrace): a small table that
// sets `meta nftrace set 1` on the packets of one tuple, before every
// other chain, and a netlink listener for the trace events the kernel then
// sends for every chain and rule those packets go through (NFT_MSG_TRACE
// on the NFNLGRP_NFTRACE group), grouped into one path per packet with
// each rule handle mapped to the rule netpol programmed (its ID, the rule
// comment). google/nftables v0.3.0 has no trace support. Findings on how
// the kernel reports: docs/nft-notes.md, "nftrace".
package nftrace

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
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/nft/trace"
)

// TableName is the inet table that arms nftrace.
const TableName = "netpol-trace"

// Priority is the trace table's base chain priority: before raw
// (-300), conntrack (-200), DNAT (-100) and filter (0), so every chain of
// every table sees the flag set.
const Priority = -350

// nfnlgrpNFTrace is NFNLGRP_NFTRACE (include/uapi/linux/netfilter/nfnetlink.h),
// which golang.org/x/sys/unix (v0.48.0) does not define.
const nfnlgrpNFTrace = 9

// Match selects packets to trace; a zero field matches anything.
// Src or Dst sets the family; with neither, Family must (IPv4 or IPv6).
type Match struct {
	Family   *nft.Family
	Src, Dst netip.Addr
	L4Proto  uint8
	DstPort  uint16
}

func (m Match) family() (*nft.Family, error) {
	var f *nft.Family
	for _, a := range []netip.Addr{m.Src, m.Dst} {
		if !a.IsValid() {
			continue
		}
		af := nft.FamilyOf(a)
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

func (m Match) String() string {
	var w []string
	if m.Src.IsValid() {
		w = append(w, "saddr "+m.Src.Unmap().String())
	}
	if m.Dst.IsValid() {
		w = append(w, "daddr "+m.Dst.Unmap().String())
	}
	if m.L4Proto != 0 {
		w = append(w, nft.ProtoName(m.L4Proto))
	}
	if m.DstPort != 0 {
		w = append(w, fmt.Sprintf("dport %d", m.DstPort))
	}
	if len(w) == 0 && m.Family != nil {
		w = append(w, m.Family.Name)
	}
	return strings.Join(w, " ")
}

// Table is the table that sets nftrace on packets matching any of the
// matches: base chains on prerouting (packets from pods and other hosts)
// and output (the host's own), one rule per match in each.
func Table(matches ...Match) (*nft.Table, error) {
	if len(matches) == 0 {
		return nil, errors.New("nftrace: nothing to match")
	}
	t := nft.NewTable(TableName)
	for _, hook := range []string{nft.HookPrerouting, nft.HookOutput} {
		c := t.AddChain(&nft.Chain{Name: hook, Base: &nft.Hook{Type: "filter", Hook: hook, Priority: Priority, Policy: "accept"}})
		for _, m := range matches {
			f, err := m.family()
			if err != nil {
				return nil, err
			}
			b := nft.NewRule()
			if !m.Src.IsValid() && !m.Dst.IsValid() {
				b.MatchFamily(f)
			}
			if m.Src.IsValid() {
				b.AddrIs(f, nft.Src, m.Src)
			}
			if m.Dst.IsValid() {
				b.AddrIs(f, nft.Dst, m.Dst)
			}
			if m.L4Proto != 0 {
				b.L4ProtoIs(m.L4Proto)
			}
			if m.DstPort != 0 {
				if m.L4Proto == 0 {
					return nil, errors.New("nftrace: a port match needs a protocol")
				}
				b.DstPortIs(m.DstPort)
			}
			r := b.NftraceSet().Done()
			r.Comment = "netpol trace: " + m.String()
			c.Rules = append(c.Rules, r)
		}
	}
	return t, nil
}

// Armed is the trace table in one network namespace.
type Armed struct {
	mu sync.Mutex
	a  *kernel.Applier
}

// Arm creates (or replaces the rules of) the trace table in the
// network namespace netnsFd (< 0: the current one). Disarm removes it;
// call it on every exit path.
func Arm(netnsFd int, matches ...Match) (*Armed, error) {
	t, err := Table(matches...)
	if err != nil {
		return nil, err
	}
	a, err := kernel.NewApplier(netnsFd, TableName)
	if err != nil {
		return nil, err
	}
	if _, err := a.Apply(t); err != nil {
		a.Delete()
		a.Close()
		return nil, fmt.Errorf("nftrace: arming: %w", err)
	}
	return &Armed{a: a}, nil
}

// Disarm deletes the trace table. It is safe to call more than once.
func (t *Armed) Disarm() error {
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

// Disarm deletes the trace table from the namespace if it is there
// (e.g. left by a process that was killed).
func Disarm(netnsFd int) error {
	a, err := kernel.NewApplier(netnsFd, TableName)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Delete()
}

// EventType is what a trace event reports.
type EventType string

const (
	// EventRule: a rule matched (its verdict, or continue).
	EventRule EventType = "rule"
	// EventReturn: the end of a regular chain was reached (the packet
	// goes back to the calling chain).
	EventReturn EventType = "return"
	// EventPolicy: the end of a base chain; its policy decided.
	EventPolicy EventType = "policy"
)

// Event is one NFT_MSG_TRACE message.
type Event struct {
	// ID is the kernel's trace ID: the same for every event of one
	// packet in one network namespace.
	ID uint32 `json:"id"`
	// Family is the table's family (NFPROTO_INET for inet tables),
	// NFProto the packet's (NFPROTO_IPV4 or NFPROTO_IPV6).
	Family  byte      `json:"family"`
	NFProto byte      `json:"nfproto"`
	Type    EventType `json:"type"`
	Table   string    `json:"table"`
	Chain   string    `json:"chain"`
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
	// Counters are the named counters the rule counts into.
	Counters []string `json:"counters,omitempty"`
	// Network and Transport are the start of the packet's headers, in the
	// first event of a packet in each base chain.
	Network   []byte `json:"-"`
	Transport []byte `json:"-"`
	Iif, Oif  uint32 `json:"-"`
	Mark      uint32 `json:"mark,omitempty"`
}

// Packet is the path of one packet through one network namespace:
// every event with its trace ID, in order.
type Packet struct {
	ID uint32
	// The packet's tuple, from the first headers reported (zero if none).
	Src, Dst         netip.Addr
	L4Proto          uint8
	SrcPort, DstPort uint16
	// TCPFlags are a TCP packet's flags (0x02 SYN, 0x10 ACK, ...).
	TCPFlags byte
	Events   []Event
}

// Opens reports whether the packet can be a connection's first: a TCP
// SYN without ACK, or any packet of another protocol.
func (p *Packet) Opens() bool {
	return p.L4Proto != unix.IPPROTO_TCP || p.TCPFlags&0x12 == 0x02
}

// Verdict is the packet's last verdict in this namespace: the last
// accept, drop or policy event ("" when the trace ended otherwise).
func (p *Packet) Verdict() string {
	for i := len(p.Events) - 1; i >= 0; i-- {
		switch v := p.Events[i].Verdict; v {
		case "accept", "drop", "stolen", "queue":
			return v
		}
	}
	return ""
}

// Packets groups events into packets, in order of each packet's first
// event. Events are grouped by trace ID, but the ID is not unique over
// time: the kernel derives it from the skb's address, flow hash and input
// interface, so the next packet of the same flow often gets the same ID
// (the freed skb's memory is reused). A packet enters a namespace through
// the trace table's chains (priority Priority, before all others),
// so an event of the trace table's rule after events of other tables
// starts a new packet. The tuple comes from each packet's first headers.
func Packets(events []Event) []*Packet {
	var out []*Packet
	cur := map[uint32]*Packet{}
	for _, e := range events {
		p := cur[e.ID]
		if p != nil && e.Table == TableName && e.Type == EventRule && p.leftTraceTable() {
			p = nil
		}
		if p == nil {
			p = &Packet{ID: e.ID}
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
func (p *Packet) leftTraceTable() bool {
	for _, e := range p.Events {
		if e.Table != TableName {
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

// ErrUnsupported says the kernel cannot trace (nf_tables without
// NFNLGRP_NFTRACE).
var ErrUnsupported = errors.New("nftrace: the kernel does not support nf_tables tracing")

// Listener receives trace events in one network namespace.
type Listener struct {
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
	counters []string
}

// Listen subscribes to the trace events of the network namespace
// netnsFd (< 0: the current one). Subscribe before the packets are sent:
// the kernel sends events only while someone listens.
func Listen(netnsFd int) (*Listener, error) {
	fd, err := kernel.DupNetNS(netnsFd)
	if err != nil {
		return nil, err
	}
	l := &Listener{nsFd: fd, rules: map[ruleKey]kernelRule{}, read: map[chainKey]bool{},
		hooks: map[chainKey]string{}, seen: map[chainKey]bool{}}
	nl, err := kernel.DialNetfilter(fd)
	if err != nil {
		l.Close()
		return nil, err
	}
	l.nl = nl
	if err := kernel.SetBuffers(nl, kernel.SocketBuffer); err != nil {
		l.Close()
		return nil, fmt.Errorf("nftrace: socket buffers: %w", err)
	}
	if err := nl.JoinGroup(nfnlgrpNFTrace); err != nil {
		l.Close()
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("%w (joining group NFNLGRP_NFTRACE: %v)", ErrUnsupported, err)
		}
		return nil, fmt.Errorf("nftrace: joining group NFNLGRP_NFTRACE: %w", err)
	}
	return l, nil
}

// Close releases the sockets.
func (l *Listener) Close() error {
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
func (l *Listener) Receive(ctx context.Context, deadline time.Time) ([]Event, error) {
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
		var out []Event
		for _, m := range msgs {
			e, ok, err := parseMessage(m)
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
func (l *Listener) Collect(ctx context.Context, idle time.Duration, done func([]Event) bool) ([]Event, error) {
	var all []Event
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
func (l *Listener) resolve(e *Event) {
	e.Hook = l.hook(chainKey{e.Family, e.Table, e.Chain})
	if e.Handle == 0 {
		return
	}
	rk := ruleKey{e.Family, e.Table, e.Handle}
	if r, ok := l.rules[rk]; ok {
		e.RuleID, e.RuleText, e.Counters = r.id, r.text, r.counters
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
	e.RuleID, e.RuleText, e.Counters = r.id, r.text, r.counters
}

// hook is a base chain's hook, "" for a regular chain (or one that could
// not be read).
func (l *Listener) hook(ck chainKey) string {
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
		if h := kernel.ChainHook(kc); h != nil {
			l.hooks[chainKey{ck.family, ck.table, kc.Name}] = h.Hook
		}
	}
	return l.hooks[ck]
}

func (l *Listener) ensureConn() error {
	if l.conn != nil {
		return nil
	}
	c, err := kernel.NewConn(l.nsFd, true)
	if err != nil {
		return err
	}
	l.conn = c
	return nil
}

func (l *Listener) readChain(ck chainKey) error {
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
		id, _ := kernel.RuleComment(kr.UserData)
		l.rules[ruleKey{ck.family, ck.table, kr.Handle}] = kernelRule{id: id, text: nft.DescribeExprs(kr.Exprs), counters: (&nft.Rule{Exprs: kr.Exprs}).CounterNames()}
	}
	return nil
}

// parseMessage decodes one NFT_MSG_TRACE message; ok is false for
// other messages.
func parseMessage(m netlink.Message) (Event, bool, error) {
	var e Event
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
				e.Verdict = nft.VerdictCodeText(code, chain)
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
		e.Type = EventRule
		if e.Handle == 0 {
			// The end of a chain: kernels since about 6.4 report it as
			// a rule event without a handle, verdict continue.
			e.Type = EventReturn
		}
	case unix.NFT_TRACETYPE_RETURN:
		e.Type = EventReturn
	case unix.NFT_TRACETYPE_POLICY:
		e.Type = EventPolicy
		if hasPolicy {
			e.Verdict = nft.VerdictCodeText(int32(policy), "")
		}
	default:
		e.Type = EventType(fmt.Sprintf("type %d", typ))
	}
	return e, true, nil
}

// PathStep is one step of a packet's path in the form the kernel's
// trace and the Tracer share: a rule that matched (by its ID) or a base
// chain's policy, and what it did, in the kernel's verdict words.
type PathStep struct {
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

func (s PathStep) String() string {
	what := "rule " + s.RuleID
	if s.Policy {
		what = "policy"
	}
	return fmt.Sprintf("%s %s/%s %s -> %s", s.Hook, s.Table, s.Chain, what, s.Verdict)
}

// Path is the packet's path as the kernel reported it: its rule and
// policy events, without return events (the end of a regular chain, which
// the Tracer does not record as a step) and without the tables in skip
// (e.g. TableName, whose rule set the flag).
func (p *Packet) Path(skip ...string) []PathStep {
	var out []PathStep
	hook := ""
	for _, e := range p.Events {
		if e.Hook != "" {
			hook = e.Hook
		}
		if e.Type == EventReturn || contains(skip, e.Table) {
			continue
		}
		out = append(out, PathStep{Hook: hook, Table: e.Table, Chain: e.Chain, RuleID: e.RuleID,
			Policy: e.Type == EventPolicy, Verdict: e.Verdict})
	}
	return out
}

// TracerPath is a Tracer result at hook in the same form: the rules that matched
// and the policies that decided, the tables in skip left out. What the
// Tracer writes as a NAT statement is an accept to the kernel, a reject a
// drop, a rule that matched without a verdict a continue.
func TracerPath(hook string, r trace.Result, skip ...string) []PathStep {
	var out []PathStep
	for _, s := range r.Steps {
		if !s.Matched || contains(skip, s.Table) {
			continue
		}
		st := PathStep{Hook: hook, Table: s.Table, Chain: s.Chain, Verdict: kernelVerdictWord(s.Verdict)}
		if s.Rule < 0 {
			st.Policy = true
		} else {
			st.RuleID = s.RuleID
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
