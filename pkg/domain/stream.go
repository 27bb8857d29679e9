package domain

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Stream puts DNS messages back together from one direction of a DNS
// over TCP connection (RFC 1035 4.2.2: each message after its length in
// two bytes), from segments as they are seen: a message split over
// several, several in one, out of order or sent again.
type Stream struct {
	next    uint32 // sequence number of the next byte wanted
	started bool
	buf     []byte            // in-order bytes not yet a whole message
	ahead   map[uint32][]byte // segments past next, by sequence number
	held    int               // bytes in ahead
}

// maxAhead bounds what a Stream keeps of segments past a gap: two of
// the largest messages.
const maxAhead = 2 * (2 + 65535)

// ErrStreamGap: more bytes arrived past a missing segment than the
// stream keeps; it cannot continue.
var ErrStreamGap = errors.New("dns over tcp: too much data past a missing segment")

// Start anchors the stream at the sender's SYN: its sequence number is
// isn, and the first data byte isn+1. Without it, the first segment
// Add sees is taken for the stream's start.
func (s *Stream) Start(isn uint32) {
	*s = Stream{next: isn + 1, started: true}
}

// Add takes a segment's sequence number and payload and returns the
// whole messages that are complete now, in stream order (each without
// its length prefix, in bytes of its own).
func (s *Stream) Add(seq uint32, payload []byte) ([][]byte, error) {
	if !s.started {
		s.next, s.started = seq, true
	}
	if len(payload) == 0 {
		return nil, nil
	}
	s.take(seq, payload)
	for {
		p, ok := s.ahead[s.next]
		if !ok {
			// A held segment that begins before next but reaches past it
			// (an overlap) counts too.
			found := false
			for at, q := range s.ahead {
				if before(at, s.next) {
					delete(s.ahead, at)
					s.held -= len(q)
					s.take(at, q)
					found = true
					break
				}
			}
			if !found {
				break
			}
			continue
		}
		delete(s.ahead, s.next)
		s.held -= len(p)
		s.take(s.next, p)
	}
	if s.held > maxAhead {
		return nil, ErrStreamGap
	}
	return s.messages(), nil
}

// take appends what of the segment is new at next, or keeps it for later
// when it begins past next.
func (s *Stream) take(seq uint32, p []byte) {
	if before(s.next, seq) {
		if _, dup := s.ahead[seq]; !dup {
			if s.ahead == nil {
				s.ahead = map[uint32][]byte{}
			}
			s.ahead[seq] = append([]byte(nil), p...)
			s.held += len(p)
		}
		return
	}
	skip := s.next - seq // bytes already taken (a retransmission)
	if uint64(skip) >= uint64(len(p)) {
		return
	}
	s.buf = append(s.buf, p[skip:]...)
	s.next += uint32(len(p)) - skip
}

// messages cuts the whole messages off the front of buf.
func (s *Stream) messages() [][]byte {
	var out [][]byte
	for len(s.buf) >= 2 {
		n := int(binary.BigEndian.Uint16(s.buf))
		if len(s.buf) < 2+n {
			break
		}
		out = append(out, append([]byte(nil), s.buf[2:2+n]...))
		s.buf = s.buf[2+n:]
	}
	if len(s.buf) == 0 {
		s.buf = nil
	}
	return out
}

// before reports whether sequence number a comes before b (modulo 2^32).
func before(a, b uint32) bool { return int32(a-b) < 0 }

// String says where the stream is, for logs.
func (s *Stream) String() string {
	return fmt.Sprintf("next %d, %d bytes of a message, %d bytes ahead", s.next, len(s.buf), s.held)
}
