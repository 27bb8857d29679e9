package nftrace

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/nft/trace"
)

// The trace table, as the Tracer runs it: the tuple's packets get the rule
// that sets nftrace, other packets do not match it.
func TestTraceTableTracer(t *testing.T) {
	src, dst := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.7")
	tbl, err := Table(Match{Src: src, Dst: dst, L4Proto: unix.IPPROTO_TCP, DstPort: 8080})
	if err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{nft.HookPrerouting, nft.HookOutput} {
		c := tbl.Chains[hook]
		if c == nil || c.Base == nil || c.Base.Priority != Priority || c.Base.Hook != hook || len(c.Rules) != 1 {
			t.Fatalf("chain %s: %+v", hook, c)
		}
		if want := "ip saddr 10.244.1.5 ip daddr 10.244.2.7 meta l4proto tcp th dport 8080 meta nftrace set 1"; c.Rules[0].Text != want {
			t.Errorf("rule text %q, want %q", c.Rules[0].Text, want)
		}
	}
	tr, err := trace.NewTracer(tbl)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		pkt   trace.Packet
		match bool
	}{
		{trace.Packet{Family: nft.IPv4, Src: src, Dst: dst, L4Proto: unix.IPPROTO_TCP, SrcPort: 4000, DstPort: 8080}, true},
		{trace.Packet{Family: nft.IPv4, Src: src, Dst: dst, L4Proto: unix.IPPROTO_TCP, SrcPort: 4000, DstPort: 8081}, false},
		{trace.Packet{Family: nft.IPv4, Src: src, Dst: dst, L4Proto: unix.IPPROTO_UDP, SrcPort: 4000, DstPort: 8080}, false},
		{trace.Packet{Family: nft.IPv4, Src: dst, Dst: src, L4Proto: unix.IPPROTO_TCP, SrcPort: 8080, DstPort: 8080}, false},
	}
	for i, c := range cases {
		rs, err := tr.Trace(nft.HookPrerouting, c.pkt)
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != 1 || rs[0].Verdict != trace.Accept || len(rs[0].Steps) != 2 {
			t.Fatalf("case %d: %+v", i, rs)
		}
		if rs[0].Steps[0].Matched != c.match {
			t.Errorf("case %d: matched %v, want %v", i, rs[0].Steps[0].Matched, c.match)
		}
	}
	// IPv6, any port, no source.
	v6 := netip.MustParseAddr("fd00::7")
	tbl6, err := Table(Match{Dst: v6, L4Proto: unix.IPPROTO_UDP})
	if err != nil {
		t.Fatal(err)
	}
	if got := tbl6.Chains[nft.HookOutput].Rules[0].Text; got != "ip6 daddr fd00::7 meta l4proto udp meta nftrace set 1" {
		t.Errorf("ipv6 rule %q", got)
	}
	for _, bad := range []Match{{}, {Src: src, Dst: v6}, {Dst: dst, DstPort: 80}} {
		if _, err := Table(bad); err == nil {
			t.Errorf("Table(%+v): no error", bad)
		}
	}
}

