//go:build e2e

package e2e

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/netpol/netpol/internal/syncbuf"
)

// TestCRDsInstalledLater starts the agents on a cluster without the policy
// CRDs; once they are installed the agents notice (CRD watch, new
// discovery) and enforce a ClusterNetworkPolicy.
func TestCRDsInstalledLater(t *testing.T) {
	w := newWorldWith(t, "e2e", false)
	installCRDs(t, w.env)
	w.converged("a ClusterNetworkPolicy right after its CRD", w.apply(`
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: z-isolated}
spec:
  tier: Admin
  priority: 1
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}
  ingress:
  - {name: deny-all, action: Deny, from: [{namespaces: {}}]}
`))
}

// TestModelWatch runs `netpol model watch` against an agent: it prints the
// model, then + and - lines as a change reaches the node.
func TestModelWatch(t *testing.T) {
	w := newWorld(t, "e2e")
	watch := startOutput(t, "model watch", exec.Command(netpolBin, "model", "watch", "--agent", w.agent["node-2"].debug, "--interval", "50ms"))
	watch.waitFor("the base chains", func(s string) bool {
		return strings.Contains(s, "+ chain forward [0] ct state established,related accept")
	})
	// x/a (10.244.2.10) is on node-2: isolating x gives it an ingress class.
	w.converged("isolate x", w.apply(isolateX))
	watch.waitFor("x/a joining the ingress dispatch map", func(s string) bool { return strings.Contains(s, "+ set ingress-pods4 10.244.2.10 : jump in.") })
	w.converged("un-isolate x", w.delete(gvrNetworkPolicy, "x", "from-x-only"))
	watch.waitFor("x/a leaving it", func(s string) bool { return strings.Contains(s, "- set ingress-pods4 10.244.2.10 : jump in.") })
}

// cmdOutput is what a running command (a watch) printed so far, on stdout
// and stderr.
type cmdOutput struct {
	t    testing.TB
	name string // the command, in messages
	syncbuf.Buffer
}

// startOutput starts cmd, called name in messages, collecting its output;
// it is killed when the test ends.
func startOutput(t testing.TB, name string, cmd *exec.Cmd) *cmdOutput {
	o := &cmdOutput{t: t, name: name}
	cmd.Stdout, cmd.Stderr = o, o
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return o
}

// waitFor waits until the output satisfies ok; after 15s the test fails,
// saying the command never printed what.
func (o *cmdOutput) waitFor(what string, ok func(string) bool) {
	o.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok(o.String()) {
		if time.Now().After(deadline) {
			o.t.Fatalf("%s never printed %s; it printed:\n%s", o.name, what, o.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
