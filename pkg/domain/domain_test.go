package domain

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestParsePattern(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{in: "example.com", want: "example.com"},
		{in: "Example.COM.", want: "example.com"},
		{in: "*.example.com", want: "*.example.com"},
		{in: "*.Sub.Example.com.", want: "*.sub.example.com"},
		{in: "localhost", want: "localhost"},
		{in: "", err: "empty"},
		{in: "*.com", err: "at least two labels"},
		{in: "*", err: `"*" only as the whole first label`},
		{in: "a.*.example.com", err: `"*" only as the whole first label`},
		{in: "**.example.com", err: "letters, digits and hyphens"},
		{in: "*example.com", err: "letters, digits and hyphens"},
		{in: "a..example.com", err: "empty label"},
		{in: "-a.example.com", err: "hyphen"},
		{in: "a_b.example.com", err: "letters, digits and hyphens"},
		{in: strings.Repeat("a", 64) + ".com", err: "longer than 63"},
		{in: strings.Repeat("abcdefghi.", 26) + "com", err: "longer than 253"},
	} {
		p, err := ParsePattern(c.in)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParsePattern(%q) = %v, %v; want an error with %q", c.in, p, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("ParsePattern(%q): %v", c.in, err)
		case c.err == "" && p.String() != c.want:
			t.Errorf("ParsePattern(%q) = %s, want %s", c.in, p, c.want)
		}
	}
}

func TestPatternMatches(t *testing.T) {
	for _, c := range []struct {
		pattern string
		yes, no []string
	}{
		{"example.com", []string{"example.com", "EXAMPLE.com", "example.com."},
			[]string{"www.example.com", "example.co", "xexample.com", "example.com.."}},
		{"*.example.com", []string{"www.example.com", "a.b.example.com", "WWW.Example.Com.", "x-1.example.com"},
			[]string{"example.com", "example.com.", "badexample.com", "www.badexample.com", ".example.com", "a..example.com", "www.example.org"}},
	} {
		p, err := ParsePattern(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.yes {
			if !p.Matches(n) {
				t.Errorf("%s does not match %q", p, n)
			}
		}
		for _, n := range c.no {
			if p.Matches(n) {
				t.Errorf("%s matches %q", p, n)
			}
		}
	}
}

// answer builds a response to the questions with the records (owner,
// type, TTL, value in zone-file syntax).
func answer(t *testing.T, questions []dns.Question, rrs ...string) *dns.Msg {
	t.Helper()
	m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: 7, Response: true, RecursionAvailable: true}, Question: questions}
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		m.Answer = append(m.Answer, rr)
	}
	return m
}

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func q(name string, qtype uint16) dns.Question {
	return dns.Question{Name: dns.Fqdn(name), Qtype: qtype, Qclass: dns.ClassINET}
}

