package lab

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The outside as a peer (root): pinned addresses of both families serve
// OutsidePorts, answering with the address; pods on either node and a
// node itself reach them, and the outside reaches pods, on TCP and UDP.
// Update keeps the servers, Down stops them.
func TestOutsidePeer(t *testing.T) {
	const out4, out6 = "192.0.2.10", "2001:db8::10"
	opts := Options{Outside: []netip.Addr{netip.MustParseAddr(out6), netip.MustParseAddr(out4)},
		OutsidePorts: mustProbes(t, "tcp/80", "udp/81")}
	l := upLab(t, loadBase(t, "dualstack.yaml"), opts)
	ext := l.External()
	if got := addrStrings(ext.Addrs); got != out4+", "+out6 {
		t.Errorf("outside addresses %s, want %s, %s", got, out4, out6)
	}
	if got := fmt.Sprint(ext.Serves); got != "[tcp/80 udp/81]" {
		t.Errorf("the outside serves %s", got)
	}

	type dial struct {
		from, dst     string
		protocol      corev1.Protocol
		result, reply string
		fromAddr      string
	}
	cases := []dial{
		{"x/four", out4 + ":80", corev1.ProtocolTCP, ResultOK, out4, "10.244.1.40"},
		{"y/dual", out4 + ":81", corev1.ProtocolUDP, ResultOK, out4, "10.244.1.52"},
		{"x/dual", "[" + out6 + "]:80", corev1.ProtocolTCP, ResultOK, out6, "fd00:10:244:2::50"},
		{"y/six", "[" + out6 + "]:81", corev1.ProtocolUDP, ResultOK, out6, "fd00:10:244:2::61"},
		{NodeSource("node-2"), out4 + ":80", corev1.ProtocolTCP, ResultOK, out4, "172.18.0.3"},
		// Only OutsidePorts are served; an IPv4-only pod has no IPv6 source.
		{"x/four", out4 + ":81", corev1.ProtocolTCP, ResultRefused, "", "10.244.1.40"},
		{"x/four", "[" + out6 + "]:80", corev1.ProtocolTCP, ResultNoAddress, "", ""},
		{ExternalSource, "10.244.1.40:80", corev1.ProtocolTCP, ResultOK, "x/four", out4},
		{ExternalSource, "10.244.2.50:81", corev1.ProtocolUDP, ResultOK, "x/dual", out4},
		{ExternalSource, "[fd00:10:244:1::60]:80", corev1.ProtocolTCP, ResultOK, "x/six", out6},
		{ExternalSource, "[fd00:10:244:2::51]:81", corev1.ProtocolUDP, ResultOK, "x/dual6", out6},
	}
	dialAll := func(t *testing.T) {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%s->%s/%s", c.from, c.dst, c.protocol), func(t *testing.T) {
				dst := netip.MustParseAddrPort(c.dst)
				o := l.Dial(t.Context(), c.from, dst, c.protocol, DialOptions{Timeout: 300 * time.Millisecond})
				if o.Result != c.result && c.result == ResultOK {
					// A lost first packet is not a verdict.
					o = l.Dial(t.Context(), c.from, dst, c.protocol, DialOptions{Timeout: 2 * time.Second})
				}
				if o.Result != c.result || o.Reply != c.reply {
					t.Errorf("%+v; want result %s, reply %q", o, c.result, c.reply)
				}
				if c.fromAddr != "" && o.FromAddr.String() != c.fromAddr {
					t.Errorf("source %s, want %s", o.FromAddr, c.fromAddr)
				}
			})
		}
	}
	t.Run("up", dialAll)

	servers := slices.Clone(l.outsideServers)
	next := loadBase(t, "dualstack.yaml")
	addYAML(t, next, podYAML("y", "late", "node-2", false, "80", "81", "10.244.2.70"))
	if err := l.Update(t.Context(), next); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if !slices.Equal(l.outsideServers, servers) {
		t.Errorf("Update replaced the outside's servers: %v, before %v", l.outsideServers, servers)
	}
	cases = append(cases, dial{"y/late", out4 + ":81", corev1.ProtocolUDP, ResultOK, out4, "10.244.2.70"})
	t.Run("updated", dialAll)

	if err := l.Down(); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if len(l.outsideServers) != 0 {
		t.Errorf("Down left %d outside servers", len(l.outsideServers))
	}
}
