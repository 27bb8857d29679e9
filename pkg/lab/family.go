package lab

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/ipfamily"
)

// ipFamily is everything the topology does differently for IPv4 and IPv6,
// so that the rest of the package has one code path for both.
type ipFamily struct {
	name     string
	af       int // socket address family
	netlink  int // netlink.FAMILY_V4 / FAMILY_V6
	hostBits int
	// gateway is the address every pod uses as its default route. Each
	// node-side pod veth carries it: on IPv4 a link-local /32 (the same
	// address on many interfaces is fine), on IPv6 fe80::1 which is
	// per-link anyway.
	gateway    netip.Prefix
	defaultDst netip.Prefix
	synthetic  netip.Prefix // where synthetic node addresses are taken from
	// outsideBits is the length of the prefix around the first node's
	// address in which the underlay takes its own (see planServices).
	outsideBits int
	v6only      bool
}

var (
	ipv4 = &ipFamily{
		name: "IPv4", af: unix.AF_INET, netlink: netlink.FAMILY_V4, hostBits: 32,
		gateway:    netip.MustParsePrefix("169.254.1.1/32"),
		defaultDst: netip.MustParsePrefix("0.0.0.0/0"),
		// RFC 2544 benchmarking range: never a real cluster's.
		synthetic:   netip.MustParsePrefix("198.18.0.0/15"),
		outsideBits: 24,
	}
	ipv6 = &ipFamily{
		name: "IPv6", af: unix.AF_INET6, netlink: netlink.FAMILY_V6, hostBits: 128,
		gateway:    netip.MustParsePrefix("fe80::1/64"),
		defaultDst: netip.MustParsePrefix("::/0"),
		// A ULA /64 spelling "lab" (fd6c:6162 = "lab" in ASCII, roughly).
		synthetic:   netip.MustParsePrefix("fd6c:6162::/64"),
		outsideBits: 64,
		v6only:      true,
	}
	ipFamilies = []*ipFamily{ipv4, ipv6}
)

func familyOf(a netip.Addr) *ipFamily {
	if ipfamily.Of(a) == ipfamily.IPv4 {
		return ipv4
	}
	return ipv6
}

func hostPrefix(a netip.Addr) netip.Prefix {
	return netip.PrefixFrom(a, familyOf(a).hostBits)
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := familyOf(p.Addr()).hostBits
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func addrFromNet(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func prefixFromNet(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addrFromNet(n.IP), ones)
}

// usable reports why an address cannot be given to a lab interface, or "".
// Link-local addresses would clash with the pod gateways.
func usable(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "invalid address"
	case a.IsUnspecified():
		return "unspecified address"
	case a.IsLoopback():
		return "loopback address"
	case a.IsMulticast():
		return "multicast address"
	case a.IsLinkLocalUnicast():
		return "link-local address"
	case a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast address"
	}
	return ""
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
