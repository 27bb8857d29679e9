package benchstat

import (
	"os"
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	vals := []int{5, 1, 4, 2, 3}
	for _, tt := range []struct {
		p    float64
		want int
	}{{0, 1}, {0.5, 3}, {0.99, 5}, {1, 5}} {
		if got := Percentile(vals, tt.p); got != tt.want {
			t.Errorf("Percentile(%v, %v) = %d, want %d", vals, tt.p, got, tt.want)
		}
	}
	if got := Percentile([]float64(nil), 0.5); got != 0 {
		t.Errorf("Percentile of nothing = %v, want 0", got)
	}
	if !slices.Equal(vals, []int{5, 1, 4, 2, 3}) {
		t.Errorf("Percentile reordered its input: %v", vals)
	}
}

func TestProcStatusKiB(t *testing.T) {
	kib, name := ProcStatusKiB(os.Getpid(), "VmRSS")
	if kib <= 0 || name == "" {
		t.Errorf("own VmRSS %d KiB, name %q: want both", kib, name)
	}
	if kib, name := ProcStatusKiB(-1, "VmRSS"); kib != 0 || name != "" {
		t.Errorf("no process: got %d, %q", kib, name)
	}
}

func TestProcCPU(t *testing.T) {
	before, ok := ProcCPU(os.Getpid())
	if !ok {
		t.Fatal("own CPU time: not read")
	}
	// Spin until the kernel has charged this process at least 50 ms more
	// (5 ticks): the reading must follow the process's own use.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if now, _ := ProcCPU(os.Getpid()); now >= before+50*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s of spinning, and the CPU time read stayed under %v", before+50*time.Millisecond)
		}
	}
	if _, ok := ProcCPU(-1); ok {
		t.Error("no process: got a CPU time")
	}
}

func TestEnvInts(t *testing.T) {
	t.Setenv("BENCHSTAT_TEST", "")
	if got, err := EnvInts("BENCHSTAT_TEST", []int{7}); err != nil || !slices.Equal(got, []int{7}) {
		t.Errorf("unset: %v, %v", got, err)
	}
	t.Setenv("BENCHSTAT_TEST", "10, 20")
	if got, err := EnvInts("BENCHSTAT_TEST", nil); err != nil || !slices.Equal(got, []int{10, 20}) {
		t.Errorf("10, 20: %v, %v", got, err)
	}
	t.Setenv("BENCHSTAT_TEST", "10,x")
	if _, err := EnvInts("BENCHSTAT_TEST", nil); err == nil {
		t.Error("10,x: no error")
	}
}
