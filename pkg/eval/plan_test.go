package eval_test

import (
	"testing"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
)

const planPolicies = `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}}
  ingress:
  - {name: pass-x, action: Pass, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}]}
  - {name: deny-odd, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}], protocols: [{future: {}}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-a, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{podSelector: {}}]
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {namespaces: {}}
  egress:
  - {name: deny-all, action: Deny, to: [{namespaces: {}}]}
`

// The plan is the one statement of the tier semantics: its content for a
// few pods, and the sharing of equal plans.
func TestPlan(t *testing.T) {
	ev := loadWith(t, planPolicies)
	r := ev.Resolved()
	pod := func(key string) int {
		for i := 0; i < r.NumPods(); i++ {
			if r.Pod(i).Key == key {
				return i
			}
		}
		t.Fatalf("no pod %s", key)
		return -1
	}
	ya, yb, za := pod("y/a"), pod("y/b"), pod("z/a")

	in := r.Plan(ya, policy.Ingress)
	if len(in.Admin) != 2 || in.Admin[0].Action != policy.Pass || in.Admin[0].Match != eval.MatchPeersPorts {
		t.Fatalf("y/a ingress Admin rules %+v", in.Admin)
	}
	if in.Admin[1].Action != policy.Deny || in.Admin[1].Match != eval.MatchAll {
		t.Errorf("a Deny with an unknown protocol entry must match everything: %+v", in.Admin[1])
	}
	if len(in.Isolating) != 1 || len(in.Allow) != 1 || !in.OwnNodeAllowed {
		t.Errorf("y/a ingress isolated by only-a with its own node allowed: %+v", in)
	}
	// y/b: the same Admin rules, not isolated: no own-node exception.
	if b := r.Plan(yb, policy.Ingress); len(b.Isolating) != 0 || b.OwnNodeAllowed || len(b.Admin) != 2 || b.Key == in.Key {
		t.Errorf("y/b ingress %+v", b)
	}
	// Egress: only the baseline; every pod shares one plan.
	eg := r.Plan(ya, policy.Egress)
	if len(eg.Admin) != 0 || len(eg.Isolating) != 0 || eg.OwnNodeAllowed || len(eg.Baseline) != 1 || eg.Baseline[0].Action != policy.Deny {
		t.Errorf("y/a egress %+v", eg)
	}
	if r.Plan(za, policy.Egress) != eg {
		t.Errorf("equal plans are not shared")
	}
	if r.Plan(za, policy.Ingress).Empty() != true {
		t.Errorf("z/a ingress: no policy applies, plan %+v", r.Plan(za, policy.Ingress))
	}
}
