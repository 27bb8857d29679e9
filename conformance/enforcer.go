// Package conformance checks the kernel against the evaluator: it programs
// a lab's nodes from a snapshot (the compiler's rulesets, applied over
// netlink), probes the real data plane, and compares the observed table
// with the evaluator's cell by cell.
package conformance

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// Enforcer programs every node of a lab as the agent programs a real node:
// through one node.Programmer per node (the agent's own: the policy table
// compiled and applied as a difference, then the Services through a
// proxier.Proxier with its conntrack cleanup), so each Sync after the
// first is an incremental transaction and the lab tests run the agent's
// sync code.
type Enforcer struct {
	lab   *lab.Lab
	nodes map[string]*node.Programmer
	// NoConntrackCleanup turns off the deletion of stale UDP conntrack
	// entries after a sync (the agent always does it; tests turn it off
	// to show what it is for).
	NoConntrackCleanup bool
	// NoStrict, set before the first Sync, turns strict mode off: a
	// policy change then leaves the open flows it denies running (the
	// agent's --strict=false; tests turn it off to show what it is for).
	NoStrict bool
	// StrictInterval, set before the first Sync, is the least time
	// between two strict checks (node.Options.StrictInterval; 0, the
	// default: after every sync, so that a Sync's report has them).
	StrictInterval time.Duration
	// NoRuleCounters, set before the first Sync, turns the per-rule
	// counters off (node.Options.RuleCounters; on by default, as in the
	// agent).
	NoRuleCounters bool
	// DNS, set before the first Sync, makes every node learn domainNames
	// addresses from the cluster DNS's answers, as the agent does.
	DNS *node.DNSOptions
	// Layout, set before the first Sync, is the policy tables' layout.
	Layout compiler.Layout
	// Audit, set before the first Sync, writes the connections policy
	// decides to the verdict log, as the agent's --audit does; each Sync
	// names the lines' addresses from its snapshot (Audit.Name is set).
	Audit *node.AuditOptions
	names atomic.Pointer[audit.Names]
	// StrictChecked counts the open flows strict mode traced, over every
	// sync.
	StrictChecked int
	// model is the policy model last synced (SyncPolicies sends what
	// changed since).
	model *policy.Model
}

// NewEnforcer prepares to program l's nodes.
func NewEnforcer(l *lab.Lab) *Enforcer {
	return &Enforcer{lab: l, nodes: map[string]*node.Programmer{}}
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
	Stats  kernel.Stats
	Counts nft.Counts
	// ProxyStats and ProxyCounts are the service NAT table's.
	ProxyStats  kernel.Stats
	ProxyCounts nft.Counts
	// Ended are the flows strict mode ended after the policy table's
	// change.
	Ended []conntrack.Flow
}

// Sync compiles snap for every lab node and applies it. Unlike the agent,
// which retries each table on its own, it fails on any table's error,
// Service failures after the commit (conntrack, health checks) included.
func (e *Enforcer) Sync(snap *cluster.Snapshot) (*SyncReport, error) {
	start := time.Now()
	e.nameFrom(snap)
	in := node.Prepare(snap)
	rep := &SyncReport{Model: in.Model, Nodes: map[string]NodeSync{}, Services: map[string]*proxy.Model{}}
	for _, n := range e.lab.Nodes() {
		p, err := e.programmer(n)
		if err != nil {
			return nil, err
		}
		p.NoConntrackCleanup = e.NoConntrackCleanup
		res := p.Sync(in, node.All)
		if err := errors.Join(res.Err(), res.Policy.Strict.Err, errors.Join(res.Services.Failures...)); err != nil {
			return nil, err
		}
		e.StrictChecked += res.Policy.Strict.Checked
		rep.Services[n.Name] = res.Services.Model
		rep.Nodes[n.Name] = NodeSync{Stats: res.Policy.Stats, Counts: res.Policy.Counts,
			ProxyStats: res.Services.Stats, ProxyCounts: res.Services.Counts, Ended: res.Policy.Strict.Ended}
	}
	rep.Duration = time.Since(start)
	e.model = in.Model
	return rep, nil
}

// SyncPolicies programs every node for snap after a change of policies
// alone, as the agent does: the changed policies (added, removed or
// edited between the last model synced and snap's) go to the node's
// programmer as typed changes, which updates or rebases the node's table
// without a full compile when it can, and a full sync follows only when
// the programmer asks for one. It returns each node's kind of sync.
func (e *Enforcer) SyncPolicies(snap *cluster.Snapshot) (map[string]node.SyncKind, error) {
	e.nameFrom(snap)
	model := policy.Build(snap)
	changed := changedPolicies(e.model, model)
	pods := make(map[string]*corev1.Pod, len(snap.Pods))
	for _, p := range snap.Pods {
		pods[p.Namespace+"/"+p.Name] = p
	}
	in := node.ChangeInputs{
		Pod: func(key string) (*corev1.Pod, error) { return pods[key], nil },
		NamespaceLabels: func(name string) labels.Set {
			if ns := snap.Namespace(name); ns != nil {
				return ns.Labels
			}
			return nil
		},
		Model: func() (*policy.Model, error) { return model, nil },
		Nodes: func() ([]*corev1.Node, error) { return snap.Nodes, nil },
	}
	kinds := map[string]node.SyncKind{}
	for _, n := range e.lab.Nodes() {
		p, err := e.programmer(n)
		if err != nil {
			return nil, err
		}
		ch := &node.PolicyChanges{}
		ch.Policies(changed...)
		cs := p.SyncPolicyChanges(ch, in)
		if cs.Kind == node.SyncFull {
			cs.PolicyResult = p.Sync(node.Prepare(snap), node.Policy).Policy
		}
		if err := errors.Join(cs.Err, cs.Strict.Err); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		e.StrictChecked += cs.Strict.Checked
		kinds[n.Name] = cs.Kind
	}
	e.model = model
	return kinds, nil
}

