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
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// Enforcer programs every node of a lab, as the agent will on a real node:
// compile the node's ruleset, apply the difference. It keeps one Applier
// per node, so each Sync after the first is an incremental transaction.
type Enforcer struct {
	lab      *lab.Lab
	appliers map[string]*nft.Applier
}

// NewEnforcer prepares to program l's nodes.
func NewEnforcer(l *lab.Lab) *Enforcer {
	return &Enforcer{lab: l, appliers: map[string]*nft.Applier{}}
}

// SyncReport is what one Sync did.
type SyncReport struct {
	Model *policy.Model
	// Nodes has, per node name, the transaction that was applied and the
	// resulting kernel object counts.
	Nodes    map[string]NodeSync
	Duration time.Duration
}

// NodeSync is one node's share of a sync.
type NodeSync struct {
	Stats  nft.Stats
	Counts nft.Counts
}

// Sync compiles snap for every lab node and applies it.
func (e *Enforcer) Sync(snap *cluster.Snapshot) (*SyncReport, error) {
	start := time.Now()
	model := policy.Build(snap)
	resolved := eval.New(snap, model).Resolved()
	rep := &SyncReport{Model: model, Nodes: map[string]NodeSync{}}
	for _, n := range e.lab.Nodes() {
		table, err := compiler.Compile(resolved, compiler.Options{Node: n.Name})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		a, err := e.applier(n)
		if err != nil {
			return nil, err
		}
		stats, err := a.Apply(table)
		if err != nil {
			return nil, fmt.Errorf("node %s: applying the ruleset: %w", n.Name, err)
		}
		rep.Nodes[n.Name] = NodeSync{Stats: stats, Counts: table.Count()}
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

func (e *Enforcer) applier(n *lab.Node) (*nft.Applier, error) {
	if a, ok := e.appliers[n.Name]; ok {
		return a, nil
	}
	a, err := nft.NewApplier(int(n.Handle), compiler.DefaultTable)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	e.appliers[n.Name] = a
	return a, nil
}

// Close releases the netlink connections; the rulesets stay in the
// kernel (the lab's Down removes them with the namespaces).
func (e *Enforcer) Close() {
	for _, a := range e.appliers {
		a.Close()
	}
	e.appliers = map[string]*nft.Applier{}
}
