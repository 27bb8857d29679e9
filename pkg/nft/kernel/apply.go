// Package kernel makes the kernel hold nft tables, over netlink: Diff
// plans the difference between two tables, and an Applier sends each plan
// as one atomic transaction carrying only that difference. The Applier
// keeps what it left in the kernel as its cache (each set's elements in
// an index, with what was last applied), so that a plan costs what
// changed, not the size of the table. Read reads a table back; Fake is an
// Applier over an in-memory kernel, for tests without root; DetectQueue
// finds the queue statement the kernel takes.
package kernel

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// SocketBuffer is the least netlink socket buffer size: the default
// (~208 KiB) is too small for a batch of 10k ranges (docs/nft-notes.md
// section 5). A batch must fit the send buffer whole, so a bigger one gets
// a connection with a buffer its size (as nft does).
const SocketBuffer = 4 << 20

// stageBytes bounds (on the wire, estimated from above) each transaction
// of a staged plan (Plan.stages): a table created with hundreds of
// thousands of elements is sent a few MiB at a time, so that its encoded
// messages and the socket's send buffer stay that size instead of the
// table's (BenchmarkApplyFresh).
const stageBytes = 2 << 20

// ErrClosed is returned by an Applier after Close.
var ErrClosed = errors.New("nft: applier closed")

// Table is one inet table in one network namespace, as the node
// programmer uses it: *Applier is the real one, NewFake an in-memory one
// for tests without root.
type Table interface {
	Apply(desired *nft.Table) (Stats, error)
	Plan(desired *nft.Table) (*Plan, error)
	Read() (*nft.Table, error)
	Verify() (bool, error)
	Counters() (map[string]nft.CounterValue, error)
	Delete() error
	Close() error
}

var _ Table = (*Applier)(nil)

// Applier makes one inet table in one network namespace match a desired
// nft.Table, one kernel transaction per Apply (see Apply for the exception).
// It is safe for concurrent use (calls are serialised).
type Applier struct {
	mu     sync.Mutex
	table  string
	nsFd   int // our own copy of the namespace fd, -1 for the current one
	conn   *nftables.Conn
	buf    int // the connection's socket buffer size
	closed bool
	// cache is what the last successful Apply left in the kernel; nil means
	// unknown, and the next Apply reads the kernel first.
	cache *state
	// gen is the namespace's nftables generation when the cache was last
	// known to be the kernel's table; genKnown is false when some other
	// commit may have come in between (Verify then reads back).
	gen      uint32
	genKnown bool
	nl       *netlink.Conn // for the generation; opened on first use
	// wireConn sends element-only transactions (elementWire), with
	// socket buffers of wireBuf bytes; opened on first use.
	wireConn *netlink.Conn
	wireBuf  int
	wire     elementWire
	// mem, in a Fake, stands in for the kernel.
	mem *memKernel
	// stageBytes bounds a staged transaction (0: the stageBytes const).
	stageBytes int
	// oneTransaction sends a plan for a table packets reach whole, not
	// in phases (BenchmarkNewSetLookups compares).
	oneTransaction bool
}

