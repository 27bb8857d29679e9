package domain

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// Learned is one address a DNS answer gave for a name a pod asked for.
type Learned struct {
	// Name is the question's name (normalised): the name a pod asked
	// for, which is what patterns match, also when the address came at
	// the end of a CNAME chain.
	Name string
	Addr netip.Addr
	// TTL is the smallest TTL along the way from the name to the
	// address record (each CNAME's and the record's own): the answer
	// vouches for the address no longer than that.
	TTL time.Duration
}

// maxChain bounds a CNAME chain inside one answer (a loop ends there).
const maxChain = 16

// Learn reads one DNS message and returns what it teaches: for every
// question, the A and AAAA records of the answer section that the
// question's name reaches, directly or through CNAMEs in the same
// answer. Queries, truncated and failed answers teach nothing (nil, no
// error). An answer of any size is read (EDNS answers exceed 512 bytes;
// over TCP up to 65,535). A message that does not parse is an error.
func Learn(msg []byte) ([]Learned, error) {
	var m dns.Msg
	if err := m.Unpack(msg); err != nil {
		return nil, fmt.Errorf("dns message: %w", err)
	}
	if !m.Response || m.Truncated || m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 {
		return nil, nil
	}
	// The answer section by owner name: CNAME targets and addresses.
	type owned struct {
		cnames []*dns.CNAME
		addrs  []dns.RR
	}
	byName := map[string]*owned{}
	for _, rr := range m.Answer {
		switch rr.(type) {
		case *dns.CNAME, *dns.A, *dns.AAAA:
		default:
			continue
		}
		name := Normalize(rr.Header().Name)
		o := byName[name]
		if o == nil {
			o = &owned{}
			byName[name] = o
		}
		if c, ok := rr.(*dns.CNAME); ok {
			o.cnames = append(o.cnames, c)
		} else {
			o.addrs = append(o.addrs, rr)
		}
	}
	var out []Learned
	seenQuestion := map[string]bool{}
	for _, q := range m.Question {
		if q.Qclass != dns.ClassINET || q.Qtype != dns.TypeA && q.Qtype != dns.TypeAAAA && q.Qtype != dns.TypeANY {
			continue
		}
		asked := Normalize(q.Name)
		if seenQuestion[asked] {
			continue
		}
		seenQuestion[asked] = true
		// Breadth-first along the CNAMEs, carrying the smallest TTL so
		// far; each name once.
		type step struct {
			name string
			ttl  uint32
		}
		visited := map[string]bool{asked: true}
		queue := []step{{asked, ^uint32(0)}}
		for depth := 0; len(queue) > 0 && depth <= maxChain; depth++ {
			var next []step
			for _, s := range queue {
				o := byName[s.name]
				if o == nil {
					continue
				}
				for _, rr := range o.addrs {
					a := rrAddr(rr)
					if !a.IsValid() {
						continue
					}
					out = append(out, Learned{Name: asked, Addr: a.Unmap(), TTL: seconds(min(s.ttl, rr.Header().Ttl))})
				}
				for _, c := range o.cnames {
					target := Normalize(c.Target)
					if !visited[target] {
						visited[target] = true
						next = append(next, step{target, min(s.ttl, c.Hdr.Ttl)})
					}
				}
			}
			queue = next
		}
	}
	return out, nil
}

func seconds(ttl uint32) time.Duration { return time.Duration(ttl) * time.Second }
