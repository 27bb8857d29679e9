package agent

import (
	"cmp"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// recordChange notes an informer event's objects in the policy table's
// changes (node.PolicyChanges), by their type: pods and namespaces by
// key, policies as their models; anything else (a Node, an event without
// objects: the served policy APIs changed, and their objects are in
// informers the last snapshot did not read) needs a full sync.
func (a *Agent) recordChange(objs []any) {
	a.mu.Lock()
	full := a.changes.FullReason() != ""
	a.mu.Unlock()
	if full {
		return // the next sync is a full one, which reads every object
	}
	var pods, namespaces []string
	var pols []*policy.Policy
	reason := ""
	if len(objs) == 0 {
		reason = "the served policy APIs changed"
	}
	for _, obj := range objs {
		key := ""
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj, key = d.Obj, d.Key
		}
		switch o := obj.(type) {
		case *leanPod:
			pods = append(pods, cmp.Or(key, o.Namespace+"/"+o.Name))
		case *corev1.Namespace:
			namespaces = append(namespaces, o.Name)
		case *corev1.Node:
			reason = "node " + o.Name + " changed"
		case *leanSlice:
			reason = "the cluster DNS's endpoints changed" // with no NAT table (Agent.changed)
		case *networkingv1.NetworkPolicy, *policyRecord:
			snap, problems := loadPolicy(obj)
			model := policy.Build(snap)
			if len(model.Policies) == 0 && len(model.Staged) == 0 {
				// Rejected: no model of its own carries the problem to the
				// status writer; a full sync's does.
				problems = append(problems, model.Errors...)
			}
			if len(problems) > 0 {
				reason = "a policy object with a problem: " + errors.Join(problems...).Error()
				continue
			}
			// A staged policy is not enforced, but the nodes it selects pods
			// of evaluate it beside the enforced ones (compiler.Options.Staged).
			pols = append(pols, model.Policies...)
			pols = append(pols, model.Staged...)
		default:
			reason = fmt.Sprintf("a %T changed", obj)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, key := range pods {
		a.changes.Pod(key)
	}
	for _, ns := range namespaces {
		a.changes.Namespace(ns)
	}
	if len(pols) > 0 {
		a.changes.Policies(pols...)
	}
	if reason != "" {
		a.changes.NeedFull(reason)
	}
}

// takeChanges returns the changes so far and starts anew.
func (a *Agent) takeChanges() *node.PolicyChanges {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := a.changes
	a.changes = &node.PolicyChanges{}
	return ch
}

// forceFull makes the next policy sync a full one.
func (a *Agent) forceFull(reason string) {
	a.mu.Lock()
	a.changes.NeedFull(reason)
	a.mu.Unlock()
}

// policySync is what syncPolicyChanges did.
type policySync struct {
	node.ChangeSync
	// model and objects are the policy model and objects, when the sync
	// built the model (a rebase, or a policy change on the status writer):
	// the status is written from them.
	model   *policy.Model
	objects map[cluster.ObjectKey]policyObject
}

// syncPolicyChanges programs the policy table from ch without a snapshot
// when it can (node.Programmer.SyncPolicyChanges decides how); Kind
// SyncFull says nothing was done.
func (a *Agent) syncPolicyChanges(ch *node.PolicyChanges) policySync {
	var out policySync
	in := node.ChangeInputs{Pod: a.src.pod, NamespaceLabels: a.namespaceLabels, Nodes: a.src.nodes,
		Model: func() (*policy.Model, error) {
			model, objects, err := a.buildModel()
			out.objects = objects
			return model, err
		}}
	out.ChangeSync = a.prog.SyncPolicyChanges(ch, in)
	switch {
	case out.Kind == node.SyncFull:
		a.log.Debug("full policy sync", "reason", out.NeedsFull)
	case out.Kind == node.SyncRebase:
		out.model = out.Model
	case ch.HasPolicies() && out.Err == nil && a.status != nil && a.status.leader.Load():
		// The status writer's model, after the kernel has the change.
		out.model, out.objects, _ = a.buildModel()
	}
	return out
}

// buildModel builds the policy model of the cached objects (from the
// policy cache: only changed objects are built) and reports its
// problems.
func (a *Agent) buildModel() (*policy.Model, map[cluster.ObjectKey]policyObject, error) {
	sources, objects, err := a.src.policySources()
	if err != nil {
		return nil, nil, err
	}
	model, problems := a.policyModels.Build(sources, loadPolicy)
	a.reportProblems("policy", append(problems, model.Errors...), model.Warnings)
	return model, objects, nil
}

// namespaceLabels are a namespace's labels as the snapshot has them.
func (a *Agent) namespaceLabels(name string) labels.Set {
	ns, err := a.src.namespace(name)
	if err != nil {
		ns = nil
	}
	return compiler.NamespaceLabelsOf(name, ns)
}
