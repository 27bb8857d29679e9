// Package dnssnoop reads the DNS answers the kernel queues to netpol
// (NFQUEUE, github.com/florianl/go-nfqueue): the packets as queued, their
// addresses, ports and DNS payload, for the agent to learn from (package
// domain) before it lets each answer go on to the pod.
package dnssnoop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Segment is one queued IP packet's transport part: a UDP datagram or a
// TCP segment.
type Segment struct {
	Src, Dst netip.AddrPort
	TCP      bool
	// Seq, SYN: TCP's sequence number and SYN flag; FIN: a FIN or RST
	// (the sender's stream ends).
	Seq      uint32
	SYN, FIN bool
	// Payload is the transport payload (a DNS message over UDP; part of
	// a DNS over TCP stream), sharing the packet's bytes.
	Payload []byte
}

// IP protocol numbers.
const (
	protoTCP = 6
	protoUDP = 17
)

// ParsePacket reads an IPv4 or IPv6 packet carrying UDP or TCP. IPv6
// extension headers are not followed (a DNS answer carries none); IPv4
// fragments other than the first are refused (they hold no transport
// header).
func ParsePacket(b []byte) (Segment, error) {
	if len(b) < 1 {
		return Segment{}, errors.New("empty packet")
	}
	var src, dst netip.Addr
	var proto byte
	var rest []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return Segment{}, fmt.Errorf("IPv4 packet of %d bytes", len(b))
		}
		ihl := int(b[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(b[2:]))
		if ihl < 20 || total < ihl || total > len(b) {
			return Segment{}, fmt.Errorf("IPv4 header length %d, total %d, packet %d bytes", ihl, total, len(b))
		}
		if binary.BigEndian.Uint16(b[6:])&0x1fff != 0 {
			return Segment{}, errors.New("IPv4 fragment past the first")
		}
		src, dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		proto, rest = b[9], b[ihl:total]
	case 6:
		if len(b) < 40 {
			return Segment{}, fmt.Errorf("IPv6 packet of %d bytes", len(b))
		}
		payload := int(binary.BigEndian.Uint16(b[4:]))
		if 40+payload > len(b) {
			return Segment{}, fmt.Errorf("IPv6 payload length %d, packet %d bytes", payload, len(b))
		}
		src, dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		proto, rest = b[6], b[40:40+payload]
	default:
		return Segment{}, fmt.Errorf("IP version %d", b[0]>>4)
	}
	var s Segment
	switch proto {
	case protoUDP:
		if len(rest) < 8 {
			return Segment{}, fmt.Errorf("UDP header of %d bytes", len(rest))
		}
		n := int(binary.BigEndian.Uint16(rest[4:]))
		if n < 8 || n > len(rest) {
			return Segment{}, fmt.Errorf("UDP length %d, %d bytes there", n, len(rest))
		}
		s.Payload = rest[8:n]
	case protoTCP:
		if len(rest) < 20 {
			return Segment{}, fmt.Errorf("TCP header of %d bytes", len(rest))
		}
		off := int(rest[12]>>4) * 4
		if off < 20 || off > len(rest) {
			return Segment{}, fmt.Errorf("TCP data offset %d, %d bytes there", off, len(rest))
		}
		s.TCP, s.Seq, s.Payload = true, binary.BigEndian.Uint32(rest[4:]), rest[off:]
		s.SYN, s.FIN = rest[13]&0x02 != 0, rest[13]&0x05 != 0
	default:
		return Segment{}, fmt.Errorf("IP protocol %d, not UDP or TCP", proto)
	}
	s.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(rest[0:]))
	s.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(rest[2:]))
	return s, nil
}
