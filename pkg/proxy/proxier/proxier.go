// Package proxier programs one node's Service load balancing. Each Sync
// turns a snapshot into the node's NAT table (proxy.Syncer: only changed
// Services are rebuilt), applies the difference (kernel.Applier: only the
// changed set elements are sent), then deletes the UDP conntrack entries
// the change made stale and, if asked, updates the externalTrafficPolicy
// Local health-check servers. The agent runs one Proxier; the lab's
// Enforcer runs one per lab node, so the lab tests exercise the agent's
// code path.
package proxier

import (
	"fmt"
	"log/slog"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/proxy/healthcheck"
)

// Options configure a Proxier.
type Options struct {
	Node string
	// NetNS is the network namespace to program; <= 0 (the zero value,
	// netns.None()) means the caller's. The Proxier keeps its own copy.
	NetNS netns.NsHandle
	// Build tunes the service model (NodePort addresses, cluster CIDRs).
	Build proxy.Options
	Table string // default proxy.DefaultTable
	// HealthChecks serves the health-check node ports (on
	// Build.NodePortAddresses; all addresses when nil).
	HealthChecks bool
	Logger       *slog.Logger
	// Kernel, when set, is the NAT table to program (a kernel.Fake in
	// tests) instead of an Applier opened in NetNS.
	Kernel kernel.Table
}

// Proxier keeps one node's NAT table in step with the cluster.
type Proxier struct {
	// NoConntrackCleanup turns off the deletion of stale UDP conntrack
	// entries (the agent never sets it; tests do, to show what it does).
	NoConntrackCleanup bool

	log     *slog.Logger
	ns      netns.NsHandle // our copy; netns.None() for the caller's
	syncer  *proxy.Syncer
	applier kernel.Table
	cleaner *conntrack.Cleaner
	health  *healthcheck.Server // nil without HealthChecks
	// programmed is the model of the last successful apply; conntrack
	// cleanup compares against it.
	programmed *proxy.Model
}

// New prepares a Proxier: netlink connections in the namespace, nothing
// sent yet.
func New(opts Options) (*Proxier, error) {
	if opts.Table == "" {
		opts.Table = proxy.DefaultTable
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxier{log: opts.Logger, ns: netns.None(),
		syncer: proxy.NewSyncer(opts.Node, opts.Build, proxy.CompileOptions{Table: opts.Table})}
	if opts.NetNS > 0 {
		fd, err := unix.FcntlInt(uintptr(opts.NetNS), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			return nil, fmt.Errorf("duplicating the network namespace handle: %w", err)
		}
		p.ns = netns.NsHandle(fd)
	}
	var err error
	p.applier = opts.Kernel
	if p.applier == nil {
		if p.applier, err = kernel.NewApplier(int(p.ns), opts.Table); err != nil {
			p.Close()
			return nil, err
		}
	}
	if p.cleaner, err = conntrack.NewCleaner(p.ns); err != nil {
		p.Close()
		return nil, err
	}
	if opts.HealthChecks {
		p.health = healthcheck.NewServer(healthcheck.Options{Addresses: opts.Build.NodePortAddresses, NetNS: p.ns, Logger: opts.Logger})
	}
	return p, nil
}

// Result is what one Sync did.
type Result struct {
	// Model is valid until the next Sync; its Errors are problems in the
	// input (the rest was programmed).
	Model  *proxy.Model
	Stats  kernel.Stats
	Counts nft.Counts
	// Failures happened after the commit (conntrack cleanup, health-check
	// listeners); they are not retried.
	Failures []error
}

// Sync programs snap's Services. endpointSlices, when not nil, are
// snap's EndpointSlices parsed for this node (proxy.ParseSlice), read in
// place of snap.EndpointSlices. An error means the kernel kept its
// previous table.
func (p *Proxier) Sync(snap *cluster.Snapshot, endpointSlices []*proxy.Slice) (Result, error) {
	var model *proxy.Model
	var table *nft.Table
	if endpointSlices != nil {
		model, table = p.syncer.SyncParsed(snap, endpointSlices)
	} else {
		model, table = p.syncer.Sync(snap)
	}
	res := Result{Model: model, Counts: table.Count()}
	var err error
	if res.Stats, err = p.applier.Apply(table); err != nil {
		return res, err
	}
	prev := p.programmed
	p.programmed = model
	if !p.NoConntrackCleanup {
		frontends, endpoints := proxy.StaleUDP(prev, model)
		if n, err := p.cleaner.Delete(conntrack.TargetsOf(frontends, endpoints)); err != nil {
			res.Failures = append(res.Failures, fmt.Errorf("deleting stale UDP conntrack entries: %w", err))
		} else if n > 0 {
			p.log.Info("deleted stale UDP conntrack entries", "entries", n, "frontends", len(frontends), "endpoints", len(endpoints))
		}
	}
	if p.health != nil {
		if err := p.health.Sync(model.HealthChecks); err != nil {
			res.Failures = append(res.Failures, fmt.Errorf("health-check node ports: %w", err))
		}
	}
	return res, nil
}

// Verify checks whether the NAT table may have changed behind the
// Proxier's back; if so the next Sync reads it back and repairs it (see
// kernel.Applier.Verify).
func (p *Proxier) Verify() (bool, error) { return p.applier.Verify() }

// Close stops the health-check servers and releases the connections; the
// NAT table stays in the kernel.
func (p *Proxier) Close() {
	if p.health != nil {
		p.health.Close()
	}
	if p.cleaner != nil {
		p.cleaner.Close()
	}
	if p.applier != nil {
		p.applier.Close()
	}
	if p.ns != netns.None() {
		p.ns.Close()
	}
}
