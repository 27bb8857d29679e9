package dnssnoop

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
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
	// Floor is how long an address of a TTL-0 answer is kept (it is good
	// for the connection that follows it); any other TTL is kept as it
	// is. Default compiler.DomainSetTimeout.
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
	// known is each element (set, address) as last set: a known one is
	// deleted and added again to take its new timeout (older kernels keep
	// the old one on a plain add). Expired entries are swept at sweepAt.
	known   map[element]Entry
	sweepAt time.Time
	stats   LearnerStats
}

// Entry is one learned address of one pattern, as the agent shows it
// (/debug/dns, explain).
type Entry struct {
	Pattern string `json:"pattern"`
	// Name is the name asked for; "" for an address the Learner found in
	// the kernel's set when it started (adopt).
	Name    string     `json:"name"`
	Addr    netip.Addr `json:"address"`
	Learned time.Time  `json:"learned"`
	Expires time.Time  `json:"expires"`
}

// LearnerStats count what the Learner did.
type LearnerStats struct {
	Answers int64 `json:"answers"` // DNS messages read
	Learned int64 `json:"learned"` // (pattern set, address) elements added or refreshed
	Expired int64 `json:"expired"` // elements whose timeout ran out without a new answer
	Errors  int64 `json:"errors"`  // answers not committed (garbage, a failed transaction)
	Known   int64 `json:"known"`   // elements learned and not expired now
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
		now: time.Now, streams: map[[2]netip.AddrPort]*domain.Stream{}, known: map[element]Entry{}}, nil
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
	defer l.mu.Unlock()
	old := map[string]bool{}
	for _, p := range l.patterns {
		old[p.prefix] = true
	}
	l.patterns = ps
	for _, p := range ps {
		if !old[p.prefix] {
			l.adopt(p)
		}
	}
	return nil
}

// adopt makes what the kernel's sets of p hold known (a restarted agent's
// Learner, or a pattern the table had before): a later answer then sets
// their timeouts anew with a delete and an add, as for what it learned
// itself. Their names are not known. A set that is not there, or a dump
// that fails, adopts nothing: later answers then add plainly.
func (l *Learner) adopt(p learnPattern) {
	now := l.now()
	for _, f := range nft.Families {
		set, err := l.conn.GetSetByName(l.table, p.prefix+f.Suffix)
		if err != nil {
			continue
		}
		els, err := l.conn.GetSetElements(set)
		if err != nil {
			continue
		}
		for _, e := range els {
			a, ok := netip.AddrFromSlice(e.Key)
			if !ok || e.Expires <= 0 {
				continue
			}
			el := element{set.Name, a.Unmap()}
			if _, known := l.known[el]; !known {
				l.known[el] = Entry{Pattern: p.pattern.String(), Addr: el.addr, Expires: now.Add(e.Expires)}
			}
		}
	}
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
	learned, err := l.learn(s)
	if err == nil {
		err = l.commit(learned)
	}
	if err != nil {
		l.stats.Errors++
		return nil, err
	}
	return learned, nil
}

func (l *Learner) learn(s Segment) ([]domain.Learned, error) {
	msgs, err := l.messages(s)
	if err != nil {
		return nil, err
	}
	var learned []domain.Learned
	for _, m := range msgs {
		l.stats.Answers++
		ls, err := domain.Learn(m)
		if err != nil {
			return nil, err
		}
		learned = append(learned, ls...)
	}
	return learned, nil
}

// Entries are the addresses learned and not expired, by pattern, name and
// address.
func (l *Learner) Entries() []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(l.now())
	out := make([]Entry, 0, len(l.known))
	for _, e := range l.known {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Pattern, b.Pattern), cmp.Compare(a.Name, b.Name), a.Addr.Compare(b.Addr))
	})
	return out
}

// Stats are the counts so far.
func (l *Learner) Stats() LearnerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(l.now())
	st := l.stats
	st.Known = int64(len(l.known))
	return st
}

// sweep forgets the entries whose timeout ran out (the kernel removed
// their elements) and counts them.
func (l *Learner) sweep(now time.Time) {
	for el, e := range l.known {
		if !e.Expires.After(now) {
			delete(l.known, el)
			l.stats.Expired++
		}
	}
	l.sweepAt = now.Add(time.Minute)
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
	names := map[element]Entry{}
	bySet := map[string][]element{}
	var sets []string
	for _, ln := range learned {
		timeout := ln.TTL
		if timeout <= 0 {
			timeout = l.opts.Floor // TTL 0: good for the connection that follows
		}
		if l.opts.Ceiling > 0 {
			timeout = min(timeout, l.opts.Ceiling)
		}
		f := nft.FamilyOf(ln.Addr)
		for _, p := range l.patterns {
			if !p.pattern.Matches(ln.Name) {
				continue
			}
			el := element{p.prefix + f.Suffix, ln.Addr}
			names[el] = Entry{Pattern: p.pattern.String(), Name: ln.Name, Addr: ln.Addr}
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
				if e, ok := l.known[el]; refresh && ok && e.Expires.After(now) {
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
	if now.After(l.sweepAt) {
		// Expired entries go once a minute, not at every answer.
		l.sweep(now)
	}
	for el, timeout := range timeouts {
		e := names[el]
		e.Learned, e.Expires = now, now.Add(timeout)
		l.known[el] = e
	}
	l.stats.Learned += int64(len(timeouts))
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

// Learned is what a node learned (Learner.Entries, or the agent's
// /debug/dns), as the evaluator's domain oracle (eval.DomainOracle): an
// address admits a pattern's rules while its entry has not expired at
// Now.
type Learned struct {
	Entries []Entry
	Now     time.Time
}

// Learned reports whether addr is learned for pattern at l.Now, and from
// which name, when and until when.
func (l Learned) Learned(pattern string, addr netip.Addr) (bool, string) {
	for _, e := range l.Entries {
		if e.Pattern == pattern && e.Addr == addr.Unmap() && e.Expires.After(l.Now) {
			how := fmt.Sprintf("%s answered %s at %s", e.Name, e.Addr, e.Learned.UTC().Format(time.RFC3339))
			if e.Name == "" {
				how = fmt.Sprintf("an answer before the agent started taught %s", e.Addr)
			}
			return true, fmt.Sprintf("%s; it expires at %s (in %s) unless answered again",
				how, e.Expires.UTC().Format(time.RFC3339), e.Expires.Sub(l.Now).Round(time.Second))
		}
	}
	return false, ""
}