// A trace message as the kernel encodes it decodes to the event.
func TestParseTraceMessage(t *testing.T) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(unix.NFTA_TRACE_TABLE, "netpol")
	ae.String(unix.NFTA_TRACE_CHAIN, "forward")
	ae.Uint64(unix.NFTA_TRACE_RULE_HANDLE, 42)
	ae.Uint32(unix.NFTA_TRACE_TYPE, unix.NFT_TRACETYPE_RULE)
	ae.Nested(unix.NFTA_TRACE_VERDICT, func(nae *netlink.AttributeEncoder) error {
		nae.Uint32(unix.NFTA_VERDICT_CODE, uint32(0xfffffffd)) // NFT_JUMP
		nae.String(unix.NFTA_VERDICT_CHAIN, "pod-x")
		return nil
	})
	ae.Uint32(unix.NFTA_TRACE_ID, 0xdeadbeef)
	ip := make([]byte, 20)
	ip[9] = unix.IPPROTO_TCP
	copy(ip[12:], []byte{10, 244, 1, 5})
	copy(ip[16:], []byte{10, 244, 2, 7})
	ae.Bytes(unix.NFTA_TRACE_NETWORK_HEADER, ip)
	ae.Bytes(unix.NFTA_TRACE_TRANSPORT_HEADER, []byte{0x9c, 0x40, 0x1f, 0x90, 0, 0, 0, 0})
	ae.Uint32(unix.NFTA_TRACE_NFPROTO, unix.NFPROTO_IPV4)
	data, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	m := netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_TRACE)},
		Data: append([]byte{unix.NFPROTO_INET, 0, 0, 0}, data...)}
	e, ok, err := parseMessage(m)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if e.Table != "netpol" || e.Chain != "forward" || e.Handle != 42 || e.Type != EventRule || e.Verdict != "jump pod-x" ||
		e.ID != 0xdeadbeef || e.Family != unix.NFPROTO_INET || e.NFProto != unix.NFPROTO_IPV4 {
		t.Errorf("event %+v", e)
	}
	ps := Packets([]Event{e, {ID: 1, Type: EventPolicy, Verdict: "accept"}, {ID: 0xdeadbeef, Type: EventPolicy, Verdict: "drop"}})
	if len(ps) != 2 || len(ps[0].Events) != 2 || ps[0].Src != netip.MustParseAddr("10.244.1.5") || ps[0].Dst != netip.MustParseAddr("10.244.2.7") ||
		ps[0].L4Proto != unix.IPPROTO_TCP || ps[0].SrcPort != 40000 || ps[0].DstPort != 8080 || ps[0].Verdict() != "drop" {
		t.Errorf("grouped %+v", ps[0])
	}
	// The next packet of a flow may get the same ID: it starts at the
	// trace table again.
	arm := Event{ID: 7, Table: TableName, Chain: "prerouting", Type: EventRule, Handle: 2, Verdict: "continue"}
	rule := Event{ID: 7, Table: "netpol", Chain: "forward", Type: EventRule, Handle: 9, Verdict: "accept"}
	if ps := Packets([]Event{arm, rule, arm, rule}); len(ps) != 2 || len(ps[0].Events) != 2 || len(ps[1].Events) != 2 {
		t.Errorf("two packets with one ID grouped as %d", len(ps))
	}
	// Other messages are not events.
	if _, ok, _ := parseMessage(netlink.Message{Header: netlink.Header{Type: 0x0a00}, Data: m.Data}); ok {
		t.Error("a NEWTABLE message decoded as a trace event")
	}
}

// traceTestTables is a small policy-like table: on output, an established
// rule that a new flow does not match, a rule that counts (matches, no
// verdict), a jump to a chain that it falls off the end of, and the
// policy; on input, an accept.
func traceTestTables(port uint16) *nft.Table {
	t := nft.NewTable("netpol")
	out := t.AddChain(&nft.Chain{Name: "output", Base: &nft.Hook{Type: "filter", Hook: nft.HookOutput, Policy: "accept"}})
	in := t.AddChain(&nft.Chain{Name: "input", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "accept"}})
	sub := t.AddChain(&nft.Chain{Name: "sub"})
	out.Rules = []*nft.Rule{
		nft.NewRule().CtEstablishedRelated().Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().L4ProtoIs(unix.IPPROTO_UDP).DstPortIs(port).Done(),
		nft.NewRule().L4ProtoIs(unix.IPPROTO_UDP).DstPortIs(port).Verdict(nft.Verdict{Kind: nft.Jump, Chain: "sub"}),
	}
	sub.Rules = []*nft.Rule{
		nft.NewRule().L4ProtoIs(unix.IPPROTO_UDP).DstPortIs(port + 1).Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	in.Rules = []*nft.Rule{
		nft.NewRule().L4ProtoIs(unix.IPPROTO_UDP).DstPortIs(port).Verdict(nft.Verdict{Kind: nft.Accept}),
	}
	return t
}

