package nft

import (
	"net/netip"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/ipfamily"
)

// Family is what differs between IPv4 and IPv6 in a rule or key: one code
// path builds both from this description.
type Family struct {
	Name      string // nft payload protocol: "ip" or "ip6"
	NFProto   byte
	AddrLen   uint32
	SrcOffset uint32 // offset of the source address in the network header
	DstOffset uint32
	Field     FieldType
	Suffix    string // "4" or "6", for object names
}

var (
	IPv4 = &Family{Name: "ip", NFProto: unix.NFPROTO_IPV4, AddrLen: 4, SrcOffset: 12, DstOffset: 16, Field: FieldIPv4, Suffix: "4"}
	IPv6 = &Family{Name: "ip6", NFProto: unix.NFPROTO_IPV6, AddrLen: 16, SrcOffset: 8, DstOffset: 24, Field: FieldIPv6, Suffix: "6"}
	// Families lists both, IPv4 first.
	Families = []*Family{IPv4, IPv6}
)

// FamilyOf returns the family of an address (ipfamily.Of).
func FamilyOf(a netip.Addr) *Family {
	if ipfamily.Of(a) == ipfamily.IPv4 {
		return IPv4
	}
	return IPv6
}

// AddrBytes is the key bytes of an address in family f.
func (f *Family) AddrBytes(a netip.Addr) []byte {
	if f == IPv4 {
		b := a.Unmap().As4()
		return b[:]
	}
	b := a.As16()
	return b[:]
}

// Side picks the source or destination address of a packet.
type Side int

const (
	Src Side = iota
	Dst
)

func (s Side) String() string {
	if s == Src {
		return "saddr"
	}
	return "daddr"
}

// Key concatenates field values into a set key; in a concatenation each
// field is padded to 4 bytes, as the kernel expects.
func Key(fields ...[]byte) []byte {
	if len(fields) == 1 {
		return append([]byte(nil), fields[0]...)
	}
	var k []byte
	for _, f := range fields {
		k = append(k, f...)
		for len(k)%4 != 0 {
			k = append(k, 0)
		}
	}
	return k
}

// ProtoBytes is the key bytes of an IP protocol number.
func ProtoBytes(p uint8) []byte { return []byte{p} }

// PortBytes is the key bytes of a transport port.
func PortBytes(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }

// Builder builds one rule's expressions and its nft text together.
type Builder struct {
	exprs []expr.Any
	words []string
	fam   *Family // the family already matched (meta nfproto), if any
}

// NewRule starts a rule.
func NewRule() *Builder { return &Builder{} }

// family matches the address family once per rule: an inet table needs it
// before any ip/ip6 payload. nft adds it implicitly, so it has no text.
func (b *Builder) family(f *Family) {
	if b.fam == f {
		return
	}
	if b.fam != nil {
		panic("nft: one rule cannot match two address families")
	}
	b.fam = f
	b.exprs = append(b.exprs,
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.NFProto}})
}

// Family matches packets of family f (`meta nfproto ipv4`): where a later
// statement (a counter) must see only what a later lookup of f's
// addresses would.
func (b *Builder) Family(f *Family) *Builder {
	if b.fam != f {
		b.family(f)
		b.words = append(b.words, "meta nfproto ipv"+f.Suffix)
	}
	return b
}

// CtEstablishedRelated matches replies and related packets of tracked
// connections.
func (b *Builder) CtEstablishedRelated() *Builder {
	return b.ctAny(expr.CtKeySTATE, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED, "ct state established,related")
}

// ICMPv6NeighborDiscovery matches router and neighbour solicitations and
// advertisements and redirects (types 133-137).
func (b *Builder) ICMPv6NeighborDiscovery() *Builder {
	b.family(IPv6)
	b.exprs = append(b.exprs,
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}})
	b.words = append(b.words, "icmpv6 type 133-137")
	return b
}

// AddrInSet matches `ip saddr @set` (or daddr, or ip6).
func (b *Builder) AddrInSet(f *Family, side Side, set string) *Builder {
	return b.In(f, set, AddrOf(f, side))
}

// L4ProtoPortInSet matches `meta l4proto . th dport @set`.
func (b *Builder) L4ProtoPortInSet(set string) *Builder {
	return b.In(nil, set, L4Proto(), DstPort())
}

// AddrL4ProtoPortInSet matches `ip saddr . meta l4proto . th dport @set`.
func (b *Builder) AddrL4ProtoPortInSet(f *Family, side Side, set string) *Builder {
	return b.In(f, set, AddrOf(f, side), L4Proto(), DstPort())
}

// Vmap ends the rule with `ip saddr vmap @map`.
func (b *Builder) Vmap(f *Family, side Side, vmap string) *Rule {
	return b.VmapKey(f, vmap, AddrOf(f, side))
}

// Verdict ends the rule with a verdict.
func (b *Builder) Verdict(v Verdict) *Rule {
	b.exprs = append(b.exprs, v.Expr())
	b.words = append(b.words, v.String())
	return b.rule()
}

// Done ends a rule that has statements but no verdict (evaluation goes on
// with the next rule).
func (b *Builder) Done() *Rule { return b.rule() }

func (b *Builder) rule() *Rule {
	// The ID once, here: every diff compares rules by it.
	return &Rule{Exprs: b.exprs, Text: strings.Join(b.words, " "), id: exprsID(b.exprs)}
}
