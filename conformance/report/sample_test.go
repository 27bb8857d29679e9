package report

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
)

var samplePods = []string{"x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"}

var sampleProbes = []l4.Port{{Protocol: corev1.ProtocolTCP, Port: 80}, {Protocol: corev1.ProtocolUDP, Port: 81}}

// table fills a truth table over the sample pods from a decision.
func table(allowed func(from, to string, p l4.Port) bool) *eval.TruthTable {
	t := &eval.TruthTable{Pods: samplePods}
	for _, p := range sampleProbes {
		t.Ports = append(t.Ports, p.String())
	}
	for _, p := range sampleProbes {
		for _, from := range samplePods {
			for _, to := range samplePods {
				t.Results = append(t.Results, eval.Result{From: from, To: to, Protocol: p.Protocol, Port: p.Port, Allowed: allowed(from, to, p)})
			}
		}
	}
	return t
}

// flip is t with the given cells inverted (the "data plane's" table).
func flip(t *eval.TruthTable, cells ...conformance.Mismatch) *eval.TruthTable {
	out := *t
	out.Results = append([]eval.Result(nil), t.Results...)
	for i, r := range out.Results {
		for _, m := range cells {
			if r.From == m.From && r.To == m.To && r.Protocol == m.Protocol && r.Port == m.Port {
				out.Results[i].Allowed = !r.Allowed
			}
		}
	}
	return &out
}

func ns(pod string) string { return strings.SplitN(pod, "/", 2)[0] }

const sampleExplain = `x/b (10.244.1.12) -> y/a (10.244.2.10) TCP/80: DENIED

Egress of x/b: ALLOWED
  Admin tier: no policy selects x/b
  NetworkPolicy tier: no NetworkPolicy isolates x/b for egress
  Baseline tier: no policy selects x/b
  Decision: ALLOWED by the Default tier: no policy decided; the default allows

Ingress of y/a: DENIED
  Admin tier: selected by AdminNetworkPolicy deny-x-to-y-a
  Decision: DENIED by the Admin tier: AdminNetworkPolicy deny-x-to-y-a ingress[0] "deny-x", action Deny`

const sampleTrace = `traced through the nftables tables: ALLOWED
  node-2 forward
    netpol/forward: ip daddr vmap @ingress-pods4   -> jump in.5f0c2a91d3e4   [10.244.2.10 : jump in.5f0c2a91d3e4]
    # NetworkPolicy y/allow-x-web ingress[0]: Allow
    netpol/in.5f0c2a91d3e4: ip saddr @peers.9b1e77a0c2d1.4 tcp dport 80 accept   -> accept   [10.244.1.12]`

const sampleExplain2 = `z/c (10.244.2.32) -> y/a (10.244.2.10) UDP/81: ALLOWED

Ingress of y/a: ALLOWED
  Admin tier: selected by AdminNetworkPolicy deny-x-to-y-a; no rule matches z/c
  NetworkPolicy tier: y/allow-x-web isolates y/a for ingress; no rule admits z/c on UDP/81
  Decision: ALLOWED by the Baseline tier: BaselineAdminNetworkPolicy default ingress[1] "allow-z", action Allow`

const sampleTrace2 = `traced through the nftables tables: DENIED
  node-2 forward
    netpol/forward: ip daddr vmap @ingress-pods4   -> jump in.5f0c2a91d3e4   [10.244.2.10 : jump in.5f0c2a91d3e4]
    netpol/in.5f0c2a91d3e4: drop   -> drop   <script>alert("not run")</script>`

const sampleYAML = `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: deny-x-to-y-a
spec:
  priority: 10
  subject:
    pods:
      namespaceSelector: {matchLabels: {ns: y}}
      podSelector: {matchLabels: {pod: a}}
  ingress:
  - name: deny-x
    action: Deny
    from:
    - namespaces: {matchLabels: {ns: x}}
`

// sampleReport is a run of two cases: one passes, one fails in its second
// step with two mismatching cells; tables cover two ports.
func sampleReport() *conformance.Report {
	all := func(string, string, l4.Port) bool { return true }
	isolated := func(from, to string, p l4.Port) bool {
		// y/a admits only x on tcp/80; everything else is open.
		if to == "y/a" {
			return ns(from) == "x" && p.Port == 80
		}
		return true
	}
	denyX := func(from, to string, p l4.Port) bool {
		if to == "y/a" {
			return ns(from) == "z" || from == "y/a"
		}
		return true
	}
	m1 := conformance.Mismatch{From: "x/b", To: "y/a", Protocol: corev1.ProtocolTCP, Port: 80, Expected: false, Observed: true, Result: "ok", Explain: sampleExplain, Trace: sampleTrace}
	m2 := conformance.Mismatch{From: "z/c", To: "y/a", Protocol: corev1.ProtocolUDP, Port: 81, Expected: true, Observed: false, Result: "timeout", Explain: sampleExplain2, Trace: sampleTrace2}
	exp2 := table(denyX)
	probes := len(samplePods) * len(samplePods) * len(sampleProbes)
	return &conformance.Report{
		Summary: conformance.Summary{Cases: 2, Steps: 3, Probes: 3 * probes, Mismatches: 2, Skipped: 162, DurationSeconds: 12.75},
		Runner:  "lab",
		Notes:   []string{"SCTP not probed: the kernel has no sctp module (162 probes skipped)"},
		Cases: []conformance.CaseResult{
			{
				Name: "target: ingress isolates y/a, allow from namespace x on tcp/80", Tags: []string{"target", "peers", "ports"},
				Passed: true, DurationSeconds: 3.5,
				Steps: []conformance.StepResult{{Step: 1, Name: "apply", Probes: probes, Mismatches: nil, Expected: table(isolated), Observed: table(isolated), Apply: "kind: NetworkPolicy\n"}},
			},
			{
				Name: "admin: ANP Deny at priority 10 beats a NetworkPolicy allow", Tags: []string{"admin", "priority"},
				Passed: false, DurationSeconds: 9.25,
				Steps: []conformance.StepResult{
					{Step: 1, Name: "allow-all baseline", Probes: probes, Mismatches: []conformance.Mismatch{}, Expected: table(all), Observed: table(all), Apply: "kind: BaselineAdminNetworkPolicy\n"},
					{Step: 2, Name: "deny x to y/a", Probes: probes, Mismatches: []conformance.Mismatch{m1, m2}, Expected: exp2, Observed: flip(exp2, m1, m2), Apply: sampleYAML},
				},
			},
		},
	}
}

// screenshotReport is the sample with a few more passing cases, as the
// docs' screenshot shows it.
func screenshotReport() *conformance.Report {
	r := sampleReport()
	extra := []struct {
		name string
		tags []string
	}{
		{"peers: ipBlock with except, egress from x/a", []string{"peers", "action"}},
		{"churn: pod label change moves y/b out of the selection", []string{"churn", "target"}},
		{"baseline: BANP Deny after an ANP Pass", []string{"baseline", "pass", "admin"}},
	}
	pass, fail := r.Cases[0], r.Cases[1]
	r.Cases = []conformance.CaseResult{pass}
	for i, e := range extra {
		c := pass
		c.Name, c.Tags, c.DurationSeconds = e.name, e.tags, 2.1+float64(i)
		r.Cases = append(r.Cases, c)
		r.Summary.Cases++
		r.Summary.Steps++
		r.Summary.Probes += c.Steps[0].Probes
		r.Summary.DurationSeconds += c.DurationSeconds
	}
	r.Cases = append(r.Cases, fail)
	return r
}
