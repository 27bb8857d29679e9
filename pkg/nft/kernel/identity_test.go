package kernel

import (
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/internal/nfttest"
	"github.com/netpol/netpol/pkg/nft/trace"
)

// TestIdentitiesInKernel applies the table, reads it back unchanged, has
// nft list it, and sends real UDP packets from each source: each arrives
// exactly when the Tracer accepts it.
func TestIdentitiesInKernel(t *testing.T) {
	a, fd := newTestApplier(t)
	desired := nfttest.IdentityTable()
	mustApply(t, a, fd, desired)
	if st, err := a.Apply(desired); err != nil || st != (Stats{}) {
		t.Errorf("second apply: %+v, %v", st, err)
	}
	h := netns.NsHandle(fd)
	if err := nsexec.LoopbackUp(h); err != nil {
		t.Fatal(err)
	}
	if err := nsexec.In(h, func() error {
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
	tr, err := trace.NewTracer(desired)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range nfttest.IdentityCases {
		t.Run(tc.Name, func(t *testing.T) {
			rs, err := tr.Trace(nft.HookOutput, trace.Packet{Family: nft.IPv4, Src: tc.Src, Dst: nfttest.IdentityLoopback, L4Proto: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: tc.Port})
			if err != nil {
				t.Fatal(err)
			}
			if got := udpArrives(t, h, tc.Src, tc.Port); got != (rs[0].Verdict == trace.Accept) || got != (trace.Verdict(tc.Verdict) == trace.Accept) {
				t.Errorf("arrived %v; tracer %s, want %s", got, rs[0].Verdict, tc.Verdict)
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
		srv, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(nfttest.IdentityLoopback, port)))
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
