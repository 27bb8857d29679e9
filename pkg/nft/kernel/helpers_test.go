package kernel

import (
	"encoding/binary"
	"net/netip"
	"sort"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/pkg/nft"
)

// requireRoot: the kernel tests run as root only (kerneltest.Require).
func requireRoot(tb testing.TB) {
	tb.Helper()
	kerneltest.Require(tb, "these tests create network namespaces and program nftables")
}

// newTestApplier returns an Applier for table "netpol" in a fresh netns.
func newTestApplier(tb testing.TB) (*Applier, int) {
	tb.Helper()
	fd := int(kerneltest.NetNS(tb, "these tests create network namespaces and program nftables"))
	a, err := NewApplier(fd, "netpol")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close() })
	return a, fd
}

// capturingConn is a library connection whose batches are kept, not sent
// (a fake socket that answers nothing, which Flush takes for success).
func capturingConn(tb testing.TB) (*nftables.Conn, *[]netlink.Message) {
	tb.Helper()
	var sent []netlink.Message
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		sent = append(sent, req...)
		return nil, nil
	}))
	if err != nil {
		tb.Fatal(err)
	}
	return conn, &sent
}

// inspectConn is a plain library connection for checks behind the
// Applier's back.
func inspectConn(tb testing.TB, fd int) *nftables.Conn {
	tb.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.CloseLasting() })
	return c
}

func kernelTable() *nftables.Table {
	return &nftables.Table{Name: "netpol", Family: nftables.TableFamilyINet}
}

// ruleHandles lists "chain/handle/comment" for every rule of the table.
func ruleHandles(tb testing.TB, c *nftables.Conn, table string) []string {
	tb.Helper()
	kt := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, ch := range chains {
		if ch.Table.Name != table {
			continue
		}
		rules, err := c.GetRules(kt, ch)
		if err != nil {
			tb.Fatal(err)
		}
		for _, r := range rules {
			comment, _ := RuleComment(r.UserData)
			out = append(out, ch.Name+"/"+itoa(r.Handle)+"/"+comment)
		}
	}
	sort.Strings(out)
	return out
}

func itoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// generation is the nftables ruleset generation: every committed
// transaction increments it, so an unchanged value proves nothing was
// committed.
func generation(tb testing.TB, fd int) uint32 {
	tb.Helper()
	nl, err := DialNetfilter(fd)
	if err != nil {
		tb.Fatal(err)
	}
	defer nl.Close()
	msgs, err := nl.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil || len(msgs) != 1 {
		tb.Fatalf("getgen: %v (%d messages)", err, len(msgs))
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		tb.Fatal(err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32()
		}
	}
	tb.Fatal("getgen: no generation id")
	return 0
}

// --- element builders ---

func addr(s string) []byte {
	a := netip.MustParseAddr(s)
	return nft.FamilyOf(a).AddrBytes(a)
}

// single is an element of a plain set.
func single(a string) nft.Element { return nft.Element{Key: addr(a)} }

// span is the range lo..hi of addresses (interval sets).
func span(lo, hi string) nft.Element { return nft.Element{Key: addr(lo), KeyEnd: addr(hi)} }

// cidr is the range of a prefix (interval sets), a single value for /32 and /128.
func cidr(p string) nft.Element {
	pr := netip.MustParsePrefix(p)
	return nft.Element{Key: addr(pr.Masked().Addr().String()), KeyEnd: addr(nft.LastAddr(pr).String())}
}

// tuple is addr-range . proto . port-range in a concatenated interval set.
func tuple(p string, proto uint8, lo, hi uint16) nft.Element {
	r := cidr(p)
	return nft.Element{
		Key:    nft.Key(r.Key, nft.ProtoBytes(proto), nft.PortBytes(lo)),
		KeyEnd: nft.Key(r.KeyEnd, nft.ProtoBytes(proto), nft.PortBytes(hi)),
	}
}

// exact is addr . proto . port in an exact concatenated set.
func exact(a string, proto uint8, port uint16) nft.Element {
	return nft.Element{Key: nft.Key(addr(a), nft.ProtoBytes(proto), nft.PortBytes(port))}
}

func svc(proto uint8, port uint16) nft.Element {
	return nft.Element{Key: nft.Key(nft.ProtoBytes(proto), nft.PortBytes(port))}
}

func to(e nft.Element, v nft.Verdict) nft.Element { e.Verdict = &v; return e }

func jump(c string) nft.Verdict  { return nft.Verdict{Kind: nft.Jump, Chain: c} }
func gotoV(c string) nft.Verdict { return nft.Verdict{Kind: nft.Goto, Chain: c} }

const (
	tcp = 6
	udp = 17
)

