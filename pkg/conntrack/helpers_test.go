package conntrack

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nsexec"
)

// requireRoot skips a kernel test when not root: it creates network
// namespaces, programs nftables and deletes conntrack entries.
func requireRoot(tb testing.TB) {
	tb.Helper()
	kerneltest.Require(tb, "it creates a network namespace, programs nftables and deletes conntrack entries")
}

// family holds one IP family's addresses in a test namespace. The client,
// the endpoint (pod) and the node address are local (on lo). The service
// VIPs are routed out of v0, one end of a veth pair whose other end, v1,
// drops what it gets (frames to a MAC that is not its own): a datagram to
// a VIP that no DNAT rule catches is tracked, then lost, like one to a
// service with no endpoints. (Not routed via lo: IPv6 turns a route via lo
// into a reject route, which drops the packet before conntrack confirms
// its entry.)
type family struct {
	name     string
	network  string     // "udp4" / "udp6"
	client   netip.Addr // source of every flow
	endpoint netip.Addr // the pod: echo servers on epPort and altPort
	node     netip.Addr // node address, NodePort nodePort DNATs to endpoint:epPort
	vip      netip.Addr // ClusterIP with endpoints: :53 -> endpoint:epPort, :54 -> endpoint:altPort
	idle     netip.Addr // ClusterIP without endpoints (no DNAT rule)
	nftDNAT  string     // "ip" / "ip6" for nft's "dnat <family> to"
}

const (
	epPort   = 5353
	altPort  = 5354
	nodePort = 30053
)

var (
	ipv4 = family{
		name: "IPv4", network: "udp4", nftDNAT: "ip",
		client:   netip.MustParseAddr("10.0.0.1"),
		endpoint: netip.MustParseAddr("10.0.0.2"),
		node:     netip.MustParseAddr("10.0.0.3"),
		vip:      netip.MustParseAddr("10.96.0.10"),
		idle:     netip.MustParseAddr("10.96.0.11"),
	}
	ipv6 = family{
		name: "IPv6", network: "udp6", nftDNAT: "ip6",
		client:   netip.MustParseAddr("fd00::1"),
		endpoint: netip.MustParseAddr("fd00::2"),
		node:     netip.MustParseAddr("fd00::3"),
		vip:      netip.MustParseAddr("fd00::10"),
		idle:     netip.MustParseAddr("fd00::11"),
	}
	families = []family{ipv4, ipv6}
)

// nftAddr formats a for an nft rule ("[fd00::2]" before a port).
func nftAddr(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

// testNS is a fresh named network namespace, deleted when the test ends
// (pass or fail), with lo up and both families' addresses on it.
type testNS struct {
	t    *testing.T
	name string
	h    netns.NsHandle
	nl   *netlink.Handle // for checking the conntrack table behind the Cleaner's back
}

func newTestNS(t *testing.T) *testNS {
	t.Helper()
	requireRoot(t)
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("test setup needs the %q binary: %v", bin, err)
		}
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	ns := &testNS{t: t, name: "netpol-ct-" + hex.EncodeToString(rnd[:])}

	// Registered first, so it runs last, after every socket is closed.
	t.Cleanup(func() {
		if err := netns.DeleteNamed(ns.name); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			t.Errorf("deleting netns %s: %v", ns.name, err)
		}
		os.Remove(filepath.Join("/run/netns", ns.name)) // in case the bind mount never happened
	})

	// A namespace belongs to an OS thread: make it on a locked thread and
	// put the thread back before anything else runs on it.
	err := nsexec.OnFreshThread(func() error {
		h, err := netns.NewNamed(ns.name)
		if err != nil {
			return fmt.Errorf("creating netns %s: %w", ns.name, err)
		}
		ns.h = h
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.h.Close() })

	ns.nl, err = netlink.NewHandleAt(ns.h, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns.name, err)
	}
	t.Cleanup(ns.nl.Close)

	// No DAD (addresses usable at once); no forwarding, so VIP traffic
	// without a DNAT rule dies quietly on lo.
	ns.sysctl("net/ipv6/conf/all/accept_dad", "0")
	ns.sysctl("net/ipv6/conf/default/accept_dad", "0")
	ns.sysctl("net/ipv4/ip_forward", "0")
	ns.ip("link", "set", "lo", "up")
	ns.ip("link", "add", "v0", "type", "veth", "peer", "name", "v1")
	ns.ip("link", "set", "v0", "up")
	ns.ip("link", "set", "v1", "up")
	for _, f := range families {
		bits := f.client.BitLen()
		for _, a := range []netip.Addr{f.client, f.endpoint, f.node} {
			args := []string{"addr", "add", netip.PrefixFrom(a, bits).String(), "dev", "lo"}
			if a.Is6() {
				args = append(args, "nodad")
			}
			ns.ip(args...)
		}
		for i, vip := range []netip.Addr{f.vip, f.idle} {
			ns.ip("route", "add", netip.PrefixFrom(vip, bits).String(), "dev", "v0")
			ns.ip("neigh", "add", vip.String(), "lladdr", fmt.Sprintf("02:00:00:00:00:%02x", i+1), "dev", "v0", "nud", "permanent")
		}
	}
	return ns
}

// in runs fn inside the namespace; sockets fn makes stay there.
func (ns *testNS) in(fn func() error) {
	ns.t.Helper()
	err := nsexec.OnFreshThread(func() error {
		if err := netns.Set(ns.h); err != nil {
			return fmt.Errorf("entering %s: %w", ns.name, err)
		}
		return fn()
	})
	if err != nil {
		ns.t.Fatal(err)
	}
}

