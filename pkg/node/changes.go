package node

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/policy"
)

// PolicyChanges are the changes to the policy table's inputs since its
// last sync, by kind, as kube-proxy's change trackers keep them: the agent
// records each informer event here, and SyncPolicyChanges decides from
// them, in this one place, how the next sync programs the table. The zero
// value holds no change. Not safe for concurrent use.
type PolicyChanges struct {
	pods       map[string]bool // pod keys (namespace/name)
	namespaces map[string]bool
	// policies are the models of the changed policy objects, before and
	// after (an object's versions share a name).
	policies []*policy.Policy
	// full says why only a full sync will do ("": nothing says so).
	full string
}

// MaxPolicyChanges is the most objects PolicyChanges holds: past it a full
// compile is cheaper than an update per object.
const MaxPolicyChanges = 5000

// Pod records a change to the pod key (namespace/name): added, changed or
// deleted.
func (c *PolicyChanges) Pod(key string) {
	if c.full != "" {
		return // a full sync reads everything
	}
	if c.pods == nil {
		c.pods = map[string]bool{}
	}
	c.pods[key] = true
	c.overflow()
}

// Namespace records a change to namespace name.
func (c *PolicyChanges) Namespace(name string) {
	if c.full != "" {
		return
	}
	if c.namespaces == nil {
		c.namespaces = map[string]bool{}
	}
	c.namespaces[name] = true
	c.overflow()
}

// Policies records a change to a policy object: the models of its old and
// new versions (none for a version that did not exist).
func (c *PolicyChanges) Policies(pols ...*policy.Policy) {
	if c.full != "" {
		return
	}
	c.policies = append(c.policies, pols...)
	c.overflow()
}

// NeedFull records a change only a full sync programs (a Node, the served
// policy APIs, a policy object with a problem) and why. The first reason
// is kept, and nothing more is recorded: the full sync reads every object
// (the agent's first informer lists are tens of thousands of changes).
func (c *PolicyChanges) NeedFull(reason string) {
	if c.full == "" {
		c.full = reason
		c.pods, c.namespaces, c.policies = nil, nil, nil
	}
}

// FullReason says why only a full sync will do ("": nothing says so).
func (c *PolicyChanges) FullReason() string { return c.full }

// Empty reports whether nothing changed.
func (c *PolicyChanges) Empty() bool {
	return c.full == "" && len(c.pods) == 0 && len(c.namespaces) == 0 && len(c.policies) == 0
}

// HasPolicies reports whether a policy object changed.
func (c *PolicyChanges) HasPolicies() bool { return len(c.policies) > 0 }

func (c *PolicyChanges) overflow() {
	if len(c.pods)+len(c.namespaces)+len(c.policies) > MaxPolicyChanges {
		c.NeedFull(fmt.Sprintf("more than %d changes", MaxPolicyChanges))
	}
}

// SyncKind is how a sync programs the policy table.
type SyncKind int

const (
	// SyncFull: a full compile of a snapshot (Sync).
	SyncFull SyncKind = iota
	// SyncIncremental: the last table updated with the elements of what
	// changed (compiler.Incremental.Update).
	SyncIncremental
	// SyncRebase: the node's classes compiled again from its own pods,
	// the rest taken from the last table (Rebase).
	SyncRebase
)

func (k SyncKind) String() string {
	switch k {
	case SyncIncremental:
		return "incremental"
	case SyncRebase:
		return "rebase"
	}
	return "full"
}

// ChangeInputs are what SyncPolicyChanges reads of the cluster, each
// only when the kind of sync needs it.
type ChangeInputs struct {
	// Pod is the pod key now (nil: deleted).
	Pod func(key string) (*corev1.Pod, error)
	// NamespaceLabels are a namespace's labels now.
	NamespaceLabels func(name string) labels.Set
	// Model is the whole policy model now, and Nodes every Node: a
	// rebase compiles the node's classes from them.
	Model func() (*policy.Model, error)
	Nodes func() ([]*corev1.Node, error)
}

// ChangeSync is what SyncPolicyChanges did.
type ChangeSync struct {
	PolicyResult
	Kind SyncKind
	// Model is the model a rebase compiled (nil otherwise).
	Model *policy.Model
	// NeedsFull, with Kind SyncFull, says why the changes need a full
	// sync; nothing was done, and the caller syncs in full.
	NeedsFull string
}

// SyncPolicyChanges programs the policy table for ch without a snapshot
// when it can, and is the one place that decides how: an update when no
// changed policy applies to this node's pods, a rebase when one does or
// the compiler refuses the update (a new identity here, the labels of a
// namespace with pods here), and nothing (SyncFull, with the reason) when
// ch says only a full sync will do, before the first full compile, or
// when the compiler refuses the rebase too.
func (p *Programmer) SyncPolicyChanges(ch *PolicyChanges, in ChangeInputs) ChangeSync {
	if ch.full != "" {
		return ChangeSync{NeedsFull: ch.full}
	}
	if p.live == nil {
		return ChangeSync{NeedsFull: "no full compile yet"}
	}
	cc := compiler.Changes{Pods: make(map[string]*compiler.PodState, len(ch.pods)), NamespaceLabels: in.NamespaceLabels,
		Namespaces: slices.Sorted(maps.Keys(ch.namespaces))}
	for key := range ch.pods {
		pod, err := in.Pod(key)
		if err != nil {
			return ChangeSync{NeedsFull: fmt.Sprintf("pod %s: %v", key, err)}
		}
		cc.Pods[key] = nil
		if pod != nil {
			cc.Pods[key] = compiler.PodStateOf(pod)
		}
	}
	var full *compiler.NeedsFullError
	if !p.selectsLocal(ch.policies) {
		r := p.updatePolicy(cc)
		if !errors.As(r.Err, &full) {
			return ChangeSync{PolicyResult: r, Kind: SyncIncremental}
		}
	}
	nodes, err := in.Nodes()
	if err != nil {
		return ChangeSync{NeedsFull: fmt.Sprintf("nodes: %v", err)}
	}
	model, err := in.Model()
	if err != nil {
		return ChangeSync{NeedsFull: fmt.Sprintf("policy model: %v", err)}
	}
	r := p.rebasePolicy(cc, model, nodes)
	if errors.As(r.Err, &full) {
		return ChangeSync{NeedsFull: full.Reason}
	}
	return ChangeSync{PolicyResult: r, Kind: SyncRebase, Model: model}
}
