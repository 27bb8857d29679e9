package eval_test

import (
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

func loadWith(t *testing.T, extra string) *eval.Evaluator {
	t.Helper()
	snap, report := cluster.LoadPaths([]string{testdata + "/base/e2e.yaml"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	if r := snap.AddDocuments([]byte(extra), "test", true); len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	model := policy.Build(snap)
	if len(model.Errors) > 0 {
		t.Fatal(model.Errors)
	}
	return eval.New(snap, model)
}

const samePriority = `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: b-allow}
spec:
  priority: 5
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}}
  ingress:
  - {name: allow-x, action: Allow, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}]}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: a-deny}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}}
  ingress:
  - name: deny-x-80
    action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
  - name: deny-z
    action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]
`

func TestTraceSamePriorityIsFlaggedAmbiguous(t *testing.T) {
	ev := loadWith(t, samePriority)
	v, err := ev.Explain("x/a", "y/a", l4.Port{Protocol: "TCP", Port: 80}, ipfamily.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	in := v.Ingress
	// Deterministic order: AdminNetworkPolicy sorts before ClusterNetworkPolicy.
	if in.Policy != "AdminNetworkPolicy b-allow" || in.Action != "Accept" || !v.Allowed {
		t.Fatalf("decided by %s %s (%s), allowed=%v", in.Policy, in.Rule, in.Action, v.Allowed)
	}
	if len(in.Ambiguous) != 1 || !strings.Contains(in.Ambiguous[0], "ClusterNetworkPolicy a-deny") ||
		!strings.Contains(in.Ambiguous[0], "AdminNetworkPolicy b-allow") {
		t.Errorf("ambiguous = %q, want one entry naming both policies", in.Ambiguous)
	}
	// On port 81 the CNP's first rule does not match: no ambiguity.
	v, _ = ev.Explain("x/a", "y/a", l4.Port{Protocol: "TCP", Port: 81}, ipfamily.IPv4)
	if len(v.Ingress.Ambiguous) != 0 {
		t.Errorf("port 81: ambiguous = %q, want none", v.Ingress.Ambiguous)
	}
}

func TestTraceSaysWhyEachEarlierRuleDidNotDecide(t *testing.T) {
	ev := loadWith(t, samePriority+`
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-c, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: c}}
  ingress: [{}]
`)
	v, err := ev.Explain("z/b", "y/a", l4.Port{Protocol: "TCP", Port: 81}, ipfamily.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	in := v.Ingress
	if in.Tier != "Admin" || in.Rule != `ingress[1] "deny-z"` || v.Allowed {
		t.Fatalf("decided by %s %s, allowed=%v", in.Tier, in.Rule, v.Allowed)
	}
	want := []eval.Step{
		{Tier: "Admin", Policy: "AdminNetworkPolicy b-allow", Rule: `ingress[0] "allow-x"`, Action: "Accept", Why: "peer did not match"},
		{Tier: "Admin", Policy: "ClusterNetworkPolicy a-deny", Rule: `ingress[0] "deny-x-80"`, Action: "Deny", Why: "port did not match"},
	}
	if len(in.Skipped) != len(want) {
		t.Fatalf("skipped = %+v, want %+v", in.Skipped, want)
	}
	for i := range want {
		if in.Skipped[i] != want[i] {
			t.Errorf("skipped[%d] = %+v, want %+v", i, in.Skipped[i], want[i])
		}
	}
	// y/c is selected by the NetworkPolicy; y/a is not, and the trace of a
	// connection reaching the NetworkPolicy tier says so.
	v, _ = ev.Explain("y/b", "y/a", l4.Port{Protocol: "UDP", Port: 81}, ipfamily.IPv4)
	found := false
	for _, s := range v.Ingress.Skipped {
		if s.Policy == "NetworkPolicy y/only-c" && s.Why == "subject not selected" {
			found = true
		}
	}
	if !found {
		t.Errorf("no 'subject not selected' step for NetworkPolicy y/only-c: %+v", v.Ingress.Skipped)
	}
}

func TestBareAddressesAndHostNetwork(t *testing.T) {
	ev := loadWith(t, `
apiVersion: v1
kind: Pod
metadata: {name: agent, namespace: x, labels: {pod: agent}}
spec:
  nodeName: node-1
  hostNetwork: true
  containers: [{name: agent}]
status: {phase: Running, podIP: 172.18.0.2, podIPs: [{ip: 172.18.0.2}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`)
	probe := l4.Port{Protocol: "TCP", Port: 80}
	for _, tc := range []struct {
		src, dst string
		allowed  bool
		why      string
	}{
		// x/b runs on node-1; its own node's address is always let in.
		{"172.18.0.2", "x/b", true, "own node"},
		{"x/agent", "x/b", true, "own node"},
		// x/a runs on node-2: the deny-all applies to node-1's address.
		{"x/agent", "x/a", false, "isolated"},
		{"192.0.2.7", "x/a", false, "isolated"},
		// The host-network pod is not a subject: nothing polices its ingress.
		{"y/a", "x/agent", true, "host-network pod"},
		// An IP that belongs to a pod is that pod, written as IPv6 too
		// (an IPv4-mapped address: IPv4 to the kernel).
		{"10.244.1.11", "y/a", false, "isolated"},
		{"::ffff:10.244.1.11", "y/a", false, "isolated"},
		{"::ffff:172.18.0.2", "x/b", true, "own node"},
	} {
		v, err := ev.Explain(tc.src, tc.dst, probe, ipfamily.Any)
		if err != nil {
			t.Fatalf("%s -> %s: %v", tc.src, tc.dst, err)
		}
		reasons := v.Egress.Reason + " | " + v.Ingress.Reason
		if v.Allowed != tc.allowed || !strings.Contains(reasons, tc.why) {
			t.Errorf("%s -> %s: allowed=%v (%s), want %v mentioning %q", tc.src, tc.dst, v.Allowed, reasons, tc.allowed, tc.why)
		}
	}
}
