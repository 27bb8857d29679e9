package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file holds the Builder's keys and statements: concatenated keys of
// packet fields and computed numbers (every set and map lookup goes
// through In, NotIn or VmapKey), map lookups that feed DNAT, dynamic-set
// updates, marks, masquerade and reject.

// firstReg is the first 32-bit register (NFT_REG32_00); a key or value
// is loaded from it upwards, each field taking whole registers.
const firstReg = 8

// IPSDstNAT is IPS_DST_NAT from linux/netfilter/nf_conntrack_common.h: the
// conntrack status bit of a connection whose destination was translated.
const IPSDstNAT = 1 << 5

// Value is something a rule can load into registers as one field of a key:
// a packet field, a conntrack field or a computed number.
type Value struct {
	text string
	len  uint32 // bytes
	load func(reg uint32) []expr.Any
}

func (v Value) regs() uint32 { return (v.len + 3) / 4 }

// AddrOf is the packet's source or destination address.
func AddrOf(f *Family, side Side) Value {
	off := f.SrcOffset
	if side == Dst {
		off = f.DstOffset
	}
	return Value{text: fmt.Sprintf("%s %s", f.Name, side), len: f.AddrLen, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.AddrLen}}
	}}
}

// L4Proto is `meta l4proto`.
func L4Proto() Value {
	return Value{text: "meta l4proto", len: 1, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}}
	}}
}

// DstPort is `th dport`.
func DstPort() Value {
	return Value{text: "th dport", len: 2, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
	}}
}

// SrcPort is `th sport`.
func SrcPort() Value {
	return Value{text: "th sport", len: 2, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}}
	}}
}

// Numgen is `numgen random mod n`: a random number in [0, n), in host
// byte order (see FieldInteger).
func Numgen(n uint32) Value {
	return Value{text: fmt.Sprintf("numgen random mod %d", n), len: 4, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Numgen{Register: reg, Modulus: n, Type: unix.NFT_NG_RANDOM}}
	}}
}

// CtOriginalAddr is the address a connection was first sent from or to,
// before any NAT: `ct original ip daddr`.
func CtOriginalAddr(f *Family, side Side) Value {
	keys := map[Side]expr.CtKey{Src: unix.NFT_CT_SRC_IP, Dst: unix.NFT_CT_DST_IP}
	if f == IPv6 {
		keys = map[Side]expr.CtKey{Src: unix.NFT_CT_SRC_IP6, Dst: unix.NFT_CT_DST_IP6}
	}
	key := keys[side]
	return Value{text: fmt.Sprintf("ct original %s %s", f.Name, side), len: f.AddrLen, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Ct{Register: reg, Key: key, Direction: 0}}
	}}
}

// CtOriginalDstPort is the connection's first destination port, before
// DNAT: `ct original proto-dst`.
func CtOriginalDstPort() Value {
	return Value{text: "ct original proto-dst", len: 2, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Ct{Register: reg, Key: expr.CtKeyPROTODST, Direction: 0}}
	}}
}

// MarkKey is `meta mark` as (a field of) the key of an interval set. nft
// keeps the keys of an interval set of a host-order type such as mark in
// network order, so the loaded mark is converted (byteorder), as nft
// does for `meta mark @set`; the set's elements hold the mark in network
// order (MarkKeyBytes).
func MarkKey() Value {
	return Value{text: "meta mark", len: 4, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: reg},
			&expr.Byteorder{SourceRegister: reg, DestRegister: reg, Op: expr.ByteorderHton, Len: 4, Size: 4}}
	}}
}

// MarkKeyBytes is a mark as an interval set's key holds it (MarkKey).
func MarkKeyBytes(mark uint32) []byte { return binary.BigEndian.AppendUint32(nil, mark) }

// MarkSetConst sets the packet mark: `meta mark set VALUE`.
func (b *Builder) MarkSetConst(mark uint32) *Builder {
	b.exprs = append(b.exprs, &expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(mark)}, packetMark.store())
	b.words = append(b.words, fmt.Sprintf("meta mark set 0x%08x", mark))
	return b
}

