package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/node"
)

// TestIncrementalPath: the running agent programs changes to pods of other
// nodes, to the labels of a namespace without pods here, and a pod of
// node-1 added (and deleted) with the labels of one compiled, without a
// full compile; a pod of node-1 relabelled as no compiled pod was takes
// the full path; after each the kernel holds what a full compile gives;
// and the periodic resync, which compares the incremental table with a
// full compile, finds them equal.
func TestIncrementalPath(t *testing.T) {
	snap, err := synth.Snapshot(synth.Spec{Namespaces: 6, Pods: 300, Nodes: 3, NetworkPolicies: 30, AdminPolicies: 6, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, snap, Options{NoStatus: true, NoProxy: true, ResyncPeriod: time.Hour})
	h.run()
	h.waitFor("first sync", 10*time.Second, func() bool { return holds(h.pol, desired(t, h.snap)) })
	paths := func() (incremental, full float64) {
		count := func(path string) float64 {
			var m dto.Metric
			h.agent.metrics.policySyncs.WithLabelValues(path).Write(&m)
			return m.GetCounter().GetValue()
		}
		return count("incremental"), count("full")
	}
	ctx := context.Background()
	remote := func(i int) *corev1.Pod {
		for _, p := range h.snap.Pods {
			if p.Spec.NodeName != "node-1" {
				if i == 0 {
					return p
				}
				i--
			}
		}
		t.Fatal("not enough remote pods")
		return nil
	}
	local := func(i int) *corev1.Pod {
		for _, p := range h.snap.Pods {
			if p.Spec.NodeName == "node-1" {
				if i == 0 {
					return p
				}
				i--
			}
		}
		t.Fatal("not enough pods on node-1")
		return nil
	}
	steps := []struct {
		name     string
		change   func() error
		wantPath string
	}{
		{"remote pod relabelled", func() error {
			p := remote(0).DeepCopy()
			p.Labels["app"] = "app-6"
			h.replacePod(p)
			_, err := h.kube.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
			return err
		}, "incremental"},
		{"remote pod deleted", func() error {
			p := remote(1)
			h.dropPod(p)
			return h.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		}, "incremental"},
		{"remote pod added", func() error {
			p := remote(2).DeepCopy()
			p.Name, p.ResourceVersion = "added-remote", ""
			p.Status.PodIP = "10.99.0.7"
			p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
			h.snap.Pods = append(h.snap.Pods, p)
			_, err := h.kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			return err
		}, "incremental"},
		{"namespace without local pods relabelled", func() error {
			for i, ns := range h.snap.Namespaces {
				if h.hasLocalPods(ns.Name) {
					continue
				}
				ns = ns.DeepCopy()
				ns.Labels["team"] = "team-9"
				h.snap.Namespaces[i] = ns
				_, err := h.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
				return err
			}
			return fmt.Errorf("every namespace has pods on node-1")
		}, "incremental"},
		{"pod of node-1 added with the labels of another", func() error {
			p := local(0).DeepCopy()
			p.Name, p.ResourceVersion = "added-local", ""
			p.Status.PodIP = "10.99.1.7"
			p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
			h.snap.Pods = append(h.snap.Pods, p)
			_, err := h.kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			return err
		}, "incremental"},
		{"that pod deleted", func() error {
			p := local(0)
			for _, q := range h.snap.Pods {
				if q.Name == "added-local" {
					p = q
				}
			}
			h.dropPod(p)
			return h.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		}, "incremental"},
		{"pod of node-1 relabelled as no pod was", func() error {
			p := local(0).DeepCopy()
			p.Labels["app"] = "never-compiled"
			h.replacePod(p)
			_, err := h.kube.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
			return err
		}, "full"},
	}
	for _, st := range steps {
		inc, full := paths()
		if err := st.change(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		want := desired(t, h.snap)
		h.waitFor(st.name+" programmed", 10*time.Second, func() bool { return holds(h.pol, want) })
		h.waitFor(st.name+" counted", 5*time.Second, func() bool { i, f := paths(); return i > inc || f > full })
		gotInc, gotFull := paths()
		if path := map[bool]string{true: "incremental", false: "full"}[gotInc > inc]; path != st.wantPath || gotInc > inc && gotFull > full {
			t.Fatalf("%s: took %d incremental and %d full syncs, want the %s path only", st.name, int(gotInc-inc), int(gotFull-full), st.wantPath)
		}
	}
	// The periodic resync: incremental and full tables must agree.
	h.agent.syncTables(node.Policy, true)
	var m dto.Metric
	h.agent.metrics.liveMismatches.Write(&m)
	if n := m.GetCounter().GetValue(); n != 0 || h.logs.count("differed from a full compile") > 0 {
		t.Fatalf("the resync found the incremental table different from a full compile (%v times)", n)
	}
}

func (h *harness) replacePod(p *corev1.Pod) {
	for i, q := range h.snap.Pods {
		if q.Namespace == p.Namespace && q.Name == p.Name {
			h.snap.Pods[i] = p
		}
	}
}

func (h *harness) dropPod(p *corev1.Pod) {
	for i, q := range h.snap.Pods {
		if q.Namespace == p.Namespace && q.Name == p.Name {
			h.snap.Pods = append(h.snap.Pods[:i:i], h.snap.Pods[i+1:]...)
			return
		}
	}
}

func (h *harness) hasLocalPods(ns string) bool {
	for _, p := range h.snap.Pods {
		if p.Namespace == ns && p.Spec.NodeName == "node-1" {
			return true
		}
	}
	return false
}

// TestDeltaRecord: pods and namespaces are recorded by key and policies
// as objects; anything else, including a change of the served policy
// APIs (an event without objects: their objects are then in informers the
// last snapshot did not read), makes the next policy sync a full one, as
// does a delta past maxDelta objects.
func TestDeltaRecord(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "x"}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	tests := []struct {
		resource string
		objs     []any
		full     bool
	}{
		{"pods", []any{pod, pod}, false},
		{"namespaces", []any{ns}, false},
		{"networkpolicies", []any{isolate("x", "a")}, false},
		{"adminnetworkpolicies", []any{&unstructured.Unstructured{}}, false},
		{"policy-apis", nil, true},
		{"nodes", []any{&corev1.Node{}}, true},
	}
	for _, tt := range tests {
		var d delta
		d.record(tt.resource, tt.objs)
		if d.full != tt.full {
			t.Errorf("%s: full %v, want %v", tt.resource, d.full, tt.full)
		}
	}
	var d delta
	d.record("pods", []any{pod})
	d.record("namespaces", []any{ns})
	if !d.pods["x/a"] || !d.namespaces["x"] || d.full {
		t.Errorf("recorded pods %v, namespaces %v, full %v", d.pods, d.namespaces, d.full)
	}
	for i := range maxDelta {
		d.record("pods", []any{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(i), Namespace: "x"}}})
	}
	if !d.full {
		t.Errorf("a delta of %d objects is not full", d.size())
	}
}
