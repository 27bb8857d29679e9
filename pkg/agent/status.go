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
	queued  []policyStatus
	pending bool
	kick    chan struct{}
	// retry is how long a failed write waits before it is tried again.
	retry time.Duration
}

func newStatusWriter(kube kubernetes.Interface, dyn dynamic.Interface, namespace, identity string, log func(string, ...any), onLeader func()) *statusWriter {
	return &statusWriter{kube: kube, dyn: dyn, namespace: namespace, identity: identity, log: log, onLeader: onLeader,
		kick: make(chan struct{}, 1), retry: 5 * time.Second}
}

// enqueue replaces whatever is waiting to be written with statuses.
func (w *statusWriter) enqueue(statuses []policyStatus) {
	w.mu.Lock()
	w.queued, w.pending = statuses, true
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
		statuses, ok := w.queued, w.pending
		w.queued, w.pending = nil, false
		w.mu.Unlock()
		if !ok || !w.leader.Load() {
			continue
		}
		if err := w.write(ctx, statuses); err != nil && ctx.Err() == nil {
			w.log("writing policy status failed; retrying", "err", err, "retry-in", w.retry)
			w.mu.Lock()
			if !w.pending {
				w.queued, w.pending = statuses, true
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
// model's problems: rejected objects are False/Invalid; objects with rules
// that fail closed are True/RulesFailClosed, listing them; others
// True/Valid.
func desiredStatus(objs map[cluster.ObjectKey]policyObject, model *policy.Model) []policyStatus {
	problems := map[cluster.ObjectKey][]string{}
	rejected := map[cluster.ObjectKey]bool{}
	for _, err := range model.Errors {
		var oe *policy.ObjectError
		if errors.As(err, &oe) {
			problems[oe.Object] = append(problems[oe.Object], oe.Field+": "+oe.Message)
			rejected[oe.Object] = rejected[oe.Object] || oe.Rejected
		}
	}
	for key, ws := range model.ObjectWarnings {
		problems[key] = append(problems[key], ws...)
	}
	var out []policyStatus
	for key, o := range objs {
		st := policyStatus{gvr: o.gvr, obj: o.obj, status: metav1.ConditionTrue, reason: "Valid", msg: "netpol enforces this policy"}
		if ps := problems[key]; len(ps) > 0 {
			sort.Strings(ps)
			st.reason = "RulesFailClosed"
			st.msg = "enforced; these entries fail closed (an Accept rule matches nothing, a Deny/Pass rule everything): " + strings.Join(ps, "; ")
			if rejected[key] {
				st.status, st.reason = metav1.ConditionFalse, "Invalid"
				st.msg = "not enforced: " + strings.Join(ps, "; ")
			}
		}
		if len(st.msg) > 32000 {
			st.msg = st.msg[:32000] + "..."
		}
		out = append(out, st)
	}
	return out
}

// policyObject is a policy as the informer holds it.
type policyObject struct {
	gvr schema.GroupVersionResource
	obj *policyRecord
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
