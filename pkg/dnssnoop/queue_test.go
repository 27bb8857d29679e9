package dnssnoop

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/domain"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

const queueNum = 3

// freshNetNS is a new network namespace with lo up, closed at the end.
func freshNetNS(t testing.TB) netns.NsHandle {
	t.Helper()
	return kerneltest.NetNS(t, "it creates a network namespace and programs nftables")
}

// queueLab is a fresh network namespace with lo up and a rule that
// queues UDP to port 5353 (queue number 3), with the queue statement
// this kernel takes (kernel.DetectQueue).
func queueLab(t *testing.T) netns.NsHandle {
	t.Helper()
	h := freshNetNS(t)
	kind, err := kernel.DetectQueue(int(h))
	if kind == nft.QueueUnavailable {
		t.Fatalf("this kernel takes no queue statement: %v", err)
	}
	t.Logf("queue statement: %s", kind)
	queue, err := nft.QueueExprs(kind, queueNum)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		t.Fatal(err)
	}
	tab := c.AddTable(&nftables.Table{Name: "dnssnoop-test", Family: nftables.TableFamilyINet})
	accept := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{Name: "out", Table: tab, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	exprs := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x14, 0xe9}}, // 5353
	}
	c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: append(exprs, queue...)})
	if err := c.Flush(); err != nil {
		t.Fatalf("queue rule: %v", err)
	}
	return h
}

// exchange sends msg from 127.0.0.1 to 127.0.0.1:5353 in the namespace
// and reports whether it arrived within wait.
func exchange(t *testing.T, h netns.NsHandle, msg []byte, wait time.Duration) bool {
	t.Helper()
	var recv, send *net.UDPConn
	err := nsexec.In(h, func() error {
		var err error
		if recv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353}); err != nil {
			return err
		}
		send, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	defer send.Close()
	if _, err := send.Write(msg); err != nil {
		t.Fatal(err)
	}
	recv.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65535)
	n, err := recv.Read(buf)
	if err != nil {
		return false
	}
	if string(buf[:n]) != string(msg) {
		t.Fatalf("received %d bytes that differ from the %d sent", n, len(msg))
	}
	return true
}

func dnsAnswer(t *testing.T) []byte {
	m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: 1, Response: true},
		Question: []dns.Question{{Name: "www.example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET}}}
	rr, err := dns.NewRR("www.example.com. 30 IN A 203.0.113.10")
	if err != nil {
		t.Fatal(err)
	}
	m.Answer = []dns.RR{rr}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestQueue: with no reader the queued answers pass (bypass: DNS keeps
// working while the agent is down); with a reader each answer waits
// for the handler, which sees the packet as sent, and its verdict
// decides whether the answer arrives.
func TestQueue(t *testing.T) {
	h := queueLab(t)
	msg := dnsAnswer(t)
	if !exchange(t, h, msg, 2*time.Second) {
		t.Fatal("with no reader the queued datagram did not pass (no bypass)")
	}

	var mu sync.Mutex
	var seen []Segment
	verdict := true
	q, err := Open(Config{NetNS: int(h), Num: queueNum}, func(s Segment) bool {
		mu.Lock()
		defer mu.Unlock()
		s.Payload = append([]byte(nil), s.Payload...)
		seen = append(seen, s)
		return verdict
	})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if !exchange(t, h, msg, 2*time.Second) {
		t.Fatal("an answer the handler accepted did not arrive")
	}
	mu.Lock()
	if len(seen) != 1 || seen[0].TCP || seen[0].Dst != netip.MustParseAddrPort("127.0.0.1:5353") || string(seen[0].Payload) != string(msg) {
		t.Fatalf("the handler saw %+v", seen)
	}
	learned, err := domain.Learn(seen[0].Payload)
	if err != nil || len(learned) != 1 || learned[0].Name != "www.example.com" || learned[0].Addr != netip.MustParseAddr("203.0.113.10") ||
		learned[0].TTL != 30*time.Second {
		t.Fatalf("learned %+v (%v) from the queued answer", learned, err)
	}
	verdict = false
	mu.Unlock()
	if exchange(t, h, msg, 300*time.Millisecond) {
		t.Fatal("an answer the handler dropped arrived: the packet was not held for the verdict")
	}
	if got := q.Stats.Packets.Load(); got != 2 {
		t.Errorf("Stats.Packets = %d, want 2", got)
	}
	q.Close()
	if !exchange(t, h, msg, 2*time.Second) {
		t.Fatal("after the reader closed the queued datagram did not pass (no bypass)")
	}
}
