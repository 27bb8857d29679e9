package domain

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const testZone = `; the lab's zone, as a ConfigMap holds it
$TTL 300
$ORIGIN example.com.
allowed          A     203.0.113.10
Six              AAAA  2001:db8:113::10
dual        60   A     203.0.113.11
dual        30   AAAA  2001:db8:113::11
www         120  CNAME cdn.example.net.
cdn.example.net. 20 A  203.0.113.20
two              CNAME www
out              CNAME elsewhere.example.org.
loop1            CNAME loop2
loop2            CNAME loop1
short       2    A     203.0.113.30
dup              A     203.0.113.40
dup              A     203.0.113.40
$GENERATE 1-100 big 60 A 198.51.100.$
`

func mustZone(t *testing.T, text string) *Zone {
	t.Helper()
	z, err := ParseZone(text)
	if err != nil {
		t.Fatalf("ParseZone: %v", err)
	}
	return z
}

func TestParseZoneErrors(t *testing.T) {
	for _, c := range []struct{ name, text, err string }{
		{"a type not served", "www.example.com. 300 IN MX 10 mail.example.com.\n",
			"line 1: www.example.com.: a MX record; the zone serves A, AAAA and CNAME records only"},
		{"after directives, comments and blank lines", "$TTL 60\n; a comment\n\nwww.example.com. A 192.0.2.1\n\n  ; more\n$ORIGIN example.com.\nmail TXT \"x\"\n",
			"line 8: mail.example.com.: a TXT record"},
		{"a record over several lines names its first", "www.example.com. 60 A 192.0.2.1\nexample.com. 60 SOA ns.example.com. admin.example.com. (\n  1 ; serial\n  60 60 60 60 )\n",
			"line 2: example.com.: a SOA record"},
		{"the last line without a newline", "a. 60 A 192.0.2.1\nb. 60 NS ns.example.com.",
			"line 2: b.: a NS record"},
		{"a bad address", "a. 60 A 192.0.2.1\nwww.example.com. 60 A 192.0.2\n", "line 2: bad A A"},
		{"no TTL at all", "www.example.com. A 192.0.2.1\n", "line 1: missing TTL with no previous value"},
		{"CNAME next to an address", "$TTL 60\nwww.example.com. A 192.0.2.1\nwww.example.com. CNAME other.example.com.\n",
			"line 3: www.example.com. CNAME: the name has address records too"},
		{"address next to a CNAME", "$TTL 60\nwww.example.com. CNAME other.example.com.\nWWW.example.com. AAAA 2001:db8::1\n",
			"line 3: WWW.example.com. AAAA: the name has a CNAME (to other.example.com.)"},
		{"two CNAMEs", "$TTL 60\nwww.example.com. CNAME a.example.com.\nwww.example.com. CNAME b.example.com.\n",
			"line 3: www.example.com. CNAME: a second CNAME"},
		{"a wildcard", "$TTL 60\n*.example.com. A 192.0.2.1\n", "line 2: *.example.com. A: wildcard names are not served"},
		{"class CH", "$TTL 60\nwww.example.com. CH A 192.0.2.1\n", "line 2: www.example.com. A: class CH"},
		{"garbage", "$TTL 60\n(((\n", "line "},
		{"a $GENERATE names its line", "a. 60 A 192.0.2.1\n$GENERATE 1-3 x$ 60 MX 10 m.\n", "line 2: x1.: a MX record"},
	} {
		t.Run(c.name, func(t *testing.T) {
			z, err := ParseZone(c.text)
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("ParseZone = %v, %v; want an error with %q", z, err, c.err)
			}
		})
	}
}

