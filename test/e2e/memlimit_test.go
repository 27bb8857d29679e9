//go:build e2e

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestAgentMemoryLimit runs node-1's agent in a memory cgroup with a
// limit, as the kubelet runs the DaemonSet's container with
// resources.limits.memory: the agent's Go runtime takes 90% of it as its
// soft limit (go_gc_gomemlimit_bytes, the Go collector's), goes on
// programming under it, and an agent in a cgroup without a limit (node-2's)
// keeps the runtime's default, none.
func TestAgentMemoryLimit(t *testing.T) {
	w := newWorld(t, "e2e")
	const limit = 600 << 20
	dir := memoryCgroup(t, "netpol-e2e-memlimit", limit)
	node := w.lab.Node("node-1")
	w.agent[node.Name].kill()
	w.agentCgroup = dir
	a := w.startAgent(node)
	w.agentCgroup = ""
	if got, want := a.metric(t, "go_gc_gomemlimit_bytes"), float64(uint64(float64(limit)*0.9)); got != want {
		t.Errorf("agent in a cgroup limited to %d bytes: go_gc_gomemlimit_bytes %v, want %v", limit, got, want)
	}
	if log, _ := os.ReadFile(a.log); !strings.Contains(string(log), `"source":"cgroup"`) {
		t.Errorf("the agent did not log the soft limit it took from its cgroup:\n%s", tail(string(log), 10))
	}
	if got := w.agent["node-2"].metric(t, "go_gc_gomemlimit_bytes"); got != math.MaxInt64 {
		t.Errorf("agent without a cgroup limit: go_gc_gomemlimit_bytes %v, want none (%v)", got, float64(math.MaxInt64))
	}
	w.converged("isolate x, node-1's agent under a memory limit", w.apply(isolateX))
}

// memoryCgroup makes a memory cgroup named name with a limit of limit
// bytes (none if negative), under the test process's own (cgroup v1's
// memory controller, or v2's unified hierarchy), removed at cleanup; it
// skips where neither can be written. Processes join it by writing their
// pid to its cgroup.procs.
func memoryCgroup(t testing.TB, name string, limit int64) string {
	t.Helper()
	parent, limitFile, err := ownMemoryCgroup()
	if err != nil {
		t.Skipf("no memory cgroup to limit an agent in: %v", err)
	}
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		t.Skipf("no memory cgroup to limit an agent in: %v", err)
	}
	t.Cleanup(func() {
		// After the processes in it are gone (their cleanups run first).
		if err := os.Remove(dir); err != nil {
			t.Logf("removing cgroup %s: %v", dir, err)
		}
	})
	value := strconv.FormatInt(limit, 10)
	if limit < 0 && limitFile == "memory.max" {
		value = "max"
	}
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(value), 0o644); err != nil {
		t.Fatalf("limiting cgroup %s: %v", dir, err)
	}
	return dir
}

// ownMemoryCgroup is the directory of this process's memory cgroup and
// the name of its limit file there.
func ownMemoryCgroup() (dir, limitFile string, err error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	var unified string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "memory" {
				if dir := filepath.Join("/sys/fs/cgroup/memory", parts[2]); isDir(dir) {
					return dir, "memory.limit_in_bytes", nil
				}
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
		}
	}
	if unified != "" {
		dir := filepath.Join("/sys/fs/cgroup", unified)
		ctl, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		if isDir(dir) && strings.Contains(string(ctl), "memory") {
			return dir, "memory.max", nil
		}
	}
	return "", "", fmt.Errorf("neither cgroup v1's memory controller nor v2's memory.max is available to this process")
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// inCgroup is cmd started in the cgroup dir: a shell joins it and then
// execs cmd, so that the process is in it from its first instruction (the
// agent reads its limit at start).
func inCgroup(cmd *exec.Cmd, dir string) *exec.Cmd {
	args := append([]string{"-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir, cmd.Path}, cmd.Args[1:]...)
	c := exec.Command("/bin/sh", args...)
	c.Env = cmd.Env
	return c
}
