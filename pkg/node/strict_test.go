package node

import (
	"testing"
	"time"
)

// TestStrictDue: a change is checked at once when the last check is an
// interval old, else when the interval ends; with no interval, always at
// once; with nothing pending, never.
func TestStrictDue(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		interval time.Duration
		last     time.Time
		pending  bool
		now      time.Time
		wantAt   time.Time
		wantDue  bool
	}{
		{"nothing pending", time.Second, t0, false, t0.Add(time.Hour), time.Time{}, false},
		{"never checked", time.Second, time.Time{}, true, t0, time.Time{}.Add(time.Second), true},
		{"within the interval", time.Second, t0, true, t0.Add(300 * time.Millisecond), t0.Add(time.Second), false},
		{"the interval ended", time.Second, t0, true, t0.Add(time.Second), t0.Add(time.Second), true},
		{"no interval", 0, t0, true, t0, t0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Programmer{opts: Options{Strict: true, StrictInterval: tc.interval}, strictPending: tc.pending, strictLast: tc.last}
			at, due := p.StrictDue(tc.now)
			if !at.Equal(tc.wantAt) || due != tc.wantDue {
				t.Errorf("StrictDue = %v, %v; want %v, %v", at, due, tc.wantAt, tc.wantDue)
			}
		})
	}
	// Nothing to check without a table the kernel took.
	p := &Programmer{opts: Options{Strict: true}, strictPending: true}
	if r := p.EndDeniedFlows(); len(r.Ended) != 0 || r.Err != nil || !p.strictPending {
		t.Errorf("EndDeniedFlows before any table: %+v, pending %v", r, p.strictPending)
	}
}
