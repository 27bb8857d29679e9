package agent

import (
	"errors"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// delta is what changed for the policy table since its last sync: the
// incremental path (compiler.Incremental) programs pods of other nodes,
// namespaces without pods here and policies that select none of them
// without a snapshot; anything else (or too much) takes the full path.
// Guarded by Agent.mu.
type delta struct {
	pods, namespaces map[string]bool
	policies         []any // policy objects seen in events, old and new
	full             bool
}

// maxDelta is the most objects a delta holds: past it a full compile is
// cheaper than one update per object.
const maxDelta = 5000

func (d *delta) size() int { return len(d.pods) + len(d.namespaces) + len(d.policies) }

// record notes an event's objects in the delta.
func (d *delta) record(resource string, objs []any) {
	if d.full {
		return
	}
	if _, policy := policyKinds[resource]; !policy && resource != "pods" && resource != "namespaces" && resource != "networkpolicies" {
		d.full = true // nodes, the served policy APIs (an event without objects)
		return
	}
	if d.pods == nil {
		d.pods, d.namespaces = map[string]bool{}, map[string]bool{}
	}
	for _, obj := range objs {
		switch resource {
		case "pods", "namespaces":
			key, err := cache.MetaNamespaceKeyFunc(obj)
			if err != nil {
				d.full = true
				return
			}
			if resource == "pods" {
				d.pods[key] = true
			} else {
				d.namespaces[key] = true
			}
		default: // a policy
			d.policies = append(d.policies, obj)
		}
	}
	if d.size() > maxDelta {
		d.full = true
	}
}

// takeDelta returns the delta so far and starts a new one.
func (a *Agent) takeDelta() delta {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.delta
	a.delta = delta{}
	return d
}

// forceFull makes the next policy sync a full one.
func (a *Agent) forceFull() {
	a.mu.Lock()
	a.delta.full = true
	a.mu.Unlock()
}

// policySync is what syncPolicyIncremental did.
type policySync struct {
	node.PolicyResult
	// path is "incremental" (compiler.Incremental's Update: the elements of
	// what changed), "rebase" (the classes of this node's pods compiled
	// again) or "" when the delta needs the full path (nothing was done).
	path string
	// model and objects are the policy model and objects, when the sync
	// built the model (a rebase, or a policy change on the status
	// writer): the status is written from them.
	model   *policy.Model
	objects map[cluster.ObjectKey]policyObject
}

// syncPolicyIncremental programs the policy table from d without a
// snapshot, when it can: by Update, or by a rebase for a policy that
// applies to this node's pods, the labels of their namespace or a pod of
// the node unlike the others.
func (a *Agent) syncPolicyIncremental(d delta) policySync {
	if d.full {
		return policySync{}
	}
	rebase := false
	if len(d.policies) > 0 {
		pols, err := policyModels(d.policies)
		if err != nil {
			return policySync{}
		}
		rebase = a.prog.SelectsLocal(pols)
	}
	ch := compiler.Changes{Pods: map[string]*compiler.PodState{}, NamespaceLabels: a.namespaceLabels}
	for key := range d.pods {
		p, err := a.src.pod(key)
		if err != nil {
			return policySync{}
		}
		ch.Pods[key] = nil
		if p != nil {
			ch.Pods[key] = compiler.PodStateOf(p)
		}
	}
	for ns := range d.namespaces {
		ch.Namespaces = append(ch.Namespaces, ns)
	}
	var full *compiler.NeedsFullError
	if !rebase {
		r := a.prog.UpdatePolicy(ch)
		if !errors.As(r.Err, &full) {
			out := policySync{PolicyResult: r, path: "incremental"}
			if len(d.policies) > 0 && r.Err == nil && a.status != nil && a.status.leader.Load() {
				// The status writer's model, after the kernel has
				// the change.
				out.model, out.objects, _ = a.buildModel()
			}
			return out
		}
		a.log.Debug("rebasing the policy table", "reason", full.Reason)
	}
	nodes, err := a.src.nodes()
	if err != nil {
		return policySync{}
	}
	model, objects, err := a.buildModel()
	if err != nil {
		return policySync{}
	}
	r := a.prog.RebasePolicy(ch, model, nodes)
	if errors.As(r.Err, &full) {
		a.log.Debug("full policy sync", "reason", full.Reason)
		return policySync{}
	}
	return policySync{PolicyResult: r, path: "rebase", model: model, objects: objects}
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

// policyModels builds the model policies of policy objects (typed
// NetworkPolicies, admin and cluster policies as policyRecords), each alone
// (an object's old and new versions share a name). An object with a
// problem is an error: the full path reports it.
func policyModels(objs []any) ([]*policy.Policy, error) {
	var out []*policy.Policy
	for _, obj := range objs {
		snap, problems := loadPolicy(obj)
		if len(problems) > 0 {
			return nil, errors.Join(problems...)
		}
		out = append(out, policy.Build(snap).Policies...)
	}
	return out, nil
}
