//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

// TestPodChurnLosesNothing: 10 s of pod events at 1,000 per second (pods
// created, reported Running with an address, deleted; every one a peer of
// a NetworkPolicy, so each changes a set of both nodes' tables), then the
// kernels must equal a from-scratch compile of the live state: no event
// lost. The latencies are logged; their targets live in BenchmarkPodChurn.
func TestPodChurnLosesNothing(t *testing.T) {
	w := newWorld(t, "e2e")
	st := podChurn(w, 1000, 10*time.Second)
	t.Logf("%d pod events in %v (%.0f/s); a marker pod programmed: idle p50 %v p99 %v, under churn p50 %v p99 %v",
		st.events, st.took.Round(time.Millisecond), st.rate(), benchstat.Percentile(st.idle, 0.5), benchstat.Percentile(st.idle, 0.99),
		benchstat.Percentile(st.busy, 0.5), benchstat.Percentile(st.busy, 0.99))
	t.Logf("CPU during the churn, %% of one core (%d cores): %v", runtime.NumCPU(), st.cpu)
}

// BenchmarkPodChurn (issue 14): pod events at NETPOL_CHURN_RATE per second
// (default 1,000) for NETPOL_CHURN_SECONDS (default 60) against the real
// test API server, two agents programming the lab's nodes. Programming
// latency is that of marker pods, added and removed one at a time every
// 250 ms: from the API write to every node's kernel holding (or no longer
// holding) the marker's address, read back every millisecond; idle first,
// then under the churn, in the same run. At the end the kernels must
// equal a from-scratch compile (no event lost).
func BenchmarkPodChurn(b *testing.B) {
	rate := envInt(b, "NETPOL_CHURN_RATE", 1000)
	seconds := envInt(b, "NETPOL_CHURN_SECONDS", 60)
	for b.Loop() {
		w := newWorld(b, "e2e")
		st := podChurn(w, rate, time.Duration(seconds)*time.Second)
		idle50, idle99 := benchstat.Percentile(st.idle, 0.5), benchstat.Percentile(st.idle, 0.99)
		busy50, busy99 := benchstat.Percentile(st.busy, 0.5), benchstat.Percentile(st.busy, 0.99)
		b.ReportMetric(st.rate(), "events/s")
		b.ReportMetric(ms(idle50), "idle-p50-ms")
		b.ReportMetric(ms(idle99), "idle-p99-ms")
		b.ReportMetric(ms(busy50), "churn-p50-ms")
		b.ReportMetric(ms(busy99), "churn-p99-ms")
		b.ReportMetric(ms(busy50)/ms(idle50), "ratio-p50")
		b.ReportMetric(ms(busy99)/ms(idle99), "ratio-p99")
		b.ReportMetric(ms(st.settled), "settle-ms")
		// Where the latency goes: the API server's answers to the
		// marker's writes, and the rest (watch, agent, kernel).
		var parts []string
		for _, part := range []struct {
			name, what string
			idle, busy []time.Duration
		}{
			{"write", "the API server's answers to the marker's writes", st.idleWrite, st.busyWrite},
			{"after-write", "after them (watch, agent, kernel)", afterWrite(st.idle, st.idleWrite), afterWrite(st.busy, st.busyWrite)},
		} {
			line := part.what + ":"
			for _, q := range []float64{0.5, 0.99} {
				i, c := benchstat.Percentile(part.idle, q), benchstat.Percentile(part.busy, q)
				b.ReportMetric(ms(i), fmt.Sprintf("%s-idle-p%.0f-ms", part.name, q*100))
				b.ReportMetric(ms(c), fmt.Sprintf("%s-churn-p%.0f-ms", part.name, q*100))
				line += fmt.Sprintf(" p%.0f idle %v churn %v", q*100, i, c)
			}
			parts = append(parts, line)
		}
		for name, a := range w.agent {
			b.ReportMetric(rssMB(a), "rss-MB-"+name)
		}
		cpu := fmt.Sprintf("CPU during the churn, %% of one core (%d cores):", runtime.NumCPU())
		for _, c := range st.cpu {
			b.ReportMetric(c.percent, "cpu-pct-"+c.name)
			cpu += fmt.Sprintf(" %s %.0f", c.name, c.percent)
		}
		b.Logf("%d pod events in %v (%.0f/s), %d markers idle and %d under churn; latency idle p50 %v p99 %v, churn p50 %v p99 %v; kernels equal a full compile %v after the last write",
			st.events, st.took.Round(time.Millisecond), st.rate(), len(st.idle), len(st.busy), idle50, idle99, busy50, busy99, st.settled.Round(time.Millisecond))
		b.Logf("of which %s", strings.Join(parts, "; "))
		b.Log(cpu)
	}
}

