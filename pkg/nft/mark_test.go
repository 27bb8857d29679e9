package nft

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	vnl "github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nftcheck"
	"github.com/netpol/netpol/internal/nsexec"
)

// The identity statements: a data map from address to a number written
// into the packet mark, and interval sets keyed by the mark alone and by
// mark . protocol . port.
var (
	idLoopback = netip.MustParseAddr("127.0.0.1")
	idOther    = netip.MustParseAddr("127.0.0.2") // not in the map: mark 0
)

const (
	idNamespace = 0x00050000 // a namespace's range of identities, /16
	idOfLoop    = idNamespace | 1
	idPort      = 9000
)

// identityLike judges UDP to ports 9000-9009 from loopback addresses by
// the source's identity, in the output hook: 9000-9001 allowed for the
// namespace, 9002 denied for it, anything else (and any address without
// an identity) dropped at the end.
func identityLike() *Table {
	t := NewTable("netpol")
	t.AddSet(&Set{Name: "ids4", Fields: []FieldType{FieldIPv4}, Data: []FieldType{FieldInteger}, Typeof: "ip saddr : meta mark",
		Elements: []Element{{Key: IPv4.AddrBytes(idLoopback), Data: IntegerBytes(idOfLoop)}}})
	t.AddSet(&Set{Name: "ids", Fields: []FieldType{FieldInteger}, Interval: true, Typeof: "meta mark",
		Elements: []Element{{Key: MarkKeyBytes(idNamespace), KeyEnd: MarkKeyBytes(idNamespace | 0xffff)}}})
	t.AddSet(&Set{Name: "allow", Fields: []FieldType{FieldInteger, FieldProto, FieldPort}, Interval: true,
		Typeof: "meta mark . meta l4proto . th dport",
		Elements: []Element{{Key: Key(MarkKeyBytes(idNamespace), ProtoBytes(unix.IPPROTO_UDP), PortBytes(idPort)),
			KeyEnd: Key(MarkKeyBytes(idNamespace|0xffff), ProtoBytes(unix.IPPROTO_UDP), PortBytes(idPort+1))}}})
	t.AddSet(&Set{Name: "probed", Fields: []FieldType{FieldProto, FieldPort}, Interval: true,
		Elements: []Element{{Key: Key(ProtoBytes(unix.IPPROTO_UDP), PortBytes(idPort)), KeyEnd: Key(ProtoBytes(unix.IPPROTO_UDP), PortBytes(idPort+9))}}})
	t.AddSet(&Set{Name: "denied-ports", Fields: []FieldType{FieldProto, FieldPort}, Interval: true,
		Elements: []Element{{Key: Key(ProtoBytes(unix.IPPROTO_UDP), PortBytes(idPort+2))}}})
	out := t.AddChain(&Chain{Name: "output", Base: &Hook{Type: "filter", Hook: HookOutput, Policy: "accept"}})
	out.Rules = []*Rule{NewRule().L4ProtoPortInSet("probed").Verdict(Verdict{Kind: Jump, Chain: "judge"})}
	judge := t.AddChain(&Chain{Name: "judge"})
	judge.Rules = []*Rule{
		NewRule().MarkSetConst(0).Done(),
		NewRule().MarkSetMap(IPv4, "ids4", AddrOf(IPv4, Src)).Done(),
		NewRule().In(nil, "allow", MarkKey(), L4Proto(), DstPort()).Verdict(Verdict{Kind: Accept}),
		NewRule().In(nil, "ids", MarkKey()).L4ProtoPortInSet("denied-ports").Verdict(Verdict{Kind: Drop}),
		NewRule().Verdict(Verdict{Kind: Drop}),
	}
	return t
}

var identityCases = []struct {
	name string
	src  netip.Addr
	port uint16
	want TraceVerdict
}{
	{"identity allowed on the port", idLoopback, idPort, TraceAccept},
	{"upper bound of the port range", idLoopback, idPort + 1, TraceAccept},
	{"identity in the denying set", idLoopback, idPort + 2, TraceDrop},
	{"identity on a port nothing allows", idLoopback, idPort + 5, TraceDrop},
	{"no identity: mark 0", idOther, idPort, TraceDrop},
	{"not judged", idLoopback, idPort + 20, TraceAccept},
}

