package audit

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/netpol/netpol/internal/syncbuf"
)

func TestParsePacket(t *testing.T) {
	v4 := func(ihl int, proto byte, dport uint16) []byte {
		b := make([]byte, ihl*4+4)
		b[0] = 4<<4 | byte(ihl)
		b[9] = proto
		copy(b[12:], []byte{10, 0, 0, 1})
		copy(b[16:], []byte{10, 0, 1, 2})
		b[ihl*4+2], b[ihl*4+3] = byte(dport>>8), byte(dport)
		return b
	}
	v6 := func(proto byte, dport uint16) []byte {
		b := make([]byte, 44)
		b[0] = 6 << 4
		b[6] = proto
		src, dst := netip.MustParseAddr("fd00::1").As16(), netip.MustParseAddr("fd00::2").As16()
		copy(b[8:], src[:])
		copy(b[24:], dst[:])
		b[42], b[43] = byte(dport>>8), byte(dport)
		return b
	}
	tests := []struct {
		name string
		b    []byte
		want Packet
		ok   bool
	}{
		{"IPv4 TCP", v4(5, 6, 80), Packet{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.2"), "TCP", 80}, true},
		{"IPv4 with options, SCTP", v4(6, 132, 9000), Packet{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.2"), "SCTP", 9000}, true},
		{"IPv6 UDP", v6(17, 53), Packet{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), "UDP", 53}, true},
		{"ICMP: no port", v4(5, 1, 0), Packet{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.1.2"), "1", 0}, true},
		{"truncated", v4(5, 6, 80)[:12], Packet{}, false},
		{"not IP", []byte{0x20, 0, 0}, Packet{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParsePacket(tc.b)
			if ok != tc.ok || got != tc.want {
				t.Errorf("ParsePacket = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// lines are the lines out holds.
func lines(t *testing.T, out *syncbuf.Buffer) []Line {
	t.Helper()
	ls, err := ParseLines(out.String())
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

// TestLoggerFoldsRepeats: the same decision again within a second is
// folded: the first is written at once, the rest as one line with
// repeats when the second ends; another decision is its own line.
func TestLoggerFoldsRepeats(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	out := &syncbuf.Buffer{}
	l := NewLogger(out, LoggerOptions{Now: clock, Window: time.Hour}) // the ticker never flushes here
	deny := Line{Time: now, Verdict: "deny", Src: "x/a", Dst: "y/b", Protocol: "TCP", Port: 80}
	for i := range 5 {
		line := deny
		line.Time = now.Add(time.Duration(i) * time.Millisecond)
		l.Log(line)
	}
	other := deny
	other.Port = 81
	l.Log(other)
	if got := lines(t, out); len(got) != 2 || got[0].Repeats != 0 || got[1].Port != 81 {
		t.Fatalf("before the window ends: %+v", got)
	}
	l.Close()
	got := lines(t, out)
	if len(got) != 3 || got[2].Repeats != 4 || got[2].Port != 80 || !got[2].Time.Equal(now.Add(4*time.Millisecond)) {
		t.Fatalf("after: %+v", got)
	}
	if l.Stats.Written.Load() != 3 || l.Stats.Folded.Load() != 4 || l.Stats.Dropped.Load() != 0 {
		t.Errorf("stats: written %d folded %d dropped %d", l.Stats.Written.Load(), l.Stats.Folded.Load(), l.Stats.Dropped.Load())
	}
}

// TestLoggerRate: past the rate's burst, lines are counted as dropped,
// not written.
func TestLoggerRate(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	out := &syncbuf.Buffer{}
	l := NewLogger(out, LoggerOptions{Rate: 10, Burst: 20, Now: func() time.Time { return now }})
	for i := range 100 {
		l.Log(Line{Time: now, Verdict: "deny", Src: "x/a", Dst: "y/b", Protocol: "TCP", Port: uint16(i)})
	}
	l.Close()
	if got := len(lines(t, out)); got != 20 {
		t.Errorf("%d lines written, want the burst of 20", got)
	}
	if l.Stats.Dropped.Load() != 80 {
		t.Errorf("%d dropped, want 80", l.Stats.Dropped.Load())
	}
}
