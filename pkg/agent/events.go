package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// Warning Events on policy objects, written by the status writer (the
// Lease holder) beside the Accepted condition: what `kubectl describe`
// shows of a policy netpol cannot enforce as written (NetworkPolicies
// included, which have no status), of entries that fail closed, and of
// two Admin or Baseline policies of one priority whose rules overlap.
// One Event per object and reason, named after both: a problem that
// stays is not written again (a new leader reads the Event first), a
// changed one updates it.
const (
	reasonNotEnforced       = "PolicyNotEnforced"
	reasonRulesFailClosed   = "PolicyRulesFailClosed"
	reasonPriorityAmbiguous = "PolicyPriorityAmbiguous"
)

// eventRefresh is how old an Event of a lasting problem may grow before
// its lastTimestamp is renewed (the API server drops Events an hour old
// by default).
const eventRefresh = 30 * time.Minute

// policyEvent is a Warning Event one policy object should carry.
type policyEvent struct {
	ref    corev1.ObjectReference
	reason string
	msg    string
}

// name is the Event's name: the object's, then a hash of what the Event
// is about (kind, namespace, name, reason).
func (e policyEvent) name() string {
	sum := sha256.Sum256([]byte(strings.Join([]string{e.ref.Kind, e.ref.Namespace, e.ref.Name, e.reason}, "/")))
	prefix := e.ref.Name
	if len(prefix) > 200 {
		prefix = prefix[:200]
	}
	return prefix + ".netpol-" + hex.EncodeToString(sum[:6])
}

// namespace is where the Event lives: the object's, or "default" for a
// cluster-scoped object (as the API server's own Events do).
func (e policyEvent) namespace() string {
	if e.ref.Namespace == "" {
		return metav1.NamespaceDefault
	}
	return e.ref.Namespace
}

// desiredEvents are the Events the model's problems (objectProblems) and
// its same-priority overlaps call for, on the
// admin and cluster policies of objs and the NetworkPolicies npRef finds
// (only those with a problem are looked up).
func desiredEvents(objs map[cluster.ObjectKey]policyObject, npRef func(namespace, name string) (corev1.ObjectReference, bool),
	model *policy.Model, problems map[cluster.ObjectKey]problems) []policyEvent {
	refOf := func(key cluster.ObjectKey) (corev1.ObjectReference, bool) {
		if key.Kind == cluster.KindNetworkPolicy {
			return npRef(key.Namespace, key.Name)
		}
		o, ok := objs[key]
		if !ok {
			return corev1.ObjectReference{}, false
		}
		return o.ref(), true
	}
	var out []policyEvent
	for key, p := range problems {
		ref, ok := refOf(key)
		if !ok {
			continue
		}
		reason := reasonRulesFailClosed
		if p.rejected {
			reason = reasonNotEnforced
		}
		out = append(out, policyEvent{ref: ref, reason: reason, msg: p.message()})
	}
	ambiguous := map[cluster.ObjectKey][]string{}
	for _, ov := range policy.SamePriorityOverlaps(model) {
		for _, p := range []*policy.Policy{ov.First, ov.Second} {
			key := cluster.ObjectKey{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}
			ambiguous[key] = append(ambiguous[key], ov.String())
		}
	}
	for key, msgs := range ambiguous {
		if ref, ok := refOf(key); ok {
			sort.Strings(msgs)
			out = append(out, policyEvent{ref: ref, reason: reasonPriorityAmbiguous, msg: strings.Join(slices.Compact(msgs), "; ")})
		}
	}
	slices.SortFunc(out, func(a, b policyEvent) int { return strings.Compare(a.name(), b.name()) })
	return out
}

// writtenEvent is what the writer last wrote, or found, of an Event.
type writtenEvent struct {
	msg string
	uid string
	at  time.Time
}

// writeEvents creates the Events that are missing and updates those whose
// message or object changed, or whose problem outlived eventRefresh;
// only the Lease holder calls it.
func (w *statusWriter) writeEvents(ctx context.Context, events []policyEvent) error {
	var errs []error
	now := time.Now()
	wanted := make(map[string]bool, len(events))
	for _, ev := range events {
		wanted[ev.name()] = true
	}
	// An Event no longer wanted stays until it expires; the writer
	// forgets it (should its problem come back, it reads it again).
	maps.DeleteFunc(w.events, func(name string, _ writtenEvent) bool { return !wanted[name] })
	for _, ev := range events {
		name := ev.name()
		if last, ok := w.events[name]; ok && last.msg == ev.msg && last.uid == string(ev.ref.UID) && now.Sub(last.at) < eventRefresh {
			continue
		}
		client := w.kube.CoreV1().Events(ev.namespace())
		cur, err := client.Get(ctx, name, metav1.GetOptions{})
		at := now
		switch {
		case apierrors.IsNotFound(err):
			_, err = client.Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: ev.namespace()},
				InvolvedObject: ev.ref, Reason: ev.reason, Message: ev.msg, Type: corev1.EventTypeWarning,
				Source:         corev1.EventSource{Component: statusFieldManager},
				FirstTimestamp: metav1.NewTime(now), LastTimestamp: metav1.NewTime(now), Count: 1,
				ReportingController: "netpol.io/agent", ReportingInstance: w.identity, Action: "Enforce",
			}, metav1.CreateOptions{})
		case err == nil && (cur.Message != ev.msg || cur.InvolvedObject.UID != ev.ref.UID || now.Sub(cur.LastTimestamp.Time) >= eventRefresh):
			cur.InvolvedObject, cur.Message, cur.LastTimestamp = ev.ref, ev.msg, metav1.NewTime(now)
			_, err = client.Update(ctx, cur, metav1.UpdateOptions{})
		case err == nil:
			at = cur.LastTimestamp.Time // as it should be: a leader before this one wrote it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("event %s/%s on %s %s: %w", ev.namespace(), name, ev.ref.Kind, ev.ref.Name, err))
			continue
		}
		w.events[name] = writtenEvent{msg: ev.msg, uid: string(ev.ref.UID), at: at}
	}
	return errors.Join(errs...)
}
