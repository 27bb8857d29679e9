package audit

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	nflog "github.com/florianl/go-nflog/v2"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// ReaderConfig is what a Reader reads and how it names what it reads.
type ReaderConfig struct {
	// NetNS is the network namespace's descriptor (<= 0: the caller's).
	NetNS int
	// Group is the NFLOG group the table logs to.
	Group uint16
	// Node names the lines.
	Node string
	// Attribution is the decision of the rule whose log prefix is given;
	// false when the table the kernel holds has no such rule (any more).
	Attribution func(prefix string) (nft.Attribution, bool)
	// Name names an address (namespace/pod, node/NAME); "" for one it
	// does not know, which the line names by the address.
	Name func(netip.Addr) string
}

// Reader reads the verdict log's NFLOG group of one network namespace
// into a Logger.
type Reader struct {
	nf     *nflog.Nflog
	cancel context.CancelFunc
}

// snaplen is how much of a packet the kernel copies: the network and
// transport headers' ports (IPv6 without extension headers).
const snaplen = 64

// The kernel sends the queued copies when 64 are queued or 0.1 s after
// the first: a line is late by a tenth of a second at most, and a burst
// is read in batches (its defaults are 100 copies or a second).
const (
	queueThreshold = 64
	flushTimeout   = 10 // hundredths of a second
	readBuffer     = 4 << 20
)

// Open starts reading cfg's group into l. Copies the kernel could not
// queue (a reader behind) and copies that do not parse are counted as
// dropped lines.
func Open(cfg ReaderConfig, l *Logger) (*Reader, error) {
	ns := cfg.NetNS
	if ns < 0 {
		ns = 0 // go-nflog: 0 is the current namespace
	}
	nf, err := nflog.Open(&nflog.Config{NetNS: ns, Group: cfg.Group, Copymode: nflog.CopyPacket, Bufsize: snaplen,
		QThresh: queueThreshold, Timeout: flushTimeout})
	if err != nil {
		return nil, fmt.Errorf("verdict log: opening NFLOG group %d: %w", cfg.Group, err)
	}
	// A burst of decisions is read in batches; a socket buffer of 4 MiB
	// (forced past rmem_max: the agent runs privileged) holds tens of
	// thousands of copies before the kernel drops any.
	if rc, err := nf.Con.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, readBuffer)
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	hook := func(a nflog.Attribute) int {
		if a.Prefix == nil || !strings.HasPrefix(*a.Prefix, nft.AuditPrefix) {
			return 0
		}
		line, ok := cfg.line(a)
		if !ok {
			l.Stats.Dropped.Add(1)
			return 0
		}
		l.Log(line)
		return 0
	}
	onErr := func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		// ENOBUFS: the socket overran and the kernel dropped copies
		// (never the packets); anything else, a line lost too.
		l.Stats.Dropped.Add(1)
		return 0
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, onErr); err != nil {
		cancel()
		nf.Close()
		return nil, fmt.Errorf("verdict log: reading NFLOG group %d: %w", cfg.Group, err)
	}
	return &Reader{nf: nf, cancel: cancel}, nil
}

// Close stops reading.
func (r *Reader) Close() error {
	if r == nil {
		return nil
	}
	r.cancel()
	return r.nf.Close()
}

// line makes the line of one copy; false when its rule or packet cannot
// be named.
func (cfg *ReaderConfig) line(a nflog.Attribute) (Line, bool) {
	at, ok := cfg.Attribution(*a.Prefix)
	if !ok || a.Payload == nil {
		return Line{}, false
	}
	p, ok := ParsePacket(*a.Payload)
	if !ok {
		return Line{}, false
	}
	t := time.Now()
	if a.Timestamp != nil {
		t = *a.Timestamp
	}
	name := func(addr netip.Addr) string {
		if cfg.Name != nil {
			if n := cfg.Name(addr); n != "" {
				return n
			}
		}
		return addr.String()
	}
	return Line{Time: t.UTC(), Node: cfg.Node, Verdict: at.Verdict, Direction: at.Direction,
		Src: name(p.Src), Dst: name(p.Dst), SrcIP: p.Src.String(), DstIP: p.Dst.String(), Protocol: p.Protocol, Port: p.Port,
		Tier: at.Tier, Policy: at.Policy, Rule: at.Rule, Action: at.Action, Staged: at.Staged, Enforced: at.Enforced}, true
}

// Packet is what a line says of a packet.
type Packet struct {
	Src, Dst netip.Addr
	Protocol string // TCP, UDP, SCTP, or the IP protocol's number
	Port     uint16 // the destination port (0 without one)
}

// ParsePacket reads an IPv4 or IPv6 packet's addresses, protocol and
// destination port (of TCP, UDP and SCTP, right after the IPv6 header or
// the IPv4 options).
func ParsePacket(b []byte) (Packet, bool) {
	if len(b) < 1 {
		return Packet{}, false
	}
	var p Packet
	var proto uint8
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return Packet{}, false
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl {
			return Packet{}, false
		}
		p.Src, _ = netip.AddrFromSlice(b[12:16])
		p.Dst, _ = netip.AddrFromSlice(b[16:20])
		proto, l4 = b[9], b[ihl:]
	case 6:
		if len(b) < 40 {
			return Packet{}, false
		}
		p.Src, _ = netip.AddrFromSlice(b[8:24])
		p.Dst, _ = netip.AddrFromSlice(b[24:40])
		proto, l4 = b[6], b[40:]
	default:
		return Packet{}, false
	}
	switch proto {
	case unix.IPPROTO_TCP:
		p.Protocol = "TCP"
	case unix.IPPROTO_UDP:
		p.Protocol = "UDP"
	case unix.IPPROTO_SCTP:
		p.Protocol = "SCTP"
	default:
		p.Protocol = fmt.Sprint(proto)
		return p, true
	}
	if len(l4) >= 4 {
		p.Port = binary.BigEndian.Uint16(l4[2:4])
	}
	return p, true
}