func TestTraceIdentities(t *testing.T) {
	tr, err := NewTracer(identityLike())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range identityCases {
		t.Run(tc.name, func(t *testing.T) {
			pkt := Packet{Family: IPv4, Src: tc.src, Dst: idLoopback, L4Proto: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: tc.port, Mark: 0x4000}
			rs, err := tr.Trace(HookOutput, pkt)
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != 1 || rs[0].Verdict != tc.want {
				t.Fatalf("got %+v, want %s", rs, tc.want)
			}
		})
	}
}

// TestIdentityStatementsRender: nft itself takes the rendered table, and
// the rules read as nft writes them.
func TestIdentityStatementsRender(t *testing.T) {
	var buf bytes.Buffer
	if err := identityLike().Render(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"typeof ip saddr : meta mark", "127.0.0.1 : 327681", "327680-393215 . udp . 9000-9001",
		"meta mark set 0x00000000", "meta mark set ip saddr map @ids4", "meta mark . meta l4proto . th dport @allow accept",
		"meta mark @ids meta l4proto . th dport @denied-ports drop",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("rendered table lacks %q:\n%s", want, buf.String())
		}
	}
	path := filepath.Join(t.TempDir(), "identity.nft")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if !kerneltest.Can(t, "nft -c checks the rendered table against the kernel") {
		return
	}
	if out, err := nftcheck.Check(path); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// TestIdentitiesInKernel applies the table, reads it back unchanged, has
// nft list it, and sends real UDP packets from each source: each arrives
// exactly when the Tracer accepts it.
func TestIdentitiesInKernel(t *testing.T) {
	a, fd := newTestApplier(t)
	desired := identityLike()
	mustApply(t, a, fd, desired)
	if st, err := a.Apply(desired); err != nil || st != (Stats{}) {
		t.Errorf("second apply: %+v, %v", st, err)
	}
	h := netns.NsHandle(fd)
	if err := nsexec.In(h, func() error {
		lo, err := vnl.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := vnl.LinkSetUp(lo); err != nil {
			return err
		}
		if nftBin, err := exec.LookPath("nft"); err == nil {
			// nft must be able to list what the Applier wrote (an
			// operator's first look at a node).
			out, err := exec.Command(nftBin, "list", "table", "inet", "netpol").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "meta mark set ip saddr map @ids4") {
				t.Errorf("nft list: %v\n%s", err, out)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tr, err := NewTracer(desired)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range identityCases {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := tr.Trace(HookOutput, Packet{Family: IPv4, Src: tc.src, Dst: idLoopback, L4Proto: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: tc.port})
			if err != nil {
				t.Fatal(err)
			}
			if got := udpArrives(t, h, tc.src, tc.port); got != (rs[0].Verdict == TraceAccept) || got != (tc.want == TraceAccept) {
				t.Errorf("arrived %v; tracer %s, want %s", got, rs[0].Verdict, tc.want)
			}
		})
	}
}

// udpArrives sends one datagram from src to 127.0.0.1:port inside h and
// reports whether it was received.
func udpArrives(t *testing.T, h netns.NsHandle, src netip.Addr, port uint16) bool {
	t.Helper()
	var got bool
	if err := nsexec.In(h, func() error {
		srv, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(idLoopback, port)))
		if err != nil {
			return err
		}
		defer srv.Close()
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), srv.LocalAddr().(*net.UDPAddr))
		if err != nil {
			return err
		}
		defer c.Close()
		if _, err := c.Write([]byte("identity")); err != nil {
			return nil // a drop in output can fail the send (EPERM): not received
		}
		srv.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 16)
		n, _, err := srv.ReadFromUDP(buf)
		got = err == nil && string(buf[:n]) == "identity"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}