// NewApplier returns an Applier for the inet table in the network namespace
// netnsFd (< 0: the current namespace). The fd is duplicated; the caller
// may close its own.
func NewApplier(netnsFd int, table string) (*Applier, error) {
	if table == "" {
		return nil, errors.New("nft: empty table name")
	}
	fd, err := DupNetNS(netnsFd)
	if err != nil {
		return nil, err
	}
	a := &Applier{table: table, nsFd: fd}
	if err := a.ensureConn(); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// Apply makes the kernel table match desired and returns what changed. It
// diffs against what the last successful Apply left (or, on first use and
// after a failure, against the kernel's table read back), sends nothing
// when nothing differs, and otherwise sends the plan's change as one
// transaction (what it adds goes in one before it, which nothing reads
// yet, and the maps and chains it deletes in one after it:
// Plan.inPhases). The kernel rejects a bad transaction as a whole, so on
// error what it enforces is unchanged (a change that fails deletes what
// the transaction before it added: Plan.undo), or is the change whole when
// only the deletions after it failed (what they did not delete is left,
// unread, for the next Apply); the cache is dropped either way.
//
// The exception is a large plan for a table that no packet reaches yet
// (absent, or without base chains): it goes in bounded stages, base
// chains last (see Plan.stages). A failure part way leaves a table that
// still no packet reaches, and the next Apply reads it back and completes
// it.
//
// Rules carry their ID as comment. desired.Name, if set, must be the
// Applier's table.
func (a *Applier) Apply(desired *nft.Table) (Stats, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if desired == nil {
		desired = nft.NewTable(a.table)
	}
	plan, err := a.plan(desired)
	if err != nil {
		a.cache = nil
		return Stats{}, err
	}
	if !plan.Empty() {
		// The generation moves by exactly one for our commit; anything
		// else means another commit came in between, which Verify
		// must not take for ours.
		before, berr := a.generation()
		n, err := a.transact(plan)
		if err != nil {
			a.cache = nil
			a.genKnown = false
			return Stats{}, err
		}
		after, aerr := a.generation()
		a.genKnown = a.genKnown && berr == nil && aerr == nil && before == a.gen && after == before+uint32(n)
		a.gen = after
		plan.Stats.Transactions = n
	}
	a.commit(plan, desired)
	return plan.Stats, nil
}

// Verify checks cheaply (one netlink round trip for the namespace's
// nftables generation, which every committed transaction increments)
// whether the table may have changed since this Applier last knew it. If
// it may have, Verify drops the cache, so that the next Apply reads the
// kernel back and repairs whatever differs, and returns true. A commit to
// another table of the namespace counts too: the generation is per
// namespace, so a false alarm costs one read-back, never a wrong table.
func (a *Applier) Verify() (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false, ErrClosed
	}
	if a.cache == nil {
		return true, nil
	}
	gen, err := a.generation()
	if err == nil && a.genKnown && gen == a.gen {
		return false, nil
	}
	a.cache = nil
	a.genKnown = false
	return true, err
}

// Counters reads the table's named counters (Counters). It does not wait
// for an Apply in progress; it must not be called after Close. The fake
// kernel counts nothing: its counters read zero.
func (a *Applier) Counters() (map[string]nft.CounterValue, error) {
	if a.mem != nil {
		t := a.mem.read()
		out := map[string]nft.CounterValue{}
		if t != nil {
			for name := range t.Counters {
				out[name] = nft.CounterValue{}
			}
		}
		return out, nil
	}
	return Counters(a.nsFd, a.table)
}

// generation is the namespace's nftables ruleset generation.
func (a *Applier) generation() (uint32, error) {
	if a.mem != nil {
		return a.mem.generation(), nil
	}
	if a.nl == nil {
		nl, err := DialNetfilter(a.nsFd)
		if err != nil {
			return 0, err
		}
		a.nl = nl
	}
	gen, err := readGeneration(a.nl)
	if err != nil {
		a.nl.Close()
		a.nl = nil
	}
	return gen, err
}

// readKernel reads the table back as the cache, nil if absent: each set's
// elements in its index only (see readTable).
func (a *Applier) readKernel() (*state, error) {
	if a.mem != nil {
		st := stateOf(a.mem.read())
		if st == nil {
			return nil, nil
		}
		for _, cs := range st.sets {
			cs.index = newSetIndex(cs.set)
			cs.set.Elements = nil // the index holds them
		}
		return st, nil
	}
	if err := a.ensureConn(); err != nil {
		return nil, err
	}
	return readTable(a.conn, a.nsFd, a.table, true)
}

