package dnssnoop

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Config says which queue to read.
type Config struct {
	// NetNS is the network namespace's fd (0: the current one).
	NetNS int
	// Num is the queue number the rules send to.
	Num uint16
	// MaxLen is how many packets the kernel holds for the reader
	// (default 4096). Past it the kernel lets packets through unread
	// (fail open): DNS keeps working and nothing is learned from them
	// (the kernel counts them: /proc/net/netfilter/nfnetlink_queue).
	MaxLen uint32
	// Latency, if set, hears how long each packet took from its arrival
	// at the reader to its verdict (the time the queue adds to an
	// answer, beyond the kernel's hand-over).
	Latency func(time.Duration)
}

// Stats counts what the queue saw.
type Stats struct {
	Packets   atomic.Uint64 // handed to the handler
	Malformed atomic.Uint64 // not an IP packet with UDP or TCP: let through
	Errors    atomic.Uint64 // socket errors (e.g. ENOBUFS: the kernel lost messages) and failed verdicts
}

// Handler decides a queued packet: true lets it go on, false drops it.
// It runs on the queue's reader goroutine, one packet at a time; the
// packet waits in the kernel until it returns.
type Handler func(Segment) bool

// Queue reads one NFQUEUE queue.
type Queue struct {
	nf     *nfqueue.Nfqueue
	cancel context.CancelFunc
	Stats  Stats
}

// Open binds the queue and starts handing its packets to h. Close stops.
func Open(cfg Config, h Handler) (*Queue, error) {
	if cfg.MaxLen == 0 {
		cfg.MaxLen = 4096
	}
	nf, err := nfqueue.Open(&nfqueue.Config{NetNS: cfg.NetNS, NfQueue: cfg.Num, MaxQueueLen: cfg.MaxLen,
		MaxPacketLen: 0xffff, Copymode: nfqueue.NfQnlCopyPacket, AfFamily: unix.AF_UNSPEC,
		Flags: nfqueue.NfQaCfgFlagFailOpen | nfqueue.NfQaCfgFlagGSO})
	if err != nil {
		return nil, fmt.Errorf("nfqueue %d: %w", cfg.Num, err)
	}
	// Report lost messages (ENOBUFS) instead of failing silently.
	if err := nf.SetOption(netlink.NoENOBUFS, false); err != nil {
		nf.Close()
		return nil, fmt.Errorf("nfqueue %d: %w", cfg.Num, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	q := &Queue{nf: nf, cancel: cancel}
	hook := func(a nfqueue.Attribute) int {
		if a.PacketID == nil {
			return 0
		}
		start := time.Now()
		verdict := nfqueue.NfAccept
		if a.Payload != nil {
			if s, err := ParsePacket(*a.Payload); err != nil {
				q.Stats.Malformed.Add(1)
			} else {
				q.Stats.Packets.Add(1)
				if !h(s) {
					verdict = nfqueue.NfDrop
				}
			}
		}
		if err := nf.SetVerdict(*a.PacketID, verdict); err != nil {
			q.Stats.Errors.Add(1)
		}
		if cfg.Latency != nil {
			cfg.Latency(time.Since(start))
		}
		return 0
	}
	onErr := func(err error) int {
		q.Stats.Errors.Add(1)
		var opErr *netlink.OpError
		if errors.As(err, &opErr) && errors.Is(opErr.Err, unix.ENOBUFS) {
			return 0 // go on reading
		}
		if ctx.Err() != nil {
			return 1
		}
		return 0
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, onErr); err != nil {
		cancel()
		nf.Close()
		return nil, fmt.Errorf("nfqueue %d: %w", cfg.Num, err)
	}
	return q, nil
}

// Close stops reading and unbinds the queue: its packets then pass
// unread (the rules' bypass flag).
func (q *Queue) Close() error {
	q.cancel()
	return q.nf.Close()
}
