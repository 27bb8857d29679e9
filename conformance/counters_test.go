package conformance_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// The policies of the counters' lab test: every kind of deciding rule.
// x/b's ingress: an Admin Deny (y/a) and Pass (the rest of y), then a
// NetworkPolicy's allow (x/c) or isolation. y/b's ingress: isolated by two
// NetworkPolicies that allow nothing. z/a's egress: an Admin Accept to x.
// z's ingress: a Baseline Deny (from y) and Pass (from x).
const counterPolicies = `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: guard-xb}
spec:
  tier: Admin
  priority: 10
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      podSelector: {matchLabels: {pod: b}}
  ingress:
  - name: deny-y-a
    action: Deny
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}
        podSelector: {matchLabels: {pod: a}}
  - name: pass-y
    action: Pass
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: za-to-x}
spec:
  tier: Admin
  priority: 20
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}
      podSelector: {matchLabels: {pod: a}}
  egress:
  - name: to-x
    action: Accept
    to:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-b, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-b-too, namespace: "y"}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: z-baseline}
spec:
  tier: Baseline
  priority: 5
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}
  ingress:
  - name: deny-y
    action: Deny
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}
  - name: pass-x
    action: Pass
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}
`

// counterKey names a per-rule counter as the evaluator's words do.
func counterKey(policyRef, rule, action, direction string) string {
	return policyRef + " " + rule + " " + action + " " + direction
}

// expectedCounts adds to want the decisions explain gives each cell: in
// each direction the packet reaches (ingress only when egress allows),
// the Pass rules that matched and the rule that decided, or each
// isolating policy of a NetworkPolicy tier's deny.
func expectedCounts(t *testing.T, ev *eval.Evaluator, cells []lab.Cell, family ipfamily.Family, want map[string]uint64) {
	t.Helper()
	for _, c := range cells {
		v, err := ev.Explain(c.From, c.To, c.Probe, family)
		if err != nil {
			t.Fatal(err)
		}
		for _, dv := range []*eval.DirectionVerdict{v.Egress, v.Ingress} {
			if dv == nil || !dv.Applies {
				continue
			}
			d := "egress"
			if dv == v.Ingress {
				d = "ingress"
			}
			for _, s := range dv.Skipped {
				if strings.HasPrefix(s.Why, "matched: Pass") {
					want[counterKey(s.Policy, s.Rule, s.Action, d)]++
				}
			}
			switch {
			case dv.Tier == policy.TierNetworkPolicy.String() && dv.Action == policy.Deny.String():
				for ref := range strings.SplitSeq(dv.Policy, ", ") {
					want[counterKey(ref, compiler.IsolationRule, dv.Action, d)]++
				}
			case dv.Policy != "":
				want[counterKey(dv.Policy, dv.Rule, dv.Action, d)]++
			}
			if !dv.Allowed {
				break // the packet goes no further
			}
		}
	}
}

// labCounts sums the nodes' per-rule counters by counterKey, and gives
// each node's counters by "node counter"; a counter with packets must
// have at least 20 bytes of each.
func labCounts(t *testing.T, enf *conformance.Enforcer) (packets map[string]uint64, values map[string]nft.CounterValue) {
	t.Helper()
	byNode, err := enf.RuleCounts()
	if err != nil {
		t.Fatal(err)
	}
	packets, values = map[string]uint64{}, map[string]nft.CounterValue{}
	for nodeName, counts := range byNode {
		for _, c := range counts {
			k := counterKey(c.Policy(), c.Rule, c.Action, c.Direction)
			packets[k] += c.Packets
			values[nodeName+" "+c.Counter] = c.CounterValue
			if c.Packets > 0 && c.Bytes < 20*c.Packets {
				t.Errorf("%s on %s: %d packets of %d bytes", k, nodeName, c.Packets, c.Bytes)
			}
		}
	}
	return packets, values
}