// transact sends the plan, staged if it is a large one for a table no
// packet reaches (Plan.stages), and returns how many transactions were
// committed.
func (a *Applier) transact(p *Plan) (int, error) {
	limit := a.stageBytes
	if limit == 0 {
		limit = stageBytes
	}
	stages := p.stages(limit)
	if a.oneTransaction && !p.unhooked {
		stages = []*Plan{p}
	}
	// The stages share one wire buffer; it goes with the call.
	defer func() { a.wire = elementWire{seq: a.wire.seq} }()
	for i, stage := range stages {
		if err := a.exec(stage); err != nil {
			switch {
			case len(stages) > 1 && p.unhooked:
				err = fmt.Errorf("stage %d of %d (the table has no base chain yet: nothing enforced changed): %w", i+1, len(stages), err)
			case stage.undo != nil:
				// The table as it was: what the first transaction added
				// goes again (nothing read it).
				if uerr := a.exec(stage.undo); uerr != nil {
					err = fmt.Errorf("%s (nothing enforced changed; the sets, maps and chains added for it are left, unread, for the next apply: %v): %w", stage.phase, uerr, err)
				} else {
					err = fmt.Errorf("%s (nothing enforced changed; the sets, maps and chains added for it were deleted again): %w", stage.phase, err)
					i++
				}
			case stage.phase != "":
				err = fmt.Errorf("%s: %w", stage.phase, err)
			}
			return i, err
		}
	}
	return len(stages), nil
}

// exec sends one transaction (to the in-memory kernel of a Fake).
func (a *Applier) exec(p *Plan) error {
	if a.mem != nil {
		return a.mem.exec(p)
	}
	return a.send(p)
}

// Plan returns what Apply(desired) would send now, without sending it.
func (a *Applier) Plan(desired *nft.Table) (*Plan, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if desired == nil {
		desired = nft.NewTable(a.table)
	}
	return a.plan(desired)
}

func (a *Applier) plan(desired *nft.Table) (*Plan, error) {
	if a.closed {
		return nil, ErrClosed
	}
	if desired.Name != "" && desired.Name != a.table {
		return nil, fmt.Errorf("nft: desired table %q, applier manages %q", desired.Name, a.table)
	}
	current := a.cache
	if current == nil {
		// The read is the kernel's table as of the generation before it
		// if the generation did not move meanwhile.
		before, berr := a.generation()
		cur, err := a.readKernel()
		if err != nil {
			return nil, err
		}
		after, aerr := a.generation()
		a.gen, a.genKnown = after, berr == nil && aerr == nil && before == after
		// The kernel state is the cache from now on; a nil (absent)
		// table makes the plan add it.
		if cur != nil {
			a.cache = cur
		}
		current = cur
	}
	named := *desired
	named.Name = a.table
	p := diff(current, &named)
	if err := validate(desired, p); err != nil {
		return nil, fmt.Errorf("table %s: %w", a.table, err)
	}
	return p, nil
}

// Read returns the kernel's table as it is now, nil if absent. Chains have
// their base Hook and rules that carry only an ID (their comment; Text and
// ID-less Exprs aside); sets have their spec and canonical Elements.
func (a *Applier) Read() (*nft.Table, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if a.mem != nil {
		return a.mem.read(), nil
	}
	if err := a.ensureConn(); err != nil {
		return nil, err
	}
	st, err := readTable(a.conn, a.nsFd, a.table, false)
	return st.table(), err
}

// Delete removes the table if it is there.
func (a *Applier) Delete() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cache = nil
	a.genKnown = false
	if a.mem != nil {
		if a.closed {
			return ErrClosed
		}
		a.mem.deleteTable()
		return nil
	}
	if err := a.ensureConn(); err != nil {
		return err
	}
	a.conn.DelTable(&nftables.Table{Name: a.table, Family: nftables.TableFamilyINet})
	if err := a.conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete table %s: %w", a.table, err)
	}
	return nil
}

// Close releases the netlink socket and the namespace fd.
func (a *Applier) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	var err error
	if a.conn != nil {
		err = a.conn.CloseLasting()
		a.conn = nil
	}
	if a.nl != nil {
		a.nl.Close()
		a.nl = nil
	}
	a.closeWire()
	if a.nsFd >= 0 {
		if cerr := unix.Close(a.nsFd); err == nil {
			err = cerr
		}
		a.nsFd = -1
	}
	return err
}

