package domain

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Zone is a DNS zone read from an RFC 1035 master file, as the lab's DNS
// server serves it: A, AAAA and CNAME records only, every name
// authoritative, any name without records unknown (NXDOMAIN; the zone
// has no apex, so there are no empty non-terminals).
type Zone struct {
	names map[string]*zoneName // by canonical owner name
}

// zoneName is what one owner name holds: a CNAME, or addresses.
type zoneName struct {
	cname *dns.CNAME
	addrs []dns.RR // *dns.A and *dns.AAAA, in file order
}

// answerUDPSize is the buffer size the zone's answers advertise in OPT:
// the DNS flag day's, which fits every path without fragments.
const answerUDPSize = 1232

// ParseZone reads a master file. The origin is the root until $ORIGIN
// says otherwise; a record without a TTL takes $TTL's, or the previous
// record's. BIND's $GENERATE works too, but its records take the TTL its
// template names, else 3600 (miekg/dns does not give them $TTL's).
// Errors name the line: a record the file cannot hold, and any record
// other than A, AAAA and CNAME of class IN (served records only, so that
// a zone that would not do what it says fails early), a wildcard owner, a
// CNAME next to other records of its name.
func ParseZone(text string) (*Zone, error) {
	z := &Zone{names: map[string]*zoneName{}}
	// A strings.Reader is an io.ByteReader, so the parser reads from it
	// byte by byte, never past the newline that ends a record: what it
	// has read tells where the next record starts.
	r := strings.NewReader(text)
	zp := dns.NewZoneParser(r, ".", "")
	start, read := 0, 0 // where the record's read began, and ended
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		if pos := len(text) - r.Len(); pos != read { // else one more of a $GENERATE's
			start, read = read, pos
		}
		if err := z.add(rr); err != nil {
			return nil, fmt.Errorf("line %d: %w", entryLine(text, start), err)
		}
	}
	if err := zp.Err(); err != nil {
		return nil, parseError(err)
	}
	return z, nil
}

// entryLine is the 1-based line where the entry after byte offset from
// starts: the first line from there that is not blank, a comment or a
// $TTL, $ORIGIN or $INCLUDE directive (which make no record).
func entryLine(text string, from int) int {
	lines := strings.Split(text, "\n")
	for i := strings.Count(text[:from], "\n"); i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		upper := strings.ToUpper(l)
		if l == "" || strings.HasPrefix(l, ";") || strings.HasPrefix(upper, "$TTL") ||
			strings.HasPrefix(upper, "$ORIGIN") || strings.HasPrefix(upper, "$INCLUDE") {
			continue
		}
		return i + 1
	}
	return len(lines)
}

// parseErrorText is how miekg/dns spells a ParseError without a file name.
var parseErrorText = regexp.MustCompile(`^dns: (.*) at line: (\d+):\d+$`)

// parseError restates a zone parser error as "line N: what".
func parseError(err error) error {
	if m := parseErrorText.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Errorf("line %s: %s", m[2], m[1])
	}
	return err
}

func (z *Zone) add(rr dns.RR) error {
	h := rr.Header()
	typ := dns.TypeToString[h.Rrtype]
	if typ == "" {
		typ = "TYPE" + strconv.Itoa(int(h.Rrtype))
	}
	if h.Class != dns.ClassINET {
		return fmt.Errorf("%s %s: class %s; the zone serves class IN only", h.Name, typ, dns.ClassToString[h.Class])
	}
	switch rr.(type) {
	case *dns.A, *dns.AAAA, *dns.CNAME:
	default:
		return fmt.Errorf("%s: a %s record; the zone serves A, AAAA and CNAME records only", h.Name, typ)
	}
	name := Normalize(h.Name)
	if name == "*" || strings.HasPrefix(name, "*.") {
		return fmt.Errorf("%s %s: wildcard names are not served", h.Name, typ)
	}
	n := z.names[name]
	if n == nil {
		n = &zoneName{}
		z.names[name] = n
	}
	if c, ok := rr.(*dns.CNAME); ok {
		switch {
		case n.cname != nil && Normalize(n.cname.Target) == Normalize(c.Target):
			return nil // the same record twice
		case n.cname != nil:
			return fmt.Errorf("%s CNAME: a second CNAME (to %s and %s); a name has at most one", h.Name, n.cname.Target, c.Target)
		case len(n.addrs) > 0:
			return fmt.Errorf("%s CNAME: the name has address records too; a CNAME must be its name's only record", h.Name)
		}
		n.cname = c
		return nil
	}
	if n.cname != nil {
		return fmt.Errorf("%s %s: the name has a CNAME (to %s), which must be its only record", h.Name, typ, n.cname.Target)
	}
	a := rrAddr(rr)
	if !a.IsValid() {
		return fmt.Errorf("%s %s: no address", h.Name, typ)
	}
	for _, have := range n.addrs {
		if rrAddr(have) == a {
			return nil // a set: the same address once
		}
	}
	n.addrs = append(n.addrs, rr)
	return nil
}

