//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

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
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: bad-subject}
spec:
  tier: Admin
  priority: 31
  subject:
    namespaces: {matchExpressions: [{key: team, operator: Bogus, values: [x]}]}
  ingress:
  - {name: deny-z, action: Deny, from: [{namespaces: {}}]}
---
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

func accepted(obj *unstructured.Unstructured) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Accepted" {
			return m
		}
	}
	return nil
}
