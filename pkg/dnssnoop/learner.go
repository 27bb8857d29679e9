package dnssnoop

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/domain"
	"github.com/netpol/netpol/pkg/nft"
)

// LearnerOptions bound the lifetime of a learned address.
type LearnerOptions struct {
	// Floor is the least time an address is kept (a TTL-0 answer is
	// good for the connection that follows it). Default
	// compiler.DomainSetTimeout.
	Floor time.Duration
	// Ceiling, when set, is the most (default: none, the record's TTL).
	Ceiling time.Duration
}

// Learner puts the addresses DNS answers give for names that domainNames
// patterns match into the patterns' sets (compiler.DomainSetPrefix) of
// one nftables table, each with its record's TTL as its timeout, and
// commits before it returns: the queue lets the answer go on to the pod
// only then, so the pod's first connection to the address finds it.
type Learner struct {
	conn  *nftables.Conn
	table *nftables.Table
	opts  LearnerOptions
	now   func() time.Time

	mu       sync.Mutex
	patterns []learnPattern
	streams  map[[2]netip.AddrPort]*domain.Stream // DNS over TCP, by (server, client), until FIN or RST
	// expires is when each element (set, address) expires as last set:
	// a known one is deleted and added again to take its new timeout
	// (older kernels keep the old one on a plain add). Expired entries
	// are swept at sweepAt.
	expires map[element]time.Time
	sweepAt time.Time
}

type learnPattern struct {
	pattern domain.Pattern
	prefix  string
}

type element struct {
	set  string
	addr netip.Addr
}

// NewLearner writes to the inet table of the network namespace netnsFd
// (< 0: the current one).
func NewLearner(netnsFd int, table string, opts LearnerOptions) (*Learner, error) {
	if opts.Floor <= 0 {
		opts.Floor = compiler.DomainSetTimeout
	}
	var copts []nftables.ConnOption
	if netnsFd >= 0 {
		copts = append(copts, nftables.WithNetNSFd(netnsFd))
	}
	conn, err := nftables.New(append(copts, nftables.AsLasting())...)
	if err != nil {
		return nil, err
	}
	return &Learner{conn: conn, table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}, opts: opts,
		now: time.Now, streams: map[[2]netip.AddrPort]*domain.Stream{}, expires: map[element]time.Time{}}, nil
}

// SetPatterns says which domainNames patterns the table has sets for
// (the policy model's, canonical).
func (l *Learner) SetPatterns(patterns []string) error {
	var ps []learnPattern
	for _, s := range patterns {
		p, err := domain.ParsePattern(s)
		if err != nil {
			return err
		}
		ps = append(ps, learnPattern{pattern: p, prefix: compiler.DomainSetPrefix(p.String())})
	}
	l.mu.Lock()
	l.patterns = ps
	l.mu.Unlock()
	return nil
}

// Close releases the netlink socket.
func (l *Learner) Close() error { return l.conn.CloseLasting() }

// Learn reads the DNS messages a queued segment completes and commits
// what they teach. It returns what it added; an error means nothing of
// this segment was committed (the answer should still go on: DNS keeps
// working, the pod's connections to those addresses are not admitted).
func (l *Learner) Learn(s Segment) ([]domain.Learned, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msgs, err := l.messages(s)
	if err != nil {
		return nil, err
	}
	var learned []domain.Learned
	for _, m := range msgs {
		ls, err := domain.Learn(m)
		if err != nil {
			return nil, err
		}
		learned = append(learned, ls...)
	}
	return learned, l.commit(learned)
}

// messages are the whole DNS messages of the segment: a UDP datagram's
// payload, or what a TCP segment completes of its stream.
func (l *Learner) messages(s Segment) ([][]byte, error) {
	if !s.TCP {
		return [][]byte{s.Payload}, nil
	}
	key := [2]netip.AddrPort{s.Src, s.Dst}
	st := l.streams[key]
	if st == nil || s.SYN {
		st = &domain.Stream{}
		l.streams[key] = st
	}
	if s.SYN {
		st.Start(s.Seq)
		return nil, nil
	}
	msgs, err := st.Add(s.Seq, s.Payload)
	if err != nil || s.FIN {
		delete(l.streams, key)
	}
	return msgs, err
}

// commit adds every (pattern set, address) the answers teach, in one
// transaction: per set, one message of deletes (the known elements, so
// that the add sets their timeout anew) and one of adds.
func (l *Learner) commit(learned []domain.Learned) error {
	timeouts := map[element]time.Duration{} // an address twice in one answer: the longest
	bySet := map[string][]element{}
	var sets []string
	for _, ln := range learned {
		timeout := max(ln.TTL, l.opts.Floor)
		if l.opts.Ceiling > 0 {
			timeout = min(timeout, l.opts.Ceiling)
		}
		f := nft.FamilyOf(ln.Addr)
		for _, p := range l.patterns {
			if !p.pattern.Matches(ln.Name) {
				continue
			}
			el := element{p.prefix + f.Suffix, ln.Addr}
			if old, ok := timeouts[el]; ok {
				timeouts[el] = max(old, timeout)
				continue
			}
			timeouts[el] = timeout
			if bySet[el.set] == nil {
				sets = append(sets, el.set)
			}
			bySet[el.set] = append(bySet[el.set], el)
		}
	}
	if len(timeouts) == 0 {
		return nil
	}
	now := l.now()
	send := func(refresh bool) error {
		for _, name := range sets {
			// HasTimeout: the library sends an element's timeout only then.
			set := &nftables.Set{Table: l.table, Name: name, HasTimeout: true}
			var del, add []nftables.SetElement
			for _, el := range bySet[name] {
				key := nft.FamilyOf(el.addr).AddrBytes(el.addr)
				if exp, ok := l.expires[el]; refresh && ok && exp.After(now) {
					del = append(del, nftables.SetElement{Key: key})
				}
				add = append(add, nftables.SetElement{Key: key, Timeout: timeouts[el]})
			}
			if len(del) > 0 {
				if err := l.conn.SetDeleteElements(set, del); err != nil {
					return err
				}
			}
			if err := l.conn.SetAddElements(set, add); err != nil {
				return err
			}
		}
		return l.conn.Flush()
	}
	err := send(true)
	if errors.Is(err, unix.ENOENT) {
		// An element the map says is there expired meanwhile: plain adds.
		err = send(false)
	}
	if err != nil {
		return fmt.Errorf("adding %d learned addresses: %w", len(timeouts), err)
	}
	for el, timeout := range timeouts {
		l.expires[el] = now.Add(timeout)
	}
	if now.After(l.sweepAt) {
		// Expired entries go once a minute, not at every answer.
		for el, exp := range l.expires {
			if !exp.After(now) {
				delete(l.expires, el)
			}
		}
		l.sweepAt = now.Add(time.Minute)
	}
	return nil
}

// Handler is the queue handler that learns from each answer and then
// lets it go on (also when learning failed: DNS keeps working, and what
// was not committed admits nothing). onErr, if set, hears of failures.
func (l *Learner) Handler(onErr func(error)) Handler {
	return func(s Segment) bool {
		if _, err := l.Learn(s); err != nil && onErr != nil {
			onErr(err)
		}
		return true
	}
}
