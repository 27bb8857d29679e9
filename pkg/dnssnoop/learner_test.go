package dnssnoop

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
)

// answerSegment is a UDP answer from the cluster DNS to a pod.
func answerSegment(t testing.TB, question string, qtype uint16, rrs ...string) Segment {
	t.Helper()
	m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: 9, Response: true},
		Question: []dns.Question{{Name: dns.Fqdn(question), Qtype: qtype, Qclass: dns.ClassINET}}}
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return Segment{Src: netip.MustParseAddrPort("10.96.0.10:53"), Dst: netip.MustParseAddrPort("10.244.1.5:40000"), Payload: b}
}

// elements lists a set's addresses and their timeouts as the kernel has
// them (expired ones are not listed).
func elements(t testing.TB, c *nftables.Conn, set string) map[netip.Addr]time.Duration {
	t.Helper()
	s, err := c.GetSetByName(&nftables.Table{Name: "netpol", Family: nftables.TableFamilyINet}, set)
	if err != nil {
		t.Fatalf("set %s: %v", set, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]time.Duration{}
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key)
		out[a] = e.Timeout
	}
	return out
}

// domainTable gives the namespace a policy table holding the domain sets
// of the patterns (as a compile makes them, empty) and returns the
// Applier that programmed it, a Learner for those patterns and a
// connection to read the sets back; all close at the end of the test.
func domainTable(t testing.TB, h netns.NsHandle, opts LearnerOptions, patterns ...string) (*nft.Table, *kernel.Applier, *Learner, *nftables.Conn) {
	t.Helper()
	desired := nft.NewTable("netpol")
	for _, p := range patterns {
		for _, f := range nft.Families {
			desired.AddSet(compiler.DomainSet(compiler.DomainSetPrefix(p), f))
		}
	}
	applier, err := kernel.NewApplier(int(h), "netpol")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { applier.Close() })
	if _, err := applier.Apply(desired); err != nil {
		t.Fatal(err)
	}
	l, err := NewLearner(int(h), "netpol", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := l.SetPatterns(patterns); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		t.Fatal(err)
	}
	return desired, applier, l, c
}

