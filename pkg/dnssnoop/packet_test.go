package dnssnoop

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
)

// packet builds an IP packet (version by the addresses) carrying a UDP
// datagram or a TCP segment (seq, flags) with payload.
func packet(src, dst netip.AddrPort, tcp bool, seq uint32, flags byte, payload []byte) []byte {
	var l4 []byte
	if tcp {
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint32(l4[4:], seq)
		l4[12], l4[13] = 5<<4, flags
	} else {
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
	}
	binary.BigEndian.PutUint16(l4[0:], src.Port())
	binary.BigEndian.PutUint16(l4[2:], dst.Port())
	l4 = append(l4, payload...)
	proto := byte(protoUDP)
	if tcp {
		proto = protoTCP
	}
	if src.Addr().Is4() {
		ip := make([]byte, 20)
		ip[0], ip[9] = 0x45, proto
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		s, d := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		return append(ip, l4...)
	}
	ip := make([]byte, 40)
	ip[0], ip[6] = 0x60, proto
	binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return append(ip, l4...)
}

func TestParsePacket(t *testing.T) {
	dns4, pod4 := netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.244.1.5:40000")
	dns6, pod6 := netip.MustParseAddrPort("[fd00::a]:53"), netip.MustParseAddrPort("[fd00:244::5]:40000")
	for _, c := range []struct {
		name string
		pkt  []byte
		want Segment
	}{
		{"UDP over IPv4", packet(dns4, pod4, false, 0, 0, []byte("answer")), Segment{Src: dns4, Dst: pod4, Payload: []byte("answer")}},
		{"TCP over IPv6, SYN", packet(dns6, pod6, true, 4242, 0x12, nil), Segment{Src: dns6, Dst: pod6, TCP: true, Seq: 4242, SYN: true, Payload: []byte{}}},
		{"TCP over IPv4, data", packet(dns4, pod4, true, 7, 0x18, []byte{0, 3, 1, 2, 3}), Segment{Src: dns4, Dst: pod4, TCP: true, Seq: 7, Payload: []byte{0, 3, 1, 2, 3}}},
	} {
		got, err := ParsePacket(c.pkt)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got.Src != c.want.Src || got.Dst != c.want.Dst || got.TCP != c.want.TCP || got.Seq != c.want.Seq || got.SYN != c.want.SYN ||
			string(got.Payload) != string(c.want.Payload) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	udp := packet(dns4, pod4, false, 0, 0, []byte("answer"))
	frag := append([]byte(nil), udp...)
	frag[7] = 1 // fragment offset 8 bytes
	icmp := append([]byte(nil), udp...)
	icmp[9] = 1
	badUDP := append([]byte(nil), udp...)
	binary.BigEndian.PutUint16(badUDP[24:], 200)
	for _, c := range []struct {
		name, err string
		pkt       []byte
	}{
		{"empty", "empty", nil},
		{"short IPv4", "IPv4 packet of 10 bytes", udp[:10]},
		{"truncated", "total", udp[:len(udp)-2]},
		{"later fragment", "fragment", frag},
		{"ICMP", "not UDP or TCP", icmp},
		{"UDP length past the packet", "UDP length 200", badUDP},
		{"IP version 5", "IP version 5", []byte{0x50, 0, 0, 0}},
	} {
		if _, err := ParsePacket(c.pkt); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.err)
		}
	}
}