// TestNFTraceInKernel sends a real packet through the kernel with nftrace
// armed and checks the events name netpol's rules (by ID) in the order
// and with the verdicts the Tracer computes for the same tables.
func TestNFTraceInKernel(t *testing.T) {
	fd := int(kerneltest.NetNS(t, "these tests create network namespaces and program nftables"))
	h := netns.NsHandle(fd)
	if err := nsexec.LoopbackUp(h); err != nil {
		t.Fatal(err)
	}
	const port = 9999
	tbl := traceTestTables(port)
	a, err := kernel.NewApplier(fd, "netpol")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Apply(tbl); err != nil {
		t.Fatal(err)
	}
	lst, err := Listen(fd)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer lst.Close()
	lo := netip.MustParseAddr("127.0.0.1")
	armed, err := Arm(fd, Match{Src: lo, Dst: lo, L4Proto: unix.IPPROTO_UDP, DstPort: port})
	if err != nil {
		t.Fatal(err)
	}
	defer armed.Disarm()

	send := func(port uint16) {
		t.Helper()
		if err := nsexec.In(h, func() error {
			c, err := net.Dial("udp4", netip.AddrPortFrom(lo, port).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("trace"))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	send(port + 2) // not the tuple: no events
	send(port)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := lst.Collect(ctx, 300*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		t.Logf("event id=%08x type=%s %s/%s handle=%d rule=%s verdict=%s text=%q", e.ID, e.Type, e.Table, e.Chain, e.Handle, e.RuleID, e.Verdict, e.RuleText)
	}
	pkts := Packets(evs)
	if len(pkts) == 0 {
		t.Fatal("the kernel reported no trace events")
	}
	var kernelPath []PathStep
	for _, p := range pkts {
		if p.DstPort != 0 && p.DstPort != port {
			t.Errorf("traced a packet to port %d: only %d is armed", p.DstPort, port)
		}
		kernelPath = append(kernelPath, p.Path(TableName)...)
	}

	// The Tracer, hook by hook as the packet goes: output, then
	// (looped back) input.
	tr, err := trace.NewTracer(tbl)
	if err != nil {
		t.Fatal(err)
	}
	var want []PathStep
	pkt := trace.Packet{Family: nft.IPv4, Src: lo, Dst: lo, L4Proto: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: port}
	for _, hook := range []string{nft.HookOutput, nft.HookInput} {
		rs, err := tr.Trace(hook, pkt)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, TracerPath(hook, rs[0])...)
	}
	if !slices.Equal(kernelPath, want) {
		t.Errorf("kernel path:\n  %s\ntracer path:\n  %s", pathText(kernelPath), pathText(want))
	}
	// The trace table's own rule was reported too, with its text.
	var sawArm bool
	for _, e := range evs {
		if e.Table == TableName && e.Type == EventRule && strings.Contains(e.RuleText, "nftrace") {
			sawArm = true
		}
	}
	if !sawArm {
		t.Error("no event of the trace table's rule")
	}

	if err := armed.Disarm(); err != nil {
		t.Fatal(err)
	}
	if got, err := kernel.Read(fd, TableName); err != nil || got != nil {
		t.Errorf("after Disarm the trace table is %v (%v)", got, err)
	}
	send(port)
	quiet, cancelQuiet := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancelQuiet()
	if evs, _ := lst.Collect(quiet, 0, nil); len(evs) > 0 {
		t.Errorf("disarmed, yet %d events", len(evs))
	}
}

func pathText(steps []PathStep) string {
	var w []string
	for _, s := range steps {
		w = append(w, s.String())
	}
	return strings.Join(w, "\n  ")
}