// rrAddr is an A or AAAA record's address (invalid for other types).
func rrAddr(rr dns.RR) netip.Addr {
	var a netip.Addr
	switch r := rr.(type) {
	case *dns.A:
		a, _ = netip.AddrFromSlice(r.A.To4())
	case *dns.AAAA:
		a, _ = netip.AddrFromSlice(r.AAAA.To16())
	}
	return a.Unmap()
}

// Names are the zone's owner names, canonical (lower case, no trailing
// dot) and sorted.
func (z *Zone) Names() []string {
	out := make([]string, 0, len(z.names))
	for name := range z.names {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Addresses are the addresses of all A and AAAA records, sorted (IPv4
// first), each once.
func (z *Zone) Addresses() []netip.Addr {
	var out []netip.Addr
	for _, n := range z.names {
		for _, rr := range n.addrs {
			out = append(out, rrAddr(rr))
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// chain follows name's CNAMEs inside the zone: the CNAME records taken,
// in order, and the name reached last, which holds the addresses (nil
// when the chain leaves the zone, loops or runs longer than maxChain; a
// loop's CNAMEs are taken until one points back).
func (z *Zone) chain(name string) (cnames []*dns.CNAME, last *zoneName) {
	seen := map[*zoneName]bool{}
	n := z.names[Normalize(name)]
	for n != nil && n.cname != nil {
		if seen[n] || len(cnames) == maxChain {
			return cnames, nil
		}
		seen[n] = true
		cnames = append(cnames, n.cname)
		n = z.names[Normalize(n.cname.Target)]
	}
	return cnames, n
}

// Lookup is what a resolver gets for name (any case, trailing dot or
// not): the A and AAAA addresses at the end of its CNAME chain inside the
// zone (sorted, IPv4 first; none when the chain leaves the zone or
// loops), and the smallest TTL along the way (each CNAME's and each
// address record's). ok is false for a name the zone does not have.
func (z *Zone) Lookup(name string) (addrs []netip.Addr, ttl time.Duration, ok bool) {
	if z.names[Normalize(name)] == nil {
		return nil, 0, false
	}
	cnames, last := z.chain(name)
	low := ^uint32(0)
	for _, c := range cnames {
		low = min(low, c.Hdr.Ttl)
	}
	if last != nil {
		for _, rr := range last.addrs {
			addrs = append(addrs, rrAddr(rr))
			low = min(low, rr.Header().Ttl)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs), seconds(low), true
}

// Answer is the zone's authoritative answer to a query: for each IN
// question, A or AAAA (the CNAMEs of the chain first, in order, owned by
// the name as asked and then by each target as the zone spells it, then
// the records of the type at the chain's end) or CNAME (the name's own).
// Other types get no records, other opcodes NOTIMP. A known name with no records of the type
// is NOERROR with an empty answer; NXDOMAIN when no question's name is
// known. The reply carries OPT when the request did, and is cut (TC set)
// to the client's UDP size when udp (512 bytes without EDNS); over TCP
// to 65,535 bytes.
func (z *Zone) Answer(req *dns.Msg, udp bool) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	resp.RecursionAvailable = false
	if req.Opcode != dns.OpcodeQuery {
		resp.Rcode = dns.RcodeNotImplemented
		return resp
	}
	known := false
	for _, q := range req.Question {
		if q.Qclass != dns.ClassINET {
			continue
		}
		if z.names[Normalize(q.Name)] == nil {
			continue
		}
		known = true
		if q.Qtype == dns.TypeCNAME {
			if c := z.names[Normalize(q.Name)].cname; c != nil {
				resp.Answer = append(resp.Answer, withOwner(c, q.Name))
			}
			continue
		}
		if q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA {
			continue
		}
		cnames, last := z.chain(q.Name)
		owner := q.Name
		for _, c := range cnames {
			resp.Answer = append(resp.Answer, withOwner(c, owner))
			owner = c.Target
		}
		if last == nil {
			continue
		}
		for _, rr := range last.addrs {
			if rr.Header().Rrtype == q.Qtype {
				resp.Answer = append(resp.Answer, withOwner(rr, owner))
			}
		}
	}
	if len(req.Question) > 0 && !known {
		resp.Rcode = dns.RcodeNameError
	}
	size := dns.MaxMsgSize
	if opt := req.IsEdns0(); opt != nil {
		resp.SetEdns0(answerUDPSize, false)
		if udp {
			size = int(opt.UDPSize())
		}
	} else if udp {
		size = dns.MinMsgSize
	}
	resp.Truncate(size)
	return resp
}

// withOwner is a copy of rr owned by name.
func withOwner(rr dns.RR, name string) dns.RR {
	c := dns.Copy(rr)
	c.Header().Name = dns.Fqdn(name)
	return c
}
