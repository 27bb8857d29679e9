// Package node programs one node's kernel from a cluster snapshot: the
// policy table (the compiler's ruleset for the node, applied as the
// difference from what the kernel holds) and the Service NAT table
// (proxier.Proxier). The agent runs one Programmer; the lab's
// conformance.Enforcer runs one per lab node, so the lab's kernel tests run
// the agent's own code. Each table succeeds or fails on its own, so that a
// caller can retry one without holding back the other.
package node

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/proxy/proxier"
)

// Options configure a Programmer.
type Options struct {
	Node string
	// NetNS is the network namespace to program; <= 0 (netns.None())
	// means the caller's. The Programmer keeps its own copies.
	NetNS netns.NsHandle
	// Table is the policy table (default compiler.DefaultTable).
	Table string
	// NoProxy leaves Services alone: no NAT table.
	NoProxy bool
	// ProxyTable is the NAT table (default proxy.DefaultTable).
	ProxyTable string
	// Build tunes the service model (NodePort addresses, cluster CIDRs).
	Build proxy.Options
	// HealthChecks serves the eTP Local health-check node ports.
	HealthChecks bool
	// AgentPorts protects the agent's own ports in the policy table.
	AgentPorts *compiler.AgentPorts
	// Layout is the policy table's layout.
	Layout compiler.Layout
	// DNS, when set, enforces domainNames rules by learning from the
	// cluster DNS's answers (dns.go). Only New takes it (it needs the
	// kernel's queue).
	DNS *DNSOptions
	// Strict ends the open flows that a policy change the kernel took
	// denies (strict.go); the agent and the lab turn it on by default.
	// StrictInterval is the least time between two of its checks: a
	// change sooner is checked when the interval ends (StrictDue,
	// EndDeniedFlows); 0 checks after every change.
	Strict         bool
	StrictInterval time.Duration
	// Audit, when set, writes the connections policy decides to the
	// verdict log (audit.go). Only New takes it (it reads the kernel's
	// NFLOG group).
	Audit *AuditOptions
	// RuleCounters counts each policy rule's decisions in the kernel
	// (RuleCounts; the identity layout only).
	RuleCounters bool
	Logger       *slog.Logger
}

// Tables is a set of the node's tables.
type Tables uint8

const (
	Policy Tables = 1 << iota
	Services
	All = Policy | Services
)

func (t Tables) String() string {
	switch t {
	case Policy:
		return "policy"
	case Services:
		return "services"
	case All:
		return "policy+services"
	}
	return "none"
}

// incrementalTable is the compiler's incremental table of either layout
// (compiler.Incremental, compiler.IdentityIncremental).
type incrementalTable interface {
	Table() *nft.Table
	Snapshot() *nft.Table
	Update(compiler.Changes) (*nft.Table, error)
	Rebase(compiler.Changes, *policy.Model, []*corev1.Node) (*nft.Table, error)
	SelectsLocal(policy.Subject) bool
	SetDNSServers([]netip.AddrPort) (*nft.Table, error)
	DNSServers() []netip.AddrPort
}

// Programmer keeps one node's tables in step with the cluster. Its
// methods are not safe for concurrent use.
type Programmer struct {
	// NoConntrackCleanup turns off the deletion of stale UDP conntrack
	// entries (the agent never sets it; tests do, to show what it does).
	NoConntrackCleanup bool

	opts   Options
	policy kernel.Table
	// live is the policy table of the last full compile, kept up to
	// date by SyncPolicyChanges; applied says the kernel took its last change.
	live    incrementalTable
	applied bool
	// identities is the identity layout's numbering, kept from sync to
	// sync so that an event changes the elements it is about.
	identities compiler.Identities
	proxy      *proxier.Proxier // nil with NoProxy
	// dns learns domainNames addresses (nil: not asked, or dnsErr says
	// why not).
	dns    *dnsSnooper
	dnsErr error
	// audit reads the verdict log (nil without Options.Audit);
	// attributions are the applied table's, by log prefix.
	audit        *audit.Reader
	auditErr     error
	auditNS      int // a copy of the namespace's descriptor (-1: the current one)
	decisions    decisionCounts
	attributions atomic.Pointer[map[string]nft.Attribution]
	lastAttr     map[string]nft.Attribution
	// counterOf says what each per-rule counter of the table last
	// compiled counts (RuleCounts).
	counterOf atomic.Pointer[map[string]nft.CounterOf]
	// strict holds strict mode's sockets (nil without Options.Strict);
	// strictPending says a change the kernel took was not checked yet,
	// strictLast when the last check ran.
	strict        *strictMode
	strictPending bool
	strictLast    time.Time
}

