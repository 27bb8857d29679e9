//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/lab"
)

// TestAgentStrictMode: the agents run with their defaults (--strict, at
// most one check per --strict-interval of 1 s). A NetworkPolicy written
// to the API server isolates x/b for ingress from x/c only: the open UDP
// flow from x/a (a fixed source port, so that a datagram later is the
// same conntrack entry) is ended by node-1's agent, which counts and logs
// it, and its next datagram is dropped; x/c's open flow goes on.
func TestAgentStrictMode(t *testing.T) {
	w := newWorld(t, "e2e")
	ctx := context.Background()
	to := netip.AddrPortFrom(w.podAddr("x/b"), 80)
	dial := func(from string, sport uint16) bool {
		return w.lab.Dial(ctx, from, to, corev1.ProtocolUDP, lab.DialOptions{SourcePort: sport, Timeout: 500 * time.Millisecond}).Allowed
	}
	// The initial matrix's probes left flows of their own (UDP entries
	// live 30 s), some of which the policy denies too.
	if err := w.lab.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	const deniedPort, keptPort = 42001, 42002
	if !dial("x/a", deniedPort) || !dial("x/c", keptPort) {
		t.Fatal("the flows were not answered before the policy")
	}
	endedBefore := w.agent["node-1"].metric(t, "netpol_strict_connections_ended_total")
	written := w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
`)
	took, _, _ := w.kernelLatency(written)
	t.Logf("the kernels took the policy in %v", took.Round(time.Millisecond))
	// The check runs with the sync, or at most a strict interval after
	// the check before it.
	deadline := time.Now().Add(5 * time.Second)
	for w.agent["node-1"].metric(t, "netpol_strict_connections_ended_total") <= endedBefore {
		if time.Now().After(deadline) {
			t.Fatal("node-1's agent ended no flow within 5 s of the policy")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ended := w.agent["node-1"].metric(t, "netpol_strict_connections_ended_total") - endedBefore
	if ended != 1 {
		t.Errorf("node-1's agent ended %v flows, want 1 (x/a's)", ended)
	}
	if dial("x/a", deniedPort) {
		t.Error("x/a's flow is still answered after strict mode ended it")
	}
	if !dial("x/c", keptPort) {
		t.Error("x/c's flow, which the policy allows, is no longer answered")
	}
	data, err := os.ReadFile(w.agent["node-1"].log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "strict mode ended the open flows the new policy denies") {
		t.Error("node-1's agent did not log what strict mode ended")
	}
}