func (ns *testNS) sysctl(key, value string) {
	ns.t.Helper()
	ns.in(func() error { return os.WriteFile("/proc/sys/"+key, []byte(value), 0o644) })
}

func (ns *testNS) ip(args ...string) {
	ns.t.Helper()
	ns.run(nil, "ip", append([]string{"-n", ns.name}, args...)...)
}

// nft loads an nft script in the namespace (test setup only).
func (ns *testNS) nft(script string) {
	ns.t.Helper()
	ns.run(strings.NewReader(script), "ip", "netns", "exec", ns.name, "nft", "-f", "-")
}

func (ns *testNS) run(stdin *strings.Reader, name string, args ...string) {
	ns.t.Helper()
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		ns.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
	}
}

// serviceRules is the proxy's part for the test: a nat output chain (which
// also turns conntrack on in the namespace) DNATing each family's VIP:53 to
// endpoint:ep53, VIP:54 to endpoint:altPort, and node:nodePort to
// endpoint:epPort. The idle VIP has no rule. The chain is replaced whole.
func (ns *testNS) serviceRules(ep53 uint16) {
	ns.t.Helper()
	var b strings.Builder
	b.WriteString("table inet svc {\n chain out { type nat hook output priority -100; }\n}\nflush chain inet svc out\n")
	for _, f := range families {
		dnat := func(dst netip.Addr, dport uint16, to netip.Addr, toPort uint16) {
			fmt.Fprintf(&b, "add rule inet svc out %s daddr %s udp dport %d dnat %s to %s:%d\n",
				f.nftDNAT, dst, dport, f.nftDNAT, nftAddr(to), toPort)
		}
		dnat(f.vip, 53, f.endpoint, ep53)
		dnat(f.vip, 54, f.endpoint, altPort)
		dnat(f.node, nodePort, f.endpoint, epPort)
	}
	ns.nft(b.String())
}

// addIdleEndpoint gives the idle VIP an endpoint: idle:53 -> endpoint:epPort.
func (ns *testNS) addIdleEndpoint() {
	ns.t.Helper()
	var b strings.Builder
	for _, f := range families {
		fmt.Fprintf(&b, "add rule inet svc out %s daddr %s udp dport 53 dnat %s to %s:%d\n",
			f.nftDNAT, f.idle, f.nftDNAT, nftAddr(f.endpoint), epPort)
	}
	ns.nft(b.String())
}

// startEcho starts a UDP server on addr:port in the namespace that answers
// every datagram with "<id>:<payload>", so a client can tell which
// endpoint answered.
func (ns *testNS) startEcho(f family, addr netip.Addr, port uint16, id string) {
	ns.t.Helper()
	var c *net.UDPConn
	ns.in(func() (err error) {
		c, err = net.ListenUDP(f.network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
		return err
	})
	ns.t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return // closed
			}
			c.WriteToUDPAddrPort(append([]byte(id+":"), buf[:n]...), from)
		}
	}()
}

// client is one UDP socket in the namespace: every datagram it sends to
// the same destination belongs to one conntrack entry.
type client struct {
	t    *testing.T
	c    *net.UDPConn
	addr netip.AddrPort
}

func (ns *testNS) newClient(f family) *client {
	ns.t.Helper()
	var c *net.UDPConn
	ns.in(func() (err error) {
		c, err = net.ListenUDP(f.network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.client, 0)))
		return err
	})
	ns.t.Cleanup(func() { c.Close() })
	return &client{t: ns.t, c: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}
}

// exchange sends one datagram to dst and returns the answer ("" if none
// came within wait). An answer must come from dst: the reply is un-NATed.
func (cl *client) exchange(dst netip.AddrPort, wait time.Duration) string {
	cl.t.Helper()
	if _, err := cl.c.WriteToUDPAddrPort([]byte("ping"), dst); err != nil {
		cl.t.Fatalf("send %v -> %v: %v", cl.addr, dst, err)
	}
	buf := make([]byte, 512)
	cl.c.SetReadDeadline(time.Now().Add(wait))
	for {
		n, from, err := cl.c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return ""
			}
			cl.t.Fatalf("receive on %v: %v", cl.addr, err)
		}
		if from == dst {
			return string(buf[:n])
		}
		cl.t.Logf("ignoring datagram from %v (waiting for %v)", from, dst)
	}
}

// flow identifies an entry by its original tuple (client -> dst).
type flow struct {
	src, dst netip.AddrPort
}

func (fl flow) String() string { return fmt.Sprintf("udp %v -> %v", fl.src, fl.dst) }

// table lists the namespace's UDP entries of both families by original
// tuple, with each entry's reply source.
func (ns *testNS) table() map[flow]netip.AddrPort {
	ns.t.Helper()
	out := map[flow]netip.AddrPort{}
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := ns.nl.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			ns.t.Fatalf("listing conntrack (family %d): %v", fam, err)
		}
		for _, f := range flows {
			if f.FamilyType != uint8(fam) {
				ns.t.Errorf("dump for family %d returned an entry of family %d: %v", fam, f.FamilyType, f)
			}
			if f.Forward.Protocol != unix.IPPROTO_UDP {
				continue
			}
			out[flow{addrPort(f.Forward.SrcIP, f.Forward.SrcPort), addrPort(f.Forward.DstIP, f.Forward.DstPort)}] =
				addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort)
		}
	}
	return out
}

// openCleaner opens a Cleaner on the namespace, closed when the test ends.
func (ns *testNS) openCleaner() *Cleaner {
	ns.t.Helper()
	c, err := NewCleaner(ns.h)
	if err != nil {
		ns.t.Fatal(err)
	}
	ns.t.Cleanup(func() { c.Close() })
	return c
}