// MarkSetMap sets the packet mark to the value the data map holds for the
// key: `meta mark set KEY map @set`. A key the map lacks leaves the mark
// alone (the rule stops there).
func (b *Builder) MarkSetMap(f *Family, set string, key ...Value) *Builder {
	if f != nil {
		b.family(f)
	}
	text := b.loadKey(key)
	b.exprs = append(b.exprs,
		&expr.Lookup{SourceRegister: firstReg, SetName: set, IsDestRegSet: true, DestRegister: firstReg},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: firstReg})
	b.words = append(b.words, fmt.Sprintf("meta mark set %s map @%s", text, set))
	return b
}

// FieldInteger keys hold host-order numbers; IntegerBytes encodes one.
func IntegerBytes(n uint32) []byte { return binary.NativeEndian.AppendUint32(nil, n) }

// AddrPortBytes is a map value `address . port`, as DNAT reads it.
func AddrPortBytes(f *Family, a netip.Addr, port uint16) []byte {
	return Key(f.AddrBytes(a), PortBytes(port))
}

// loadKey loads the values as one concatenated key from firstReg and
// returns its text.
func (b *Builder) loadKey(vals []Value) string {
	reg := uint32(firstReg)
	texts := make([]string, len(vals))
	for i, v := range vals {
		b.exprs = append(b.exprs, v.load(reg)...)
		reg += v.regs()
		texts[i] = v.text
	}
	return strings.Join(texts, " . ")
}

// In matches `KEY @set`, the key being the concatenation of vals.
func (b *Builder) In(f *Family, set string, vals ...Value) *Builder {
	return b.lookupKey(f, set, false, vals)
}

// NotIn matches `KEY != @set`.
func (b *Builder) NotIn(f *Family, set string, vals ...Value) *Builder {
	return b.lookupKey(f, set, true, vals)
}

func (b *Builder) lookupKey(f *Family, set string, invert bool, vals []Value) *Builder {
	if f != nil {
		b.family(f)
	}
	key := b.loadKey(vals)
	b.exprs = append(b.exprs, &expr.Lookup{SourceRegister: firstReg, SetName: set, Invert: invert})
	op := ""
	if invert {
		op = "!= "
	}
	b.words = append(b.words, fmt.Sprintf("%s %s@%s", key, op, set))
	return b
}

// MatchFamily matches `meta nfproto ipv4` (or ipv6): for rules that
// otherwise look at no address.
func (b *Builder) MatchFamily(f *Family) *Builder {
	b.family(f)
	name := "ipv4"
	if f == IPv6 {
		name = "ipv6"
	}
	b.words = append(b.words, "meta nfproto "+name)
	return b
}

// L4ProtoIs matches `meta l4proto tcp` (or udp, sctp, a number).
func (b *Builder) L4ProtoIs(proto uint8) *Builder {
	b.exprs = append(b.exprs,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}})
	b.words = append(b.words, "meta l4proto "+ProtoName(proto))
	return b
}

// CtStateNew matches the first packet of a connection.
func (b *Builder) CtStateNew() *Builder {
	return b.ctAny(expr.CtKeySTATE, expr.CtStateBitNEW, "ct state new")
}

// CtStateInvalid matches packets conntrack could not place in a
// connection (a TCP segment out of its window).
func (b *Builder) CtStateInvalid() *Builder {
	return b.ctAny(expr.CtKeySTATE, expr.CtStateBitINVALID, "ct state invalid")
}

// CtStatusDNAT matches connections whose destination was translated.
func (b *Builder) CtStatusDNAT() *Builder {
	return b.ctAny(expr.CtKeySTATUS, IPSDstNAT, "ct status dnat")
}

// ctAny matches packets whose conntrack state or status (key) has any of
// bits; text is the match in nft syntax.
func (b *Builder) ctAny(key expr.CtKey, bits uint32, text string) *Builder {
	b.exprs = append(b.exprs,
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}})
	b.words = append(b.words, text)
	return b
}