// probeAll dials every cell once (no retry; under a second, so a denied
// TCP connection sends one SYN) and checks each against the evaluator.
func probeAll(t *testing.T, l *lab.Lab, ev *eval.Evaluator, cells []lab.Cell, family ipfamily.Family) {
	t.Helper()
	obs, err := l.ProbeCells(context.Background(), cells, lab.ProbeOptions{Family: family, Timeout: 700 * time.Millisecond, NoRetry: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range obs {
		v, err := ev.Explain(cells[i].From, cells[i].To, cells[i].Probe, family)
		if err != nil {
			t.Fatal(err)
		}
		if o.Allowed != v.Allowed {
			t.Errorf("%s -> %s %s (%s): the kernel says allowed=%v, explain %v", o.From, o.To, o.Probe, familyWord(family), o.Allowed, v.Allowed)
		}
	}
}

func familyWord(f ipfamily.Family) string {
	if f == ipfamily.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// TestRuleCountersCountDecisions: after a probe of every pair of pods
// (TCP and UDP, IPv4 and IPv6), each policy rule's counter, summed over the
// nodes, holds exactly the probes explain says that rule decided (Admin
// and Baseline Accept, Deny and Pass, a NetworkPolicy's allow, the
// isolation of one or two NetworkPolicies), and no other counter counts.
// A sync that rewrites a policy's chain (a rule added to it) and adds a
// policy leaves every counter as it was; the next probes add to them.
func TestRuleCountersCountDecisions(t *testing.T) {
	requireRoot(t)
	snap := strictSnapshot(t, counterPolicies, nil)
	l := labtest.Up(t, snap, lab.Options{})
	enf := conformance.NewEnforcer(l)
	enf.Layout = compiler.LayoutIdentities
	defer enf.Close()
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	var cells []lab.Cell
	var pods []string
	for _, p := range l.Pods() {
		if !p.HostNetwork {
			pods = append(pods, p.Name)
		}
	}
	for _, from := range pods {
		for _, to := range pods {
			if from == to {
				continue
			}
			for _, pr := range []l4.Port{{Protocol: corev1.ProtocolTCP, Port: 80}, {Protocol: corev1.ProtocolUDP, Port: 81}} {
				cells = append(cells, lab.Cell{From: from, To: to, Probe: pr})
			}
		}
	}
	families := []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}
	want := map[string]uint64{}
	run := func(snap *cluster.Snapshot) {
		ev := eval.New(snap, policy.Build(snap))
		for _, f := range families {
			probeAll(t, l, ev, cells, f)
			expectedCounts(t, ev, cells, f, want)
		}
	}
	check := func(step string) map[string]nft.CounterValue {
		got, values := labCounts(t, enf)
		for k, n := range got {
			if n != want[k] {
				t.Errorf("%s: counter %s: %d packets, want %d", step, k, n, want[k])
			}
		}
		for k, n := range want {
			if _, ok := got[k]; !ok {
				t.Errorf("%s: no counter %s (want %d packets)", step, k, n)
			}
		}
		return values
	}
	run(snap)
	before := check("first probes")
	t.Logf("%d probes; counters: %v", 2*len(cells), want)
	if len(want) < 8 {
		t.Fatalf("the probes exercised %d rules: %v", len(want), want)
	}

	// A rule added to guard-xb (its chain is made again) and a policy
	// added: the counters stay as they were.
	changed := strictSnapshot(t, strings.Replace(counterPolicies, "  - name: pass-y\n", `  - name: pass-y
    action: Pass
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}
  - name: accept-z-c
    action: Accept
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}
        podSelector: {matchLabels: {pod: c}}
  - name: unused
`, 1)+`---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-c, namespace: z}
spec:
  podSelector: {matchLabels: {pod: c}}
  policyTypes: [Egress]
`, nil)
	rep, err := enf.Sync(changed)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range rep.Nodes {
		t.Logf("%s: %+v", name, r.Stats)
	}
	_, after := labCounts(t, enf)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("counter %s: %+v before the sync, %+v after", k, v, after[k])
		}
	}
	if !slices.ContainsFunc(slices.Collect(maps.Values(rep.Nodes)), func(n conformance.NodeSync) bool { return n.Stats.ChainsAdded > 0 }) {
		t.Errorf("the sync made no chain: it did not rewrite guard-xb's")
	}
	run(changed)
	check("after the change")
}