func learnedText(ls []Learned) string {
	var out []string
	for _, l := range ls {
		out = append(out, fmt.Sprintf("%s=%s/%v", l.Name, l.Addr, l.TTL))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func TestLearn(t *testing.T) {
	edns := answer(t, []dns.Question{q("big.example.com", dns.TypeA)})
	for i := range 120 {
		rr, _ := dns.NewRR(fmt.Sprintf("big.example.com. 60 IN A 198.51.%d.%d", i/100, i%100))
		edns.Answer = append(edns.Answer, rr)
	}
	edns.SetEdns0(4096, false)
	var bigWant []string
	for i := range 120 {
		bigWant = append(bigWant, fmt.Sprintf("big.example.com=198.51.%d.%d/1m0s", i/100, i%100))
	}
	slices.Sort(bigWant)
	for _, c := range []struct {
		name string
		msg  *dns.Msg
		want string
	}{
		{"A", answer(t, []dns.Question{q("www.example.com", dns.TypeA)}, "www.example.com. 30 IN A 203.0.113.10"),
			"www.example.com=203.0.113.10/30s"},
		{"AAAA", answer(t, []dns.Question{q("WWW.Example.com", dns.TypeAAAA)}, "www.example.com. 300 IN AAAA 2001:db8::10"),
			"www.example.com=2001:db8::10/5m0s"},
		{"the name asked for, through a CNAME chain, with the chain's smallest TTL",
			answer(t, []dns.Question{q("shop.example.com", dns.TypeA)},
				"shop.example.com. 600 IN CNAME shop.cdn.example.net.",
				"shop.cdn.example.net. 20 IN CNAME edge.cdn.example.net.",
				"edge.cdn.example.net. 120 IN A 203.0.113.20",
				"edge.cdn.example.net. 120 IN A 203.0.113.21"),
			"shop.example.com=203.0.113.20/20s shop.example.com=203.0.113.21/20s"},
		{"records no question reaches teach nothing",
			answer(t, []dns.Question{q("a.example.com", dns.TypeA)},
				"a.example.com. 60 IN A 203.0.113.1", "other.example.com. 60 IN A 203.0.113.2"),
			"a.example.com=203.0.113.1/1m0s"},
		{"two questions", answer(t, []dns.Question{q("a.example.com", dns.TypeA), q("b.example.com", dns.TypeAAAA)},
			"a.example.com. 60 IN A 203.0.113.1", "b.example.com. 60 IN AAAA 2001:db8::2"),
			"a.example.com=203.0.113.1/1m0s b.example.com=2001:db8::2/1m0s"},
		{"TTL 0 is kept as 0 (the caller's floor applies)", answer(t, []dns.Question{q("z.example.com", dns.TypeA)}, "z.example.com. 0 IN A 203.0.113.3"),
			"z.example.com=203.0.113.3/0s"},
		{"a CNAME loop ends", answer(t, []dns.Question{q("loop.example.com", dns.TypeA)},
			"loop.example.com. 60 IN CNAME loop2.example.com.", "loop2.example.com. 60 IN CNAME loop.example.com."), ""},
		{"an EDNS answer over 1,232 bytes", edns, strings.Join(bigWant, " ")},
	} {
		t.Run(c.name, func(t *testing.T) {
			data := pack(t, c.msg)
			got, err := Learn(data)
			if err != nil {
				t.Fatal(err)
			}
			if g := learnedText(got); g != c.want {
				t.Errorf("learned\n %s\nwant\n %s", g, c.want)
			}
		})
	}
	if n := len(pack(t, edns)); n <= 1232 {
		t.Errorf("the EDNS answer is %d bytes, not over 1,232", n)
	}
}

func TestLearnNothing(t *testing.T) {
	ok := func() *dns.Msg {
		return answer(t, []dns.Question{q("a.example.com", dns.TypeA)}, "a.example.com. 60 IN A 203.0.113.1")
	}
	query := ok()
	query.Response = false
	truncated := ok()
	truncated.Truncated = true
	nx := ok()
	nx.Rcode = dns.RcodeNameError
	mx := answer(t, []dns.Question{q("a.example.com", dns.TypeMX)}, "a.example.com. 60 IN MX 10 mail.example.com.")
	for name, m := range map[string]*dns.Msg{"query": query, "truncated": truncated, "NXDOMAIN": nx, "MX": mx} {
		got, err := Learn(pack(t, m))
		if err != nil || len(got) != 0 {
			t.Errorf("%s: learned %v (%v), want nothing", name, got, err)
		}
	}
	if _, err := Learn([]byte{1, 2, 3}); err == nil {
		t.Error("three bytes parsed as a DNS message")
	}
}

// TestLearnThousandAddresses: no limit on the addresses of one name (a
// 1,000-record answer, as over TCP).
func TestLearnThousandAddresses(t *testing.T) {
	m := answer(t, []dns.Question{q("many.example.com", dns.TypeAAAA)})
	for i := range 1000 {
		m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: "many.example.com.", Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 5},
			AAAA: net.IP(netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}).AsSlice())})
	}
	got, err := Learn(pack(t, m))
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[netip.Addr]bool{}
	for _, l := range got {
		if l.Name != "many.example.com" || l.TTL != 5*time.Second {
			t.Fatalf("learned %+v", l)
		}
		addrs[l.Addr] = true
	}
	if len(addrs) != 1000 {
		t.Errorf("%d distinct addresses learned, want 1000", len(addrs))
	}
}

// framed is messages as a DNS over TCP stream carries them.
func framed(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
		b = append(b, m...)
	}
	return b
}

func TestStream(t *testing.T) {
	m1 := pack(t, answer(t, []dns.Question{q("a.example.com", dns.TypeA)}, "a.example.com. 60 IN A 203.0.113.1"))
	m2 := pack(t, answer(t, []dns.Question{q("b.example.com", dns.TypeA)}, "b.example.com. 60 IN A 203.0.113.2"))
	stream := framed(m1, m2)
	type seg struct{ from, to int } // byte offsets into stream
	const isn = 0xffffff00          // the sequence numbers wrap inside the stream
	for _, c := range []struct {
		name string
		segs []seg
	}{
		{"one segment each", []seg{{0, 2 + len(m1)}, {2 + len(m1), len(stream)}}},
		{"both in one segment", []seg{{0, len(stream)}}},
		{"split inside the length and the message", []seg{{0, 1}, {1, 10}, {10, 2 + len(m1) + 1}, {2 + len(m1) + 1, len(stream)}}},
		{"out of order", []seg{{10, 30}, {0, 10}, {30, len(stream)}}},
		{"retransmitted and overlapping", []seg{{0, 20}, {0, 20}, {10, 40}, {30, len(stream)}, {0, len(stream)}}},
		{"held overlapping a gap", []seg{{0, 10}, {20, 40}, {5, 30}, {40, len(stream)}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s Stream
			s.Start(isn)
			var got [][]byte
			for _, g := range c.segs {
				msgs, err := s.Add(isn+1+uint32(g.from), stream[g.from:g.to])
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, msgs...)
			}
			if len(got) != 2 || string(got[0]) != string(m1) || string(got[1]) != string(m2) {
				t.Fatalf("%d messages (%s), want the two sent", len(got), s.String())
			}
		})
	}
	t.Run("without a SYN the first segment starts it", func(t *testing.T) {
		var s Stream
		msgs, err := s.Add(1000, stream)
		if err != nil || len(msgs) != 2 {
			t.Fatalf("%d messages, %v", len(msgs), err)
		}
	})
	t.Run("too much past a gap", func(t *testing.T) {
		var s Stream
		s.Start(0)
		big := make([]byte, 60000)
		var err error
		for i := 1; i <= 4 && err == nil; i++ {
			_, err = s.Add(uint32(1+i*60000), big)
		}
		if err != ErrStreamGap {
			t.Fatalf("got %v, want ErrStreamGap", err)
		}
	})
}
