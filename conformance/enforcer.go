// Package conformance checks the kernel against the evaluator: it programs
// a lab's nodes from a snapshot (the compiler's rulesets, applied over
// netlink), probes the real data plane, and compares the observed table
// with the evaluator's cell by cell.
package conformance

import (
	"errors"
	"fmt"
	"time"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/proxy/proxier"
)

// Enforcer programs every node of a lab, as the agent does on a real node:
// compile the node's policy table and apply the difference, then sync its
// Services through a proxier.Proxier (NAT table, conntrack cleanup). It
// keeps one Applier and one Proxier per node, so each Sync after the first
// is an incremental transaction.
type Enforcer struct {
	lab      *lab.Lab
	appliers map[string]*nft.Applier     // policy tables, by node
	proxiers map[string]*proxier.Proxier // by node
	// NoConntrackCleanup turns off the deletion of stale UDP conntrack
	// entries after a sync (the agent always does it; tests turn it off
	// to show what it is for).
	NoConntrackCleanup bool
}

// NewEnforcer prepares to program l's nodes.
func NewEnforcer(l *lab.Lab) *Enforcer {
	return &Enforcer{lab: l, appliers: map[string]*nft.Applier{}, proxiers: map[string]*proxier.Proxier{}}
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
		stats, err := e.applyPolicy(n, table)
		if err != nil {
			return nil, err
		}
		p, err := e.proxier(n)
		if err != nil {
			return nil, err
		}
		p.NoConntrackCleanup = e.NoConntrackCleanup
		res, err := p.Sync(snap)
		if err == nil {
			err = errors.Join(res.Failures...)
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: services: %w", n.Name, err)
		}
		rep.Services[n.Name] = res.Model
		rep.Nodes[n.Name] = NodeSync{Stats: stats, Counts: table.Count(), ProxyStats: res.Stats, ProxyCounts: res.Counts}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// applyPolicy makes node n's policy table match t.
func (e *Enforcer) applyPolicy(n *lab.Node, t *nft.Table) (nft.Stats, error) {
	a, ok := e.appliers[n.Name]
	if !ok {
		var err error
		if a, err = nft.NewApplier(int(n.Handle), t.Name); err != nil {
			return nft.Stats{}, fmt.Errorf("node %s: %w", n.Name, err)
		}
		e.appliers[n.Name] = a
	}
	stats, err := a.Apply(t)
	if err != nil {
		return stats, fmt.Errorf("node %s: applying table %s: %w", n.Name, t.Name, err)
	}
	return stats, nil
}

func (e *Enforcer) proxier(n *lab.Node) (*proxier.Proxier, error) {
	if p, ok := e.proxiers[n.Name]; ok {
		return p, nil
	}
	p, err := proxier.New(proxier.Options{Node: n.Name, NetNS: n.Handle})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	e.proxiers[n.Name] = p
	return p, nil
}

// Close releases the netlink connections; the rulesets stay in the
// kernel (the lab's Down removes them with the namespaces).
func (e *Enforcer) Close() {
	for _, a := range e.appliers {
		a.Close()
	}
	e.appliers = map[string]*nft.Applier{}
	for _, p := range e.proxiers {
		p.Close()
	}
	e.proxiers = map[string]*proxier.Proxier{}
}
