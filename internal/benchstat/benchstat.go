// Package benchstat is what the benchmarks and scale harnesses share:
// percentiles of their samples, a process's memory and CPU time from
// /proc and its own live heap, and sizes given in the environment.
package benchstat

import (
	"cmp"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Percentile is the p-quantile (0 to 1) of vals by nearest rank; the zero
// value when there are none.
func Percentile[T cmp.Ordered](vals []T, p float64) T {
	if len(vals) == 0 {
		var zero T
		return zero
	}
	s := slices.Sorted(slices.Values(vals))
	return s[int(p*float64(len(s)-1)+0.5)]
}

// ProcStatusKiB reads one kB field of /proc/PID/status (VmRSS, VmHWM) and
// the process's Name; 0 and "" when the process is gone.
func ProcStatusKiB(pid int, field string) (kib int64, name string) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case field + ":":
			kib, _ = strconv.ParseInt(f[1], 10, 64)
		case "Name:":
			name = f[1]
		}
	}
	return kib, name
}

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on every
// Linux architecture (what sysconf(_SC_CLK_TCK) returns).
const userHZ = 100

// ProcCPU is the CPU time (user and system) a process has used so far, from
// /proc/PID/stat; ok is false when the process is gone.
func ProcCPU(pid int) (cpu time.Duration, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses,
	// so the fields are counted from its last ")"; utime and stime are
	// the stat's 14th and 15th fields, the 12th and 13th after comm.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / userHZ, true
}

// EnvInts reads the comma-separated positive integers of environment
// variable name; def when it is unset.
func EnvInts(name string, def []int) ([]int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s=%q: want positive integers", name, v)
		}
		out = append(out, n)
	}
	return out, nil
}

// LiveHeap is the live heap as of the last collection (call runtime.GC
// first for the live heap now).
func LiveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// WatchPeakLive collects garbage back to back until the returned function
// is called, which returns the largest live heap a collection found. The
// collections slow down what runs meanwhile: measure its time apart.
func WatchPeakLive() func() uint64 {
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			runtime.GC()
			if v := LiveHeap(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return peak.Load()
	}
}
