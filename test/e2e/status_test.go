//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestPolicyStatus: validation problems the API server's schema lets
// through (here: label selectors with an unknown operator) show in the
// policy's status.conditions, written by exactly one agent (the Lease
// holder) and not rewritten once right.
func TestPolicyStatus(t *testing.T) {
	w := newWorld(t, "e2e")
	w.apply(`
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: valid}
spec:
  tier: Admin
  priority: 30
  subject: {namespaces: {}}
  ingress:
  - {name: deny-z, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]}
---
` + badSubject(31, "Bogus") + `---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: bad-peer}
spec:
  tier: Admin
  priority: 32
  subject: {namespaces: {}}
  ingress:
  - name: accept-odd
    action: Accept
    from:
    - namespaces: {matchExpressions: [{key: team, operator: Bogus, values: [x]}]}
`)
	want := map[string]struct{ status, reason, text string }{
		"valid":       {"True", "Valid", "enforces"},
		"bad-subject": {"False", "Invalid", "not enforced: spec.subject"},
		"bad-peer":    {"True", "RulesFailClosed", "spec.ingress[0]"},
	}
	deadline := time.Now().Add(30 * time.Second)
	for name, wc := range want {
		for {
			obj, err := w.env.Dynamic.Resource(gvrCNP).Get(w.ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c := accepted(obj); c != nil && c["status"] == wc.status && c["reason"] == wc.reason && strings.Contains(c["message"].(string), wc.text) {
				t.Logf("%s: Accepted=%s %s: %s", name, c["status"], c["reason"], c["message"])
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no condition Accepted=%s/%s mentioning %q; status is %v", name, wc.status, wc.reason, wc.text, obj.Object["status"])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// One writer, and no rewrites once the conditions are right.
	before := map[string]string{}
	for name := range want {
		obj, err := w.env.Dynamic.Resource(gvrCNP).Get(w.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[name] = obj.GetResourceVersion()
		var writers []string
		for _, mf := range obj.GetManagedFields() {
			if mf.Subresource == "status" {
				writers = append(writers, mf.Manager)
			}
		}
		if len(writers) != 1 || writers[0] != "netpol-status" {
			t.Errorf("%s: status written by %v, want only netpol-status", name, writers)
		}
	}
	time.Sleep(2 * time.Second)
	for name, rv := range before {
		obj, err := w.env.Dynamic.Resource(gvrCNP).Get(w.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if obj.GetResourceVersion() != rv {
			t.Errorf("%s was written again (resourceVersion %s -> %s) although nothing changed", name, rv, obj.GetResourceVersion())
		}
	}
}

// badSubject is ClusterNetworkPolicy bad-subject at priority prio, whose
// subject's selector has the operator op (the API server's schema lets
// any through; netpol does not enforce it).
func badSubject(prio int, op string) string {
	return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: bad-subject}
spec:
  tier: Admin
  priority: %d
  subject:
    namespaces: {matchExpressions: [{key: team, operator: %s, values: [x]}]}
  ingress:
  - {name: deny-z, action: Deny, from: [{namespaces: {}}]}
`, prio, op)
}

func accepted(obj *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Accepted" {
			return m
		}
	}
	return nil
}

// TestPolicyEvents: a policy netpol does not enforce as written and two
// Admin policies of one priority whose rules overlap get Warning Events
// (what `kubectl describe` shows), one per object and reason, written by
// one agent (the Lease holder), not once per node and not again while
// nothing changes; a changed problem updates its Event.
func TestPolicyEvents(t *testing.T) {
	w := newWorld(t, "e2e")
	w.apply(`
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: deny-dev}
spec:
  tier: Admin
  priority: 40
  subject: {namespaces: {}}
  ingress:
  - {name: dev, action: Deny, from: [{namespaces: {matchLabels: {env: dev}}}]}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: accept-all}
spec:
  tier: Admin
  priority: 40
  subject: {namespaces: {}}
  ingress:
  - {name: all, action: Accept, from: [{namespaces: {}}]}
---
` + badSubject(41, "Bogus"))
	want := map[string]struct{ reason, text string }{
		"deny-dev":    {"PolicyPriorityAmbiguous", "the API leaves their order undefined"},
		"accept-all":  {"PolicyPriorityAmbiguous", "ClusterNetworkPolicy accept-all and ClusterNetworkPolicy deny-dev have the same priority 40"},
		"bad-subject": {"PolicyNotEnforced", "not enforced: spec.subject"},
	}
	events := func() map[string][]corev1.Event {
		list, err := w.env.Client.CoreV1().Events(metav1.NamespaceDefault).List(w.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]corev1.Event{}
		for _, ev := range list.Items {
			if ev.InvolvedObject.Kind == "ClusterNetworkPolicy" {
				out[ev.InvolvedObject.Name] = append(out[ev.InvolvedObject.Name], ev)
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := events()
		ok := true
		for name, wt := range want {
			evs := got[name]
			ok = ok && len(evs) == 1 && evs[0].Reason == wt.reason && strings.Contains(evs[0].Message, wt.text)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %+v, want one per policy: %+v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := events()
	for name := range want {
		ev := got[name][0]
		obj, err := w.env.Dynamic.Resource(gvrCNP).Get(w.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != obj.GetUID() || ev.Count != 1 {
			t.Errorf("%s: event %s %s for UID %s, count %d; want a Warning for UID %s, count 1", name, ev.Type, ev.Reason, ev.InvolvedObject.UID, ev.Count, obj.GetUID())
		}
		t.Logf("%s: %s %s: %s", name, ev.Type, ev.Reason, ev.Message)
	}
	// Not written again while nothing changes, though every agent syncs.
	time.Sleep(2 * time.Second)
	for name, evs := range events() {
		if evs[0].ResourceVersion != got[name][0].ResourceVersion {
			t.Errorf("%s: the event was written again (resourceVersion %s -> %s)", name, got[name][0].ResourceVersion, evs[0].ResourceVersion)
		}
	}
	// A changed problem updates its event, in place.
	w.apply(badSubject(41, "AlsoBogus"))
	deadline = time.Now().Add(30 * time.Second)
	for {
		evs := events()["bad-subject"]
		if len(evs) == 1 && strings.Contains(evs[0].Message, "AlsoBogus") {
			break
		}
		if len(evs) != 1 || time.Now().After(deadline) {
			t.Fatalf("bad-subject's events %+v, want its one event updated to name AlsoBogus", evs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The condition follows too (a rejected policy changed into another
	// rejected form has no model of its own: the agent syncs in full).
	obj, err := w.env.Dynamic.Resource(gvrCNP).Get(w.ctx, "bad-subject", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := accepted(obj); c == nil || !strings.Contains(fmt.Sprint(c["message"]), "AlsoBogus") {
		t.Errorf("bad-subject's Accepted condition %v does not name AlsoBogus", c)
	}
}
