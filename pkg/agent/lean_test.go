package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"sigs.k8s.io/yaml"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// kubeletPod is a pod as a kubelet and a ReplicaSet leave it: managed
// fields, annotations, volumes, probes, conditions, container statuses.
func kubeletPod(t testing.TB) *corev1.Pod {
	t.Helper()
	data, err := os.ReadFile("testdata/kubelet-pod.json")
	if err != nil {
		t.Fatal(err)
	}
	var p corev1.Pod
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

// TestLeanPodKeepsWhatPolicyReads: the lean pod decides every connection
// as the full one does (labels, node, ports for named ports, phase,
// addresses), and nothing else is kept.
func TestLeanPodKeepsWhatPolicyReads(t *testing.T) {
	full := kubeletPod(t)
	rec := newLeanPod(full)
	// The record has no room for managed fields, annotations or owners;
	// informer stores key it by its metadata.
	if key, err := cache.MetaNamespaceKeyFunc(rec); err != nil || key != full.Namespace+"/"+full.Name {
		t.Errorf("the record's store key is %q (%v), want %s/%s", key, err, full.Namespace, full.Name)
	}
	if m, err := meta.Accessor(rec); err != nil || m.GetUID() != "" || m.GetResourceVersion() != full.ResourceVersion ||
		m.GetDeletionTimestamp() != nil || fmt.Sprint(m.GetLabels()) != fmt.Sprint(full.Labels) {
		t.Errorf("the record's metadata through metav1.Object: %+v (%v)", m, err)
	}
	lean := rec.pod()
	if lean.Name != full.Name || lean.Namespace != full.Namespace || lean.UID != "" || lean.ResourceVersion != full.ResourceVersion ||
		fmt.Sprint(lean.Labels) != fmt.Sprint(full.Labels) || lean.Spec.NodeName != "node-17" || lean.Status.Phase != corev1.PodRunning ||
		fmt.Sprint(cluster.PodAddresses(lean)) != fmt.Sprint(cluster.PodAddresses(full)) {
		t.Fatalf("lean pod lost what policy reads: %+v", lean)
	}
	if len(lean.ManagedFields) > 0 || len(lean.Annotations) > 0 || len(lean.Spec.Volumes) > 0 || len(lean.Status.Conditions) > 0 ||
		len(lean.Status.ContainerStatuses) > 0 || len(lean.OwnerReferences) > 0 {
		t.Errorf("lean pod keeps what nothing reads: %+v", lean)
	}
	if len(lean.Spec.Containers) != 1 || len(lean.Spec.Containers[0].Ports) != 2 || lean.Spec.Containers[0].Env != nil || lean.Spec.Containers[0].Image != "" {
		t.Errorf("lean containers: %+v", lean.Spec.Containers)
	}
	// The same verdicts, named port included, for a policy on the pod.
	np := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: http-only, namespace: shop}
spec:
  podSelector: {matchLabels: {app: api}}
  ingress: [{ports: [{port: http}]}]
`
	for name, pod := range map[string]*corev1.Pod{"full": full, "lean": lean} {
		snap := cluster.New()
		snap.Pods = append(snap.Pods, pod)
		if rep := snap.AddDocuments([]byte(np), "np", false); len(rep.Errors) > 0 {
			t.Fatal(rep.Errors)
		}
		ev := eval.New(snap, policy.Build(snap))
		for _, tc := range []struct {
			port    int32
			allowed bool
		}{{8080, true}, {9090, false}} {
			v, err := ev.Explain("192.0.2.1", "shop/"+full.Name, l4.Port{Protocol: corev1.ProtocolTCP, Port: tc.port}, ipfamily.Any)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed != tc.allowed {
				t.Errorf("%s pod: TCP %d allowed=%v, want %v", name, tc.port, v.Allowed, tc.allowed)
			}
		}
	}
}

func TestSameLean(t *testing.T) {
	base := newLeanPod(kubeletPod(t))
	change := func(f func(p *corev1.Pod)) *leanPod {
		p := kubeletPod(t)
		f(p)
		return newLeanPod(p)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"zone": "a"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.2"}}}}
	heartbeat := node.DeepCopy()
	heartbeat.ResourceVersion = "2"
	heartbeat.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	moved := node.DeepCopy()
	moved.Status.Addresses[0].Address = "172.18.0.3"
	serviceCIDR := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", ResourceVersion: "1"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}
	serviceCIDRReady := serviceCIDR.DeepCopy()
	serviceCIDRReady.ResourceVersion = "2"
	serviceCIDRReady.Status.Conditions = []metav1.Condition{{Type: networkingv1.ServiceCIDRConditionReady, Status: metav1.ConditionTrue}}
	serviceCIDRTwo := serviceCIDR.DeepCopy()
	serviceCIDRTwo.Spec.CIDRs = append(serviceCIDRTwo.Spec.CIDRs, "fd00:96::/108")
	lean := func(o *networkingv1.ServiceCIDR) any { return leanObject(o, "n") }
	tests := []struct {
		name     string
		old, cur any
		same     bool
	}{
		{"a pod's status conditions and resource version", base, func() *leanPod {
			full := kubeletPod(t)
			full.ResourceVersion = "481516299"
			full.Status.Conditions = nil
			full.Status.ContainerStatuses[0].RestartCount = 3
			return newLeanPod(full)
		}(), true},
		{"a pod's labels", base, change(func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }), false},
		{"a pod's address", base, change(func(p *corev1.Pod) { p.Status.PodIPs = []corev1.PodIP{{IP: "10.244.3.99"}} }), false},
		{"a pod's phase", base, change(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), false},
		{"a pod's ports", base, change(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 8081 }), false},
		{"a pod being deleted", base, change(func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }), false},
		{"a node's heartbeat", leanNode(node), leanNode(heartbeat), true},
		{"a node's address", leanNode(node), leanNode(moved), false},
		{"a ServiceCIDR's status", lean(serviceCIDR), lean(serviceCIDRReady), true},
		{"a ServiceCIDR's ranges", lean(serviceCIDR), lean(serviceCIDRTwo), false},
		{"a Service (never compared)", &corev1.Service{}, &corev1.Service{}, false},
	}
	for _, tt := range tests {
		if got := sameLean(tt.old, tt.cur); got != tt.same {
			t.Errorf("%s: sameLean = %v, want %v", tt.name, got, tt.same)
		}
	}
	// A tombstone passes the transform unchanged.
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/x", Obj: base}
	if out, err := leanTransform("node-1")(tomb); err != nil || out != any(tomb) {
		t.Errorf("tombstone: %v %v", out, err)
	}
}

// internedWith counts the interned values that has says hold marker.
func internedWith[T any](in *interner[T], has func(*T) bool) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for _, wp := range in.m {
		if v := wp.Value(); v != nil && has(v) {
			n++
		}
	}
	return n
}

// TestIntern: pods with equal labels share one map, and pods with equal
// container ports one list; a value no pod holds any more leaves its
// table; a deep copy shares nothing.
func TestIntern(t *testing.T) {
	const marker = "intern-test"
	labels := func() int {
		return internedWith(&internedLabels, func(l *labelSet) bool { return slices.Contains(slices.Collect(maps.Values(l.m)), marker) })
	}
	ports := func() int {
		return internedWith(&internedPorts, func(l *portList) bool {
			return slices.ContainsFunc(l.p, func(p corev1.ContainerPort) bool { return p.Name == marker })
		})
	}
	pod := func(name string, lbls map[string]string, ports ...corev1.ContainerPort) *leanPod {
		return newLeanPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Ports: ports}}}})
	}
	http := corev1.ContainerPort{Name: marker, ContainerPort: 80, Protocol: corev1.ProtocolTCP}
	func() { // the pods live only in here
		a := pod("a", map[string]string{"app": marker, "tier": "x"}, http)
		b := pod("b", map[string]string{"tier": "x", "app": marker}, http)
		c := pod("c", map[string]string{"app": marker}, corev1.ContainerPort{Name: marker, ContainerPort: 81, Protocol: corev1.ProtocolTCP})
		if a.labels != b.labels || a.labels == c.labels {
			t.Fatalf("equal labels share a set: %v, different ones do not: %v", a.labels == b.labels, a.labels != c.labels)
		}
		if a.ports != b.ports || a.ports == c.ports || &a.Ports()[0] != &b.Ports()[0] {
			t.Fatalf("equal ports share a list: %v, different ones do not: %v", a.ports == b.ports, a.ports != c.ports)
		}
		copied := a.DeepCopyObject().(*leanPod)
		copied.Labels["app"] = "changed"
		copied.Ports()[0].ContainerPort = 8080
		if a.Labels["app"] != marker || b.Ports()[0].ContainerPort != 80 {
			t.Error("a deep copy shares the interned labels or ports")
		}
		if n, m := labels(), ports(); n != 2 || m != 2 {
			t.Fatalf("%d interned label sets and %d port lists, want 2 and 2", n, m)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for labels()+ports() != 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n, m := labels(), ports(); n+m != 0 {
		t.Errorf("%d label sets and %d port lists stay interned after their pods went", n, m)
	}
}

// TestPodConditionsAreNoEvent: the agent's informers are lean, and a pod
// update the kubelet makes to conditions only is not an event; a label
// change is.
func TestPodConditionsAreNoEvent(t *testing.T) {
	snap := loadSnapshot(t, "e2e.yaml")
	h := newHarness(t, snap, Options{NoStatus: true, ResyncPeriod: time.Hour})
	h.run()
	h.waitFor("the first sync", 5*time.Second, func() bool { return h.agent.ready.Load() })
	events := func() float64 {
		var m dto.Metric
		h.agent.metrics.events.WithLabelValues("pods").Write(&m)
		return m.GetCounter().GetValue()
	}
	pods := h.kube.CoreV1().Pods(snap.Pods[0].Namespace)
	pod, err := pods.Get(context.Background(), snap.Pods[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := events()
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse})
	if pod, err = pods.UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The store holds the lean pod once the update arrived.
	h.waitFor("the update in the cache", 5*time.Second, func() bool {
		obj, err := h.agent.src.listers.pods.Get(pod.Namespace + "/" + pod.Name)
		return err == nil && obj.(*leanPod).ResourceVersion == pod.ResourceVersion
	})
	if n := events() - before; n != 0 {
		t.Errorf("a conditions-only update made %v events", n)
	}
	if cached, _ := h.agent.src.listers.pods.Get(pod.Namespace + "/" + pod.Name); len(cached.(*leanPod).pod().Status.Conditions) != 0 {
		t.Error("the cache holds the pod's conditions")
	}
	pod.Labels = map[string]string{"pod": "relabelled"}
	if _, err := pods.Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the label change as an event", 5*time.Second, func() bool { return events() > before })
}

// BenchmarkLeanPods measures the bytes an informer holds per pod, for the
// pod a kubelet writes and for its lean copy, in one run (b.N pods, at
// least 10,000: the heap's growth over storing them). The lean copy is
// also stored with the namespace index an informer factory's informers
// carry (the agent's do not: lean-indexed-bytes/pod is what it saves).
func BenchmarkLeanPods(b *testing.B) {
	data, err := os.ReadFile("testdata/kubelet-pod.json")
	if err != nil {
		b.Fatal(err)
	}
	n := max(b.N, 10000)
	held := func(transform, indexed bool) float64 {
		store := cache.NewStore(cache.MetaNamespaceKeyFunc)
		if indexed {
			store = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		}
		return float64(heldBytes(store, func() {
			for i := 0; i < n; i++ {
				var p corev1.Pod
				if err := json.Unmarshal(data, &p); err != nil {
					b.Fatal(err)
				}
				p.Name = fmt.Sprintf("api-%d", i)
				p.Namespace = fmt.Sprintf("ns-%d", i%100)
				var obj any = &p
				if transform {
					obj = leanObject(obj, "node-1")
				}
				store.Add(obj)
			}
		})) / float64(n)
	}
	full := held(false, false)
	lean := held(true, false)
	b.ReportMetric(full, "full-bytes/pod")
	b.ReportMetric(lean, "lean-bytes/pod")
	b.ReportMetric(held(true, true), "lean-indexed-bytes/pod")
	b.ReportMetric(lean/full, "ratio")
}

// TestLeanEndpointSlice: the proxy builds the same Services from a lean
// EndpointSlice (the slice parsed for the node) and Service as from the
// full ones.
func TestLeanEndpointSlice(t *testing.T) {
	yes, no := true, false
	node, zone, host := "node-1", "zone-a", "web-0"
	full := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}, Annotations: map[string]string{"a": "b"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				Hostname: &host, NodeName: &node, Zone: &zone, DeprecatedTopology: map[string]string{"x": "y"},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-0", UID: "1234", ResourceVersion: "99"}},
			{Addresses: []string{"10.244.2.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes},
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}},
		},
	}
	lean := leanObject(full, "node-1").(*leanSlice)
	if lean.Name != "web-1" || lean.Namespace != "shop" || lean.slice.Service != "web" || len(lean.slice.Endpoints) != 2 {
		t.Errorf("lean slice: %+v, parsed %+v", lean, lean.slice)
	}
	local, single := corev1.ServiceInternalTrafficPolicyLocal, corev1.IPFamilyPolicySingleStack
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", Annotations: map[string]string{"a": "b"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Type: corev1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": "web"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single,
			InternalTrafficPolicy: &local, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: 30001,
			SessionAffinity: corev1.ServiceAffinityClientIP, LoadBalancerSourceRanges: []string{"192.0.2.0/24"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http"), NodePort: 30080}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "203.0.113.7"}}}}}
	leanSvc := leanObject(svc.DeepCopy(), "node-1").(*corev1.Service)
	if leanSvc.Spec.Selector != nil || leanSvc.Annotations != nil {
		t.Errorf("lean Service keeps what the proxy does not read: %+v", leanSvc)
	}
	if again := leanObject(svc.DeepCopy(), "node-1"); again.(*corev1.Service).Spec.InternalTrafficPolicy != leanSvc.Spec.InternalTrafficPolicy {
		t.Error("two lean Services do not share their traffic policy value")
	}
	models := map[string]string{}
	for name, lean := range map[string]bool{"full": false, "lean": true} {
		snap := cluster.New()
		syncer := proxy.NewSyncer("node-1", proxy.Options{}, proxy.CompileOptions{})
		var m *proxy.Model
		if lean {
			snap.Services = append(snap.Services, leanSvc)
			m, _ = syncer.SyncParsed(snap, []*proxy.Slice{leanObject(full, "node-1").(*leanSlice).slice})
		} else {
			snap.Services = append(snap.Services, svc)
			snap.EndpointSlices = append(snap.EndpointSlices, full)
			m, _ = syncer.Sync(snap)
		}
		if len(m.Services) != 1 || len(m.Services[0].ClusterEndpoints) != 1 || len(m.Services[0].LocalEndpoints) != 1 {
			t.Fatalf("%s: %d Service ports: %+v", name, len(m.Services), m.Services)
		}
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		models[name] = string(data)
	}
	if models["full"] != models["lean"] {
		t.Errorf("the lean Service and slice build another model:\nfull %s\nlean %s", models["full"], models["lean"])
	}
}

func ptr[T any](v T) *T { return &v }

// A policy object is kept as a record: its JSON without managedFields,
// annotations and status, which builds the same policy, and what the
// status writer reads of it (its Accepted condition); the informer's
// input is not changed.
func TestLeanPolicy(t *testing.T) {
	const anp = `{"apiVersion":"policy.networking.k8s.io/v1alpha1","kind":"AdminNetworkPolicy",
	 "metadata":{"name":"deny-db","uid":"u1","resourceVersion":"7","generation":3,"labels":{"team":"db"},
	  "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{}"},
	  "managedFields":[{"manager":"kubectl","operation":"Apply","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:priority":{}}}}]},
	 "spec":{"priority":10,"subject":{"namespaces":{}},
	  "ingress":[{"name":"deny","action":"Deny","from":[{"namespaces":{"matchLabels":{"kubernetes.io/metadata.name":"web"}}}]}]},
	 "status":{"conditions":[{"type":"Accepted","status":"True","reason":"Valid","message":"netpol enforces this policy","lastTransitionTime":"2026-12-01T00:00:00Z","observedGeneration":3}]}}`
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON([]byte(anp)); err != nil {
		t.Fatal(err)
	}
	before := u.DeepCopy()
	got, err := leanPolicy(u)
	if err != nil {
		t.Fatal(err)
	}
	rec := got.(*policyRecord)
	if !equality.Semantic.DeepEqual(u, before) {
		t.Error("the input was changed")
	}
	if rec.APIVersion != "policy.networking.k8s.io/v1alpha1" || rec.Kind != "AdminNetworkPolicy" || rec.Name != "deny-db" ||
		rec.Namespace != "" || rec.ResourceVersion != "7" || rec.GetGeneration() != 3 || rec.err != nil {
		t.Errorf("record %+v", rec)
	}
	want := condition{status: "True", reason: "Valid", message: "netpol enforces this policy", observedGeneration: 3}
	if rec.accepted == nil || *rec.accepted != want {
		t.Errorf("Accepted condition %+v, want %+v", rec.accepted, want)
	}
	if key, _ := cache.MetaNamespaceKeyFunc(rec); key != "deny-db" {
		t.Errorf("store key %q", key)
	}
	// The JSON is the object without managedFields, annotations and
	// status.
	var kept map[string]any
	if err := json.Unmarshal(rec.json, &kept); err != nil {
		t.Fatal(err)
	}
	meta := kept["metadata"].(map[string]any)
	if meta["managedFields"] != nil || meta["annotations"] != nil || kept["status"] != nil {
		t.Errorf("kept managedFields %v, annotations %v, status %v", meta["managedFields"], meta["annotations"], kept["status"])
	}
	if meta["name"] != "deny-db" || meta["uid"] != "u1" || meta["labels"].(map[string]any)["team"] != "db" {
		t.Errorf("metadata %v", meta)
	}
	// The model reads the same policy from the record as from the object.
	full := cluster.New()
	if errs := full.AddAPIObject([]byte(anp)).Errors; len(errs) > 0 {
		t.Fatal(errs)
	}
	leanSnap, leanErrs := loadPolicy(rec)
	if len(leanErrs) > 0 {
		t.Fatalf("load: %v", leanErrs)
	}
	if len(full.AdminPolicies) != 1 || len(leanSnap.AdminPolicies) != 1 ||
		!equality.Semantic.DeepEqual(full.AdminPolicies[0].Spec, leanSnap.AdminPolicies[0].Spec) ||
		full.AdminPolicies[0].Name != leanSnap.AdminPolicies[0].Name {
		t.Errorf("the lean policy loads differently:\n%+v\n%+v", full.AdminPolicies, leanSnap.AdminPolicies)
	}
	// An object without an Accepted condition has none.
	u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
	if got, _ := leanPolicy(u); got.(*policyRecord).accepted != nil {
		t.Errorf("a Ready condition was read as Accepted: %+v", got.(*policyRecord).accepted)
	}
	// Anything else passes unchanged.
	np := &networkingv1.NetworkPolicy{}
	if out, _ := leanPolicy(np); out != any(np) {
		t.Error("a typed object was replaced")
	}
}

// BenchmarkLeanSlices measures the bytes an informer holds per endpoint
// of the agent benchmarks' EndpointSlices (internal/synth: 100,000 pods,
// 20,000 Services, a slice of up to 5 endpoints each), stored as decoded
// and stored lean (parsed for node-1), in one run.
func BenchmarkLeanSlices(b *testing.B) {
	const pods = 100000
	snap, err := synth.Snapshot(synth.Spec{Namespaces: pods / 100, Pods: pods, Nodes: pods / 100, Services: pods / 5, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	endpoints := 0
	for _, es := range snap.EndpointSlices {
		endpoints += len(es.Endpoints)
	}
	held := func(lean bool) float64 {
		store := cache.NewStore(cache.MetaNamespaceKeyFunc)
		return float64(heldBytes(store, func() {
			for _, es := range snap.EndpointSlices {
				var obj any = es.DeepCopy() // as decoded: nothing shared
				if lean {
					obj = leanObject(obj, "node-1")
				}
				store.Add(obj)
			}
		})) / float64(endpoints)
	}
	var full, lean float64
	for b.Loop() {
		full, lean = held(false), held(true)
	}
	b.ReportMetric(full, "full-bytes/endpoint")
	b.ReportMetric(lean, "lean-bytes/endpoint")
	b.ReportMetric(lean/full, "ratio")
}

// BenchmarkLeanPolicies measures the bytes an informer holds per admin,
// baseline or cluster policy of the agent benchmarks (internal/synth's
// 1,000 at 100,000 pods), stored as the dynamic
// informer decodes them (unstructured) and as policyRecords, in one run.
// The synthetic objects have no managedFields or annotations, so the
// first is also what the transform before policyRecords kept.
func BenchmarkLeanPolicies(b *testing.B) {
	const pods = 100000
	spec := synth.Spec{Namespaces: pods / 100, Pods: pods, Nodes: pods / 100, AdminPolicies: pods / 100, Seed: 1}
	var docs [][]byte // the policies as the API server sends them
	for doc := range strings.SplitSeq(synth.YAML(spec), "\n---\n") {
		if !strings.Contains(doc, "apiVersion: policy.networking.k8s.io/") {
			continue
		}
		data, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			b.Fatal(err)
		}
		docs = append(docs, data)
	}
	held := func(lean bool) float64 {
		store := cache.NewStore(cache.MetaNamespaceKeyFunc)
		return float64(heldBytes(store, func() {
			for _, data := range docs {
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(data); err != nil {
					b.Fatal(err)
				}
				var obj any = u
				if lean {
					obj, _ = leanPolicy(u)
				}
				store.Add(obj)
			}
		})) / float64(len(docs))
	}
	var full, lean float64
	for b.Loop() {
		full, lean = held(false), held(true)
	}
	b.ReportMetric(float64(len(docs)), "policies")
	b.ReportMetric(full, "unstructured-bytes/policy")
	b.ReportMetric(lean, "record-bytes/policy")
	b.ReportMetric(lean/full, "ratio")
}

// TestLeanPodAddresses: the record's one string of addresses gives the
// thin pod the full pod's addresses: none, one, the primary repeated in
// status.podIPs, two families, and podIPs without podIP.
func TestLeanPodAddresses(t *testing.T) {
	for _, tc := range []struct {
		podIP  string
		podIPs []string
	}{
		{"", nil},
		{"10.244.1.5", nil},
		{"10.244.1.5", []string{"10.244.1.5"}},
		{"10.244.1.5", []string{"10.244.1.5", "fd00:10:244:1::5"}},
		{"", []string{"fd00:10:244:1::5", "10.244.1.5"}},
	} {
		full := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "api"}}
		full.Status.PodIP = tc.podIP
		for _, ip := range tc.podIPs {
			full.Status.PodIPs = append(full.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		rec := newLeanPod(full)
		if got, want := fmt.Sprint(cluster.PodAddresses(rec.pod())), fmt.Sprint(cluster.PodAddresses(full)); got != want {
			t.Errorf("%q %v: thin pod's addresses %s, want %s (record %q)", tc.podIP, tc.podIPs, got, want, rec.ips)
		}
		if again := newLeanPod(rec.pod()); !again.sameAs(rec) {
			t.Errorf("%q %v: the thin pod's record differs: %q against %q", tc.podIP, tc.podIPs, again.ips, rec.ips)
		}
	}
}

// heldBytes is what the live heap grows by while fill adds objects to
// store, and store holds them.
func heldBytes(store cache.Store, fill func()) int64 {
	runtime.GC()
	before := benchstat.LiveHeap()
	fill()
	runtime.GC()
	after := benchstat.LiveHeap()
	runtime.KeepAlive(store)
	return int64(after) - int64(before)
}
