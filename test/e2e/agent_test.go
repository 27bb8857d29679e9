//go:build e2e

package e2e

import (
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/policy"
)

// TestAgentConverges changes every kind of input the agents watch, one at
// a time, and after each checks that every node's kernel matches the
// compiled live state and the probed matrix equals the evaluator's table.
func TestAgentConverges(t *testing.T) {
	w := newWorld(t, "e2e")
	steps := []struct {
		name string
		do   func() time.Time
	}{
		{"create a NetworkPolicy: x isolated for ingress, only from y", func() time.Time {
			return w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: blue}}
`)
		}},
		{"label namespace y team=blue (selected by the policy)", func() time.Time {
			return w.patch("namespaces", "", "y", `{"metadata":{"labels":{"team":"blue"}}}`)
		}},
		{"update the NetworkPolicy: only TCP 80, and egress isolation for x/a", func() time.Time {
			return w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: blue}}
    ports:
    - {protocol: TCP, port: 80}
  egress:
  - to:
    - podSelector: {}
`)
		}},
		{"Admin ClusterNetworkPolicy: z may not reach pods labelled pod=b", func() time.Time {
			return w.apply(`
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: z-not-to-b}
spec:
  tier: Admin
  priority: 10
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}
  egress:
  - name: deny-b
    action: Deny
    to:
    - pods:
        namespaceSelector: {}
        podSelector: {matchLabels: {pod: b}}
`)
		}},
		{"relabel pod y/c as pod=b (now denied from z)", func() time.Time {
			return w.patch("pods", "y", "c", `{"metadata":{"labels":{"pod":"b"}}}`)
		}},
		{"AdminNetworkPolicy passes y -> z UDP, BaselineAdminNetworkPolicy denies it", func() time.Time {
			return w.apply(`
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: pass-udp-to-z}
spec:
  priority: 5
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}
  ingress:
  - name: pass-udp
    action: Pass
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}
    ports:
    - portRange: {protocol: UDP, start: 80, end: 81}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}
  ingress:
  - name: deny-y
    action: Deny
    from:
    - namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}
`)
		}},
		{"Baseline ClusterNetworkPolicy: nothing reaches x/a on TCP 81", func() time.Time {
			return w.apply(`
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-x-a}
spec:
  tier: Baseline
  priority: 20
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "x"}}
      podSelector: {matchLabels: {pod: a}}
  ingress:
  - name: deny-81
    action: Deny
    from:
    - namespaces: {}
    protocols:
    - tcp: {destinationPort: {number: 81}}
`)
		}},
		{"a pod comes: y/d on node-1 (labelled pod=b)", func() time.Time {
			return w.addPod("y", "d", "node-1", "10.244.1.23", map[string]string{"pod": "b"})
		}},
		{"a pod goes: z/c", func() time.Time {
			return w.deletePod("z", "c")
		}},
		{"delete the NetworkPolicy", func() time.Time {
			return w.delete(gvrNetworkPolicy, "x", "from-y")
		}},
		{"delete the Admin ClusterNetworkPolicy", func() time.Time {
			return w.delete(gvrCNP, "", "z-not-to-b")
		}},
	}
	for _, st := range steps {
		written := st.do()
		w.converged(st.name, written)
		if t.Failed() {
			return
		}
	}
	t.Logf("convergence over %d changes: p50 %v, max %v", len(w.convergence)-1,
		benchstat.Percentile(w.convergence[1:], 0.5).Round(time.Millisecond), benchstat.Percentile(w.convergence[1:], 1).Round(time.Millisecond))
}

