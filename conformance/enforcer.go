// Package conformance checks the kernel against the evaluator: it programs
// a lab's nodes from a snapshot (the compiler's rulesets, applied over
// netlink), probes the real data plane, and compares the observed table
// with the evaluator's cell by cell.
package conformance

import (
	"fmt"
	"time"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// Enforcer programs every node of a lab, as the agent does on a real node:
// compile the node's policy table and service NAT table, apply the
// differences. It keeps one Applier per node and table, so each Sync after
// the first is an incremental transaction.
type Enforcer struct {
	lab      *lab.Lab
	appliers map[string]*nft.Applier  // by node and table name
	syncers  map[string]*proxy.Syncer // by node
	cleaners map[string]*conntrack.Cleaner
	services map[string]*proxy.Model // by node, as last applied
	// NoConntrackCleanup turns off the deletion of stale UDP conntrack
	// entries after a sync (the agent always does it; tests turn it off
	// to show what it is for).
	NoConntrackCleanup bool
}

// NewEnforcer prepares to program l's nodes.
func NewEnforcer(l *lab.Lab) *Enforcer {
	return &Enforcer{lab: l, appliers: map[string]*nft.Applier{}, syncers: map[string]*proxy.Syncer{},
		cleaners: map[string]*conntrack.Cleaner{}, services: map[string]*proxy.Model{}}
}

// SyncReport is what one Sync did.
type SyncReport struct {
	Model *policy.Model
	// Services has, per node name, the node's service model.
	Services map[string]*proxy.Model
	// Nodes has, per node name, the transaction that was applied and the
	// resulting kernel object counts.
	Nodes    map[string]NodeSync
	Duration time.Duration
}

// NodeSync is one node's share of a sync.
type NodeSync struct {
	Stats  nft.Stats
	Counts nft.Counts
	// ProxyStats and ProxyCounts are the service NAT table's.
	ProxyStats  nft.Stats
	ProxyCounts nft.Counts
}

// Sync compiles snap for every lab node and applies it.
func (e *Enforcer) Sync(snap *cluster.Snapshot) (*SyncReport, error) {
	start := time.Now()
	model := policy.Build(snap)
	resolved := eval.New(snap, model).Resolved()
	rep := &SyncReport{Model: model, Nodes: map[string]NodeSync{}, Services: map[string]*proxy.Model{}}
	for _, n := range e.lab.Nodes() {
		table, err := compiler.Compile(resolved, compiler.Options{Node: n.Name})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		stats, err := e.apply(n, table)
		if err != nil {
			return nil, err
		}
		syncer := e.syncers[n.Name]
		if syncer == nil {
			syncer = proxy.NewSyncer(n.Name, proxy.Options{}, proxy.CompileOptions{})
			e.syncers[n.Name] = syncer
		}
		services, natTable := syncer.Sync(snap)
		natStats, err := e.apply(n, natTable)
		if err != nil {
			return nil, err
		}
		prev := e.services[n.Name]
		e.services[n.Name] = services
		if err := e.cleanConntrack(n, prev, services); err != nil {
			return nil, err
		}
		rep.Services[n.Name] = services
		rep.Nodes[n.Name] = NodeSync{Stats: stats, Counts: table.Count(), ProxyStats: natStats, ProxyCounts: natTable.Count()}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// apply makes node n's kernel table match t.
func (e *Enforcer) apply(n *lab.Node, t *nft.Table) (nft.Stats, error) {
	key := n.Name + "/" + t.Name
	a, ok := e.appliers[key]
	if !ok {
		var err error
		if a, err = nft.NewApplier(int(n.Handle), t.Name); err != nil {
			return nft.Stats{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
		e.appliers[key] = a
	}
	stats, err := a.Apply(t)
	if err != nil {
		return stats, fmt.Errorf("node %s: applying table %s: %w", n.Name, t.Name, err)
	}
	return stats, nil
}

// cleanConntrack deletes the node's UDP conntrack entries that the change
// from prev to next made stale, as the agent does.
func (e *Enforcer) cleanConntrack(n *lab.Node, prev, next *proxy.Model) error {
	if e.NoConntrackCleanup {
		return nil
	}
	c := e.cleaners[n.Name]
	if c == nil {
		var err error
		if c, err = conntrack.NewCleaner(n.Handle); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		e.cleaners[n.Name] = c
	}
	if _, err := c.Delete(conntrack.TargetsOf(proxy.StaleUDP(prev, next))); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

// Close releases the netlink connections; the rulesets stay in the
// kernel (the lab's Down removes them with the namespaces).
func (e *Enforcer) Close() {
	for _, a := range e.appliers {
		a.Close()
	}
	e.appliers = map[string]*nft.Applier{}
	for _, c := range e.cleaners {
		c.Close()
	}
	e.cleaners = map[string]*conntrack.Cleaner{}
}
