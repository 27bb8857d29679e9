package kernel

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/nft"
)

// sourcesTable is a table whose input chain accepts UDP to port from the
// addresses of an interval set named set (127.0.0.2-127.0.0.60) and drops
// the rest. Two tables of different set names differ as a policy change
// that gives a peer a set of new content does (sets are named by content).
func sourcesTable(set string, port uint16) *nft.Table {
	d := nft.NewTable("netpol")
	d.AddSet(&nft.Set{Name: set, Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true,
		Elements: []nft.Element{span("127.0.0.2", "127.0.0.60")}})
	d.AddChain(&nft.Chain{Name: "input", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "accept"}, Rules: []*nft.Rule{
		nft.NewRule().AddrInSet(nft.IPv4, nft.Src, set).Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().L4ProtoIs(17).DstPortIs(port).Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	return d
}

// dispatchTable is sourcesTable with a verdict map named m in place of
// the set: 127.0.0.2 goes to chain m.accept, which accepts.
func dispatchTable(m string, port uint16) *nft.Table {
	d := nft.NewTable("netpol")
	d.AddChain(&nft.Chain{Name: m + ".accept", Rules: []*nft.Rule{nft.NewRule().Verdict(nft.Verdict{Kind: nft.Accept})}})
	d.AddSet(&nft.Set{Name: m, Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true,
		Elements: []nft.Element{{Key: addr("127.0.0.2"), Verdict: &nft.Verdict{Kind: nft.Goto, Chain: m + ".accept"}}}})
	d.AddChain(&nft.Chain{Name: "input", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "accept"}, Rules: []*nft.Rule{
		nft.NewRule().VmapKey(nft.IPv4, m, nft.AddrOf(nft.IPv4, nft.Src)),
		nft.NewRule().L4ProtoIs(17).DstPortIs(port).Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	return d
}

func TestPlanInPhases(t *testing.T) {
	with := func(d *nft.Table, change func(d *nft.Table)) *nft.Table {
		change(d)
		return d
	}
	cases := []struct {
		name    string
		from    *nft.Table // nil: no table
		to      *nft.Table
		want    []int    // messages per transaction
		inFirst []string // the first transaction's messages, by prefix
	}{
		{name: "a new set read by a rewritten base chain: the set first",
			from: sourcesTable("a", 9), to: sourcesTable("b", 9), want: []int{2, 4},
			inFirst: []string{"add set inet netpol b", "add element inet netpol b"}},
		{name: "a new verdict map and the chain it names first; the old map and its chain deleted last",
			from: dispatchTable("a", 9), to: dispatchTable("b", 9), want: []int{4, 4, 2},
			inFirst: []string{"add chain inet netpol b.accept", "add map inet netpol b", "add element inet netpol b", "add rule inet netpol b.accept"}},
		{name: "nothing new: one transaction",
			from: sourcesTable("a", 9), to: sourcesTable("a", 10), want: []int{3}},
		{name: "a table no packet reaches: one transaction",
			from: nil, to: sourcesTable("a", 9), want: []int{6}},
		{name: "only new objects: one transaction",
			from: sourcesTable("a", 9), to: with(sourcesTable("a", 9), func(d *nft.Table) {
				d.AddSet(&nft.Set{Name: "spare", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{single("10.9.9.9")}})
			}), want: []int{2}},
		{name: "a set recreated under its name stays with the rest",
			from: sourcesTable("a", 9), to: with(sourcesTable("a", 9), func(d *nft.Table) {
				d.Sets["a"] = &nft.Set{Name: "a", Fields: d.Sets["a"].Fields, Elements: []nft.Element{single("127.0.0.2")}} // no longer an interval set
			}), want: []int{6}},
		{name: "a new chain that reads a set recreated under its name stays with it",
			from: sourcesTable("a", 9), to: with(sourcesTable("a", 9), func(d *nft.Table) {
				d.Sets["a"] = &nft.Set{Name: "a", Fields: d.Sets["a"].Fields, Elements: []nft.Element{single("127.0.0.2")}}
				d.AddChain(&nft.Chain{Name: "reads-a", Rules: []*nft.Rule{nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "a").Verdict(nft.Verdict{Kind: nft.Accept})}})
				d.AddSet(&nft.Set{Name: "spare", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{single("10.9.9.9")}})
			}), want: []int{2, 8}, inFirst: []string{"add set inet netpol spare", "add element inet netpol spare"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Diff(tc.from, tc.to)
			stages := p.stages(stageBytes)
			var got []int
			for _, s := range stages {
				got = append(got, len(s.Ops))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("messages per transaction %v, want %v; plan:\n%s", got, tc.want, p)
			}
			if len(tc.inFirst) > 0 {
				first := strings.Split(strings.TrimSpace(stages[0].String()), "\n")
				for i, line := range first {
					if !strings.HasPrefix(line, tc.inFirst[i]) {
						t.Errorf("first transaction's message %d: %q, want %q...", i, line, tc.inFirst[i])
					}
				}
			}
		})
	}
}

// TestApplyInPhases: in the kernel, a change that gives a rule of a hooked
// table a new set, or a new map and chain, is two transactions (the
// generation moves by two), three when it deletes a map and chain, and
// the table read back is the desired one.
func TestApplyInPhases(t *testing.T) {
	a, fd := newTestApplier(t)
	mustApply(t, a, fd, sourcesTable("a", 9))
	gen := generation(t, fd)
	st := mustApply(t, a, fd, sourcesTable("b", 9))
	if st.Transactions != 2 || st.SetsAdded != 1 || st.SetsDeleted != 1 {
		t.Errorf("stats %+v, want 2 transactions, one set added and one deleted", st)
	}
	if moved := generation(t, fd) - gen; moved != 2 {
		t.Errorf("generation moved by %d, want 2", moved)
	}
	if st := mustApply(t, a, fd, sourcesTable("b", 10)); st.Transactions != 1 {
		t.Errorf("a change without a new set: %d transactions, want 1", st.Transactions)
	}
	gen = generation(t, fd)
	if st := mustApply(t, a, fd, dispatchTable("m", 10)); st.Transactions != 2 || st.ChainsAdded != 1 {
		t.Errorf("a new map and chain: %+v, want 2 transactions, one chain added", st)
	}
	if moved := generation(t, fd) - gen; moved != 2 {
		t.Errorf("generation moved by %d, want 2", moved)
	}
	gen = generation(t, fd)
	if st := mustApply(t, a, fd, dispatchTable("n", 10)); st.Transactions != 3 || st.ChainsDeleted != 1 || st.SetsDeleted != 1 {
		t.Errorf("a map and chain for others: %+v, want 3 transactions, one chain and one map deleted", st)
	}
	if moved := generation(t, fd) - gen; moved != 3 {
		t.Errorf("generation moved by %d, want 3", moved)
	}
}

// BenchmarkNewSetLookups measures what Plan.inPhases is for: a socket in the
// test's namespace sends UDP datagrams, one at a time, from an address the
// table accepts, while the Applier switches the table between two that
// differ only in the name of what the accepting rule reads (a policy
// change that gives a peer a set of new content): an interval set
// (sourcesTable) or a verdict map and its chain (dispatchTable). Every
// datagram must arrive; "misses" are those that did not (20 ms to
// arrive: loopback takes microseconds), per mode:
//   - phased: the Applier as it is (the new objects in a transaction
//     before the one that makes the rule read them, the old map and chain
//     deleted in one after it);
//   - one-transaction: all in the transaction that switches the rule.
//
// NETPOL_BENCH_SECONDS (default 10) is each run's duration. The table
// uses no conntrack, so that every datagram is looked up.
func BenchmarkNewSetLookups(b *testing.B) {
	seconds := 10
	if v, err := strconv.Atoi(os.Getenv("NETPOL_BENCH_SECONDS")); err == nil && v > 0 {
		seconds = v
	}
	tables := []struct {
		name  string
		table func(name string, port uint16) *nft.Table
	}{{"interval-set", sourcesTable}, {"verdict-map", dispatchTable}}
	for _, tb := range tables {
		b.Run(tb.name, func(b *testing.B) { newSetLookups(b, seconds, tb.table) })
	}
}

func newSetLookups(b *testing.B, seconds int, table func(string, uint16) *nft.Table) {
	for _, mode := range []struct {
		name string
		one  bool
	}{{"phased", false}, {"one-transaction", true}} {
		b.Run(mode.name, func(b *testing.B) {
			a, fd := newTestApplier(b)
			a.oneTransaction = mode.one
			h := netns.NsHandle(fd)
			if err := nsexec.LoopbackUp(h); err != nil {
				b.Fatal(err)
			}
			const port = 9
			for b.Loop() {
				if _, err := a.Apply(table("a", port)); err != nil {
					b.Fatal(err)
				}
				var commits, sent, missed atomic.Int64
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				var applyErr error
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := a.Apply(table(string(rune('a'+(i+1)%2)), port)); err != nil {
							applyErr = err
							return
						}
						commits.Add(1)
					}
				}()
				err := nsexec.In(h, func() error {
					srv, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:9")))
					if err != nil {
						return err
					}
					defer srv.Close()
					c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.2:0")), srv.LocalAddr().(*net.UDPAddr))
					if err != nil {
						return err
					}
					defer c.Close()
					buf := make([]byte, 16)
					for end := time.Now().Add(time.Duration(seconds) * time.Second); time.Now().Before(end); {
						if _, err := c.Write([]byte("lookup")); err != nil {
							return err
						}
						sent.Add(1)
						srv.SetReadDeadline(time.Now().Add(20 * time.Millisecond)) // loopback: microseconds
						if _, _, err := srv.ReadFromUDP(buf); err != nil {
							var ne net.Error
							if !errors.As(err, &ne) || !ne.Timeout() {
								return err
							}
							missed.Add(1)
						}
					}
					return nil
				})
				close(stop)
				wg.Wait()
				if err != nil || applyErr != nil {
					b.Fatal(err, applyErr)
				}
				b.ReportMetric(float64(sent.Load()), "datagrams")
				b.ReportMetric(float64(commits.Load()), "switches")
				b.ReportMetric(float64(missed.Load()), "misses")
				b.ReportMetric(1000*float64(missed.Load())/float64(max(commits.Load(), 1)), "misses/1k-switches")
			}
		})
	}
}