// FibSaddrLocal matches packets whose source address is one of this
// (network namespace's) host's: `fib saddr type local`.
func (b *Builder) FibSaddrLocal() *Builder {
	b.exprs = append(b.exprs,
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	b.words = append(b.words, "fib saddr type local")
	return b
}

// MarkHas matches packets whose mark has all of bits.
func (b *Builder) MarkHas(bits uint32) *Builder { return b.markHas(packetMark, bits) }

// MarkSet sets bits in the packet mark: `meta mark set meta mark | bits`.
func (b *Builder) MarkSet(bits uint32) *Builder { return b.markSet(packetMark, bits) }

// MarkClear clears bits in the packet mark.
func (b *Builder) MarkClear(bits uint32) *Builder { return b.markClear(packetMark, bits) }

// CtMarkHas matches packets whose connection's mark has all of bits.
func (b *Builder) CtMarkHas(bits uint32) *Builder { return b.markHas(connMark, bits) }

// CtMarkSet sets bits in the connection's mark: `ct mark set ct mark |
// bits`. Unlike the packet mark it holds for every later packet of the
// connection, in every hook.
func (b *Builder) CtMarkSet(bits uint32) *Builder { return b.markSet(connMark, bits) }

// CtMarkClear clears bits in the connection's mark.
func (b *Builder) CtMarkClear(bits uint32) *Builder { return b.markClear(connMark, bits) }

// CtMarkSetField writes value into the bits of the connection's mark that
// mask covers, leaving the others: `ct mark set ct mark & ~mask | value`
// (value within mask).
func (b *Builder) CtMarkSetField(mask, value uint32) *Builder {
	b.markRewrite(connMark, ^mask, value&mask)
	b.words = append(b.words, fmt.Sprintf("ct mark set ct mark & 0x%08x | 0x%08x", ^mask, value&mask))
	return b
}

// CtMarkBits is the connection's mark with only mask's bits kept (`ct
// mark & mask`): a key of a map of FieldInteger (host order).
func CtMarkBits(mask uint32) Value {
	return Value{text: fmt.Sprintf("ct mark & 0x%08x", mask), len: 4, load: func(reg uint32) []expr.Any {
		return []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: reg},
			&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(0)}}
	}}
}

// mark is a 32-bit mark the rules can read and write: the packet's
// (meta mark) or its connection's (ct mark).
type mark struct {
	text  string
	load  func() expr.Any
	store func() expr.Any
}

var (
	packetMark = mark{"meta mark",
		func() expr.Any { return &expr.Meta{Key: expr.MetaKeyMARK, Register: 1} },
		func() expr.Any { return &expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1} }}
	connMark = mark{"ct mark",
		func() expr.Any { return &expr.Ct{Key: expr.CtKeyMARK, Register: 1} },
		func() expr.Any { return &expr.Ct{Key: expr.CtKeyMARK, SourceRegister: true, Register: 1} }}
)

func (b *Builder) markHas(m mark, bits uint32) *Builder {
	b.exprs = append(b.exprs, m.load(),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(bits)})
	b.words = append(b.words, fmt.Sprintf("%s & 0x%08x == 0x%08x", m.text, bits, bits))
	return b
}

func (b *Builder) markSet(m mark, bits uint32) *Builder {
	b.markRewrite(m, ^bits, bits)
	b.words = append(b.words, fmt.Sprintf("%s set %s | 0x%08x", m.text, m.text, bits))
	return b
}

func (b *Builder) markClear(m mark, bits uint32) *Builder {
	b.markRewrite(m, ^bits, 0)
	b.words = append(b.words, fmt.Sprintf("%s set %s & 0x%08x", m.text, m.text, ^bits))
	return b
}

// markRewrite sets m = (m & mask) ^ xor.
func (b *Builder) markRewrite(m mark, mask, xor uint32) {
	b.exprs = append(b.exprs, m.load(),
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		m.store())
}

// Update adds the key to a dynamic set, or refreshes its timeout:
// `update @set { KEY }`.
func (b *Builder) Update(f *Family, set string, key ...Value) *Builder {
	if f != nil {
		b.family(f)
	}
	text := b.loadKey(key)
	b.exprs = append(b.exprs, &expr.Dynset{SrcRegKey: firstReg, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE})
	b.words = append(b.words, fmt.Sprintf("update @%s { %s }", set, text))
	return b
}

