package agent

import (
	"errors"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

func TestSetMemoryLimit(t *testing.T) {
	const mib = 1 << 20
	noCgroup := func() (uint64, error) { return 0, errors.New("no memory controller") }
	for _, tc := range []struct {
		name       string
		ratio      float64
		provider   memlimit.Provider
		env        string
		wantBytes  int64
		wantSource string
		wantErr    bool
	}{
		{name: "a container's limit", ratio: 0.9, provider: memlimit.Limit(1000 * mib), wantBytes: 900 * mib, wantSource: "cgroup"},
		{name: "the whole limit", ratio: 1, provider: memlimit.Limit(512 * mib), wantBytes: 512 * mib, wantSource: "cgroup"},
		{name: "no limit in the cgroup", ratio: 0.9, provider: func() (uint64, error) { return 0, memlimit.ErrNoLimit }, wantBytes: math.MaxInt64, wantSource: "none"},
		{name: "no cgroup", ratio: 0.9, provider: noCgroup, wantBytes: math.MaxInt64, wantSource: "none"},
		{name: "off", ratio: 0, provider: memlimit.Limit(1000 * mib), wantBytes: math.MaxInt64, wantSource: "none"},
		{name: "GOMEMLIMIT wins", ratio: 0.9, provider: memlimit.Limit(1000 * mib), env: "300MiB", wantBytes: 300 * mib, wantSource: "GOMEMLIMIT"},
		{name: "ratio over 1", ratio: 1.5, provider: memlimit.Limit(1000 * mib), wantErr: true},
		{name: "negative ratio", ratio: -0.1, provider: memlimit.Limit(1000 * mib), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := debug.SetMemoryLimit(-1)
			t.Cleanup(func() { debug.SetMemoryLimit(before) })
			debug.SetMemoryLimit(math.MaxInt64)
			t.Setenv("GOMEMLIMIT", tc.env)
			if tc.env != "" {
				// The runtime reads GOMEMLIMIT at start; a process
				// started with it has this limit.
				debug.SetMemoryLimit(tc.wantBytes)
			}
			got, err := setMemoryLimit(tc.ratio, tc.provider, slog.New(slog.DiscardHandler))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ratio %v: no error, limit %+v", tc.ratio, got)
				}
				if debug.SetMemoryLimit(-1) != math.MaxInt64 {
					t.Errorf("a rejected ratio changed the runtime's limit to %d", debug.SetMemoryLimit(-1))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Bytes != tc.wantBytes || got.Source != tc.wantSource {
				t.Errorf("got %+v, want %d bytes from %s", got, tc.wantBytes, tc.wantSource)
			}
			if rt := debug.SetMemoryLimit(-1); rt != tc.wantBytes {
				t.Errorf("the runtime's limit is %d, want %d", rt, tc.wantBytes)
			}
		})
	}
}