// New opens the node's tables in opts.NetNS; nothing is sent yet.
func New(opts Options) (*Programmer, error) {
	fd := -1
	if opts.NetNS > 0 {
		fd = int(opts.NetNS)
	}
	opts.defaults()
	a, err := kernel.NewApplier(fd, opts.Table)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", opts.Node, err)
	}
	p, err := newProgrammer(opts, a, nil)
	if err != nil {
		return nil, err
	}
	if opts.Audit != nil {
		if err := p.startAudit(fd); err != nil {
			// The node is policed as ever; its rules' copies go unread.
			p.auditErr = err
			opts.Logger.Error("the verdict log is not read", "err", err)
		}
	}
	if opts.DNS == nil {
		return p, nil
	}
	if err := p.startDNS(fd, *opts.DNS); err != nil {
		// The node is still policed; its domainNames rules admit nothing.
		p.dnsErr = err
		opts.Logger.Error("domainNames: not learning", "err", err)
	}
	return p, nil
}

// NewWith is New with the kernel tables given (kernel.Fake in tests); nat
// is unused with NoProxy. The Programmer owns them from now on.
func NewWith(opts Options, policyTable, nat kernel.Table) (*Programmer, error) {
	opts.defaults()
	return newProgrammer(opts, policyTable, nat)
}

func newProgrammer(opts Options, policyTable, nat kernel.Table) (*Programmer, error) {
	if opts.Audit != nil && opts.Layout != compiler.LayoutIdentities {
		policyTable.Close()
		return nil, fmt.Errorf("node %s: the verdict log needs the identity layout (--layout identities)", opts.Node)
	}
	if opts.RuleCounters && opts.Layout != compiler.LayoutIdentities {
		policyTable.Close()
		return nil, fmt.Errorf("node %s: per-rule counters need the identity layout (--layout identities)", opts.Node)
	}
	opts.DNS = nil // New starts the DNS side (startDNS)
	p := &Programmer{opts: opts, policy: policyTable}
	var err error
	if opts.Strict {
		if p.strict, err = openStrictMode(opts.NetNS); err != nil {
			policyTable.Close()
			return nil, fmt.Errorf("node %s: %w", opts.Node, err)
		}
	}
	if opts.NoProxy {
		return p, nil
	}
	p.proxy, err = proxier.New(proxier.Options{Node: opts.Node, NetNS: opts.NetNS, Build: opts.Build, Table: opts.ProxyTable,
		HealthChecks: opts.HealthChecks, Logger: opts.Logger, Kernel: nat})
	if err != nil {
		policyTable.Close()
		p.strict.close()
		return nil, fmt.Errorf("node %s: %w", opts.Node, err)
	}
	return p, nil
}

