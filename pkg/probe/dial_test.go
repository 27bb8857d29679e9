package probe

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/l4"
)

func TestParseTarget(t *testing.T) {
	tests := []struct {
		in   string
		want Target
		err  bool
	}{
		{in: "x/a=10.244.1.10:tcp/80", want: Target{"x/a", netip.MustParseAddr("10.244.1.10"), corev1.ProtocolTCP, 80}},
		{in: "y/b=[fd00::5]:UDP/81", want: Target{"y/b", netip.MustParseAddr("fd00::5"), corev1.ProtocolUDP, 81}},
		{in: "z/c=10.0.0.1:sctp/65535", want: Target{"z/c", netip.MustParseAddr("10.0.0.1"), corev1.ProtocolSCTP, 65535}},
		{in: "10.0.0.1:tcp/80", err: true},      // no name
		{in: "x/a=10.0.0.1:80", err: true},      // no protocol
		{in: "x/a=10.0.0.1:icmp/80", err: true}, // unknown protocol
		{in: "x/a=10.0.0.1:tcp/0", err: true},
		{in: "x/a=nowhere:tcp/80", err: true},
	}
	for _, tt := range tests {
		got, err := ParseTarget(tt.in)
		if (err != nil) != tt.err {
			t.Errorf("ParseTarget(%q): error %v, want error %v", tt.in, err, tt.err)
			continue
		}
		if err != nil {
			continue
		}
		if got != tt.want {
			t.Errorf("ParseTarget(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if back, err := ParseTarget(got.String()); err != nil || back != got {
			t.Errorf("ParseTarget(%q.String() = %q) = %+v, %v", tt.in, got.String(), back, err)
		}
	}
}

// freePort is a port nothing listens on (TCP and UDP) on loopback.
func freePort(t *testing.T) int32 {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			pc.Close()
			return int32(port)
		}
	}
	t.Fatal("no free port")
	return 0
}

// TestDialAll probes servers on loopback: answered, refused, and a server
// that answers for someone else.
func TestDialAll(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	served, unserved := freePort(t), freePort(t)
	var servers []*Server
	for _, p := range []l4.Port{{Protocol: corev1.ProtocolTCP, Port: served}, {Protocol: corev1.ProtocolUDP, Port: served}} {
		s, err := Serve(netns.None(), "x/a", lo, p)
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, s)
	}
	defer func() {
		if err := StopServers(servers); err != nil {
			t.Error(err)
		}
	}()
	targets := []Target{
		{"x/a", lo, corev1.ProtocolTCP, served},
		{"x/a", lo, corev1.ProtocolUDP, served},
		{"x/a", lo, corev1.ProtocolTCP, unserved},
		{"x/b", lo, corev1.ProtocolTCP, served}, // x/a answers
	}
	want := []struct {
		allowed bool
		result  string
	}{{true, ResultOK}, {true, ResultOK}, {false, ResultRefused}, {false, ResultWrongReply}}
	got := DialAll(context.Background(), targets, DialOptions{Timeout: time.Second, RetryTimeout: time.Second})
	if len(got) != len(targets) {
		t.Fatalf("%d outcomes for %d targets", len(got), len(targets))
	}
	for i, o := range got {
		if o.Allowed != want[i].allowed || o.Result != want[i].result || o.To != targets[i].Name || o.Port != targets[i].Port || o.Protocol != targets[i].Protocol {
			t.Errorf("%s: %+v, want allowed=%v result %s", targets[i], o, want[i].allowed, want[i].result)
		}
	}
}

// TestUDPReplyFromDst: a UDP server on the wildcard address answers from
// the address it was asked on (127.0.0.2 here), not from the one routing
// picks towards the client (127.0.0.1), which the client's connected
// socket would not take: a host-network pod, asked on its node's address
// by a local pod, is the case in a cluster.
func TestUDPReplyFromDst(t *testing.T) {
	port := freePort(t)
	s, err := Serve(netns.None(), "h/h", netip.IPv4Unspecified(), l4.Port{Protocol: corev1.ProtocolUDP, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	other := netip.MustParseAddr("127.0.0.2")
	got := DialAll(context.Background(), []Target{{"h/h", other, corev1.ProtocolUDP, port}}, DialOptions{Timeout: time.Second, RetryTimeout: time.Second})
	if len(got) != 1 || !got[0].Allowed || got[0].Result != ResultOK {
		t.Errorf("UDP to %s on a wildcard server: %+v, want an answer", other, got)
	}
}
