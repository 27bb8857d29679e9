package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// ConditionAccepted is the condition netpol writes on AdminNetworkPolicy,
// BaselineAdminNetworkPolicy and ClusterNetworkPolicy objects.
const ConditionAccepted = "Accepted"

// statusFieldManager owns the condition (server-side apply).
const statusFieldManager = "netpol-status"

// statusWriter writes policy status once per cluster: the agents elect one
// writer with a Lease, and it writes a condition only when it differs from
// the object's current one.
type statusWriter struct {
	kube      kubernetes.Interface
	dyn       dynamic.Interface
	namespace string
	identity  string
	leader    atomic.Bool
	log       func(msg string, args ...any)
	// onLeader asks for a sync, so a new leader writes status at once.
	onLeader func()

	// The sync loop queues the statuses it wants and goes on; writeLoop
	// writes the latest (at client QPS, N changed policies take N/QPS
	// seconds, which must not stall kernel programming).
	mu      sync.Mutex
	queued  queuedStatus
	pending bool
	kick    chan struct{}
	// retry is how long a failed write waits before it is tried again.
	retry time.Duration
	// events are the Events written or found, by name (writeLoop's own).
	events map[string]writtenEvent
}

// queuedStatus is what a sync asks the writer to write.
type queuedStatus struct {
	statuses []policyStatus
	events   []policyEvent
}

func newStatusWriter(kube kubernetes.Interface, dyn dynamic.Interface, namespace, identity string, log func(string, ...any), onLeader func()) *statusWriter {
	return &statusWriter{kube: kube, dyn: dyn, namespace: namespace, identity: identity, log: log, onLeader: onLeader,
		kick: make(chan struct{}, 1), retry: 5 * time.Second, events: map[string]writtenEvent{}}
}

// enqueue replaces whatever is waiting to be written with q.
func (w *statusWriter) enqueue(q queuedStatus) {
	w.mu.Lock()
	w.queued, w.pending = q, true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// writeLoop writes the queued statuses until ctx ends. A failed write is
// tried again after a pause unless newer statuses came meanwhile.
func (w *statusWriter) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		w.mu.Lock()
		q, ok := w.queued, w.pending
		w.queued, w.pending = queuedStatus{}, false
		w.mu.Unlock()
		if !ok || !w.leader.Load() {
			continue
		}
		if err := errors.Join(w.write(ctx, q.statuses), w.writeEvents(ctx, q.events)); err != nil && ctx.Err() == nil {
			w.log("writing policy status failed; retrying", "err", err, "retry-in", w.retry)
			w.mu.Lock()
			if !w.pending {
				w.queued, w.pending = q, true
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(w.retry):
			}
			select {
			case w.kick <- struct{}{}:
			default:
			}
		}
	}
}

// run takes part in the election until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: "netpol-status-writer", Namespace: w.namespace},
		Client:     w.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: w.identity},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock: lock, ReleaseOnCancel: true,
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					w.leader.Store(true)
					w.log("writing policy status for the cluster (leader)")
					w.onLeader()
				},
				OnStoppedLeading: func() { w.leader.Store(false) },
			},
		})
	}
}

// policyStatus is the condition one policy object should carry.
type policyStatus struct {
	gvr    schema.GroupVersionResource
	obj    *policyRecord
	status metav1.ConditionStatus
	reason string
	msg    string
}

// desiredStatus derives each policy object's Accepted condition from the
// model's problems (objectProblems): rejected objects are False/Invalid; objects with rules
// that fail closed are True/RulesFailClosed, listing them; staged ones
// (stagedKeys) True/Staged; others True/Valid.
func desiredStatus(objs map[cluster.ObjectKey]policyObject, problems map[cluster.ObjectKey]problems, staged map[cluster.ObjectKey]bool) []policyStatus {
	var out []policyStatus
	for key, o := range objs {
		st := policyStatus{gvr: o.gvr, obj: o.obj, status: metav1.ConditionTrue, reason: "Valid", msg: "netpol enforces this policy"}
		if staged[key] {
			st.reason, st.msg = "Staged", "staged ("+policy.StagedAnnotation+`: "true"): netpol does not enforce it; netpol diff --promote shows what enforcing it would change`
		}
		if p, ok := problems[key]; ok {
			st.reason, st.msg = "RulesFailClosed", p.message()
			if p.rejected {
				st.status, st.reason = metav1.ConditionFalse, "Invalid"
			}
		}
		out = append(out, st)
	}
	return out
}

