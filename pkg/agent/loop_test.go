package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
)

// harness runs the agent's sync loop against fake API clients and fake
// kernel tables: no API server, no root.
type harness struct {
	t        testing.TB
	snap     *cluster.Snapshot
	kube     *kubefake.Clientset
	dyn      *dynamicfake.FakeDynamicClient
	pol, nat *kernel.Fake
	agent    *Agent
	logs     *logBuffer
	cancel   context.CancelFunc
	done     chan error
}

// logBuffer holds the agent's log while it runs.
type logBuffer struct{ syncbuf.Buffer }

// count is how many times s was logged so far.
func (b *logBuffer) count(s string) int { return strings.Count(b.String(), s) }

// loadSnapshot reads a base snapshot of the repository's testdata.
func loadSnapshot(t testing.TB, name string) *cluster.Snapshot {
	t.Helper()
	snap, report := cluster.LoadPaths([]string{filepath.Join("..", "..", "testdata", "base", name)}, nil)
	if len(report.Errors) > 0 {
		t.Fatalf("loading %s: %v", name, report.Errors)
	}
	return snap
}

// policyObjects are ANP objects (unstructured) for the dynamic client.
func policyObjects(t testing.TB, docs ...string) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, d := range docs {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(d), &u.Object); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// apiObjects are snap's objects that the fake clientset serves: its
// namespaces, nodes, pods, Services, EndpointSlices and NetworkPolicies
// (the policy.networking.k8s.io kinds come from the dynamic client).
func apiObjects(snap *cluster.Snapshot) []runtime.Object {
	objs := appendObjects(nil, snap.Namespaces)
	objs = appendObjects(objs, snap.Nodes)
	objs = appendObjects(objs, snap.Pods)
	objs = appendObjects(objs, snap.Services)
	objs = appendObjects(objs, snap.EndpointSlices)
	return appendObjects(objs, snap.NetworkPolicies)
}

func appendObjects[T runtime.Object](objs []runtime.Object, items []T) []runtime.Object {
	for _, o := range items {
		objs = append(objs, o)
	}
	return objs
}

// newHarness prepares an agent for node-1 of snap, with the ANPs given
// served by the fake API.
func newHarness(t testing.TB, snap *cluster.Snapshot, opts Options, anps ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, snap: snap, kube: kubefake.NewClientset(apiObjects(snap)...), pol: kernel.NewFake(compiler.DefaultTable),
		nat: kernel.NewFake("netpol-proxy"), logs: &logBuffer{}, done: make(chan error, 1)}
	h.kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: cluster.GVRAdminPolicy.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: cluster.GVRAdminPolicy.Resource}},
	}}
	h.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		gvrCRD:                           "CustomResourceDefinitionList",
		cluster.GVRAdminPolicy:           "AdminNetworkPolicyList",
		cluster.GVRBaselinePolicy:        "BaselineAdminNetworkPolicyList",
		cluster.GVRClusterPolicyV1beta1:  "ClusterNetworkPolicyList",
		cluster.GVRClusterPolicyV1alpha2: "ClusterNetworkPolicyList",
	}, anps...)
	if opts.NodeName == "" {
		opts.NodeName = "node-1"
	}
	if opts.MinSyncInterval == 0 {
		opts.MinSyncInterval = 5 * time.Millisecond
	}
	opts.Logger = slog.New(slog.NewTextHandler(h.logs, nil))
	prog, err := node.NewWith(node.Options{Node: opts.NodeName, NoProxy: opts.NoProxy, Layout: opts.Layout}, h.pol, h.nat)
	if err != nil {
		t.Fatal(err)
	}
	h.agent = newAgent(opts, h.kube, h.dyn, prog)
	return h
}

// run starts the agent's loop; the test's end stops it.
func (h *harness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- h.agent.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			h.t.Errorf("Run: %v", err)
		}
	})
}

// startSources runs only the informers, for tests that call sync directly.
func (h *harness) startSources() {
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	if err := h.agent.src.start(ctx); err != nil {
		h.t.Fatal(err)
	}
}

// waitFor polls cond until it holds or the timeout passes.
func (h *harness) waitFor(what string, timeout time.Duration, cond func() bool) time.Duration {
	h.t.Helper()
	return waitUntil(h.t, what, timeout, 2*time.Millisecond, cond)
}

// waitUntil polls cond every poll until it holds, failing t (the caller's
// own: a subtest must not fail its parent) when timeout passes first.
func waitUntil(t testing.TB, what string, timeout, poll time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(poll)
	}
	return time.Since(start)
}

