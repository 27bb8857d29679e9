package agent

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestWriteEvents: an Event is created once, not written again while its
// problem is the same, updated in place when it changes; a new leader
// reads what the last one wrote and repeats nothing.
func TestWriteEvents(t *testing.T) {
	kube := fake.NewSimpleClientset()
	writer := func() *statusWriter { return newStatusWriter(kube, nil, "netpol-system", "agent-1", t.Logf, func() {}) }
	ctx := context.Background()
	ev := policyEvent{ref: corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Namespace: "x", Name: "bad", UID: "u1"},
		reason: reasonNotEnforced, msg: "not enforced: spec.policyTypes[0]: unsupported value"}
	writes := func() (out []string) {
		for _, a := range kube.Actions() {
			if a.GetResource().Resource == "events" && a.GetVerb() != "get" {
				out = append(out, a.GetVerb())
			}
		}
		kube.ClearActions()
		return out
	}
	step := func(w *statusWriter, e policyEvent, want ...string) {
		t.Helper()
		if err := w.writeEvents(ctx, []policyEvent{e}); err != nil {
			t.Fatal(err)
		}
		got := writes()
		if len(got) != len(want) || (len(want) == 1 && got[0] != want[0]) {
			t.Fatalf("writes %v, want %v", got, want)
		}
	}
	leader := writer()
	step(leader, ev, "create")
	step(leader, ev) // the same problem: nothing
	changed := ev
	changed.msg = "not enforced: spec.policyTypes[1]: unsupported value"
	step(leader, changed, "update")
	step(writer(), changed) // a new leader: reads, writes nothing
	recreated := changed
	recreated.ref.UID = "u2" // the object deleted and made again
	step(writer(), recreated, "update")
	list, err := kube.CoreV1().Events("x").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d events, want 1", len(list.Items))
	}
	got := list.Items[0]
	if got.Name != ev.name() || got.Message != changed.msg || got.InvolvedObject.UID != "u2" || got.Type != corev1.EventTypeWarning || got.Count != 1 {
		t.Errorf("event %+v", got)
	}
}
