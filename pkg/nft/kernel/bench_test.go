package kernel

import (
	"math"
	"runtime"
	"testing"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/pkg/nft"
)

// BenchmarkApplyIncremental measures one Apply that adds an element and one
// that removes it again (one op = both), against a 10k-element set: the pod
// add/remove path. It includes the diff of the whole table.
func BenchmarkApplyIncremental(b *testing.B) {
	sets := []struct {
		name string
		set  func() *nft.Set
		elem func(i int) nft.Element
	}{
		{
			name: "hash10k",
			set:  func() *nft.Set { return &nft.Set{Name: "pods4", Fields: []nft.FieldType{nft.FieldIPv4}} },
			elem: func(i int) nft.Element { return nft.Element{Key: []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}} },
		},
		{
			name: "concat10k",
			set: func() *nft.Set {
				return &nft.Set{Name: "allow4", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Interval: true}
			},
			elem: func(i int) nft.Element {
				a := []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}
				return nft.Element{Key: nft.Key(a, nft.ProtoBytes(tcp), nft.PortBytes(8000)), KeyEnd: nft.Key(a, nft.ProtoBytes(tcp), nft.PortBytes(8100))}
			},
		},
	}
	for _, bs := range sets {
		b.Run(bs.name, func(b *testing.B) {
			a, _ := newTestApplier(b)
			s := bs.set()
			for i := 0; i < 10000; i++ {
				s.Elements = append(s.Elements, bs.elem(i))
			}
			d := nft.NewTable("netpol")
			d.AddSet(s)
			if _, err := a.Apply(d); err != nil {
				b.Fatal(err)
			}
			base := s.Elements
			with := append(base[:len(base):len(base)], bs.elem(1<<20))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.Elements = with
				if st, err := a.Apply(d); err != nil || st.ElementsAdded != 1 {
					b.Fatalf("add: %+v, %v", st, err)
				}
				s.Elements = base
				if st, err := a.Apply(d); err != nil || st.ElementsDeleted != 1 {
					b.Fatalf("remove: %+v, %v", st, err)
				}
			}
		})
	}
}

// BenchmarkApplyFresh programs a fresh table holding one verdict map of
// 200,000 addresses (each a jump to a chain, as the policy table's
// dispatch maps) and a base chain that looks it up into an empty network
// namespace: the first sync's transaction. Besides its time it reports
// the transactions' size on the wire (the Applier's estimate, from above:
// wire-bytes/elem), the live heap the Apply holds at its peak over what
// the table itself holds (apply-peak-live-bytes/elem, sampled by
// collecting back to back, which slows the Apply down) and the cache it
// keeps (cache-bytes/elem). "staged" is the Applier as it is (Plan.stages,
// stageBytes per transaction); "one-transaction" sends the table whole,
// as the Applier did before it staged, for the ratio.
func BenchmarkApplyFresh(b *testing.B) {
	const n = 200000
	desired := func() *nft.Table {
		t := nft.NewTable("netpol")
		t.AddChain(&nft.Chain{Name: "pod-class-with-a-long-name-0001"})
		s := &nft.Set{Name: "dispatch4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true}
		for i := range n {
			s.Elements = append(s.Elements, nft.Element{Key: []byte{10, byte(i >> 16), byte(i >> 8), byte(i)},
				Verdict: &nft.Verdict{Kind: nft.Jump, Chain: "pod-class-with-a-long-name-0001"}})
		}
		t.AddSet(s)
		t.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: "forward", Policy: "accept"},
			Rules: []*nft.Rule{nft.NewRule().Vmap(nft.IPv4, nft.Src, "dispatch4")}})
		return t
	}
	for _, mode := range []struct {
		name       string
		stageBytes int
	}{{"one-transaction", math.MaxInt}, {"staged", 0}} {
		b.Run(mode.name, func(b *testing.B) {
			applier := func() *Applier {
				a, _ := newTestApplier(b)
				a.stageBytes = mode.stageBytes
				return a
			}
			for b.Loop() {
				b.StopTimer()
				a := applier()
				d := desired()
				runtime.GC()
				before := benchstat.LiveHeap()
				b.StartTimer()
				st, err := a.Apply(d)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric(float64(st.Transactions), "transactions")
				runtime.GC()
				b.ReportMetric(float64(benchstat.LiveHeap()-before)/n, "cache-bytes/elem")
				a.Close()
				// The same transaction again into a fresh namespace, sampled.
				a2 := applier()
				p, err := a2.Plan(d)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(planBytes(p))/n, "wire-bytes/elem")
				// The baseline again: the first Applier's cache stays
				// reachable (its cleanup holds it) and is not this Apply's.
				runtime.GC()
				before = benchstat.LiveHeap()
				peak := benchstat.WatchPeakLive()
				if _, err := a2.Apply(d); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(peak()-before)/n, "apply-peak-live-bytes/elem")
				a2.Close()
				b.StartTimer()
			}
		})
	}
}