// fullTable has every kind of set this package supports and base chains on
// forward, input and output, with rules from the Builder.
func fullTable() *nft.Table {
	t := nft.NewTable("netpol")
	t.AddSet(&nft.Set{Name: "peers4", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true, Elements: []nft.Element{
		cidr("10.0.0.0/8"), single("192.0.2.7"), span("198.51.100.10", "198.51.100.20"),
		span("198.51.100.21", "198.51.100.30"), // adjacent to the previous range
		cidr("224.0.0.0/3"),                    // reaches the top address: no end element
		span("203.0.113.5", "203.0.113.5"),     // a singleton written as a range
	}})
	t.AddSet(&nft.Set{Name: "peers6", Fields: []nft.FieldType{nft.FieldIPv6}, Interval: true, Elements: []nft.Element{
		cidr("2001:db8::/32"), single("fd00::1"), cidr("ff00::/8"),
	}})
	t.AddSet(&nft.Set{Name: "allow4", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Interval: true, Elements: []nft.Element{
		tuple("10.0.0.0/8", tcp, 1, 1023), tuple("192.0.2.7/32", udp, 53, 53), tuple("0.0.0.0/0", udp, 0, 65535),
		tuple("11.200.0.0/24", tcp, 8080, 8081),
	}})
	t.AddSet(&nft.Set{Name: "allow6", Fields: []nft.FieldType{nft.FieldIPv6, nft.FieldProto, nft.FieldPort}, Interval: true, Elements: []nft.Element{
		tuple("2001:db8::/64", tcp, 443, 443), tuple("::/0", udp, 53, 53),
	}})
	t.AddSet(&nft.Set{Name: "exact4", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Elements: []nft.Element{
		exact("1.2.3.4", tcp, 443), exact("1.2.3.5", udp, 53),
	}})
	t.AddSet(&nft.Set{Name: "svc", Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Elements: []nft.Element{
		svc(tcp, 80), svc(udp, 53),
	}})
	t.AddSet(&nft.Set{Name: "hosts4", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{
		single("10.1.0.1"), single("10.1.0.2"),
	}})
	t.AddSet(&nft.Set{Name: "pods4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true, Elements: []nft.Element{
		to(single("10.1.0.1"), jump("class-a")), to(single("10.1.0.2"), gotoV("class-b")),
		to(single("10.1.0.3"), nft.Verdict{Kind: nft.Drop}),
	}})
	t.AddSet(&nft.Set{Name: "pods6", Fields: []nft.FieldType{nft.FieldIPv6}, Verdict: true, Elements: []nft.Element{
		to(single("fd00::10"), jump("class-a")), to(single("fd00::11"), gotoV("class-b")),
	}})

	ctAccept := nft.NewRule().CtEstablishedRelated().Verdict(nft.Verdict{Kind: nft.Accept})
	t.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: "forward", Priority: 0, Policy: "accept"}, Rules: []*nft.Rule{
		ctAccept,
		nft.NewRule().ICMPv6NeighborDiscovery().Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().Vmap(nft.IPv4, nft.Src, "pods4"),
		nft.NewRule().Vmap(nft.IPv6, nft.Src, "pods6"),
	}})
	t.AddChain(&nft.Chain{Name: "input", Base: &nft.Hook{Type: "filter", Hook: "input", Priority: -10, Policy: "accept"}, Rules: []*nft.Rule{
		ctAccept,
		nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "hosts4").Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	t.AddChain(&nft.Chain{Name: "output", Base: &nft.Hook{Type: "filter", Hook: "output", Priority: 10, Policy: "accept"}, Rules: []*nft.Rule{
		nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "peers4").Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().AddrInSet(nft.IPv6, nft.Dst, "peers6").Verdict(nft.Verdict{Kind: nft.Accept}),
	}})
	t.AddCounter(&nft.Counter{Name: "rule.allow4"})
	t.AddChain(&nft.Chain{Name: "class-a", Rules: []*nft.Rule{
		nft.NewRule().AddrL4ProtoPortInSet(nft.IPv4, nft.Dst, "allow4").CountInto("rule.allow4").Verdict(nft.Verdict{Kind: nft.Return}),
		nft.NewRule().AddrL4ProtoPortInSet(nft.IPv4, nft.Dst, "exact4").Verdict(nft.Verdict{Kind: nft.Return}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	t.AddChain(&nft.Chain{Name: "class-b", Rules: []*nft.Rule{
		nft.NewRule().AddrL4ProtoPortInSet(nft.IPv6, nft.Dst, "allow6").Verdict(nft.Verdict{Kind: nft.Return}),
		nft.NewRule().L4ProtoPortInSet("svc").Verdict(nft.Verdict{Kind: nft.Return}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	return t
}

// clone deep-copies a test table so steps can mutate their own copy.
func clone(t *nft.Table) *nft.Table {
	c := nft.NewTable(t.Name)
	for n, ch := range t.Chains {
		cc := *ch
		cc.Rules = append([]*nft.Rule(nil), ch.Rules...)
		if ch.Base != nil {
			h := *ch.Base
			cc.Base = &h
		}
		c.Chains[n] = &cc
	}
	for n, k := range t.Counters {
		c.AddCounter(&nft.Counter{Name: n, Of: k.Of})
	}
	for n, s := range t.Sets {
		cs := *s
		cs.Fields = append([]nft.FieldType(nil), s.Fields...)
		cs.Elements = append([]nft.Element(nil), s.Elements...)
		c.Sets[n] = &cs
	}
	return c
}

// without returns the elements minus those equal to drop (by ElementText).
func without(s *nft.Set, drop ...nft.Element) []nft.Element {
	gone := map[string]bool{}
	for _, e := range drop {
		gone[s.ElementText(e)] = true
	}
	var out []nft.Element
	for _, e := range s.Elements {
		if !gone[s.ElementText(e)] {
			out = append(out, e)
		}
	}
	return out
}