func (w *world) patch(resource, namespace, name, patch string) time.Time {
	w.t.Helper()
	written := time.Now()
	var err error
	switch resource {
	case "namespaces":
		_, err = w.env.Client.CoreV1().Namespaces().Patch(w.ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	case "pods":
		_, err = w.env.Client.CoreV1().Pods(namespace).Patch(w.ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	}
	if err != nil {
		w.t.Fatalf("patching %s %s/%s: %v", resource, namespace, name, err)
	}
	return written
}

// delete removes one object through the dynamic client.
func (w *world) delete(gvr schema.GroupVersionResource, namespace, name string) time.Time {
	w.t.Helper()
	written := time.Now()
	if err := w.env.Dynamic.Resource(gvr).Namespace(namespace).Delete(w.ctx, name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatalf("deleting %s %s/%s: %v", gvr.Resource, namespace, name, err)
	}
	return written
}

var (
	gvrNetworkPolicy = schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}
	gvrCNP           = cluster.GVRClusterPolicyV1beta1
)

// addPod creates a pod like the base's (serving 80 and 81 on TCP and UDP),
// adds it to the lab, then reports it Running: the order kubelet follows.
func (w *world) addPod(namespace, name, node, ip string, labels map[string]string) time.Time {
	w.t.Helper()
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "server", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
			Ports: []corev1.ContainerPort{{ContainerPort: 80}, {ContainerPort: 81}, {ContainerPort: 80, Protocol: corev1.ProtocolUDP}, {ContainerPort: 81, Protocol: corev1.ProtocolUDP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
	snap, _, _ := w.expected()
	snap.Pods = append(snap.Pods, p)
	if err := w.lab.Update(w.ctx, snap); err != nil {
		w.t.Fatal(err)
	}
	written := time.Now()
	w.publishPod(p)
	return written
}

func (w *world) deletePod(namespace, name string) time.Time {
	w.t.Helper()
	written := time.Now()
	if err := w.env.Client.CoreV1().Pods(namespace).Delete(w.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		w.t.Fatal(err)
	}
	snap, _, _ := w.expected()
	if err := w.lab.Update(w.ctx, snap); err != nil {
		w.t.Fatal(err)
	}
	return written
}

// isolateX lets pods of x take connections only from x.
const isolateX = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-x-only, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - podSelector: {}
`

// TestAgentKilled kills one agent with SIGKILL while the matrix is probed:
// nothing changes while it is down (the kernel keeps the last state); the
// restarted agent adopts the table without sending anything, and then
// follows a change.
func TestAgentKilled(t *testing.T) {
	w := newWorld(t, "e2e")
	w.converged("isolate x", w.apply(isolateX))
	node := w.lab.Node("node-2")
	w.agent[node.Name].kill()
	snap, model, _ := w.expected()
	stop := w.probeContinuously(snap, model, 3)
	time.Sleep(time.Second)
	stop()
	a := w.startAgent(node)
	if n := a.metric(t, `netpol_syncs_total{result="success"}`); n != 0 {
		t.Errorf("the restarted agent sent %v transactions for an up-to-date table; adoption should send none", n)
	}
	if n := a.metric(t, `netpol_syncs_total{result="unchanged"}`); n < 1 {
		t.Errorf("the restarted agent did no sync (unchanged = %v)", n)
	}
	w.converged("after the restart: isolate y too", w.apply(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y-only, namespace: "y"}
spec:
  podSelector: {}
  ingress:
  - from:
    - podSelector: {}
`))
}

// TestAPIServerDown stops kube-apiserver: the kernel keeps enforcing and
// the agents stay healthy; changes made after it returns are applied.
func TestAPIServerDown(t *testing.T) {
	w := newWorld(t, "e2e")
	w.converged("isolate x", w.apply(isolateX))
	snap, model, _ := w.expected()
	w.env.StopAPIServer()
	stop := w.probeContinuously(snap, model, 3)
	time.Sleep(2 * time.Second)
	stop()
	for name, a := range w.agent {
		if !a.ready() {
			t.Errorf("agent %s not ready while the API server is down", name)
		}
	}
	if err := w.env.StartAPIServer(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.converged("after the API server returned: delete the policy", w.delete(gvrNetworkPolicy, "x", "from-x-only"))
}

// probeContinuously probes the full matrix round after round (at least
// rounds) until the returned stop is called; every round must equal the
// evaluator's table for snap.
func (w *world) probeContinuously(snap *cluster.Snapshot, model *policy.Model, rounds int) (stop func()) {
	want := eval.New(snap, model).TruthTable(eval.TruthTableOptions{Probes: probes, Family: ipfamily.IPv4})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	n := 0
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				if n >= rounds {
					return
				}
			default:
			}
			got, _, err := w.lab.Probe(w.ctx, lab.ProbeOptions{Probes: probes, Family: ipfamily.IPv4, Timeout: 300 * time.Millisecond, NoRetry: true})
			n++
			if err != nil {
				w.t.Errorf("probe round %d: %v", n, err)
				return
			}
			if diffs, _ := conformance.Compare(want, got); len(diffs) > 0 {
				w.t.Errorf("probe round %d changed: %v", n, diffs)
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		w.t.Logf("%d probe rounds, every one equal to the evaluator's table", n)
	}
}