// DNATMap ends the rule with `dnat ip to KEY map @set`: the map's value
// (address . port) is the new destination.
func (b *Builder) DNATMap(f *Family, set string, key ...Value) *Rule {
	b.family(f)
	text := b.loadKey(key)
	b.exprs = append(b.exprs,
		&expr.Lookup{SourceRegister: firstReg, SetName: set, IsDestRegSet: true, DestRegister: firstReg},
		b.dnat(f))
	b.words = append(b.words, fmt.Sprintf("dnat %s to %s map @%s", f.Name, text, set))
	return b.rule()
}

// DNAT ends the rule with `dnat ip to ADDR:PORT`. nft requires a
// transport protocol match (L4ProtoIs) before it.
func (b *Builder) DNAT(f *Family, a netip.Addr, port uint16) *Rule {
	b.family(f)
	b.exprs = append(b.exprs,
		&expr.Immediate{Register: firstReg, Data: f.AddrBytes(a)},
		&expr.Immediate{Register: firstReg + f.AddrLen/4, Data: PortBytes(port)},
		b.dnat(f))
	b.words = append(b.words, fmt.Sprintf("dnat %s to %s", f.Name, netip.AddrPortFrom(a, port)))
	return b.rule()
}

func (b *Builder) dnat(f *Family) *expr.NAT {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(f.NFProto),
		RegAddrMin: firstReg, RegProtoMin: firstReg + f.AddrLen/4, Specified: true}
}

// VmapKey ends the rule with `KEY vmap @set`.
func (b *Builder) VmapKey(f *Family, set string, key ...Value) *Rule {
	if f != nil {
		b.family(f)
	}
	text := b.loadKey(key)
	b.exprs = append(b.exprs, &expr.Lookup{SourceRegister: firstReg, SetName: set, IsDestRegSet: true, DestRegister: 0})
	b.words = append(b.words, fmt.Sprintf("%s vmap @%s", text, set))
	return b.rule()
}

// Masquerade ends the rule with `masquerade fully-random`: the source
// becomes the outgoing interface's address, with random source ports (as
// kube-proxy does, against port-reuse races).
func (b *Builder) Masquerade() *Rule {
	b.exprs = append(b.exprs, &expr.Masq{FullyRandom: true})
	b.words = append(b.words, "masquerade fully-random")
	return b.rule()
}

// RejectTCPReset ends the rule with a TCP reset, which a client reads as
// "connection refused" at once. Unlike ICMP errors, resets are not rate
// limited per destination by the kernel. nft requires `meta l4proto tcp`
// (L4ProtoIs) before it.
func (b *Builder) RejectTCPReset() *Rule {
	b.exprs = append(b.exprs, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	b.words = append(b.words, "reject with tcp reset")
	return b.rule()
}

// Reject ends the rule with an ICMP(v6) port unreachable, which a TCP
// client reads as "connection refused", as for a closed port; the kernel
// sends at most about one per second to a given host (icmp_ratelimit).
func (b *Builder) Reject() *Rule {
	b.exprs = append(b.exprs, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})
	b.words = append(b.words, "reject with icmpx port-unreachable")
	return b.rule()
}

// AddrIs matches `ip saddr A` (or daddr, or ip6).
func (b *Builder) AddrIs(f *Family, side Side, a netip.Addr) *Builder {
	b.family(f)
	b.exprs = append(b.exprs, AddrOf(f, side).load(1)...)
	b.exprs = append(b.exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: f.AddrBytes(a)})
	b.words = append(b.words, fmt.Sprintf("%s %s %s", f.Name, side, a.Unmap()))
	return b
}

// DstPortIs matches `th dport P`.
func (b *Builder) DstPortIs(p uint16) *Builder {
	b.exprs = append(b.exprs, DstPort().load(1)...)
	b.exprs = append(b.exprs, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: PortBytes(p)})
	b.words = append(b.words, fmt.Sprintf("th dport %d", p))
	return b
}

// NftraceSet is `meta nftrace set 1`.
func (b *Builder) NftraceSet() *Builder {
	b.exprs = append(b.exprs,
		&expr.Immediate{Register: 1, Data: []byte{1}},
		&expr.Meta{Key: expr.MetaKeyNFTRACE, SourceRegister: true, Register: 1})
	b.words = append(b.words, "meta nftrace set 1")
	return b
}
