//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/lab"
)

// TestAgentStagedPolicy: staging an enforced NetworkPolicy (annotation
// netpol.io/staged: "true") stops the agents enforcing it; removing the
// annotation enforces it again. Each state is waited for by its effect on
// real connections, and the tables then equal the compile of the live
// cluster.
func TestAgentStagedPolicy(t *testing.T) {
	w := newWorld(t, "e2e")
	to := netip.AddrPortFrom(w.podAddr("x/b"), 80)
	step := func(change, annotations string, allowed bool) {
		t.Helper()
		written := time.Now()
		w.apply(bFromC(annotations))
		// The kernels equal the compile of the live cluster, and the
		// probed matrix the evaluator's table.
		w.converged(change, written)
		if got := w.lab.Dial(context.Background(), "x/a", to, corev1.ProtocolUDP, lab.DialOptions{Timeout: 300 * time.Millisecond}).Allowed; got != allowed {
			t.Errorf("%s: x/a -> x/b allowed=%v, want %v", change, got, allowed)
		}
	}
	step("b-from-c enforced", "", false)
	step("b-from-c staged", `, annotations: {netpol.io/staged: "true"}`, true)
	step("b-from-c enforced again", `, annotations: {netpol.io/staged: "false"}`, false)
}
