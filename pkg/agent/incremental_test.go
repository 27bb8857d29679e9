package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
)

// TestIncrementalPath: the running agent programs changes to pods of other
// nodes, to the labels of a namespace without pods here, a pod of node-1
// added (and deleted) with the labels of one compiled, and a policy that
// selects no pod of node-1, without compiling anything (incremental); a
// pod of node-1 relabelled as no compiled pod was, the labels of a
// namespace with pods here and a policy that selects pods here compile
// node-1's pods' classes only (rebase); a Node's change takes the full
// path. After each the kernel holds what a full compile gives, and the
// periodic resync, which compares the table with a full compile, finds
// them equal.
func TestIncrementalPath(t *testing.T) {
	snap, err := synth.Snapshot(synth.Spec{Namespaces: 6, Pods: 300, Nodes: 3, NetworkPolicies: 30, AdminPolicies: 6, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, snap, Options{NoStatus: true, NoProxy: true, ResyncPeriod: time.Hour})
	h.run()
	h.waitFor("first sync", 10*time.Second, func() bool { return holds(h.pol, desired(t, h.snap)) })
	paths := h.syncPaths
	ctx := context.Background()
	// nth is the i-th pod of the snapshot on node-1 (or, with onNode1
	// false, on another node).
	nth := func(onNode1 bool, i int) *corev1.Pod {
		for _, p := range h.snap.Pods {
			if (p.Spec.NodeName == "node-1") == onNode1 {
				if i == 0 {
					return p
				}
				i--
			}
		}
		t.Fatalf("not enough pods (on node-1: %v)", onNode1)
		return nil
	}
	remote := func(i int) *corev1.Pod { return nth(false, i) }
	local := func(i int) *corev1.Pod { return nth(true, i) }
	// addCopy creates a pod like p, named name, at address ip.
	addCopy := func(p *corev1.Pod, name, ip string) (*corev1.Pod, error) {
		p = p.DeepCopy()
		p.Name, p.ResourceVersion = name, ""
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		h.snap.Pods = append(h.snap.Pods, p)
		return h.kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	}
	// relabel gives p's copy the app label app.
	relabel := func(p *corev1.Pod, app string) error {
		p = p.DeepCopy()
		p.Labels["app"] = app
		h.replacePod(p)
		_, err := h.kube.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
		return err
	}
	// relabelNamespace gives the first namespace with pods on node-1 (or,
	// with local false, without) the label team=team.
	relabelNamespace := func(local bool, team string) error {
		for i, ns := range h.snap.Namespaces {
			if h.hasLocalPods(ns.Name) != local {
				continue
			}
			ns = ns.DeepCopy()
			ns.Labels["team"] = team
			h.snap.Namespaces[i] = ns
			_, err := h.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
			return err
		}
		return fmt.Errorf("no namespace to relabel (with pods on node-1: %v)", local)
	}
	var addedLocal *corev1.Pod
	steps := []struct {
		name     string
		change   func() error
		wantPath string
	}{
		{"remote pod relabelled", func() error { return relabel(remote(0), "app-6") }, "incremental"},
		{"remote pod deleted", func() error {
			p := remote(1)
			h.dropPod(p)
			return h.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		}, "incremental"},
		{"remote pod added", func() error {
			_, err := addCopy(remote(2), "added-remote", "10.99.0.7")
			return err
		}, "incremental"},
		{"namespace without local pods relabelled", func() error { return relabelNamespace(false, "team-9") }, "incremental"},
		{"pod of node-1 added with the labels of another", func() (err error) {
			addedLocal, err = addCopy(local(0), "added-local", "10.99.1.7")
			return err
		}, "incremental"},
		{"that pod deleted", func() error {
			h.dropPod(addedLocal)
			return h.kube.CoreV1().Pods(addedLocal.Namespace).Delete(ctx, addedLocal.Name, metav1.DeleteOptions{})
		}, "incremental"},
		{"pod of node-1 relabelled as no pod was", func() error { return relabel(local(0), "never-compiled") }, "rebase"},
		{"namespace with pods here relabelled", func() error { return relabelNamespace(true, "team-8") }, "rebase"},
		{"NetworkPolicy selecting a pod here added", func() error {
			return h.createPolicy(selectApp("local", local(1)))
		}, "rebase"},
		{"NetworkPolicy selecting no pod here added", func() error {
			np := selectApp("remote", remote(3))
			np.Spec.PodSelector.MatchLabels["app"] = "no-pod-here"
			return h.createPolicy(np)
		}, "incremental"},
		{"Node relabelled", func() error {
			n := h.snap.Nodes[1].DeepCopy()
			n.Labels = map[string]string{"zone": "b"}
			h.snap.Nodes[1] = n
			_, err := h.kube.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}, "full"},
	}
	for _, st := range steps {
		before := paths()
		if err := st.change(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		want := desired(t, h.snap)
		h.waitFor(st.name+" programmed", 10*time.Second, func() bool { return holds(h.pol, want) })
		h.waitFor(st.name+" counted", 5*time.Second, func() bool { return !maps.Equal(paths(), before) })
		after := paths()
		for path, n := range after {
			if took := n > before[path]; took != (path == st.wantPath) {
				t.Fatalf("%s: took %v syncs by path (before: %v), want the %s path only", st.name, after, before, st.wantPath)
			}
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

// syncPaths counts the agent's policy syncs by path.
func (h *harness) syncPaths() map[string]float64 {
	out := map[string]float64{}
	for _, path := range []string{"incremental", "rebase", "full"} {
		var m dto.Metric
		h.agent.metrics.policySyncs.WithLabelValues(path).Write(&m)
		out[path] = m.GetCounter().GetValue()
	}
	return out
}

// selectApp is a NetworkPolicy named name that isolates the pods of p's
// namespace with p's app label for ingress, allowing TCP 80 from the
// namespaces of team team-1.
func selectApp(name string, p *corev1.Pod) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(80)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.Namespace},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": p.Labels["app"]}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "team-1"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}}}}
}

// createPolicy adds a NetworkPolicy through the API and to h.snap.
func (h *harness) createPolicy(np *networkingv1.NetworkPolicy) error {
	h.snap.NetworkPolicies = append(h.snap.NetworkPolicies, np)
	_, err := h.kube.NetworkingV1().NetworkPolicies(np.Namespace).Create(context.Background(), np, metav1.CreateOptions{})
	return err
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

// TestRecordChange: pods and namespaces are recorded by key and policies
// as their models; a policy object with a problem, a Node, the cluster
// DNS's EndpointSlice (with no NAT table) and a change of the served
// policy APIs (an event without objects: their objects are then in
// informers the last snapshot did not read) make the next policy sync a
// full one, as do changes past node.MaxPolicyChanges objects.
func TestRecordChange(t *testing.T) {
	pod := newLeanPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "x"}})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
	anp, err := leanPolicy(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.networking.k8s.io/v1alpha1", "kind": "AdminNetworkPolicy",
		"metadata": map[string]any{"name": "deny-all"},
		"spec": map[string]any{"priority": int64(10), "subject": map[string]any{"namespaces": map[string]any{}},
			"ingress": []any{map[string]any{"action": "Deny", "from": []any{map[string]any{"namespaces": map[string]any{}}}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		objs     []any
		full     bool
		policies bool
	}{
		{"pods", []any{pod, pod}, false, false},
		{"a deleted pod", []any{cache.DeletedFinalStateUnknown{Key: "x/a", Obj: pod}}, false, false},
		{"namespaces", []any{ns}, false, false},
		{"a NetworkPolicy", []any{isolate("x", "a")}, false, true},
		{"an admin policy", []any{anp}, false, true},
		{"a policy with a problem", []any{&policyRecord{err: errors.New("no JSON")}}, true, false},
		{"the policy APIs", nil, true, false},
		{"a node", []any{&corev1.Node{}}, true, false},
		{"the cluster DNS", []any{&leanSlice{}}, true, false},
	}
	for _, tt := range tests {
		a := &Agent{changes: &node.PolicyChanges{}}
		a.recordChange(tt.objs)
		if full := a.changes.FullReason() != ""; full != tt.full || a.changes.Empty() || a.changes.HasPolicies() != tt.policies {
			t.Errorf("%s: full %v (%q), policies %v, want full %v, policies %v", tt.name, full, a.changes.FullReason(),
				a.changes.HasPolicies(), tt.full, tt.policies)
		}
	}
	// Changes that already need a full sync record nothing more (the
	// policy is not even built).
	a := &Agent{changes: &node.PolicyChanges{}}
	a.changes.NeedFull("the first sync")
	a.recordChange([]any{&policyRecord{err: errors.New("not read")}, pod})
	if reason := a.changes.FullReason(); reason != "the first sync" || a.changes.HasPolicies() {
		t.Errorf("a full sync's changes: reason %q, policies %v", reason, a.changes.HasPolicies())
	}
	a = &Agent{changes: &node.PolicyChanges{}}
	for i := range node.MaxPolicyChanges {
		a.recordChange([]any{newLeanPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(i), Namespace: "x"}})})
	}
	if reason := a.changes.FullReason(); reason != "" {
		t.Errorf("%d pods need a full sync: %s", node.MaxPolicyChanges, reason)
	}
	a.recordChange([]any{ns})
	if a.changes.FullReason() == "" {
		t.Errorf("%d changes do not need a full sync", node.MaxPolicyChanges+1)
	}
}

// TestLeaderStatusWithoutFullSync: on the status writer, an admin policy
// that selects pods of node-1 takes the rebase path and one that selects
// none the incremental path; the status of each (here: a rule that fails
// closed) is written from the policy cache's model, with no full sync.
func TestLeaderStatusWithoutFullSync(t *testing.T) {
	snap := loadSnapshot(t, "e2e.yaml")
	h := newHarness(t, snap, Options{ResyncPeriod: time.Hour, StatusNamespace: "netpol-system"})
	var mu sync.Mutex
	patched := map[string]string{}
	h.dyn.PrependReactor("patch", cluster.GVRAdminPolicy.Resource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		p := action.(k8stesting.PatchAction)
		mu.Lock()
		patched[p.GetName()] = string(p.GetPatch())
		mu.Unlock()
		return false, nil, nil
	})
	h.run()
	h.waitFor("first sync", 10*time.Second, func() bool { return holds(h.pol, desired(t, h.snap)) })
	h.waitFor("leadership", 20*time.Second, func() bool { return h.agent.status.leader.Load() })
	count := func(path string) float64 {
		var m dto.Metric
		h.agent.metrics.policySyncs.WithLabelValues(path).Write(&m)
		return m.GetCounter().GetValue()
	}
	// A new leader syncs in full once (to write every policy's status),
	// and so does the agent once the policy APIs are discovered: wait
	// until both are done, nothing is pending and the count of full
	// syncs stays put.
	drain := func() { h.agent.tableMu.Lock(); h.agent.tableMu.Unlock() } // an in-flight sync ends
	settled := func() bool {
		h.agent.src.policyMu.RLock()
		discovered := h.agent.src.policies != nil
		h.agent.src.policyMu.RUnlock()
		drain()
		h.agent.mu.Lock()
		defer h.agent.mu.Unlock()
		if !discovered || h.agent.changes.FullReason() != "" {
			return false
		}
		for _, ts := range h.agent.tables {
			if !ts.pending.IsZero() {
				return false
			}
		}
		return true
	}
	h.waitFor("the agent's own full syncs", 10*time.Second, func() bool {
		if !settled() {
			return false
		}
		before := count("full")
		time.Sleep(100 * time.Millisecond)
		return settled() && count("full") == before
	})
	local := ""
	for _, ns := range h.snap.Namespaces {
		if h.hasLocalPods(ns.Name) {
			local = ns.Name
		}
	}
	for _, tt := range []struct{ name, namespace, path string }{
		{"local-fails-closed", local, "rebase"},
		{"remote-fails-closed", "no-such-namespace", "incremental"},
	} {
		full, want := count("full"), count(tt.path)
		obj := policyObjects(t, fmt.Sprintf(`
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: %s}
spec:
  priority: 20
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: %q}}}
  ingress:
  - name: bogus
    action: Deny
    from: [{namespaces: {matchExpressions: [{key: team, operator: Bogus, values: [x]}]}}]
`, tt.name, tt.namespace))[0].(*unstructured.Unstructured)
		if _, err := h.dyn.Resource(cluster.GVRAdminPolicy).Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.waitFor(tt.name+"'s status", 10*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return strings.Contains(patched[tt.name], "RulesFailClosed")
		})
		if count("full") != full || count(tt.path) <= want {
			t.Fatalf("%s: syncs full %v -> %v, %s %v -> %v; want no full sync and a %s one", tt.name, full, count("full"), tt.path, want, count(tt.path), tt.path)
		}
	}
}