// problems are what is wrong with one policy object: the entries that
// fail closed or, when rejected, why netpol does not enforce it.
type problems struct {
	entries  []string // sorted
	rejected bool
}

// message says it, as the Accepted condition and the Event do.
func (p problems) message() string {
	msg := "enforced; these entries fail closed (an Accept rule matches nothing, a Deny/Pass rule everything): " + strings.Join(p.entries, "; ")
	if p.rejected {
		msg = "not enforced: " + strings.Join(p.entries, "; ")
	}
	if len(msg) > 32000 {
		msg = msg[:32000] + "..."
	}
	return msg
}

// objectProblems are the model's problems by object.
func objectProblems(model *policy.Model) map[cluster.ObjectKey]problems {
	out := map[cluster.ObjectKey]problems{}
	for _, err := range model.Errors {
		var oe *policy.ObjectError
		if errors.As(err, &oe) {
			p := out[oe.Object]
			p.entries = append(p.entries, oe.Field+": "+oe.Message)
			p.rejected = p.rejected || oe.Rejected
			out[oe.Object] = p
		}
	}
	for key, ws := range model.ObjectWarnings {
		p := out[key]
		p.entries = append(p.entries, ws...)
		out[key] = p
	}
	for key, p := range out {
		sort.Strings(p.entries)
		out[key] = p
	}
	return out
}

// stagedKeys are the objects of the model's staged policies.
func stagedKeys(model *policy.Model) map[cluster.ObjectKey]bool {
	out := make(map[cluster.ObjectKey]bool, len(model.Staged))
	for _, p := range model.Staged {
		out[cluster.ObjectKey{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}] = true
	}
	return out
}

// policyObject is an admin or cluster policy as the informer holds it.
type policyObject struct {
	gvr schema.GroupVersionResource
	obj *policyRecord
}

// ref is what an Event about the object names.
func (o policyObject) ref() corev1.ObjectReference {
	return corev1.ObjectReference{Kind: o.obj.Kind, APIVersion: o.obj.APIVersion, Name: o.obj.Name, UID: o.obj.uid}
}

// write applies the conditions that differ from the objects' own; only
// the Lease holder calls it.
func (w *statusWriter) write(ctx context.Context, statuses []policyStatus) error {
	var errs []error
	for _, st := range statuses {
		if current(st) {
			continue
		}
		patch := map[string]any{
			"apiVersion": st.obj.APIVersion, "kind": st.obj.Kind,
			"metadata": map[string]any{"name": st.obj.Name},
			"status": map[string]any{"conditions": []any{map[string]any{
				"type": ConditionAccepted, "status": string(st.status), "reason": st.reason, "message": st.msg,
				"observedGeneration": st.obj.generation, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
			}}},
		}
		data, err := json.Marshal(patch)
		if err != nil {
			return err
		}
		force := true
		_, err = w.dyn.Resource(st.gvr).Patch(ctx, st.obj.Name, types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: statusFieldManager, Force: &force}, "status")
		if err != nil {
			errs = append(errs, fmt.Errorf("status of %s %s: %w", st.obj.Kind, st.obj.Name, err))
		}
	}
	return errors.Join(errs...)
}

// current reports whether the object already carries the condition.
func current(st policyStatus) bool {
	c := st.obj.accepted
	return c != nil && c.status == string(st.status) && c.reason == st.reason && c.message == st.msg &&
		c.observedGeneration == st.obj.generation
}
