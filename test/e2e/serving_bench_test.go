//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/pkg/agent"
)

// BenchmarkWatchersLatency measures the agents' programming latency (from
// the API write to both nodes' kernels holding the new state, polled every
// millisecond) over single-policy changes, first with nobody watching,
// then with 100 concurrent /debug/model watch streams per agent reading as
// fast as they can and one slow reader per agent (it asks for the stream
// and reads 64 bytes a second), and reports the ratio of the two p50s and
// p90s in the same run. The sync loop only closes a channel for the
// watchers; each stream renders from a per-generation cache and writes
// with its own deadline, so the ratio should stay near 1 (the issue's
// bound: within 2x).
func BenchmarkWatchersLatency(b *testing.B) {
	const (
		changes  = 20
		watchers = 100
	)
	for b.Loop() {
		w := newWorld(b, "e2e")
		gen := 0
		measure := func() []time.Duration { return w.policyLatencies(changes, &gen, "{}") }
		idle := measure()

		// The watchers: 100 per agent, each decoding every model it gets.
		var (
			wg       sync.WaitGroup
			models   atomic.Int64
			lastGen  sync.Map // watcher -> last generation seen
			failures atomic.Int64
			conns    []net.Conn
			mu       sync.Mutex
		)
		stop := make(chan struct{})
		for name, a := range w.agent {
			url := "http://" + a.debug + "/debug/model?watch=true"
			for i := 0; i < watchers; i++ {
				id := fmt.Sprintf("%s-%d", name, i)
				wg.Go(func() {
					resp, err := http.Get(url)
					if err != nil || resp.StatusCode != http.StatusOK {
						failures.Add(1)
						return
					}
					go func() { <-stop; resp.Body.Close() }()
					dec := json.NewDecoder(resp.Body)
					for {
						var m agent.ModelView
						if err := dec.Decode(&m); err != nil {
							return
						}
						models.Add(1)
						lastGen.Store(id, m.Generation)
					}
				})
			}
			// The slow reader: a small receive buffer, 64 bytes a second.
			c, err := net.Dial("tcp", a.debug)
			if err != nil {
				b.Fatal(err)
			}
			c.(*net.TCPConn).SetReadBuffer(4096)
			fmt.Fprintf(c, "GET /debug/model?watch=true HTTP/1.1\r\nHost: agent\r\n\r\n")
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				r := bufio.NewReaderSize(c, 64)
				buf := make([]byte, 64)
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Second):
					}
					if _, err := r.Read(buf); err != nil {
						return
					}
				}
			})
		}
		time.Sleep(time.Second) // every stream open
		watched := measure()
		// Every fast watcher got the final generation of its agent.
		final := map[string]int64{}
		for name, a := range w.agent {
			var m agent.ModelView
			resp, err := http.Get("http://" + a.debug + "/debug/model")
			if err != nil {
				b.Fatal(err)
			}
			json.NewDecoder(resp.Body).Decode(&m)
			resp.Body.Close()
			final[name] = m.Generation
		}
		time.Sleep(200 * time.Millisecond)
		behind := 0
		lastGen.Range(func(k, v any) bool {
			id := k.(string)
			for name, g := range final {
				if len(id) > len(name) && id[:len(name)+1] == name+"-" && v.(int64) != g {
					behind++
				}
			}
			return true
		})
		close(stop)
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
		if failures.Load() > 0 {
			b.Errorf("%d watchers could not open the stream", failures.Load())
		}
		if behind > 0 {
			b.Errorf("%d watchers did not get their agent's final generation", behind)
		}
		ip50, ip90 := benchstat.Percentile(idle, 0.5), benchstat.Percentile(idle, 0.9)
		wp50, wp90 := benchstat.Percentile(watched, 0.5), benchstat.Percentile(watched, 0.9)
		r50, r90 := float64(wp50)/float64(ip50), float64(wp90)/float64(ip90)
		b.ReportMetric(ms(ip50), "idle-p50-ms")
		b.ReportMetric(ms(ip90), "idle-p90-ms")
		b.ReportMetric(ms(wp50), "watched-p50-ms")
		b.ReportMetric(ms(wp90), "watched-p90-ms")
		b.ReportMetric(r50, "ratio-p50")
		b.ReportMetric(r90, "ratio-p90")
		b.ReportMetric(float64(models.Load()), "models-streamed")
		b.Logf("programming latency over %d changes: idle p50 %v p90 %v; with %d watchers per agent and a slow reader: p50 %v p90 %v; ratio p50 %.2f, p90 %.2f; %d models streamed",
			changes, ip50, ip90, watchers, wp50, wp90, r50, r90, models.Load())
		if r50 > 2 {
			b.Errorf("p50 with watchers is %.2fx the idle p50, want within 2x", r50)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