// desired compiles node-1's policy table for snap.
func desired(t testing.TB, snap *cluster.Snapshot) *nft.Table {
	t.Helper()
	table, err := compiler.Compile(node.Prepare(snap).Resolved, compiler.Options{Node: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// holds reports whether the fake kernel holds exactly want.
func holds(f *kernel.Fake, want *nft.Table) bool {
	got := f.Kernel()
	return got != nil && kernel.Diff(got, want).Empty()
}

func gauge(g interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	g.Write(&m)
	return m.GetGauge().GetValue()
}

// isolate is a NetworkPolicy that isolates a pod for ingress.
func isolate(namespace, pod string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "isolate-" + pod, Namespace: namespace},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"pod": pod}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
}

// create adds a NetworkPolicy through the API and to h.snap, and returns
// node-1's policy table for the new snapshot, which the kernel must not
// hold yet.
func (h *harness) create(np *networkingv1.NetworkPolicy) *nft.Table {
	h.t.Helper()
	h.snap.NetworkPolicies = append(h.snap.NetworkPolicies, np)
	want := desired(h.t, h.snap)
	if holds(h.pol, want) {
		h.t.Fatalf("the kernel holds the table for NetworkPolicy %s before it exists", np.Name)
	}
	if _, err := h.kube.NetworkingV1().NetworkPolicies(np.Namespace).Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	return want
}

// TestSyncReportsProblemsOnce: each problem is logged once however many
// syncs re-find it, and netpol_policy_errors counts policy problems only
// (Service problems have their own gauge). Before, the Service report
// replaced the policy report: every policy error was logged again at every
// sync and the gauge counted the Services' problems.
func TestSyncReportsProblemsOnce(t *testing.T) {
	snap := loadSnapshot(t, "e2e.yaml")
	bad := isolate("x", "b")
	bad.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "not-a-cidr"}}}}}
	snap.NetworkPolicies = append(snap.NetworkPolicies, bad)
	h := newHarness(t, snap, Options{NoStatus: true})
	// Two Service problems (external IPs that are not ones), against one
	// policy problem: a gauge that counted the other kind would be off.
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "x"}, Spec: corev1.ServiceSpec{
		ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
		Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}, ExternalIPs: []string{"not-an-ip", "nor-this"}}}
	if _, err := h.kube.CoreV1().Services("x").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.startSources()
	tests := []struct {
		name           string
		policy, svc    string // a substring of the problem
		policyN, svcsN float64
	}{{name: "bad CIDR and bad external IP", policy: "not-a-cidr", svc: `invalid IP \"not-an-ip\"`, policyN: 1, svcsN: 2}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < 3; i++ {
				if failed := h.agent.sync(node.All, false); failed != 0 {
					t.Fatalf("sync %d: failed tables %v\n%s", i, failed, h.logs.String())
				}
			}
			if n := h.logs.count(tt.policy); n != 1 {
				t.Errorf("the policy problem was logged %d times in 3 syncs, want once", n)
			}
			if n := h.logs.count(tt.svc); n != 1 {
				t.Errorf("the Service problem was logged %d times in 3 syncs, want once", n)
			}
			if g := gauge(h.agent.metrics.policyErrors); g != tt.policyN {
				t.Errorf("netpol_policy_errors = %v, want %v", g, tt.policyN)
			}
			if g := gauge(h.agent.metrics.serviceErrors); g != tt.svcsN {
				t.Errorf("netpol_service_errors = %v, want %v", g, tt.svcsN)
			}
		})
	}
}

// TestResyncRepairsDrift: a table changed behind the agent's back (in the
// fake kernel) is repaired within the resync period, with no change in
// the cluster. Before, the resync diffed against the Applier's cache and
// sent nothing.
func TestResyncRepairsDrift(t *testing.T) {
	for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
		t.Run(layout.String(), func(t *testing.T) { resyncRepairsDrift(t, layout) })
	}
}

func resyncRepairsDrift(t *testing.T, layout compiler.Layout) {
	const period = 150 * time.Millisecond
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, ResyncPeriod: period, Layout: layout})
	want, err := compiler.Compile(node.Prepare(h.snap).Resolved, compiler.Options{Node: "node-1", Layout: layout})
	if err != nil {
		t.Fatal(err)
	}
	h.run()
	h.waitFor("the first sync", 5*time.Second, func() bool { return h.agent.ready.Load() && holds(h.pol, want) })
	nat := h.nat.Kernel()
	tamper := []struct {
		name  string
		kern  *kernel.Fake
		fn    func(*nft.Table) *nft.Table
		check func() bool
	}{
		{"policy rule deleted", h.pol, func(t *nft.Table) *nft.Table {
			c := t.Chains["forward"] // a base chain in both layouts
			c.Rules = c.Rules[1:]
			return t
		}, func() bool { return holds(h.pol, want) }},
		{"policy element added", h.pol, func(t *nft.Table) *nft.Table {
			// self-pods4 is ipv4_addr . ipv4_addr: 254.254.254.254
			// reaching itself, which no pod is.
			s := t.Sets["self-pods4"]
			s.Elements = append(s.Elements, nft.Element{Key: bytes.Repeat([]byte{0xfe}, 8)})
			return t
		}, func() bool { return holds(h.pol, want) }},
		{"policy table deleted", h.pol, func(*nft.Table) *nft.Table { return nil }, func() bool { return holds(h.pol, want) }},
		{"NAT chain flushed", h.nat, func(t *nft.Table) *nft.Table {
			for _, c := range t.Chains {
				if c.Base != nil {
					c.Rules = nil
				}
			}
			return t
		}, func() bool { return holds(h.nat, nat) }},
	}
	for _, tc := range tamper {
		t.Run(tc.name, func(t *testing.T) {
			tc.kern.Tamper(tc.fn)
			if tc.check() {
				t.Fatal("the tampering changed nothing")
			}
			took := waitUntil(t, "repair", 3*period+time.Second, 2*time.Millisecond, tc.check)
			t.Logf("repaired after %v (resync period %v)", took, period)
		})
	}
}