func TestZoneNamesAndAddresses(t *testing.T) {
	z := mustZone(t, testZone)
	want := []string{"allowed.example.com", "big.example.com", "cdn.example.net", "dual.example.com", "dup.example.com",
		"loop1.example.com", "loop2.example.com", "out.example.com", "short.example.com", "six.example.com",
		"two.example.com", "www.example.com"}
	if got := z.Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %q\nwant %q", got, want)
	}
	addrs := z.Addresses()
	if len(addrs) != 100+7 || addrs[0] != netip.MustParseAddr("198.51.100.1") ||
		addrs[len(addrs)-1] != netip.MustParseAddr("2001:db8:113::11") ||
		!slices.IsSortedFunc(addrs, netip.Addr.Compare) {
		t.Errorf("Addresses() = %v", addrs)
	}
	// The origin is the root until $ORIGIN.
	z = mustZone(t, "a 60 A 192.0.2.1\n$ORIGIN Example.COM.\nb 60 AAAA 2001:db8::1\n")
	if got := z.Names(); !slices.Equal(got, []string{"a", "b.example.com"}) {
		t.Errorf("Names() = %q", got)
	}
	if got := mustZone(t, "").Names(); len(got) != 0 {
		t.Errorf("an empty zone has names %q", got)
	}
}

func TestZoneLookup(t *testing.T) {
	z := mustZone(t, testZone)
	for _, c := range []struct {
		name  string
		addrs string
		ttl   time.Duration
		ok    bool
	}{
		{"allowed.example.com", "203.0.113.10", 300 * time.Second, true},
		{"ALLOWED.Example.com.", "203.0.113.10", 300 * time.Second, true},
		{"six.example.com", "2001:db8:113::10", 300 * time.Second, true},
		{"dual.example.com", "203.0.113.11 2001:db8:113::11", 30 * time.Second, true},
		// The smallest TTL along the chain: the CNAME's 120, the A's 20.
		{"www.example.com", "203.0.113.20", 20 * time.Second, true},
		{"two.example.com", "203.0.113.20", 20 * time.Second, true},
		// A chain that leaves the zone: known, no addresses.
		{"out.example.com", "", 300 * time.Second, true},
		{"loop1.example.com", "", 300 * time.Second, true},
		{"short.example.com", "203.0.113.30", 2 * time.Second, true},
		{"dup.example.com", "203.0.113.40", 300 * time.Second, true},
		{"example.com", "", 0, false},
		{"elsewhere.example.org", "", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			addrs, ttl, ok := z.Lookup(c.name)
			var got []string
			for _, a := range addrs {
				got = append(got, a.String())
			}
			if strings.Join(got, " ") != c.addrs || ttl != c.ttl || ok != c.ok {
				t.Errorf("Lookup = %v, %v, %v; want %s, %v, %v", addrs, ttl, ok, c.addrs, c.ttl, c.ok)
			}
		})
	}
	// A chain longer than maxChain is cut like a loop.
	var long strings.Builder
	long.WriteString("$TTL 60\n")
	for i := range maxChain + 1 {
		fmt.Fprintf(&long, "c%d. CNAME c%d.\n", i, i+1)
	}
	fmt.Fprintf(&long, "c%d. A 192.0.2.1\n", maxChain+1)
	lz := mustZone(t, long.String())
	if addrs, _, ok := lz.Lookup("c1"); len(addrs) != 1 || !ok {
		t.Errorf("Lookup(c1) = %v, %v; want the address, %d CNAMEs away", addrs, ok, maxChain)
	}
	if addrs, _, ok := lz.Lookup("c0"); len(addrs) != 0 || !ok {
		t.Errorf("Lookup(c0) = %v, %v; want no address, %d CNAMEs away", addrs, ok, maxChain+1)
	}
}

// rrStrings is each record as "name ttl class type data".
func rrStrings(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		out = append(out, strings.Join(strings.Fields(rr.String()), " "))
	}
	return out
}

