package nft

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
)

// requireRoot: the kernel tests run as root only (kerneltest.Require).
func requireRoot(tb testing.TB) {
	tb.Helper()
	kerneltest.Require(tb, "these tests create network namespaces and program nftables")
}

// newNetNS creates a network namespace named netpol-test-<random> for one
// test and returns its fd; cleanup deletes it even if the test fails.
func newNetNS(tb testing.TB) int {
	tb.Helper()
	requireRoot(tb)
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		tb.Fatal(err)
	}
	name := "netpol-test-" + hex.EncodeToString(rnd[:])
	tb.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			tb.Errorf("delete netns %s: %v", name, err)
		}
		os.Remove(filepath.Join("/run/netns", name)) // if the mount never happened
	})

	// Namespaces belong to OS threads: create on this locked thread, then
	// switch it back before it runs anything else.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("current netns: %v", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		tb.Fatalf("switch back to the original netns: %v", serr)
	}
	if err != nil {
		tb.Fatalf("create netns %s: %v", name, err)
	}
	tb.Cleanup(func() { h.Close() })
	return int(h)
}

// newTestApplier returns an Applier for table "netpol" in a fresh netns.
func newTestApplier(tb testing.TB) (*Applier, int) {
	tb.Helper()
	fd := newNetNS(tb)
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
			comment, _ := ruleComment(r.UserData)
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
	nl, err := dialNetfilter(fd)
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
	return FamilyOf(a).AddrBytes(a)
}

// single is an element of a plain set.
func single(a string) Element { return Element{Key: addr(a)} }

// span is the range lo..hi of addresses (interval sets).
func span(lo, hi string) Element { return Element{Key: addr(lo), KeyEnd: addr(hi)} }

// cidr is the range of a prefix (interval sets), a single value for /32 and /128.
func cidr(p string) Element {
	pr := netip.MustParsePrefix(p)
	return Element{Key: addr(pr.Masked().Addr().String()), KeyEnd: addr(LastAddr(pr).String())}
}

// tuple is addr-range . proto . port-range in a concatenated interval set.
func tuple(p string, proto uint8, lo, hi uint16) Element {
	r := cidr(p)
	return Element{
		Key:    Key(r.Key, ProtoBytes(proto), PortBytes(lo)),
		KeyEnd: Key(r.KeyEnd, ProtoBytes(proto), PortBytes(hi)),
	}
}

// exact is addr . proto . port in an exact concatenated set.
func exact(a string, proto uint8, port uint16) Element {
	return Element{Key: Key(addr(a), ProtoBytes(proto), PortBytes(port))}
}

func svc(proto uint8, port uint16) Element {
	return Element{Key: Key(ProtoBytes(proto), PortBytes(port))}
}

func to(e Element, v Verdict) Element { e.Verdict = &v; return e }

func jump(c string) Verdict  { return Verdict{Kind: Jump, Chain: c} }
func gotoV(c string) Verdict { return Verdict{Kind: Goto, Chain: c} }

const (
	tcp = 6
	udp = 17
)

