package conformance_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
)

// dnsBench is the lab of examples/lab-dns.yaml with one Enforcer at a
// time: domainLab takes a *testing.T, and the benchmarks reprogram the
// same lab with other DNS options instead of bringing up another.
type dnsBench struct {
	b      *testing.B
	snap   *cluster.Snapshot
	lab    *lab.Lab
	enf    *conformance.Enforcer
	server netip.Addr // kube-dns's ClusterIP
}

func newDNSBench(b *testing.B) *dnsBench {
	requireRoot(b)
	snap, report := cluster.LoadPaths([]string{domainsFixture}, nil)
	if len(report.Errors) > 0 {
		b.Fatal(report.Errors)
	}
	l := labtest.Up(b, snap, lab.Options{OutsidePorts: []l4.Port{web}})
	d := &dnsBench{b: b, snap: snap, lab: l}
	// Registered after the lab's Down, so it runs first: the Enforcer
	// closes before Down.
	b.Cleanup(func() { d.program(nil, false) })
	var ok bool
	if d.server, ok = l.ClusterDNS(netip.MustParseAddr("10.244.1.10")); !ok {
		b.Fatal("no cluster DNS address")
	}
	return d
}

// program replaces the Enforcer by one with dns (nil: no queue rules, the
// compile of a node without DNS learning) and syncs, unless !sync.
func (d *dnsBench) program(dns *node.DNSOptions, sync bool) {
	if d.enf != nil {
		d.enf.Close()
		d.enf = nil
	}
	if !sync {
		return
	}
	d.enf = conformance.NewEnforcer(d.lab)
	d.enf.DNS = dns
	if _, err := d.enf.Sync(d.snap); err != nil {
		d.b.Fatal(err)
	}
	// Check the kernel has the queue rules (the dns-* chains) exactly
	// when DNS is on, so the two modes differ in that alone.
	for _, n := range d.lab.Nodes() {
		t, err := kernel.Read(int(n.Handle), compiler.DefaultTable)
		if err != nil {
			d.b.Fatal(err)
		}
		var queued bool
		for name := range t.Chains {
			queued = queued || strings.HasPrefix(name, "dns-")
		}
		if queued != (dns != nil) {
			d.b.Fatalf("node %s: queue chains %v with DNS options %v", n.Name, queued, dns)
		}
	}
}

// resolve times one UDP resolution through kube-dns's ClusterIP.
func (d *dnsBench) resolve(pod, name string) (time.Duration, error) {
	start := time.Now()
	_, err := d.lab.Resolve(context.Background(), pod, name, false, d.server)
	return time.Since(start), err
}

type dnsCounts struct{ answers, packets, errors, queued int64 }

// counts sums the learners' and queues' counts over the nodes.
func (d *dnsBench) counts() dnsCounts {
	var c dnsCounts
	for _, st := range d.enf.DNSStatus() {
		c.answers += st.Stats.Answers
		c.packets += int64(st.QueuePackets)
		c.errors += int64(st.QueueErrors)
		c.queued += int64(st.QueuedAnswers)
	}
	return c
}