// changedPolicies are the policies of before and after that the other
// has not as they are (by reference and content): added, removed, edited.
func changedPolicies(before, after *policy.Model) []*policy.Policy {
	if before == nil {
		return after.Policies
	}
	index := func(m *policy.Model) map[string]*policy.Policy {
		out := make(map[string]*policy.Policy, len(m.Policies))
		for _, p := range m.Policies {
			out[p.Ref()] = p
		}
		return out
	}
	was, is := index(before), index(after)
	var out []*policy.Policy
	for ref, p := range is {
		if q, ok := was[ref]; !ok || !reflect.DeepEqual(p, q) {
			out = append(out, p)
		}
	}
	for ref, p := range was {
		if _, ok := is[ref]; !ok {
			out = append(out, p)
		}
	}
	return out
}

// Verify checks every node's tables for changes made behind the
// Enforcer's back (the agent does it at its resync period) and returns
// the nodes whose tables the next Sync reads back.
func (e *Enforcer) Verify() (map[string]node.Tables, error) {
	drifted := map[string]node.Tables{}
	var errs []error
	for name, p := range e.nodes {
		d, err := p.Verify(node.All)
		if d != 0 {
			drifted[name] = d
		}
		errs = append(errs, err)
	}
	return drifted, errors.Join(errs...)
}

// nameFrom names the verdict log's addresses from snap.
func (e *Enforcer) nameFrom(snap *cluster.Snapshot) {
	if e.Audit != nil {
		names := audit.NamesOf(snap)
		e.names.Store(&names)
	}
}

func (e *Enforcer) programmer(n *lab.Node) (*node.Programmer, error) {
	if p, ok := e.nodes[n.Name]; ok {
		return p, nil
	}
	var auditOpts *node.AuditOptions
	if e.Audit != nil {
		a := *e.Audit
		a.Name = func(addr netip.Addr) string {
			if names := e.names.Load(); names != nil {
				return names.Name(addr)
			}
			return ""
		}
		auditOpts = &a
	}
	p, err := node.New(node.Options{Node: n.Name, NetNS: n.Handle, DNS: e.DNS, Layout: e.Layout, Strict: !e.NoStrict, StrictInterval: e.StrictInterval, Audit: auditOpts,
		RuleCounters: !e.NoRuleCounters && e.Layout == compiler.LayoutIdentities})
	if err != nil {
		return nil, err
	}
	if err := p.AuditErr(); err != nil {
		p.Close()
		return nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	e.nodes[n.Name] = p
	return p, nil
}

// EndDeniedFlows runs each node's pending strict check now, whatever
// StrictInterval says (node.Programmer.EndDeniedFlows), and returns what
// each did.
func (e *Enforcer) EndDeniedFlows() (map[string]node.StrictResult, error) {
	out := map[string]node.StrictResult{}
	var errs []error
	for name, p := range e.nodes {
		r := p.EndDeniedFlows()
		out[name] = r
		e.StrictChecked += r.Checked
		errs = append(errs, r.Err)
	}
	return out, errors.Join(errs...)
}

// AuditDecisions is how many decisions the nodes' verdict log rules made
// (node.Programmer.AuditDecisions), summed.
func (e *Enforcer) AuditDecisions() (uint64, error) {
	var total uint64
	var errs []error
	for _, p := range e.nodes {
		n, err := p.AuditDecisions()
		total += n
		errs = append(errs, err)
	}
	return total, errors.Join(errs...)
}

// DNSStatus is each node's DNS side (node.Programmer.DNS), by node name.
func (e *Enforcer) DNSStatus() map[string]*node.DNSStatus {
	out := map[string]*node.DNSStatus{}
	for name, p := range e.nodes {
		out[name] = p.DNS(true)
	}
	return out
}

// Close releases the netlink connections; the rulesets stay in the
// kernel (the lab's Down removes them with the namespaces).
func (e *Enforcer) Close() {
	for _, p := range e.nodes {
		p.Close()
	}
	e.nodes = map[string]*node.Programmer{}
}

// RuleCounts is each node's per-rule counters (node.Programmer.RuleCounts),
// by node name.
func (e *Enforcer) RuleCounts() (map[string][]node.RuleCount, error) {
	return e.counts((*node.Programmer).RuleCounts)
}

// StagedCounts is each node's staged policies' counters
// (node.Programmer.StagedCounts), by node name.
func (e *Enforcer) StagedCounts() (map[string][]node.RuleCount, error) {
	return e.counts((*node.Programmer).StagedCounts)
}

func (e *Enforcer) counts(read func(*node.Programmer) ([]node.RuleCount, error)) (map[string][]node.RuleCount, error) {
	out := map[string][]node.RuleCount{}
	var errs []error
	for name, p := range e.nodes {
		c, err := read(p)
		out[name] = c
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}
