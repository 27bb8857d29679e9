package kernel

import (
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/nft"
)

// countingTable counts UDP packets sent to 127.0.0.1 in a named counter,
// from the output chain; extra adds a rule before it.
func countingTable(extra bool) *nft.Table {
	t := nft.NewTable("netpol")
	t.AddCounter(&nft.Counter{Name: "rule.udp", Of: nft.CounterOf{Kind: "NetworkPolicy", Name: "x"}})
	var rules []*nft.Rule
	if extra {
		rules = append(rules, nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "none4").Verdict(nft.Verdict{Kind: nft.Drop}))
		t.AddSet(&nft.Set{Name: "none4", Fields: []nft.FieldType{nft.FieldIPv4}})
	}
	rules = append(rules, nft.NewRule().L4ProtoPortInSet("udp9").CountInto("rule.udp").Verdict(nft.Verdict{Kind: nft.Accept}))
	t.AddSet(&nft.Set{Name: "udp9", Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Elements: []nft.Element{svc(udp, 9)}})
	t.AddChain(&nft.Chain{Name: "output", Base: &nft.Hook{Type: "filter", Hook: "output", Policy: "accept"}, Rules: rules})
	return t
}

// sendUDP sends n datagrams to 127.0.0.1:9 from inside the namespace.
func sendUDP(t *testing.T, fd, n int) {
	t.Helper()
	h := netns.NsHandle(fd)
	if err := nsexec.LoopbackUp(h); err != nil {
		t.Fatal(err)
	}
	err := nsexec.In(h, func() error {
		// Unconnected: the port unreachable answers do not fail a write.
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer c.Close()
		for range n {
			if _, err := c.WriteTo([]byte("x"), &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A named counter keeps counting through a rewrite of the chain whose rule
// counts into it, and through an Applier that adopts the table; deleting
// it from the desired table deletes it.
func TestCountersSurviveRewrites(t *testing.T) {
	a, fd := newTestApplier(t)
	mustApply(t, a, fd, countingTable(false))
	sendUDP(t, fd, 3)
	want := func(packets uint64) {
		t.Helper()
		got, err := Counters(fd, "netpol")
		if err != nil {
			t.Fatal(err)
		}
		if got["rule.udp"].Packets != packets || got["rule.udp"].Bytes != packets*29 {
			t.Fatalf("counter rule.udp %+v, want %d packets of 29 bytes", got["rule.udp"], packets)
		}
	}
	want(3)
	// The chain is rewritten (a rule before the counting one).
	if st := mustApply(t, a, fd, countingTable(true)); st.ChainsRewritten != 1 || st.CountersAdded != 0 {
		t.Fatalf("rewrite: %+v", st)
	}
	sendUDP(t, fd, 2)
	want(5)
	// A restarted agent adopts the table, counters included.
	b, err := NewApplier(fd, "netpol")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if p, err := b.Plan(countingTable(true)); err != nil || !p.Empty() {
		t.Fatalf("adoption plan: %v\n%s", err, p)
	}
	// Gone from the desired table, the counter goes from the kernel.
	bare := countingTable(true)
	bare.Counters = nil
	bare.Chains["output"].Rules = bare.Chains["output"].Rules[:1]
	if st := mustApply(t, b, fd, bare); st.CountersDeleted != 1 {
		t.Fatalf("delete: %+v", st)
	}
	if got, err := Counters(fd, "netpol"); err != nil || len(got) != 0 {
		t.Fatalf("counters left: %v, %v", got, err)
	}
}

// A rule that counts into a counter the table lacks is refused before
// anything is sent, naming the chain and the counter.
func TestMissingCounterRefused(t *testing.T) {
	a, _ := newTestApplier(t)
	bad := countingTable(false)
	bad.Counters = nil
	_, err := a.Apply(bad)
	if err == nil || !strings.Contains(err.Error(), `chain output: a rule counts into counter "rule.udp"`) {
		t.Fatalf("apply: %v", err)
	}
}