func percentile(s []time.Duration, p int) time.Duration {
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// BenchmarkDNSAnswerLatency is the time a pod waits for a DNS answer when
// the answer is queued (the agent parses it and commits its addresses
// before releasing it) against the same resolution, same pod, same path,
// with the node programmed without DNS learning (no queue rules). The
// modes alternate in rounds, in both orders, to cancel drift. agent-p50-us
// is the reader's own time per queued answer (DNSOptions.Latency).
func BenchmarkDNSAnswerLatency(b *testing.B) {
	d := newDNSBench(b)
	const rounds, perRound, warmup = 3, 300, 20
	const pod, name = "x/a", "allowed.example.com"
	var mu sync.Mutex
	var queued, plain, agent []time.Duration
	opts := &node.DNSOptions{Latency: func(t time.Duration) {
		mu.Lock()
		agent = append(agent, t)
		mu.Unlock()
	}}
	for b.Loop() {
		for r := range rounds {
			for i, dns := range []*node.DNSOptions{opts, nil} {
				if r%2 == 1 {
					dns = []*node.DNSOptions{nil, opts}[i]
				}
				d.program(dns, true)
				before := int64(0)
				if dns != nil {
					before = d.counts().answers
				}
				for j := range warmup + perRound {
					t, err := d.resolve(pod, name)
					if err != nil {
						b.Fatal(err)
					}
					switch {
					case j < warmup:
					case dns != nil:
						queued = append(queued, t)
					default:
						plain = append(plain, t)
					}
				}
				// Every answer of a queued round went through the reader.
				if dns != nil {
					if got := d.counts().answers - before; got != warmup+perRound {
						b.Fatalf("the queue read %d answers of %d", got, warmup+perRound)
					}
				}
			}
		}
	}
	d.program(nil, false)
	q50, q99 := percentile(queued, 50), percentile(queued, 99)
	p50, p99 := percentile(plain, 50), percentile(plain, 99)
	mu.Lock()
	a50, a99 := percentile(agent, 50), percentile(agent, 99)
	mu.Unlock()
	b.ReportMetric(us(q50), "queued-p50-us")
	b.ReportMetric(us(q99), "queued-p99-us")
	b.ReportMetric(us(p50), "plain-p50-us")
	b.ReportMetric(us(p99), "plain-p99-us")
	b.ReportMetric(us(q50)/us(p50), "p50-ratio")
	b.ReportMetric(us(q99)/us(p99), "p99-ratio")
	b.ReportMetric(us(a50), "agent-p50-us")
	b.Logf("%d resolutions per mode: queued p50 %v p99 %v; plain p50 %v p99 %v; ratio p50 %.2f p99 %.2f; agent (read to verdict) p50 %v p99 %v over %d answers",
		len(queued), q50, q99, p50, p99, us(q50)/us(p50), us(q99)/us(p99), a50, a99, len(agent))
}

// BenchmarkDNSLearnBurst fires answers at the queue as fast as the pods
// can ask: workers resolve from x/a (node-1) and x/b (node-2) for 3 s or
// 10,000 resolutions. pod-answers are the resolutions that succeeded,
// queue-read the answers the learners read; the difference passed the
// queue unread (fail open: the kernel's queue was full). With 8 workers at
// most 8 answers are in flight, so the 8-answer queue runs with 32 (and
// the default queue with 32 too, to compare at the same load).
func BenchmarkDNSLearnBurst(b *testing.B) {
	d := newDNSBench(b)
	names := []string{"allowed.example.com", "www.example.com", "big.example.com", "short.example.com"}
	pods := []string{"x/a", "x/b"}
	for _, c := range []struct {
		name    string
		maxLen  uint32
		workers int
	}{{"queue-default-8workers", 0, 8}, {"queue-default-32workers", 0, 32}, {"queue-8-8workers", 8, 8}, {"queue-8-32workers", 8, 32}} {
		b.Run(c.name, func(b *testing.B) {
			d.b = b
			d.program(&node.DNSOptions{MaxQueueLen: c.maxLen}, true)
			defer d.program(nil, false)
			var ok, failed atomic.Int64
			var firstErr atomic.Value
			var elapsed time.Duration
			before, served := d.counts(), d.lab.DNSQueries()
			for b.Loop() {
				var n atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				deadline := start.Add(3 * time.Second)
				for w := range c.workers {
					wg.Go(func() {
						for i := w; ; i += c.workers {
							if n.Add(1) > 10000 || time.Now().After(deadline) {
								return
							}
							if _, err := d.resolve(pods[w%len(pods)], names[i%len(names)]); err != nil {
								failed.Add(1)
								firstErr.CompareAndSwap(nil, err)
							} else {
								ok.Add(1)
							}
						}
					})
				}
				wg.Wait()
				elapsed += time.Since(start)
			}
			after := d.counts()
			read := after.answers - before.answers
			b.ReportMetric(float64(ok.Load())/elapsed.Seconds(), "answers/s")
			b.ReportMetric(float64(ok.Load()), "pod-answers")
			b.ReportMetric(float64(failed.Load()), "failed")
			b.ReportMetric(float64(read), "queue-read")
			b.ReportMetric(float64(ok.Load()-read), "passed-unread")
			b.ReportMetric(float64(after.errors-before.errors), "queue-errors")
			// What the agent's metrics show of it: the queue rules'
			// counters (netpol_dns_answers_queued_total) minus the packets
			// read (netpol_dns_queue_packets_total).
			unread := (after.queued - before.queued) - (after.packets - before.packets)
			b.ReportMetric(float64(unread), "metric-unread")
			if unread != ok.Load()-read {
				b.Errorf("the metrics say %d answers passed unread, the pods got %d more answers than the queue read", unread, ok.Load()-read)
			}
			b.Logf("%s, %d workers, %v: %d resolutions succeeded (%.0f/s), %d failed (first: %v); server answered %d; queue read %d answers (%d packets), %d passed unread; %d queue errors",
				c.name, c.workers, elapsed.Round(time.Millisecond), ok.Load(), float64(ok.Load())/elapsed.Seconds(), failed.Load(), firstErr.Load(),
				d.lab.DNSQueries()-served, read, after.packets-before.packets, ok.Load()-read, after.errors-before.errors)
			if c.maxLen != 0 && failed.Load() > 0 {
				b.Errorf("with a full queue DNS must keep working (fail open): %d resolutions failed", failed.Load())
			}
		})
	}
}