// TestIncrementalPathIdentities is TestIncrementalPath on the identity
// layout: a replica of a workload (an identity that exists) added or
// deleted on another node is one pod-ids element written, whatever the
// policies that select it; one added on node-1 adds its own entries; a
// policy that selects no pod here writes nothing. A new identity, the
// labels of a namespace with pods and a policy that selects pods here and
// reads a pod label no peer read are compiled in full, keeping the
// numbering (so the kernel is sent what changed); other policies that
// select pods here are a rebase (the node's classes compiled again). After each the kernel holds what a full compile with the
// numbering gives, and the periodic resync agrees.
func TestIncrementalPathIdentities(t *testing.T) {
	snap, err := synth.Snapshot(synth.Spec{Namespaces: 6, Pods: 300, Nodes: 3, NetworkPolicies: 30, AdminPolicies: 6, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, snap, Options{NoStatus: true, NoProxy: true, ResyncPeriod: time.Hour, Layout: compiler.LayoutIdentities})
	numbering := &compiler.Identities{} // follows the agent's: both number alike from the same states
	want := func() *nft.Table {
		table, err := compiler.Compile(node.Prepare(h.snap).Resolved, compiler.Options{Node: "node-1", Layout: compiler.LayoutIdentities, Identities: numbering})
		if err != nil {
			t.Fatal(err)
		}
		return table
	}
	h.run()
	first := want()
	h.waitFor("first sync", 10*time.Second, func() bool { return holds(h.pol, first) })
	ctx := context.Background()
	pod := func(onNode1 bool, i int) *corev1.Pod {
		for _, p := range h.snap.Pods {
			if (p.Spec.NodeName == "node-1") == onNode1 && !p.Spec.HostNetwork {
				if i == 0 {
					return p
				}
				i--
			}
		}
		t.Fatalf("not enough pods (on node-1: %v)", onNode1)
		return nil
	}
	addCopy := func(p *corev1.Pod, name, ip string) error {
		p = p.DeepCopy()
		p.Name, p.ResourceVersion = name, ""
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		h.snap.Pods = append(h.snap.Pods, p)
		_, err := h.kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		return err
	}
	remove := func(ns, name string) error {
		for _, p := range h.snap.Pods {
			if p.Namespace == ns && p.Name == name {
				h.dropPod(p)
			}
		}
		return h.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	// update changes a copy of p through the API and in h.snap.
	update := func(p *corev1.Pod, change func(*corev1.Pod)) error {
		p = p.DeepCopy()
		change(p)
		h.replacePod(p)
		_, err := h.kube.CoreV1().Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{})
		return err
	}
	// remoteOnly is a namespace with pods, none of them on node-1.
	remoteOnly := func() string {
		here := map[string]bool{}
		for _, p := range h.snap.Pods {
			if p.Spec.NodeName == "node-1" {
				here[p.Namespace] = true
			}
		}
		for _, p := range h.snap.Pods {
			if !here[p.Namespace] {
				return p.Namespace
			}
		}
		t.Fatal("every namespace with pods has one on node-1")
		return ""
	}
	// relabel sets a label of namespace name through the API and in h.snap.
	relabel := func(name, key, value string) error {
		ns, err := h.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels[key] = value
		for i, n := range h.snap.Namespaces {
			if n.Name == name {
				h.snap.Namespaces[i] = ns.DeepCopy()
			}
		}
		_, err = h.kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
		return err
	}
	// createAdmin creates the AdminNetworkPolicy of YAML doc through the
	// API and in h.snap.
	createAdmin := func(doc string) error {
		h.snap.AddDocuments([]byte(doc), "test", true)
		_, err := h.dyn.Resource(cluster.GVRAdminPolicy).Create(ctx, policyObjects(t, doc)[0].(*unstructured.Unstructured), metav1.CreateOptions{})
		return err
	}
	remote, local := pod(false, 2), pod(true, 0)
	steps := []struct {
		name     string
		change   func() error
		wantPath string
		writes   int // element writes the kernel must see (-1: any)
	}{
		{"replica on another node added", func() error { return addCopy(remote, "replica-remote", "10.99.0.7") }, "incremental", 1},
		{"that replica deleted", func() error { return remove(remote.Namespace, "replica-remote") }, "incremental", 1},
		{"replica on node-1 added", func() error { return addCopy(local, "replica-local", "10.99.1.7") }, "incremental", -1},
		{"NetworkPolicy selecting no pod here added", func() error {
			np := selectApp("remote", remote)
			np.Spec.PodSelector.MatchLabels["app"] = "no-pod-here"
			return h.createPolicy(np)
		}, "incremental", 0},
		{"AdminNetworkPolicy whose subjects are not here added (the policies renumbered)", func() error {
			doc := `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: aaa-elsewhere}
spec:
  priority: 1
  subject:
    namespaces:
      matchLabels: {team: nobody}
  ingress:
  - name: deny-all
    action: Deny
    from:
    - namespaces: {}`
			return createAdmin(doc)
		}, "incremental", 0},
		{"pod on another node relabelled with a label no selector here reads", func() error {
			return update(pod(false, 5), func(p *corev1.Pod) { p.Labels["release"] = "canary" })
		}, "incremental", 0},
		{"pod of node-1 relabelled by a rollout (a label no subject or peer reads)", func() error {
			return update(pod(true, 2), func(p *corev1.Pod) { p.Labels["pod-template-hash"] = "rollout-2" })
		}, "incremental", 0},
		{"pod on another node given a named port no pod had (a new identity, numbered in place)", func() error {
			return update(pod(false, 6), func(p *corev1.Pod) {
				p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "never-seen", ContainerPort: 9999}}}}
			})
		}, "incremental", -1},
		{"namespace with no pod on node-1 relabelled", func() error { return relabel(remoteOnly(), "team", "relabelled") }, "incremental", -1},
		{"pod of node-1 given labels no pod had (a new identity of this node)", func() error {
			return update(pod(true, 3), func(p *corev1.Pod) { p.Labels["app"] = "never-seen" })
		}, "full", -1},
		{"NetworkPolicy selecting a pod here added", func() error { return h.createPolicy(selectApp("local", pod(true, 1))) }, "rebase", -1},
		{"AdminNetworkPolicy whose subjects are every namespace added", func() error {
			doc := `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: aaa-everywhere}
spec:
  priority: 2
  subject:
    namespaces: {}
  ingress:
  - name: deny-team-2
    action: Deny
    from:
    - namespaces:
        matchLabels: {team: team-2}
    ports:
    - portNumber: {protocol: TCP, port: 6379}`
			return createAdmin(doc)
		}, "rebase", -1},
		{"that AdminNetworkPolicy deleted", func() error {
			h.snap.AdminPolicies = slices.DeleteFunc(h.snap.AdminPolicies, func(p *anpv1alpha1.AdminNetworkPolicy) bool { return p.Name == "aaa-everywhere" })
			return h.dyn.Resource(cluster.GVRAdminPolicy).Delete(ctx, "aaa-everywhere", metav1.DeleteOptions{})
		}, "rebase", -1},
		{"NetworkPolicy here whose peers read a pod label no peer read (identities change)", func() error {
			np := selectApp("local-new-key", pod(true, 1))
			np.Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"never-read": "x"}}
			return h.createPolicy(np)
		}, "full", -1},
	}
	paths := h.syncPaths
	for _, st := range steps {
		before, kernelBefore := paths(), h.pol.Kernel()
		if err := st.change(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		w := want()
		h.waitFor(st.name+" programmed", 10*time.Second, func() bool { return holds(h.pol, w) })
		h.waitFor(st.name+" counted", 5*time.Second, func() bool { return !maps.Equal(paths(), before) })
		after := paths()
		for path, n := range after {
			if took := n > before[path]; took != (path == st.wantPath) {
				t.Fatalf("%s: took %v syncs by path (before: %v), want the %s path only", st.name, after, before, st.wantPath)
			}
		}
		d := kernel.Diff(kernelBefore, h.pol.Kernel())
		writes := d.Stats.ElementsAdded + d.Stats.ElementsDeleted
		t.Logf("%s: %s path, %d element writes, %d chains added, %d rewritten", st.name, st.wantPath, writes, d.Stats.ChainsAdded, d.Stats.ChainsRewritten)
		if st.writes >= 0 && writes != st.writes {
			t.Errorf("%s: %d element writes, want %d", st.name, writes, st.writes)
		}
	}
	h.agent.syncTables(node.Policy, true)
	var m dto.Metric
	h.agent.metrics.liveMismatches.Write(&m)
	if n := m.GetCounter().GetValue(); n != 0 || h.logs.count("differed from a full compile") > 0 {
		t.Fatalf("the resync found the incremental table different from a full compile (%v times)", n)
	}
}
