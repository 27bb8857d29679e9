package conformance_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/lab"
)

// BenchmarkStrictCheck is what a strict check costs in the kernel's
// netns, beside the policy sync it follows, in the same run: the e2e lab
// with NETPOL_BENCH_FLOWS open UDP flows (default 10,000: x/a to x/b's
// port 80, one source port each) that no policy denies, and syncs that
// move between the base and a NetworkPolicy isolating z/c. Each op is one
// sync (timed: sync-ms) and the nodes' strict checks after it (timed:
// strict-ms): the conntrack dump of each node, a trace per flow and no
// delete.
func BenchmarkStrictCheck(b *testing.B) {
	requireRoot(b)
	n, err := benchstat.EnvInts("NETPOL_BENCH_FLOWS", []int{10000})
	if err != nil {
		b.Fatal(err)
	}
	load := func(extra string) *cluster.Snapshot {
		snap, report := cluster.LoadPaths([]string{testdata + "/base/e2e.yaml"}, nil)
		if extra != "" {
			report = snap.AddDocuments([]byte(extra), "bench", false)
		}
		if len(report.Errors) > 0 {
			b.Fatal(report.Errors)
		}
		return snap
	}
	snaps := []*cluster.Snapshot{load(""), load(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c-isolated, namespace: z}
spec:
  podSelector: {matchLabels: {pod: c}}
  policyTypes: [Ingress]
`)}
	l := labtest.Up(b, snaps[0], lab.Options{})
	enf := conformance.NewEnforcer(l)
	enf.StrictInterval = time.Hour // checked below, on their own clock
	defer enf.Close()
	if _, err := enf.Sync(snaps[0]); err != nil {
		b.Fatal(err)
	}
	to := netip.AddrPortFrom(labPodAddr(b, l, "x/b"), 80)
	for i := range n[0] {
		if o := l.Dial(context.Background(), "x/a", to, corev1.ProtocolUDP, lab.DialOptions{SourcePort: uint16(20000 + i)}); !o.Allowed {
			b.Fatalf("flow %d: %s", i, o.Result)
		}
	}
	var syncTime, strictTime time.Duration
	checked, i := 0, 0
	for b.Loop() {
		i++
		start := time.Now()
		if _, err := enf.Sync(snaps[i%2]); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		rs, err := enf.EndDeniedFlows()
		if err != nil {
			b.Fatal(err)
		}
		strictTime += time.Since(mid)
		syncTime += mid.Sub(start)
		for _, r := range rs {
			if len(r.Ended) > 0 {
				b.Fatalf("ended %v: the benchmark's flows are all allowed", r.Ended)
			}
			checked += r.Checked
		}
	}
	ops := float64(b.N)
	b.ReportMetric(float64(syncTime.Microseconds())/1000/ops, "sync-ms")
	b.ReportMetric(float64(strictTime.Microseconds())/1000/ops, "strict-ms")
	b.ReportMetric(float64(checked)/ops, "flows-traced")
	b.ReportMetric(float64(strictTime)/float64(syncTime), "strict/sync")
}

func labPodAddr(b *testing.B, l *lab.Lab, key string) netip.Addr {
	for _, p := range l.Pods() {
		if p.Name == key {
			return p.Addrs[0]
		}
	}
	b.Fatalf("no pod %s", key)
	return netip.Addr{}
}
