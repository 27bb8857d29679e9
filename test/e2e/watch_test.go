//go:build e2e

package e2e

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
	cmd := exec.Command(netpolBin, "model", "watch", "--agent", w.agent["node-2"].debug, "--interval", "50ms")
	var mu sync.Mutex
	var out bytes.Buffer
	cmd.Stdout = writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	text := func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String()
	}
	waitFor := func(what string, ok func(string) bool) {
		deadline := time.Now().Add(15 * time.Second)
		for !ok(text()) {
			if time.Now().After(deadline) {
				t.Fatalf("model watch never printed %s; it printed:\n%s", what, text())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("the base chains", func(s string) bool {
		return strings.Contains(s, "+ chain forward [0] ct state established,related accept")
	})
	// x/a (10.244.2.10) is on node-2: isolating x gives it an ingress class.
	w.converged("isolate x", w.apply(isolateX))
	waitFor("x/a joining the ingress dispatch map", func(s string) bool { return strings.Contains(s, "+ set ingress-pods4 10.244.2.10 : jump in.") })
	w.converged("un-isolate x", w.delete(gvrNetworkPolicy, "x", "from-x-only"))
	waitFor("x/a leaving it", func(s string) bool { return strings.Contains(s, "- set ingress-pods4 10.244.2.10 : jump in.") })
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