func TestZoneAnswer(t *testing.T) {
	z := mustZone(t, testZone)
	for _, c := range []struct {
		name   string
		qname  string
		qtype  uint16
		edns   uint16 // 0: no OPT
		udp    bool
		rcode  int
		answer []string // nil: not checked (see count)
		count  int      // answer records, when answer is nil
		tc     bool
		max    int // packed size at most
	}{
		{name: "A", qname: "allowed.example.com.", qtype: dns.TypeA, udp: true,
			answer: []string{"allowed.example.com. 300 IN A 203.0.113.10"}, max: 512},
		{name: "the owner is the name as asked", qname: "AllOwed.Example.COM.", qtype: dns.TypeA, udp: true,
			answer: []string{"AllOwed.Example.COM. 300 IN A 203.0.113.10"}, max: 512},
		{name: "AAAA", qname: "six.example.com.", qtype: dns.TypeAAAA, edns: 4096, udp: true,
			answer: []string{"six.example.com. 300 IN AAAA 2001:db8:113::10"}, max: 4096},
		{name: "AAAA of a dual name", qname: "dual.example.com.", qtype: dns.TypeAAAA, udp: true,
			answer: []string{"dual.example.com. 30 IN AAAA 2001:db8:113::11"}, max: 512},
		{name: "known, no record of the type", qname: "six.example.com.", qtype: dns.TypeA, udp: true,
			answer: []string{}, max: 512},
		{name: "known, a type not served", qname: "allowed.example.com.", qtype: dns.TypeMX, udp: true,
			answer: []string{}, max: 512},
		{name: "CNAME chain", qname: "two.example.com.", qtype: dns.TypeA, udp: false,
			answer: []string{
				"two.example.com. 300 IN CNAME www.example.com.",
				"www.example.com. 120 IN CNAME cdn.example.net.",
				"cdn.example.net. 20 IN A 203.0.113.20",
			}, max: 512},
		{name: "CNAME chain, AAAA the end lacks", qname: "www.example.com.", qtype: dns.TypeAAAA, udp: true,
			answer: []string{"www.example.com. 120 IN CNAME cdn.example.net."}, max: 512},
		{name: "CNAME to a name the zone lacks", qname: "out.example.com.", qtype: dns.TypeA, udp: true,
			answer: []string{"out.example.com. 300 IN CNAME elsewhere.example.org."}, max: 512},
		{name: "CNAME question", qname: "www.example.com.", qtype: dns.TypeCNAME, udp: true,
			answer: []string{"www.example.com. 120 IN CNAME cdn.example.net."}, max: 512},
		{name: "loop", qname: "loop1.example.com.", qtype: dns.TypeA, udp: true,
			answer: []string{
				"loop1.example.com. 300 IN CNAME loop2.example.com.",
				"loop2.example.com. 300 IN CNAME loop1.example.com.",
			}, max: 512},
		{name: "unknown name", qname: "nope.example.com.", qtype: dns.TypeA, udp: true,
			rcode: dns.RcodeNameError, answer: []string{}, max: 512},
		{name: "a parent of known names is unknown", qname: "example.com.", qtype: dns.TypeA, udp: true,
			rcode: dns.RcodeNameError, answer: []string{}, max: 512},
		{name: "big over TCP", qname: "big.example.com.", qtype: dns.TypeA, udp: false,
			count: 100, max: dns.MaxMsgSize},
		{name: "big over UDP, EDNS 4096", qname: "big.example.com.", qtype: dns.TypeA, edns: 4096, udp: true,
			count: 100, max: 4096},
		{name: "big over UDP, EDNS 1232", qname: "big.example.com.", qtype: dns.TypeA, edns: 1232, udp: true,
			count: -1, tc: true, max: 1232},
		{name: "big over UDP without EDNS", qname: "big.example.com.", qtype: dns.TypeA, udp: true,
			count: -1, tc: true, max: 512},
		{name: "EDNS below 512 counts as 512", qname: "big.example.com.", qtype: dns.TypeA, edns: 100, udp: true,
			count: -1, tc: true, max: 512},
	} {
		t.Run(c.name, func(t *testing.T) {
			req := new(dns.Msg).SetQuestion(c.qname, c.qtype)
			if c.edns > 0 {
				req.SetEdns0(c.edns, false)
			}
			resp := z.Answer(req, c.udp)
			if !resp.Response || !resp.Authoritative || resp.Id != req.Id || resp.Rcode != c.rcode {
				t.Errorf("header %+v; want a response, authoritative, id %d, rcode %s", resp.MsgHdr, req.Id, dns.RcodeToString[c.rcode])
			}
			if resp.Truncated != c.tc {
				t.Errorf("truncated %v, want %v", resp.Truncated, c.tc)
			}
			if (resp.IsEdns0() != nil) != (c.edns > 0) {
				t.Errorf("OPT %v; the request had one: %v", resp.IsEdns0(), c.edns > 0)
			}
			packed, err := resp.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if len(packed) > c.max {
				t.Errorf("%d bytes, more than %d", len(packed), c.max)
			}
			switch {
			case c.answer != nil:
				if got := rrStrings(resp.Answer); !slices.Equal(got, c.answer) && !(len(got) == 0 && len(c.answer) == 0) {
					t.Errorf("answer\n %q\nwant\n %q", got, c.answer)
				}
			case c.count >= 0 && len(resp.Answer) != c.count:
				t.Errorf("%d records, want %d", len(resp.Answer), c.count)
			case c.count < 0 && (len(resp.Answer) == 0 || len(resp.Answer) >= 100):
				t.Errorf("%d records, want some but not all", len(resp.Answer))
			}
		})
	}
}