func (o *Options) defaults() {
	if o.Table == "" {
		o.Table = compiler.DefaultTable
	}
	if o.ProxyTable == "" {
		o.ProxyTable = proxy.DefaultTable
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Input is what a sync starts from: the snapshot, its policy model and the
// evaluator's resolution of it (each built from the one before when not
// given: the agent gives the model, from its policy.Cache). One Input
// serves every node.
type Input struct {
	Snapshot *cluster.Snapshot
	Model    *policy.Model
	Resolved *eval.Resolved
	// CheckIncremental compares the incremental table (SyncPolicyChanges's) with
	// the full compile before replacing it (PolicyResult.IncrementalDiffers).
	CheckIncremental bool
	// Pods, when set, are the pods the resolution reads instead of
	// Snapshot.Pods: a sequence in (namespace, name) order whose pods
	// may be made for their step alone (eval.NewFromPods; the agent's
	// 100,000 thin pods of 1,240 bytes were the largest part of its first
	// sync's memory).
	Pods iter.Seq[*corev1.Pod]
	// PodCount is how many pods Pods yields, about (0: unknown): the
	// resolution's index is sized once.
	PodCount int
	// EndpointSlices, when not nil, are the snapshot's EndpointSlices
	// parsed for this node (proxy.ParseSlice), read in place of
	// Snapshot.EndpointSlices: the agent's informer stores them so.
	EndpointSlices []*proxy.Slice
}

// Prepare builds the policy model and the resolution of snap.
func Prepare(snap *cluster.Snapshot) *Input {
	in := &Input{Snapshot: snap}
	in.prepare()
	return in
}

func (in *Input) prepare() {
	if in.Resolved == nil {
		if in.Model == nil {
			in.Model = policy.Build(in.Snapshot)
		}
		if in.Pods != nil {
			in.Resolved = eval.NewFromPods(in.Snapshot, in.Model, in.Pods, in.PodCount).Resolved()
		} else {
			in.Resolved = eval.New(in.Snapshot, in.Model).Resolved()
		}
	}
}

// Result is what one Sync did, table by table.
type Result struct {
	Policy   PolicyResult
	Services ServicesResult
}

// PolicyResult is the policy table's share of a sync.
type PolicyResult struct {
	Ran bool // the table was asked for
	// Table is the compiled table (also when applying it failed); the
	// next SyncPolicyChanges changes it (PolicyTable is a lasting copy).
	Table  *nft.Table
	Stats  kernel.Stats
	Counts nft.Counts
	// Incremental: the table came from SyncPolicyChanges, not a full compile.
	Incremental bool
	// IncrementalDiffers: with Input.CheckIncremental, the incremental table differed
	// from the full compile (a bug; the full table is what was applied).
	IncrementalDiffers bool
	// Err means the kernel kept its previous table.
	Err error
	// Strict is what strict mode ended after the kernel took the table.
	Strict StrictResult
}

// ServicesResult is the NAT table's share of a sync; Result.Failures
// happened after the commit (conntrack cleanup, health checks).
type ServicesResult struct {
	Ran bool
	proxier.Result
	// Err means the kernel kept its previous table.
	Err error
}

// Err joins the tables' errors.
func (r Result) Err() error { return errors.Join(r.Policy.Err, r.Services.Err) }

// Failed lists the tables whose sync failed.
func (r Result) Failed() Tables {
	var t Tables
	if r.Policy.Err != nil {
		t |= Policy
	}
	if r.Services.Err != nil {
		t |= Services
	}
	return t
}

// Sync programs the chosen tables from in; the NAT table is skipped with
// NoProxy. A table's failure does not keep the other from being synced.
// The NAT table is synced once the policy table is sent (the tables share
// nothing but the snapshot, which neither changes); the policy model and
// resolution are built here when in lacks them (Input.Model is set
// afterwards; a resolution built here is dropped once compiled).
func (p *Programmer) Sync(in *Input, tables Tables) Result {
	var res Result
	var services sync.WaitGroup
	syncServices := func() {
		if tables&Services == 0 || p.proxy == nil {
			return
		}
		services.Go(func() {
			r := &res.Services
			r.Ran = true
			p.proxy.NoConntrackCleanup = p.NoConntrackCleanup
			r.Result, r.Err = p.proxy.Sync(in.Snapshot, in.EndpointSlices)
			if r.Err != nil {
				r.Err = fmt.Errorf("node %s: services: %w", p.opts.Node, r.Err)
			}
		})
	}
	if tables&Policy != 0 {
		built := in.Resolved == nil
		r := &res.Policy
		r.Ran = true
		opts := compiler.Options{Node: p.opts.Node, Table: p.opts.Table, AgentPorts: p.opts.AgentPorts, DNS: p.compilerDNS(in), Audit: p.compilerAudit(),
			RuleCounters: p.opts.RuleCounters}
		var live incrementalTable
		var err error
		if p.opts.Layout == compiler.LayoutIdentities && p.live == nil && p.identities.Empty() {
			// The first sync (a restart): number as the table the kernel
			// holds does, so that it sends only what changed meanwhile.
			if held, err := p.policy.Read(); err == nil && held != nil {
				opts.Adopt = held
			}
		}
		switch {
		case p.opts.Layout == compiler.LayoutIdentities && in.Resolved == nil && in.Pods != nil:
			// One pod of each identity resolved, not every pod.
			if in.Model == nil {
				in.Model = policy.Build(in.Snapshot)
			}
			opts.Identities, opts.Staged = &p.identities, in.Model.Staged
			live, err = compiler.NewIdentityIncrementalFromPods(in.Snapshot, in.Model, in.Pods, in.PodCount, opts)
		case p.opts.Layout == compiler.LayoutIdentities:
			in.prepare()
			opts.Identities = &p.identities
			if in.Model != nil {
				opts.Staged = in.Model.Staged
			}
			live, err = compiler.NewIdentityIncremental(in.Resolved, opts)
		default:
			in.prepare()
			live, err = compiler.NewIncremental(in.Resolved, opts)
		}
		if built {
			// A resolution made here serves this sync only; the apply
			// does not need it, and it holds every pod.
			in.Resolved = nil
		}
		if err == nil && live != nil {
			r.Table = live.Table()
			if in.CheckIncremental && p.live != nil {
				r.IncrementalDiffers = !kernel.Diff(p.live.Table(), r.Table).Empty()
			}
			p.live = live
			p.noteAttributions(r.Table) // before the kernel logs with them
			p.noteCounters(r.Table)
		}
		p.applyPolicy(r, err)
		if r.Err == nil {
			r.Err = p.learnPatterns(in.Model, r.Table)
		}
		// The NAT table is built after the policy table's send, not
		// beside it: a first sync's memory peaked where the NAT build
		// met the send's netlink messages (about 30 MB at 100,000
		// realistic pods; docs/history/benchmarks-journal.md), and the
		// policy compile's garbage is unreachable by then.
		syncServices()
	} else {
		syncServices()
		// An EndpointSlice change may move the cluster DNS.
		if tables&Services != 0 {
			if err := p.syncDNSServers(in); err != nil {
				services.Wait()
				res.Services.Err = errors.Join(res.Services.Err, err)
				return res
			}
		}
	}
	services.Wait()
	return res
}

// updatePolicy programs the policy table from the last one and the
// changes since (compiler.Incremental), without a snapshot. A
// compiler.NeedsFullError (in PolicyResult.Err) means nothing was done:
// the caller syncs in full.
func (p *Programmer) updatePolicy(ch compiler.Changes) PolicyResult {
	r := PolicyResult{Ran: true, Incremental: true}
	if p.live == nil {
		r.Err = &compiler.NeedsFullError{Reason: "no full compile yet"}
		return r
	}
	t, err := p.live.Update(ch)
	if err != nil {
		r.Err = err
		return r
	}
	r.Table = t
	p.applyPolicy(&r, nil)
	return r
}

// rebasePolicy programs the policy table for a new policy model and the
// changes since the last sync, compiling only the node's own pods' classes
// (compiler.Incremental.Rebase, compiler.IdentityIncremental.Rebase): for a change
// Update refuses. nodes are every
// Node. A compiler.NeedsFullError means nothing was done.
func (p *Programmer) rebasePolicy(ch compiler.Changes, model *policy.Model, nodes []*corev1.Node) PolicyResult {
	r := PolicyResult{Ran: true, Incremental: true}
	if p.live == nil {
		r.Err = &compiler.NeedsFullError{Reason: "no full compile yet"}
		return r
	}
	t, err := p.live.Rebase(ch, model, nodes)
	if err != nil {
		// The incremental table may hold the pod changes now: only a full compile
		// starts again from a known state.
		p.live = nil
		r.Err = &compiler.NeedsFullError{Reason: err.Error()}
		return r
	}
	r.Table = t
	p.noteAttributions(t) // before the kernel logs with them
	p.noteCounters(t)
	p.applyPolicy(&r, nil)
	if r.Err == nil {
		r.Err = p.learnPatterns(model, t)
	}
	return r
}

// PolicyTable is a copy of the policy table the kernel took last, which
// later updates do not change; nil before the first and while the last
// transaction failed (the kernel then holds an older one).
func (p *Programmer) PolicyTable() *nft.Table {
	if p.live == nil || !p.applied {
		return nil
	}
	return p.live.Snapshot()
}

// Identities is the identity layout's numbering as the last compile left
// it: a compile given a pointer to it numbers as this node did.
func (p *Programmer) Identities() compiler.Identities { return p.identities }

// selectsLocal reports whether some policy of pols applies to a pod of
// this node (true before the first full compile).
func (p *Programmer) selectsLocal(pols []*policy.Policy) bool {
	if p.live == nil {
		return true
	}
	for _, pol := range pols {
		if p.live.SelectsLocal(pol.Subject) {
			return true
		}
	}
	return false
}

func (p *Programmer) applyPolicy(r *PolicyResult, err error) {
	if err == nil {
		r.Counts = r.Table.Count()
		r.Stats, err = p.policy.Apply(r.Table)
	}
	p.applied = err == nil
	if err != nil {
		r.Err = fmt.Errorf("node %s: policy table %s: %w", p.opts.Node, p.opts.Table, err)
		return
	}
	if p.opts.Strict && r.Stats.Messages > 0 {
		p.strictPending = true
		if _, due := p.StrictDue(time.Now()); due {
			r.Strict = p.EndDeniedFlows()
		}
	}
}

// Verify checks cheaply whether the chosen tables may have been changed
// behind the Programmer's back (kernel.Applier.Verify) and returns those that
// may have: their next Sync reads them back and repairs them.
func (p *Programmer) Verify(tables Tables) (Tables, error) {
	var drifted Tables
	var errs []error
	if tables&Policy != 0 {
		d, err := p.policy.Verify()
		if d {
			drifted |= Policy
		}
		errs = append(errs, err)
	}
	if tables&Services != 0 && p.proxy != nil {
		d, err := p.proxy.Verify()
		if d {
			drifted |= Services
		}
		errs = append(errs, err)
	}
	return drifted, errors.Join(errs...)
}

// Close releases the netlink connections and stops the health-check
// servers; the tables stay in the kernel.
func (p *Programmer) Close() {
	if err := p.dns.close(); err != nil {
		p.opts.Logger.Warn("domainNames: closing the queue", "err", err)
	}
	p.policy.Close()
	p.strict.close()
	if err := p.audit.Close(); err != nil {
		p.opts.Logger.Warn("the verdict log: closing its NFLOG socket", "err", err)
	}
	if p.audit != nil && p.auditNS >= 0 {
		unix.Close(p.auditNS)
	}
	if p.proxy != nil {
		p.proxy.Close()
	}
}