// fullTable has every kind of set this package supports and base chains on
// forward, input and output, with rules from the Builder.
func fullTable() *Table {
	t := NewTable("netpol")
	t.AddSet(&Set{Name: "peers4", Fields: []FieldType{FieldIPv4}, Interval: true, Elements: []Element{
		cidr("10.0.0.0/8"), single("192.0.2.7"), span("198.51.100.10", "198.51.100.20"),
		span("198.51.100.21", "198.51.100.30"), // adjacent to the previous range
		cidr("224.0.0.0/3"),                    // reaches the top address: no end element
		span("203.0.113.5", "203.0.113.5"),     // a singleton written as a range
	}})
	t.AddSet(&Set{Name: "peers6", Fields: []FieldType{FieldIPv6}, Interval: true, Elements: []Element{
		cidr("2001:db8::/32"), single("fd00::1"), cidr("ff00::/8"),
	}})
	t.AddSet(&Set{Name: "allow4", Fields: []FieldType{FieldIPv4, FieldProto, FieldPort}, Interval: true, Elements: []Element{
		tuple("10.0.0.0/8", tcp, 1, 1023), tuple("192.0.2.7/32", udp, 53, 53), tuple("0.0.0.0/0", udp, 0, 65535),
		tuple("11.200.0.0/24", tcp, 8080, 8081),
	}})
	t.AddSet(&Set{Name: "allow6", Fields: []FieldType{FieldIPv6, FieldProto, FieldPort}, Interval: true, Elements: []Element{
		tuple("2001:db8::/64", tcp, 443, 443), tuple("::/0", udp, 53, 53),
	}})
	t.AddSet(&Set{Name: "exact4", Fields: []FieldType{FieldIPv4, FieldProto, FieldPort}, Elements: []Element{
		exact("1.2.3.4", tcp, 443), exact("1.2.3.5", udp, 53),
	}})
	t.AddSet(&Set{Name: "svc", Fields: []FieldType{FieldProto, FieldPort}, Elements: []Element{
		svc(tcp, 80), svc(udp, 53),
	}})
	t.AddSet(&Set{Name: "hosts4", Fields: []FieldType{FieldIPv4}, Elements: []Element{
		single("10.1.0.1"), single("10.1.0.2"),
	}})
	t.AddSet(&Set{Name: "pods4", Fields: []FieldType{FieldIPv4}, Verdict: true, Elements: []Element{
		to(single("10.1.0.1"), jump("class-a")), to(single("10.1.0.2"), gotoV("class-b")),
		to(single("10.1.0.3"), Verdict{Kind: Drop}),
	}})
	t.AddSet(&Set{Name: "pods6", Fields: []FieldType{FieldIPv6}, Verdict: true, Elements: []Element{
		to(single("fd00::10"), jump("class-a")), to(single("fd00::11"), gotoV("class-b")),
	}})

	ctAccept := NewRule().CtEstablishedRelated().Verdict(Verdict{Kind: Accept})
	t.AddChain(&Chain{Name: "forward", Base: &Hook{Type: "filter", Hook: "forward", Priority: 0, Policy: "accept"}, Rules: []*Rule{
		ctAccept,
		NewRule().ICMPv6NeighborDiscovery().Verdict(Verdict{Kind: Accept}),
		NewRule().Vmap(IPv4, Src, "pods4"),
		NewRule().Vmap(IPv6, Src, "pods6"),
	}})
	t.AddChain(&Chain{Name: "input", Base: &Hook{Type: "filter", Hook: "input", Priority: -10, Policy: "accept"}, Rules: []*Rule{
		ctAccept,
		NewRule().AddrInSet(IPv4, Src, "hosts4").Verdict(Verdict{Kind: Drop}),
	}})
	t.AddChain(&Chain{Name: "output", Base: &Hook{Type: "filter", Hook: "output", Priority: 10, Policy: "accept"}, Rules: []*Rule{
		NewRule().AddrInSet(IPv4, Dst, "peers4").Verdict(Verdict{Kind: Accept}),
		NewRule().AddrInSet(IPv6, Dst, "peers6").Verdict(Verdict{Kind: Accept}),
	}})
	t.AddChain(&Chain{Name: "class-a", Rules: []*Rule{
		NewRule().AddrL4ProtoPortInSet(IPv4, Dst, "allow4").Verdict(Verdict{Kind: Return}),
		NewRule().AddrL4ProtoPortInSet(IPv4, Dst, "exact4").Verdict(Verdict{Kind: Return}),
		NewRule().Verdict(Verdict{Kind: Drop}),
	}})
	t.AddChain(&Chain{Name: "class-b", Rules: []*Rule{
		NewRule().AddrL4ProtoPortInSet(IPv6, Dst, "allow6").Verdict(Verdict{Kind: Return}),
		NewRule().L4ProtoPortInSet("svc").Verdict(Verdict{Kind: Return}),
		NewRule().Verdict(Verdict{Kind: Drop}),
	}})
	return t
}

// clone deep-copies a test table so steps can mutate their own copy.
func clone(t *Table) *Table {
	c := NewTable(t.Name)
	for n, ch := range t.Chains {
		cc := *ch
		cc.Rules = append([]*Rule(nil), ch.Rules...)
		if ch.Base != nil {
			h := *ch.Base
			cc.Base = &h
		}
		c.Chains[n] = &cc
	}
	for n, s := range t.Sets {
		cs := *s
		cs.Fields = append([]FieldType(nil), s.Fields...)
		cs.Elements = append([]Element(nil), s.Elements...)
		c.Sets[n] = &cs
	}
	return c
}

// without returns the elements minus those equal to drop (by ElementText).
func without(s *Set, drop ...Element) []Element {
	gone := map[string]bool{}
	for _, e := range drop {
		gone[s.ElementText(e)] = true
	}
	var out []Element
	for _, e := range s.Elements {
		if !gone[s.ElementText(e)] {
			out = append(out, e)
		}
	}
	return out
}
