//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/lab"
)

// TestAgentStagedPolicy: staging an enforced NetworkPolicy (annotation
// netpol.io/staged: "true") stops the agents enforcing it, and node-1's
// agent (x/b's) logs each connection the policy would deny with "staged":
// true (would deny, enforced allow, the policy as explain names its
// isolation) and counts them in netpol_staged_verdict_changes_total;
// removing the annotation enforces it again. Each state is waited for by
// its effect on real connections, and the tables then equal the compile of
// the live cluster (with the staged policy beside the enforced ones).
func TestAgentStagedPolicy(t *testing.T) {
	w := newWorld(t, "e2e")
	n := w.lab.Node("node-1")
	logPath := filepath.Join(t.TempDir(), "verdicts.log")
	w.agent[n.Name].kill()
	a := w.startAgent(n, "--audit-log", logPath) // the verdict log at off: the staged lines alone
	to := netip.AddrPortFrom(w.podAddr("x/b"), 80)
	sport := uint16(46000)
	dial := func(from string) bool {
		sport++
		return w.lab.Dial(context.Background(), from, to, corev1.ProtocolUDP, lab.DialOptions{SourcePort: sport, Timeout: 300 * time.Millisecond}).Allowed
	}
	step := func(change, annotations string, allowed bool) {
		t.Helper()
		written := time.Now()
		w.apply(bFromC(annotations))
		// The kernels equal the compile of the live cluster, and the
		// probed matrix the evaluator's table.
		w.converged(change, written)
		if got := dial("x/a"); got != allowed {
			t.Errorf("%s: x/a -> x/b allowed=%v, want %v", change, got, allowed)
		}
	}
	step("b-from-c enforced", "", false)
	step("b-from-c staged", `, annotations: {netpol.io/staged: "true"}`, true)
	const changes = `netpol_staged_verdict_changes_total{kind="NetworkPolicy",name="b-from-c",namespace="x",verdict="deny"}`
	before := a.metric(t, changes)
	const more = 3
	for range more {
		if !dial("x/a") {
			t.Fatal("x/a -> x/b denied while the policy is staged")
		}
	}
	if !dial("x/c") {
		t.Fatal("x/c -> x/b denied")
	}
	if got := a.metric(t, changes) - before; got != more {
		t.Errorf("%s grew by %v, want %d", changes, got, more)
	}
	var lines []audit.Line
	found := false
	for deadline := time.Now().Add(5 * time.Second); !found && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		lines = readVerdictLog(logPath)
		for _, l := range lines {
			if l.Staged && l.Src == "x/a" && l.Dst == "x/b" && l.Verdict == "deny" && l.Enforced == "allow" && l.Direction == "ingress" &&
				l.Tier == "NetworkPolicy" && l.Policy == "NetworkPolicy x/b-from-c" && l.Rule == "" && l.Action == "Deny" && l.Node == "node-1" {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("no staged line for x/a -> x/b; the log has %+v", lines)
	}
	// The matrix probed at each step gave the other sources' lines: the
	// staged policy's, to x/b, and none from x/c, which it allows.
	for _, l := range lines {
		if !l.Staged || l.Dst != "x/b" || l.Policy != "NetworkPolicy x/b-from-c" || l.Src == "x/c" {
			t.Errorf("a line the staged policy does not explain: %+v", l)
		}
	}
	step("b-from-c enforced again", `, annotations: {netpol.io/staged: "false"}`, false)
}
