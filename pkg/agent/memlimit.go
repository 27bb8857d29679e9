package agent

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// DefaultMemoryLimitRatio is the share of the container's memory limit
// the agent gives the Go runtime as its soft limit: the rest covers what
// the runtime does not count (the binary's pages, the kernel's socket
// buffers charged to the cgroup) before the kernel's OOM killer acts.
const DefaultMemoryLimitRatio = 0.9

// MemoryLimit is the soft memory limit the agent runs with and where it
// came from.
type MemoryLimit struct {
	// Bytes is the runtime's soft limit; math.MaxInt64 means none.
	Bytes int64
	// Source: "GOMEMLIMIT" (the environment), "cgroup" (ratio of the
	// cgroup's limit), "none" (no limit found, or ratio 0).
	Source string
}

// SetMemoryLimit gives the Go runtime a soft memory limit of ratio times
// the memory limit of the agent's cgroup (a container's
// resources.limits.memory; cgroup v1 or v2), unless GOMEMLIMIT is set,
// which wins. The garbage collector then runs more often as the heap
// nears the limit instead of letting it grow to twice what is live: the
// agent's peak during a large first sync stays under its container's
// limit rather than being OOM-killed for garbage (GOGC's pacing otherwise;
// see docs/history/benchmarks-journal.md). With no cgroup limit, or ratio 0, the runtime
// keeps its default (no limit). It is process-wide: cmd/ calls it once.
func SetMemoryLimit(ratio float64, log *slog.Logger) (MemoryLimit, error) {
	return setMemoryLimit(ratio, memlimit.FromCgroup, log)
}

func setMemoryLimit(ratio float64, provider memlimit.Provider, log *slog.Logger) (MemoryLimit, error) {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		return MemoryLimit{Bytes: debug.SetMemoryLimit(-1), Source: "GOMEMLIMIT"}, nil
	}
	if ratio == 0 {
		return MemoryLimit{Bytes: debug.SetMemoryLimit(-1), Source: "none"}, nil
	}
	if math.IsNaN(ratio) || ratio < 0 || ratio > 1 {
		return MemoryLimit{}, fmt.Errorf("memory limit ratio %v: a share of the container's limit, in (0, 1], or 0 (off)", ratio)
	}
	limit, err := memlimit.Set(memlimit.WithRatio(ratio), memlimit.WithProvider(provider))
	if err != nil {
		// No cgroup memory controller (a process outside containers):
		// the runtime's default, which is no limit.
		log.Debug("no cgroup memory limit found", "err", err)
		return MemoryLimit{Bytes: debug.SetMemoryLimit(-1), Source: "none"}, nil
	}
	if limit == math.MaxInt64 {
		return MemoryLimit{Bytes: limit, Source: "none"}, nil
	}
	return MemoryLimit{Bytes: limit, Source: "cgroup"}, nil
}