func envInt(b *testing.B, name string, def int) int {
	v, err := benchstat.EnvInts(name, []int{def})
	if err != nil {
		b.Fatal(err)
	}
	return v[0]
}

// rssMB is an agent's resident memory in MiB.
func rssMB(a *agentProc) float64 {
	kib, _ := benchstat.ProcStatusKiB(a.cmd.Process.Pid, "VmRSS")
	return float64(kib) / 1024
}

type churnStats struct {
	events     int64
	took       time.Duration
	idle, busy []time.Duration // marker programming latencies
	// idleWrite, busyWrite: the part of each marker latency until the API
	// server answered its last write (the rest is the watch and the agent).
	idleWrite, busyWrite []time.Duration
	settled              time.Duration // last write to the kernels equal to a full compile
	cpu                  []cpuShare    // what each process used during the churn
}

// cpuShare is a process's CPU time over a span, in percent of one core.
type cpuShare struct {
	name    string
	percent float64
}

// cpuMeter measures the CPU of the processes that share the machine in a
// churn: the API server, etcd, this test process (the writers and the
// marker's poll) and each agent. On a machine with few cores the churn's
// latencies follow who had the cores, so the benchmark says so.
type cpuMeter struct {
	names []string
	pids  []int
	start []time.Duration
	at    time.Time
}

func (w *world) meterCPU() *cpuMeter {
	etcd, api := w.env.PIDs()
	m := &cpuMeter{names: []string{"apiserver", "etcd", "test"}, pids: []int{api, etcd, os.Getpid()}, at: time.Now()}
	for _, name := range slices.Sorted(maps.Keys(w.agent)) {
		m.names = append(m.names, "agent-"+name)
		m.pids = append(m.pids, w.agent[name].cmd.Process.Pid)
	}
	for _, pid := range m.pids {
		used, ok := benchstat.ProcCPU(pid)
		if !ok {
			w.t.Fatalf("CPU time of pid %d: the process is gone", pid)
		}
		m.start = append(m.start, used)
	}
	return m
}

// shares is each process's CPU since the meter started.
func (m *cpuMeter) shares() []cpuShare {
	span := time.Since(m.at)
	out := make([]cpuShare, len(m.pids))
	for i, pid := range m.pids {
		used, _ := benchstat.ProcCPU(pid)
		out[i] = cpuShare{m.names[i], 100 * float64(used-m.start[i]) / float64(span)}
	}
	return out
}

// afterWrite is each latency less its write part: from the API server's
// answer to the kernels holding the change.
func afterWrite(total, write []time.Duration) []time.Duration {
	out := make([]time.Duration, len(total))
	for i := range total {
		out[i] = total[i] - write[i]
	}
	return out
}

func (s churnStats) rate() float64 { return float64(s.events) / s.took.Seconds() }

