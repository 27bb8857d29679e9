//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/lab"
)

// TestAgentVerdictLog: node-1's agent restarted with --audit all
// --audit-log FILE; a NetworkPolicy written to the API server admits x/b's
// ingress from x/c only. x/a's denied and x/c's allowed connections to x/b
// are one line each in the file, the pods named from the agent's caches,
// the decision as explain names it, and counted in the agent's metrics.
func TestAgentVerdictLog(t *testing.T) {
	w := newWorld(t, "e2e")
	n := w.lab.Node("node-1")
	logPath := filepath.Join(t.TempDir(), "verdicts.log")
	w.agent[n.Name].kill()
	a := w.startAgent(n, "--audit", "all", "--audit-log", logPath)
	w.apply(bFromC(""))
	to := netip.AddrPortFrom(w.podAddr("x/b"), 80)
	// (The harness's kernelLatency compares the tables with a compile
	// without the verdict log: the policy is waited for by its effect.)
	deadline := time.Now().Add(30 * time.Second)
	for sport := uint16(44000); w.lab.Dial(context.Background(), "x/a", to, corev1.ProtocolUDP, lab.DialOptions{SourcePort: sport, Timeout: 200 * time.Millisecond}).Allowed; sport++ {
		if time.Now().After(deadline) {
			t.Fatal("the policy was not enforced within 30 s")
		}
	}
	w.lab.Dial(context.Background(), "x/c", to, corev1.ProtocolUDP, lab.DialOptions{Timeout: 300 * time.Millisecond})
	want := map[string]bool{
		`deny x/a x/b UDP 80 NetworkPolicy "NetworkPolicy x/b-from-c" "" Deny node-1`:              false,
		`allow x/c x/b UDP 80 NetworkPolicy "NetworkPolicy x/b-from-c" "ingress[0]" Accept node-1`: false,
	}
	var lines []audit.Line
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lines = readVerdictLog(logPath)
		for _, l := range lines {
			key := strings.Join([]string{l.Verdict, l.Src, l.Dst, l.Protocol, strconv.Itoa(int(l.Port)), quote(l.Tier, l.Policy, l.Rule), l.Action, l.Node}, " ")
			if _, ok := want[key]; ok {
				want[key] = true
			}
		}
		if !want[`deny x/a x/b UDP 80 NetworkPolicy "NetworkPolicy x/b-from-c" "" Deny node-1`] ||
			!want[`allow x/c x/b UDP 80 NetworkPolicy "NetworkPolicy x/b-from-c" "ingress[0]" Accept node-1`] {
			continue
		}
		break
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("the verdict log lacks %s; it has %+v", k, lines)
		}
	}
	if got := a.metric(t, `netpol_audit_lines_total{result="written"}`); got < 2 {
		t.Errorf("netpol_audit_lines_total{result=\"written\"} = %v, want 2 or more", got)
	}
	if got := a.metric(t, "netpol_audit_decisions_total"); got < 2 {
		t.Errorf("netpol_audit_decisions_total = %v, want 2 or more", got)
	}
}

// readVerdictLog is the lines of the verdict log file so far (a line
// being written is left out).
func readVerdictLog(path string) []audit.Line {
	data, _ := os.ReadFile(path)
	var out []audit.Line
	for _, s := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var l audit.Line
		if s != "" && json.Unmarshal([]byte(s), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// bFromC is the NetworkPolicy that admits only x/c to x/b, with extra
// metadata (", annotations: {...}") when not "".
func bFromC(metadata string) string {
	return `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-c, namespace: x` + metadata + `}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
`
}

// quote is tier, then policy and rule quoted.
func quote(tier, pol, rule string) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return tier + " " + q(pol) + " " + q(rule)
}
