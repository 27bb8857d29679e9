package proxy_test

import (
	"testing"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/proxy"
)

// BenchmarkSyncerFirstSync is the NAT table's first sync on node-1 of the
// agent benchmarks' 100,000-pod cluster (internal/synth: 20,000 Services,
// each with an EndpointSlice of up to 5 pods): a new Syncer builds every
// Service. B/op is what the first sync allocates on the NAT side (what it
// keeps, and the garbage it leaves the collector). api parses the API
// slices in the sync (Sync: the offline path); parsed is given them
// parsed (SyncParsed), as the agent's informer stores them.
func BenchmarkSyncerFirstSync(b *testing.B) {
	pods := 100000
	snap, err := synth.Snapshot(synth.Spec{Namespaces: pods / 100, Pods: pods, Nodes: pods / 100, Services: pods / 5, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	parsed := proxy.ParseSlices(snap.EndpointSlices, "node-1")
	for _, mode := range []string{"api", "parsed"} {
		b.Run(mode, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s := proxy.NewSyncer("node-1", proxy.Options{}, proxy.CompileOptions{})
				var t *nft.Table
				if mode == "api" {
					_, t = s.Sync(snap)
				} else {
					_, t = s.SyncParsed(snap, parsed)
				}
				elements := 0
				for _, set := range t.Sets {
					elements += len(set.Elements)
				}
				if elements == 0 {
					b.Fatal("the NAT table has no set elements")
				}
				b.ReportMetric(float64(elements), "elements")
			}
		})
	}
}