// podChurn makes every pod of namespace y a peer of a policy in x, measures
// marker latencies idle, then runs rate pod events per second for dur
// while measuring them again, and finally waits for the kernels to equal
// a full compile of the live state (failing w.t if they do not within
// 30 s).
func podChurn(w *world, rate int, dur time.Duration) churnStats {
	w.t.Helper()
	w.converged("policy", w.apply(podsOfYArePeers))
	client := w.fastClient(5000)
	var st churnStats
	markers := 0
	// marker returns the latencies of a marker's add and removal, and the
	// part of each until the API server answered its writes.
	marker := func() (out, writes []time.Duration) {
		ip := netip.AddrFrom4([4]byte{10, 250, byte(markers / 250), byte(markers%250 + 1)})
		name := fmt.Sprintf("marker-%d", markers)
		markers++
		before := w.setsHolding(ip)
		written := time.Now()
		if err := createPod(w, client, apiOnlyPod("y", name, "node-1", "marker"), ip.String()); err != nil {
			w.t.Fatal(err)
		}
		writes = append(writes, time.Since(written))
		out = append(out, w.waitSets(ip, written, func(n map[string]int) bool { return w.more(n, before) }))
		written = time.Now()
		if err := client.CoreV1().Pods("y").Delete(w.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			w.t.Fatal(err)
		}
		writes = append(writes, time.Since(written))
		out = append(out, w.waitSets(ip, written, func(n map[string]int) bool { return !w.more(n, before) }))
		return out, writes
	}
	for range 10 {
		lat, writes := marker()
		st.idle, st.idleWrite = append(st.idle, lat...), append(st.idleWrite, writes...)
		time.Sleep(250 * time.Millisecond)
	}

	// The churn: each pod is created, reported Running with an address
	// and deleted, three events, by 64 writers taking one token per write.
	tokens := make(chan struct{}, rate)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		start, sent := time.Now(), 0
		for {
			select {
			case <-stop:
				close(tokens)
				return
			case now := <-tick.C:
				for due := int(now.Sub(start).Seconds() * float64(rate)); sent < due; sent++ {
					select {
					case tokens <- struct{}{}:
					default: // the writers are behind: the rate is not met, and the count says so
					}
				}
			}
		}
	})
	// Deleted at once: there is no kubelet to finish a graceful deletion.
	now := metav1.DeleteOptions{GracePeriodSeconds: new(int64)}
	var next, events, failures atomic.Int64
	meter := w.meterCPU()
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				name := fmt.Sprintf("churn-%d", i)
				ip := fmt.Sprintf("10.244.%d.%d", 100+(i/250)%100, i%250+1)
				node := []string{"node-1", "node-2"}[i%2]
				for step := range 3 {
					if _, ok := <-tokens; !ok {
						if step > 0 { // leave no half-made pod behind
							client.CoreV1().Pods("y").Delete(w.ctx, name, now)
						}
						return
					}
					var err error
					switch step {
					case 0:
						_, err = client.CoreV1().Pods("y").Create(w.ctx, apiOnlyPod("y", name, node, "churn"), metav1.CreateOptions{})
					case 1:
						err = reportRunning(w, client, "y", name, ip)
					case 2:
						err = client.CoreV1().Pods("y").Delete(w.ctx, name, now)
					}
					if err != nil {
						failures.Add(1)
						break
					}
					events.Add(1)
				}
			}
		})
	}
	deadline := start.Add(dur)
	for time.Now().Before(deadline) {
		lat, writes := marker()
		st.busy, st.busyWrite = append(st.busy, lat...), append(st.busyWrite, writes...)
		time.Sleep(250 * time.Millisecond)
	}
	st.cpu = meter.shares()
	close(stop)
	wg.Wait()
	st.took, st.events = time.Since(start), events.Load()
	if n := failures.Load(); n > 0 {
		w.t.Fatalf("%d churn writes failed", n)
	}
	last := time.Now()
	settled, _, _ := w.kernelLatency(last)
	st.settled = settled
	return st
}

// setsHolding counts, per node, the IPv4 sets of its policy table with an
// element whose address range holds ip.
func (w *world) setsHolding(ip netip.Addr) map[string]int {
	out := map[string]int{}
	a := ip.As4()
	for _, n := range w.lab.Nodes() {
		t, err := kernel.Read(int(n.Handle), compiler.DefaultTable)
		if err != nil || t == nil {
			continue
		}
		for _, s := range t.Sets {
			if len(s.Fields) == 0 || s.Fields[0] != nft.FieldIPv4 {
				continue
			}
			for _, e := range s.Elements {
				lo, hi := e.Key, e.KeyEnd
				if len(hi) == 0 {
					hi = lo
				}
				if len(lo) >= 4 && len(hi) >= 4 && bytes.Compare(lo[:4], a[:]) <= 0 && bytes.Compare(a[:], hi[:4]) <= 0 {
					out[n.Name]++
					break
				}
			}
		}
	}
	return out
}

// more reports whether every node holds the address in more sets than
// before.
func (w *world) more(now, before map[string]int) bool {
	for _, n := range w.lab.Nodes() {
		if now[n.Name] <= before[n.Name] {
			return false
		}
	}
	return true
}

// waitSets polls the kernels every millisecond until done holds of the
// sets holding ip, and returns the time since written.
func (w *world) waitSets(ip netip.Addr, written time.Time, done func(map[string]int) bool) time.Duration {
	w.t.Helper()
	for !done(w.setsHolding(ip)) {
		if time.Since(written) > 30*time.Second {
			w.t.Fatalf("marker %v: the kernels did not change within 30s", ip)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(written)
}