// The big name's answer is over 1,232 bytes: what forces EDNS or TCP.
func TestZoneBigAnswer(t *testing.T) {
	z := mustZone(t, "$GENERATE 1-100 big.example.com. 60 A 198.51.100.$\n")
	req := new(dns.Msg).SetQuestion("big.example.com.", dns.TypeA)
	resp := z.Answer(req, false)
	packed, err := resp.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Answer) != 100 || len(packed) <= 1232 || resp.Truncated {
		t.Errorf("%d records in %d bytes, truncated %v; want 100 in over 1232", len(resp.Answer), len(packed), resp.Truncated)
	}
	addrs, ttl, ok := z.Lookup("big.example.com")
	if len(addrs) != 100 || ttl != time.Minute || !ok {
		t.Errorf("Lookup = %d addresses, %v, %v", len(addrs), ttl, ok)
	}
}

// What the zone answers is what Learn (the agent's reading of answers)
// learns, with Lookup's TTL: the two sides of one name agree.
func TestZoneAnswerTeachesLookup(t *testing.T) {
	z := mustZone(t, testZone)
	for _, name := range []string{"allowed.example.com", "two.example.com", "dual.example.com", "short.example.com"} {
		addrs, ttl, _ := z.Lookup(name)
		var learned []netip.Addr
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA} {
			packed, err := z.Answer(new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype), false).Pack()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Learn(packed)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range got {
				if l.Name != name || l.TTL < ttl {
					t.Errorf("%s: learned %+v; want name %s, TTL at least %v", name, l, name, ttl)
				}
				learned = append(learned, l.Addr)
			}
		}
		slices.SortFunc(learned, netip.Addr.Compare)
		if !slices.Equal(learned, addrs) {
			t.Errorf("%s: learned %v, Lookup has %v", name, learned, addrs)
		}
	}
}

func TestZoneAnswerOtherOpcodes(t *testing.T) {
	z := mustZone(t, testZone)
	req := new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA)
	req.Opcode = dns.OpcodeUpdate
	if resp := z.Answer(req, true); resp.Rcode != dns.RcodeNotImplemented || len(resp.Answer) != 0 {
		t.Errorf("an UPDATE got rcode %s and %d records; want NOTIMP", dns.RcodeToString[resp.Rcode], len(resp.Answer))
	}
}