func (a *Applier) ensureConn() error {
	if a.closed {
		return ErrClosed
	}
	if a.conn != nil {
		return nil
	}
	if a.buf < SocketBuffer {
		a.buf = SocketBuffer
	}
	conn, err := newConnBuf(a.nsFd, true, a.buf)
	if err != nil {
		return fmt.Errorf("nft: netlink connection: %w", err)
	}
	a.conn = conn
	return nil
}

// fitBuffer makes sure the connection's send buffer holds a batch of size
// bytes (planBytes) twice, reconnecting with a bigger one if not.
func (a *Applier) fitBuffer(size int) {
	need := 2 * size
	if need <= a.buf {
		return
	}
	if a.conn != nil {
		a.conn.CloseLasting()
		a.conn = nil
	}
	a.buf = need
}

// planBytes estimates (from above) the netlink encoding of a plan.
func planBytes(p *Plan) int {
	n := 0
	for _, op := range p.Ops {
		n += opBytes(op)
	}
	return n
}

// opBytes estimates (from above) the netlink encoding of one operation.
func opBytes(op Op) int {
	switch op.Kind {
	case OpAddElements, OpDeleteElements:
		n := 256
		for _, e := range op.Elements {
			n += elementBytes(op.Set, e)
		}
		return n
	case OpAddRule:
		return 512 + 64*len(op.Rule.Exprs)
	}
	return 512
}

// send queues the plan and flushes it as one batch.
func (a *Applier) send(p *Plan) error {
	size := planBytes(p)
	a.fitBuffer(size)
	if p.elementsOnly() {
		return a.sendElements(p, size)
	}
	if err := a.ensureConn(); err != nil {
		return err
	}
	if err := queue(a.conn, a.table, p); err != nil {
		// Drop the half-queued batch with its socket.
		a.conn.CloseLasting()
		a.conn = nil
		return fmt.Errorf("table %s: %w", a.table, err)
	}
	if err := a.conn.Flush(); err != nil {
		// A fresh socket for the next call: no stale acks can be left.
		a.conn.CloseLasting()
		a.conn = nil
		return fmt.Errorf("table %s: transaction of %d messages failed: %w", a.table, len(p.Ops), err)
	}
	return nil
}

// sendElements sends an element-only plan, of size bytes at most
// (planBytes), as one batch it encodes itself (elementWire).
func (a *Applier) sendElements(p *Plan, size int) error {
	a.wire.reserve(size)
	if err := a.wire.encode(a.table, p); err != nil {
		return fmt.Errorf("table %s: %w", a.table, err)
	}
	if err := a.ensureWire(); err != nil {
		return err
	}
	if err := a.wire.send(a.wireConn); err != nil {
		// A fresh socket for the next call: no stale acks can be left.
		a.closeWire()
		return fmt.Errorf("table %s: transaction of %d messages failed: %w", a.table, len(p.Ops), err)
	}
	return nil
}

// ensureWire opens the element socket, again if fitBuffer grew the buffer
// since.
func (a *Applier) ensureWire() error {
	if a.wireConn != nil && a.wireBuf >= a.buf {
		return nil
	}
	a.closeWire()
	nl, err := DialNetfilter(a.nsFd)
	if err != nil {
		return err
	}
	// An error echoes the refused message whole: the receive buffer holds
	// that, as it is twice the batch (fitBuffer). (Capped acks would be
	// smaller, but the netlink library cannot read them with the extended
	// acks that name what was refused.)
	if err := nl.SetOption(netlink.ExtendedAcknowledge, true); err != nil {
		nl.Close()
		return fmt.Errorf("nft: netlink connection: %w", err)
	}
	if err := SetBuffers(nl, a.buf); err != nil {
		nl.Close()
		return fmt.Errorf("nft: netlink connection: %w", err)
	}
	a.wireConn, a.wireBuf = nl, a.buf
	return nil
}

func (a *Applier) closeWire() {
	if a.wireConn != nil {
		a.wireConn.Close()
		a.wireConn = nil
	}
}

// setIDs numbers the sets added in batches (see queue).
var setIDs atomic.Uint32