// TestFailingNATDoesNotSlowPolicy: while every NAT transaction fails (and
// backs off), policy changes are still programmed at once. Before, one
// backoff covered both tables: after a few NAT failures a policy change
// waited seconds.
func TestFailingNATDoesNotSlowPolicy(t *testing.T) {
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, ResyncPeriod: time.Hour})
	var mu sync.Mutex
	var attempts []time.Time
	h.nat.FailWith(func(*kernel.Plan) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, time.Now())
		return errors.New("injected NAT failure")
	})
	h.run()
	// Let the NAT backoff grow past a second (0.1+0.2+0.4+0.8 s).
	h.waitFor("NAT attempts", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) >= 5
	})
	// Pods on node-1, one new policy each.
	for i, pod := range [][2]string{{"x", "b"}, {"y", "a"}, {"y", "c"}} {
		want := h.create(isolate(pod[0], pod[1]))
		took := h.waitFor("the policy change", 5*time.Second, func() bool { return holds(h.pol, want) })
		if took > 500*time.Millisecond {
			t.Errorf("policy change %d programmed after %v with the NAT table failing, want at once", i, took)
		}
	}
	mu.Lock()
	n := len(attempts)
	gaps := []time.Duration{}
	for i := 1; i < n; i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]))
	}
	mu.Unlock()
	if gaps[len(gaps)-1] < 700*time.Millisecond {
		t.Errorf("NAT retries %v: the failing table does not back off", gaps)
	}
	if h.agent.ready.Load() {
		t.Error("ready although the NAT table was never programmed")
	}
	h.nat.FailWith(nil)
	h.waitFor("the NAT table once it works", 35*time.Second, func() bool { return h.nat.Kernel() != nil })
}

// TestStatusWritesDoNotDelayProgramming: while the status writer is stuck
// in an API call, kernel programming goes on. Before, the writes ran
// inline in the sync (at client QPS: N changed statuses stalled the loop
// for N/20 s).
func TestStatusWritesDoNotDelayProgramming(t *testing.T) {
	anpYAML := `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny-z}
spec:
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: "x"}}}
  ingress:
  - {name: deny-z, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: "z"}}}]}
`
	anp := policyObjects(t, anpYAML)
	snap := loadSnapshot(t, "e2e.yaml")
	if r := snap.AddDocuments([]byte(anpYAML), "test", true); len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	h := newHarness(t, snap, Options{ResyncPeriod: time.Hour, StatusNamespace: "netpol-system"}, anp...)
	release := make(chan struct{})
	var once sync.Once
	stuck := make(chan struct{})
	h.dyn.PrependReactor("patch", cluster.GVRAdminPolicy.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(stuck) })
		<-release
		return true, anp[0].DeepCopyObject(), nil
	})
	h.run()
	t.Cleanup(func() { close(release) }) // before the agent stops (cleanups run last first)
	select {
	case <-stuck:
	case <-time.After(20 * time.Second):
		t.Fatal("the status writer never wrote (no leader?)")
	}
	want := h.create(isolate("y", "a")) // a pod on node-1
	took := h.waitFor("a policy change while the status write hangs", 5*time.Second, func() bool { return holds(h.pol, want) })
	t.Logf("programmed after %v with the status write stuck", took)
}

// TestServiceChangeSyncsOnlyNAT: a Service and its EndpointSlice feed the
// NAT table only; the policy table is not synced (nor its model rebuilt)
// for them. Before, every event synced both tables.
func TestServiceChangeSyncsOnlyNAT(t *testing.T) {
	h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true, ResyncPeriod: time.Hour})
	h.run()
	h.waitFor("the first sync", 5*time.Second, func() bool { return h.agent.ready.Load() })
	syncs := func(table node.Tables) uint64 {
		var m dto.Metric
		h.agent.metrics.programmingLatency.WithLabelValues(table.String()).(prometheus.Histogram).Write(&m)
		return m.GetHistogram().GetSampleCount()
	}
	policyBefore, natBefore := syncs(node.Policy), syncs(node.Services)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "x"}, Spec: corev1.ServiceSpec{
		ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
		Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	if _, err := h.kube.CoreV1().Services("x").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the NAT sync", 5*time.Second, func() bool { return syncs(node.Services) > natBefore })
	time.Sleep(300 * time.Millisecond) // a policy sync would follow within MinSyncInterval
	if n := syncs(node.Policy); n != policyBefore {
		t.Errorf("the policy table was synced %d times for a Service", n-policyBefore)
	}
}