// TestLearner: learned addresses go into the set of each pattern that
// matches the name asked for (through CNAMEs), with the TTL as timeout
// (the floor below it), a later answer refreshes the timeout, a sync of
// the policy table leaves them alone, and they expire with their TTL.
func TestLearner(t *testing.T) {
	h := freshNetNS(t)
	wildcard, exact := compiler.DomainSetPrefix("*.example.com"), compiler.DomainSetPrefix("www.example.com")
	desired, applier, l, c := domainTable(t, h, LearnerOptions{Floor: time.Second}, "*.example.com", "www.example.com")
	a4, a6, cdn := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("198.51.100.7")

	if _, err := l.Learn(answerSegment(t, "WWW.example.com.", dns.TypeA, "www.example.com. 20 IN A 203.0.113.10")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Learn(answerSegment(t, "www.example.com", dns.TypeAAAA, "www.example.com. 0 IN AAAA 2001:db8::10")); err != nil {
		t.Fatal(err)
	}
	// The name asked for decides, not the CNAME's target.
	if _, err := l.Learn(answerSegment(t, "img.example.com", dns.TypeA,
		"img.example.com. 60 IN CNAME img.cdn.example.net.", "img.cdn.example.net. 3 IN A 198.51.100.7")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Learn(answerSegment(t, "example.com", dns.TypeA, "example.com. 60 IN A 192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	check := func(when string, set string, want map[netip.Addr]time.Duration) {
		t.Helper()
		got := elements(t, c, set)
		if len(got) != len(want) {
			t.Errorf("%s: %s holds %v, want %v", when, set, got, want)
			return
		}
		for a, to := range want {
			if got[a] != to {
				t.Errorf("%s: %s holds %v, want %v", when, set, got, want)
			}
		}
	}
	check("learned", wildcard+"4", map[netip.Addr]time.Duration{a4: 20 * time.Second, cdn: 3 * time.Second})
	check("learned", wildcard+"6", map[netip.Addr]time.Duration{a6: time.Second}) // TTL 0: the floor
	check("learned", exact+"4", map[netip.Addr]time.Duration{a4: 20 * time.Second})
	check("learned", exact+"6", map[netip.Addr]time.Duration{a6: time.Second})

	// A sync of the policy table keeps what was learned.
	if _, err := applier.Apply(desired); err != nil {
		t.Fatal(err)
	}
	restarted, err := kernel.NewApplier(int(h), "netpol") // a restarted agent reads the table back and syncs
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
	if _, err := restarted.Apply(desired); err != nil {
		t.Fatal(err)
	}
	check("after a sync", wildcard+"4", map[netip.Addr]time.Duration{a4: 20 * time.Second, cdn: 3 * time.Second})

	// A later answer sets the timeout anew.
	if _, err := l.Learn(answerSegment(t, "www.example.com", dns.TypeA, "www.example.com. 300 IN A 203.0.113.10")); err != nil {
		t.Fatal(err)
	}
	check("refreshed", exact+"4", map[netip.Addr]time.Duration{a4: 300 * time.Second})

	// The TTL runs out: the address goes (the kernel expires it).
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := elements(t, c, wildcard+"4")[cdn]; !ok {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	check("expired", wildcard+"4", map[netip.Addr]time.Duration{a4: 300 * time.Second})
	check("expired", wildcard+"6", map[netip.Addr]time.Duration{})
	// Learning again after the expiry (the map still had it) works.
	if _, err := l.Learn(answerSegment(t, "img.example.com", dns.TypeA,
		"img.example.com. 60 IN CNAME img.cdn.example.net.", "img.cdn.example.net. 30 IN A 198.51.100.7")); err != nil {
		t.Fatal(err)
	}
	check("learned again", wildcard+"4", map[netip.Addr]time.Duration{a4: 300 * time.Second, cdn: 30 * time.Second})

	// A restarted agent's Learner adopts what the sets hold: it shows the
	// addresses (without names), and a later answer sets their timeouts
	// anew by delete and add, as for its own.
	again, err := NewLearner(int(h), "netpol", LearnerOptions{Floor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := again.SetPatterns([]string{"*.example.com", "www.example.com"}); err != nil {
		t.Fatal(err)
	}
	adopted := map[string]Entry{}
	for _, e := range again.Entries() {
		adopted[e.Pattern+" "+e.Addr.String()] = e
	}
	if e, ok := adopted["*.example.com 198.51.100.7"]; !ok || e.Name != "" || time.Until(e.Expires) > 30*time.Second || time.Until(e.Expires) < 20*time.Second {
		t.Errorf("adopted %v, want *.example.com 198.51.100.7 expiring in 20-30 s, without a name", adopted)
	}
	if len(adopted) != 3 { // a4 in both patterns' sets, cdn in the wildcard's
		t.Errorf("adopted %d entries, want 3: %v", len(adopted), adopted)
	}
	if _, err := again.Learn(answerSegment(t, "img.example.com", dns.TypeA, "img.example.com. 7 IN A 198.51.100.7")); err != nil {
		t.Fatal(err)
	}
	check("refreshed after a restart", wildcard+"4", map[netip.Addr]time.Duration{a4: 300 * time.Second, cdn: 7 * time.Second})
	if st := again.Stats(); st.Errors != 0 {
		t.Errorf("%d answers failed after the restart", st.Errors)
	}
}

// TestAnswerReleasedAfterCommit: an answer read from the queue reaches
// the pod only once its addresses are in the kernel's set, so the pod's
// first connection after resolving finds them.
func TestAnswerReleasedAfterCommit(t *testing.T) {
	h := queueLab(t)
	prefix := compiler.DomainSetPrefix("www.example.com")
	_, _, l, c := domainTable(t, h, LearnerOptions{}, "www.example.com")
	q, err := Open(Config{NetNS: int(h), Num: queueNum}, l.Handler(func(err error) { t.Error(err) }))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	for i := range 20 {
		addr := netip.AddrFrom4([4]byte{203, 0, 113, byte(10 + i)})
		msg := answerSegment(t, "www.example.com", dns.TypeA, "www.example.com. 60 IN A "+addr.String()).Payload
		if !exchange(t, h, msg, 2*time.Second) {
			t.Fatalf("answer %d did not arrive", i)
		}
		if _, ok := elements(t, c, prefix+"4")[addr]; !ok {
			t.Fatalf("answer %d arrived before %s was in the set", i, addr)
		}
	}
}

// TestLearnerTCP: an answer over TCP, split over two segments after the
// server's SYN-ACK, is learned once whole.
func TestLearnerTCP(t *testing.T) {
	h := freshNetNS(t)
	prefix := compiler.DomainSetPrefix("*.example.com")
	_, _, l, c := domainTable(t, h, LearnerOptions{}, "*.example.com")
	udp := answerSegment(t, "api.example.com", dns.TypeAAAA, "api.example.com. 60 IN AAAA 2001:db8::53")
	stream := append([]byte{byte(len(udp.Payload) >> 8), byte(len(udp.Payload))}, udp.Payload...)
	server, client := netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.244.1.5:40001")
	const isn = 1000
	segs := []Segment{
		{Src: server, Dst: client, TCP: true, SYN: true, Seq: isn},
		{Src: server, Dst: client, TCP: true, Seq: isn + 1, Payload: stream[:9]},
		{Src: server, Dst: client, TCP: true, Seq: isn + 1 + 9, Payload: stream[9:]},
	}
	var learned int
	for i, s := range segs {
		ls, err := l.Learn(s)
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 && len(ls) > 0 {
			t.Fatalf("segment %d alone taught %v", i, ls)
		}
		learned += len(ls)
	}
	if got := elements(t, c, prefix+"6"); learned != 1 || got[netip.MustParseAddr("2001:db8::53")] != time.Minute {
		t.Errorf("learned %d; the set holds %v", learned, got)
	}
}