// queue puts the plan's operations into the connection's batch.
func queue(conn *nftables.Conn, table string, p *Plan) error {
	kt := &nftables.Table{Name: table, Family: nftables.TableFamilyINet}
	added := map[string]*nftables.Set{} // sets created in this batch
	var enc elementEncoder
	kset := func(s *nft.Set) *nftables.Set {
		if ks := added[s.Name]; ks != nil {
			return ks
		}
		return &nftables.Set{Table: kt, Name: s.Name} // found by name
	}
	for _, op := range p.Ops {
		switch op.Kind {
		case OpAddTable:
			conn.AddTable(kt)
		case OpAddChain:
			conn.AddChain(kernelChain(kt, op.Chain))
		case OpFlushChain:
			conn.FlushChain(&nftables.Chain{Name: op.Chain.Name, Table: kt})
		case OpDeleteChain:
			conn.DelChain(&nftables.Chain{Name: op.Chain.Name, Table: kt})
		case OpAddRule:
			conn.AddRule(&nftables.Rule{
				Table:    kt,
				Chain:    &nftables.Chain{Name: op.Chain.Name, Table: kt},
				Exprs:    op.Rule.Exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, op.Rule.ID()),
			})
		case OpAddSet:
			ks := kernelSet(kt, op.Set)
			// Our own ID: google/nftables numbers sets from an
			// unsynchronised package counter, which two Appliers
			// (the policy and NAT tables, synced concurrently) would
			// race on. An ID only names a set within its batch.
			ks.ID = setIDs.Add(1)
			if err := conn.AddSet(ks, nil); err != nil {
				return fmt.Errorf("add set %s: %w", op.Set.Name, err)
			}
			added[op.Set.Name] = ks
		case OpDeleteSet:
			conn.DelSet(&nftables.Set{Table: kt, Name: op.Set.Name})
			delete(added, op.Set.Name)
		case OpAddCounter:
			conn.AddObj(&nftables.NamedObj{Table: kt, Name: op.Counter.Name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
		case OpDeleteCounter:
			conn.DeleteObject(&nftables.NamedObj{Table: kt, Name: op.Counter.Name, Type: nftables.ObjTypeCounter})
		case OpAddElements:
			if err := conn.SetAddElements(kset(op.Set), enc.encode(op.Set, op.Elements, false)); err != nil {
				return fmt.Errorf("add elements to set %s: %w", op.Set.Name, err)
			}
		case OpDeleteElements:
			if err := conn.SetDeleteElements(kset(op.Set), enc.encode(op.Set, op.Elements, true)); err != nil {
				return fmt.Errorf("delete elements of set %s: %w", op.Set.Name, err)
			}
		default:
			return fmt.Errorf("unknown plan operation %d", op.Kind)
		}
	}
	return nil
}

// commit makes the cache what the kernel holds after the plan: the cached
// sets' indexes are updated by the plan's element operations (no copy of
// unchanged elements), new or recreated sets and changed chains are copied
// from desired.
func (a *Applier) commit(p *Plan, desired *nft.Table) {
	if a.cache == nil {
		a.cache = snapshot(desired, a.table, p.indexes)
		for name, cs := range a.cache.sets {
			cs.fingerprint, cs.revision = p.fingerprints[name], p.revisions[name]
		}
		return
	}
	fresh := map[string]bool{} // sets and chains (re)created or rewritten
	for _, op := range p.Ops {
		switch {
		case op.Kind == OpAddSet:
			fresh["set "+op.Set.Name] = true
		case op.Chain != nil:
			fresh["chain "+op.Chain.Name] = true
		}
	}
	buf := make([]byte, 0, 256)
	for _, op := range p.Ops {
		if op.Kind != OpAddElements && op.Kind != OpDeleteElements || fresh["set "+op.Set.Name] {
			continue
		}
		cs := a.cache.sets[op.Set.Name]
		for _, e := range op.Elements {
			if op.Kind == OpAddElements {
				buf = cs.index.insert(e, buf)
			} else {
				buf = cs.index.remove(e, buf)
			}
		}
	}
	next := &state{name: a.table, chains: make(map[string]*nft.Chain, len(desired.Chains)),
		sets: make(map[string]*cachedSet, len(desired.Sets)), counters: maps.Clone(desired.Counters)}
	for name, ds := range desired.Sets {
		cs := a.cache.sets[name]
		if cs == nil || cs.index == nil || fresh["set "+name] {
			cs = snapshotSet(ds, p.indexes[name])
		}
		cs.fingerprint, cs.revision = p.fingerprints[name], p.revisions[name]
		next.sets[name] = cs
	}
	for name, dc := range desired.Chains {
		if cc := a.cache.chains[name]; cc != nil && !fresh["chain "+name] {
			next.chains[name] = cc
		} else {
			next.chains[name] = snapshotChain(dc)
		}
	}
	a.cache = next
}

// snapshot copies the desired table as the cache: its own chains and sets,
// each set's elements in its index only.
// indexes are those the plan made of its added sets.
func snapshot(t *nft.Table, name string, indexes map[string]*setIndex) *state {
	c := &state{name: name, chains: make(map[string]*nft.Chain, len(t.Chains)), sets: make(map[string]*cachedSet, len(t.Sets)),
		counters: maps.Clone(t.Counters)}
	for n, ch := range t.Chains {
		c.chains[n] = snapshotChain(ch)
	}
	for n, s := range t.Sets {
		c.sets[n] = snapshotSet(s, indexes[n])
	}
	return c
}

// snapshotChain keeps the hook and the rule IDs, all a diff needs.
func snapshotChain(ch *nft.Chain) *nft.Chain {
	cc := &nft.Chain{Name: ch.Name, Rules: make([]*nft.Rule, len(ch.Rules))}
	if ch.Base != nil {
		h := *ch.Base
		cc.Base = &h
	}
	for i, r := range ch.Rules {
		cc.Rules[i] = nft.RuleWithID(r.ID(), nil)
	}
	return cc
}

// snapshotSet copies the spec and indexes the elements in canonical form.
func snapshotSet(s *nft.Set, idx *setIndex) *cachedSet {
	if idx == nil {
		idx = newSetIndex(s)
	}
	return &cachedSet{set: heldSpec(s), index: idx}
}

// NewConn opens a library connection in the namespace fd (< 0: current)
// with big socket buffers.
func NewConn(nsFd int, lasting bool) (*nftables.Conn, error) {
	return newConnBuf(nsFd, lasting, SocketBuffer)
}

// newConnBuf is NewConn with socket buffers of size bytes.
func newConnBuf(nsFd int, lasting bool, size int) (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(func(c *netlink.Conn) error { return SetBuffers(c, size) })}
	if lasting {
		opts = append(opts, nftables.AsLasting())
	}
	if nsFd >= 0 {
		opts = append(opts, nftables.WithNetNSFd(nsFd))
	}
	return nftables.New(opts...)
}

// DialNetfilter opens a netfilter netlink socket in the namespace fd (< 0:
// current).
func DialNetfilter(nsFd int) (*netlink.Conn, error) {
	cfg := &netlink.Config{}
	if nsFd >= 0 {
		cfg.NetNS = nsFd
	}
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("nft: netlink connection: %w", err)
	}
	return nl, nil
}

// SetBuffers sets the socket buffers; as root it goes past the
// net.core.[rw]mem_max cap, which is only 208 KiB on a default kernel.
func SetBuffers(c *netlink.Conn, size int) error {
	if err := c.SetWriteBuffer(size); err != nil {
		return err
	}
	if err := c.SetReadBuffer(size); err != nil {
		return err
	}
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			// Fails without CAP_NET_ADMIN; the capped size stays.
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size)
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
		})
	}
	return nil
}

// DupNetNS duplicates a namespace fd to one >= 3 (the netlink library takes
// fd 0 for "current namespace"); -1 stays -1.
func DupNetNS(fd int) (int, error) {
	if fd < 0 {
		return -1, nil
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return -1, fmt.Errorf("nft: duplicate netns fd %d: %w", fd, err)
	}
	return dup, nil
}
