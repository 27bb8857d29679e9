package dnssnoop

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
)

// BenchmarkLearnManyNames learns 10,000 names of 10 addresses each
// (100,000 addresses) into one pattern's set in the real kernel, answer
// by answer as the queue hands them over: the commit time of the first
// and the last 1,000 answers (p50, p99; their ratio shows whether an
// answer's cost grows with what was learned), the Learner's heap per
// learned address, and the kernel's element count at the end.
func BenchmarkLearnManyNames(b *testing.B) {
	const names, perName = 10000, 10
	for range b.N {
		h := freshNetNS(b)
		_, _, l, c := domainTable(b, h, LearnerOptions{}, "*.example.com")
		answers := make([]Segment, names)
		for i := range names {
			m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: uint16(i), Response: true},
				Question: []dns.Question{{Name: fmt.Sprintf("host-%d.example.com.", i), Qtype: dns.TypeA, Qclass: dns.ClassINET}}}
			for j := range perName {
				n := i*perName + j
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600},
					A: netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}).AsSlice()})
			}
			payload, err := m.Pack()
			if err != nil {
				b.Fatal(err)
			}
			answers[i] = Segment{Src: netip.MustParseAddrPort("10.96.0.10:53"), Dst: netip.MustParseAddrPort("10.244.1.5:40000"), Payload: payload}
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		took := make([]time.Duration, names)
		start := time.Now()
		for i, s := range answers {
			t0 := time.Now()
			if _, err := l.Learn(s); err != nil {
				b.Fatalf("answer %d: %v", i, err)
			}
			took[i] = time.Since(t0)
		}
		total := time.Since(start)
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(answers)
		// A dump of a set with timeouts can come back short (seen here:
		// about 1 in 3; a second dump is whole, so the elements are there):
		// the most of three dumps counts.
		got := 0
		for range 3 {
			got = max(got, len(elements(b, c, compiler.DomainSetPrefix("*.example.com")+nft.IPv4.Suffix)))
		}
		if got != names*perName {
			b.Fatalf("the kernel's set holds %d addresses, want %d", got, names*perName)
		}
		first, last := percentiles(took[:1000]), percentiles(took[names-1000:])
		perAddr := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / (names * perName)
		b.ReportMetric(float64(first[0].Microseconds()), "first-p50-us")
		b.ReportMetric(float64(first[1].Microseconds()), "first-p99-us")
		b.ReportMetric(float64(last[0].Microseconds()), "last-p50-us")
		b.ReportMetric(float64(last[1].Microseconds()), "last-p99-us")
		b.ReportMetric(float64(last[0])/float64(first[0]), "p50-last/first")
		b.ReportMetric(perAddr, "heap-B/addr")
		b.ReportMetric(float64(names)/total.Seconds(), "answers/s")
		b.Logf("%d answers, %d addresses in %v: first 1,000 p50 %v p99 %v, last 1,000 p50 %v p99 %v; Learner heap %.0f B per address; kernel set %d elements",
			names, names*perName, total.Round(time.Millisecond), first[0], first[1], last[0], last[1], perAddr, got)
	}
}

// percentiles are the p50 and p99 of ds.
func percentiles(ds []time.Duration) [2]time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return [2]time.Duration{s[len(s)/2], s[len(s)*99/100]}
}
