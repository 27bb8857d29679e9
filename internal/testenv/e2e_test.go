//go:build e2e

package testenv_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netpol/netpol/internal/testenv"
	"github.com/netpol/netpol/pkg/cluster"
)

var gvrCRD = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// One environment for the whole sequence: starting one takes seconds, and
// the later steps use what the deploy step installed.
func TestEnvironment(t *testing.T) {
	start := time.Now()
	env := testenv.Start(t, testenv.Options{Users: []testenv.User{{Name: "alice", Token: "alice-token", Groups: []string{"e2e:viewers"}}}})
	t.Logf("etcd %s + kube-apiserver ready in %v (%s)", env.EtcdVersion, time.Since(start).Round(time.Millisecond), env.Config.Host)

	if !t.Run("deploy manifests", func(t *testing.T) { testDeploy(t, env) }) {
		t.FailNow()
	}
	t.Run("agent RBAC", func(t *testing.T) { testAgentRBAC(t, env) })
	t.Run("static token user", func(t *testing.T) { testStaticUser(t, env) })
	t.Run("kubeconfig CRUD", func(t *testing.T) { testKubeconfig(t, env) })
	t.Run("watch and informer", func(t *testing.T) { testWatch(t, env) })
	t.Run("manifest errors", func(t *testing.T) { testApplyErrors(t, env) })
	t.Run("children survive thread exits", func(t *testing.T) { testThreadExits(t, env) })
	t.Run("apiserver restart", func(t *testing.T) { testRestart(t, env) })
}

// testThreadExits: a goroutine that exits while locked to its OS thread
// ends the thread (network-namespace code does so on purpose). The
// children get SIGKILL when the thread that forked them dies, so they must
// not have been forked from a thread that can die.
func testThreadExits(t *testing.T, env *testenv.Env) {
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			runtime.LockOSThread()
			time.Sleep(time.Millisecond)
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	if _, err := env.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(t.Context()); err != nil {
		t.Fatalf("after 64 thread exits: %v", err)
	}
	if _, err := env.Client.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("after 64 thread exits: %v", err)
	}
}

// testDeploy installs deploy/'s CRDs and applies every other manifest the
// kustomization lists: for real, except workloads, which are applied with
// dry-run=server (no controllers run here to act on them).
func testDeploy(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	resources, err := testenv.KustomizationResources("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	var crds, rest []string
	for _, r := range resources {
		if strings.Contains(r, "/crds/") {
			crds = append(crds, r)
		} else {
			rest = append(rest, r)
		}
	}
	start := time.Now()
	if err := env.InstallCRDs(ctx, crds...); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d CRDs established in %v", len(crds), time.Since(start).Round(time.Millisecond))
	docs, err := testenv.ReadFiles(rest...)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		dry := d.Object.GetKind() == "DaemonSet" || d.Object.GetKind() == "Deployment"
		if err := env.Apply(ctx, dry, d); err != nil {
			t.Fatal(err)
		}
		t.Logf("applied %s (dry-run: %v)", d.Name(), dry)
	}
	// Dry-run stored nothing; the rest is there.
	if _, err := env.Client.AppsV1().DaemonSets("netpol-system").Get(ctx, "netpol-agent", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the dry-run DaemonSet: want NotFound, got %v", err)
	}
	if _, err := env.Client.RbacV1().ClusterRoles().Get(ctx, "netpol-agent", metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	// A second apply of the same manifests is a no-op, not a conflict.
	if err := env.ApplyFiles(ctx, false, rest[:len(rest)-1]...); err != nil {
		t.Errorf("re-apply: %v", err)
	}
}

// testAgentRBAC authenticates as the agent's service account (a token from
// the TokenRequest API) and checks that deploy/rbac.yaml allows what the
// agent does and nothing more.
func testAgentRBAC(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	kubeconfig, _, err := env.ServiceAccountConfig(ctx, "netpol-system", "netpol-agent")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200 // client-go's default 5 QPS would pace the checks
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	// A policy of each kind to read and to write status on, made by the admin.
	mustCreate(t, env.Dynamic, cluster.GVRClusterPolicyV1beta1, cnpYAML("rbac-cnp", "v1beta1"))
	mustCreate(t, env.Dynamic, cluster.GVRAdminPolicy, anpYAML("rbac-anp"))
	mustCreate(t, env.Dynamic, cluster.GVRBaselinePolicy, banpYAML)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.Dynamic.Resource(cluster.GVRClusterPolicyV1beta1).Delete(ctx, "rbac-cnp", metav1.DeleteOptions{})
		_ = env.Dynamic.Resource(cluster.GVRAdminPolicy).Delete(ctx, "rbac-anp", metav1.DeleteOptions{})
		_ = env.Dynamic.Resource(cluster.GVRBaselinePolicy).Delete(ctx, "default", metav1.DeleteOptions{})
	})

	allowed := map[string]func() error{
		"list pods":       func() error { _, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); return err },
		"list namespaces": func() error { _, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); return err },
		"list nodes":      func() error { _, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); return err },
		"list services":   func() error { _, err := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{}); return err },
		"list endpointslices": func() error {
			_, err := kube.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list networkpolicies": func() error {
			_, err := kube.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list servicecidrs": func() error {
			_, err := kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
			return err
		},
		"watch servicecidrs": func() error {
			w, err := kube.NetworkingV1().ServiceCIDRs().Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		},
		"watch pods": func() error {
			w, err := kube.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		},
		"list crds":  func() error { _, err := dyn.Resource(gvrCRD).List(ctx, metav1.ListOptions{}); return err },
		"watch crds": func() error { return watchOnce(ctx, dyn.Resource(gvrCRD)) },
		"list cnp v1beta1": func() error {
			_, err := dyn.Resource(cluster.GVRClusterPolicyV1beta1).List(ctx, metav1.ListOptions{})
			return err
		},
		"watch cnp v1alpha2": func() error { return watchOnce(ctx, dyn.Resource(cluster.GVRClusterPolicyV1alpha2)) },
		"list anp": func() error {
			_, err := dyn.Resource(cluster.GVRAdminPolicy).List(ctx, metav1.ListOptions{})
			return err
		},
		"list banp": func() error {
			_, err := dyn.Resource(cluster.GVRBaselinePolicy).List(ctx, metav1.ListOptions{})
			return err
		},
		"patch cnp status":  func() error { return patchStatus(ctx, dyn, cluster.GVRClusterPolicyV1beta1, "rbac-cnp") },
		"patch anp status":  func() error { return patchStatus(ctx, dyn, cluster.GVRAdminPolicy, "rbac-anp") },
		"patch banp status": func() error { return patchStatus(ctx, dyn, cluster.GVRBaselinePolicy, "default") },
		"create lease": func() error {
			_, err := kube.CoordinationV1().Leases("netpol-system").Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "netpol-status-writer"}}, metav1.CreateOptions{})
			return err
		},
		"create, get and update a core event": func() error {
			ev, err := kube.CoreV1().Events("default").Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{GenerateName: "netpol-"},
				InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-1"},
				Reason:         "Test", Message: "rbac test", Type: corev1.EventTypeNormal,
			}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if ev, err = kube.CoreV1().Events("default").Get(ctx, ev.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			ev.Message = "rbac test, updated"
			_, err = kube.CoreV1().Events("default").Update(ctx, ev, metav1.UpdateOptions{})
			return err
		},
		"create events.k8s.io event": func() error {
			_, err := kube.EventsV1().Events("default").Create(ctx, &eventsv1.Event{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "netpol-"}, EventTime: metav1.NowMicro(),
				ReportingController: "netpol.dev/agent", ReportingInstance: "netpol-agent-node-1",
				Action: "Enforce", Reason: "Test", Type: corev1.EventTypeNormal,
				Regarding: corev1.ObjectReference{Kind: "Node", Name: "node-1"},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for name, call := range allowed {
		if err := call(); err != nil {
			t.Errorf("%s: want allowed, got %v", name, err)
		}
	}
	lease, err := kube.CoordinationV1().Leases("netpol-system").Get(ctx, "netpol-status-writer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder := "node-1"
	lease.Spec.HolderIdentity = &holder
	if _, err := kube.CoordinationV1().Leases("netpol-system").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Errorf("update lease: %v", err)
	}

	forbidden := map[string]func() error{
		"patch cnp spec": func() error {
			_, err := dyn.Resource(cluster.GVRClusterPolicyV1beta1).Patch(ctx, "rbac-cnp", types.MergePatchType, []byte(`{"spec":{"priority":99}}`), metav1.PatchOptions{})
			return err
		},
		"delete anp": func() error {
			return dyn.Resource(cluster.GVRAdminPolicy).Delete(ctx, "rbac-anp", metav1.DeleteOptions{})
		},
		"create cnp": func() error {
			return createFrom(ctx, dyn, cluster.GVRClusterPolicyV1beta1, cnpYAML("sa-made", "v1beta1"))
		},
		"list secrets": func() error { _, err := kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{}); return err },
		"get configmaps": func() error {
			_, err := kube.CoreV1().ConfigMaps("default").Get(ctx, "x", metav1.GetOptions{})
			return err
		},
		"delete pods": func() error { return kube.CoreV1().Pods("default").Delete(ctx, "x", metav1.DeleteOptions{}) },
		"patch node": func() error {
			_, err := kube.CoreV1().Nodes().Patch(ctx, "x", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
			return err
		},
		"delete crd": func() error {
			return dyn.Resource(gvrCRD).Delete(ctx, "adminnetworkpolicies.policy.networking.k8s.io", metav1.DeleteOptions{})
		},
		"lease elsewhere": func() error {
			_, err := kube.CoordinationV1().Leases("default").Get(ctx, "x", metav1.GetOptions{})
			return err
		},
		"delete lease": func() error {
			return kube.CoordinationV1().Leases("netpol-system").Delete(ctx, "netpol-status-writer", metav1.DeleteOptions{})
		},
	}
	for name, call := range forbidden {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: want Forbidden, got %v", name, err)
		}
	}
}

// testStaticUser: Options.Users are authenticated by token (403, not
// 401, without a binding) and RBAC applies to their groups.
func testStaticUser(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = "alice-token"
	kube := kubernetes.NewForConfigOrDie(cfg)
	if _, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice without a binding: want Forbidden, got %v", err)
	}
	// Not the built-in "view": aggregated roles stay empty without the
	// controller manager.
	err := env.ApplyYAML(ctx, false, `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e-pod-reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: e2e-viewers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-pod-reader}
subjects: [{kind: Group, name: "e2e:viewers", apiGroup: rbac.authorization.k8s.io}]
`)
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func() error { _, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); return err }); err != nil {
		t.Fatalf("alice with a binding: %v", err)
	}
	cfg.BearerToken = "wrong"
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("a wrong token: want Unauthorized, got %v", err)
	}
}

func poll(ctx context.Context, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		err := f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testKubeconfig uses only the kubeconfig file: the objects the agent
// e2e tests create, including a Pod whose status the test sets as kubelet
// would.
func testKubeconfig(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: "e2e-kubeconfig", Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels["kubernetes.io/metadata.name"] != "e2e-kubeconfig" {
		t.Errorf("namespace labels %v: want the kubernetes.io/metadata.name label the apiserver adds", ns.Labels)
	}
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: "node-1", Labels: map[string]string{"kubernetes.io/hostname": "node-1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	pod, err := kube.CoreV1().Pods(ns.Name).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"app": "a"}},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{
			Name: "c", Image: "registry.invalid/none", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.ServiceAccountName != "" {
		t.Errorf("serviceAccountName %q: the ServiceAccount admission plugin should be off", pod.Spec.ServiceAccountName)
	}
	pod.Status = corev1.PodStatus{
		Phase:  corev1.PodRunning,
		HostIP: "192.0.2.1", HostIPs: []corev1.HostIP{{IP: "192.0.2.1"}},
		PodIP: "10.244.1.5", PodIPs: []corev1.PodIP{{IP: "10.244.1.5"}, {IP: "fd00:10:244:1::5"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
	}
	if _, err := kube.CoreV1().Pods(ns.Name).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := kube.CoreV1().Pods(ns.Name).Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.244.1.5" || len(got.Status.PodIPs) != 2 {
		t.Errorf("pod status after update: %+v", got.Status)
	}
	// A merge patch of the status, as a test moving a pod changes its IP.
	if _, err := kube.CoreV1().Pods(ns.Name).Patch(ctx, "a", types.MergePatchType,
		[]byte(`{"status":{"podIP":"10.244.1.6","podIPs":[{"ip":"10.244.1.6"}]}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		gvr  schema.GroupVersionResource
		yaml string
	}{
		{cluster.GVRClusterPolicyV1beta1, cnpYAML("kc-beta", "v1beta1")},
		{cluster.GVRClusterPolicyV1alpha2, cnpYAML("kc-alpha", "v1alpha2")},
		{cluster.GVRAdminPolicy, anpYAML("kc-anp")},
		{cluster.GVRBaselinePolicy, banpYAML},
	} {
		if err := createFrom(ctx, dyn, c.gvr, c.yaml); err != nil {
			t.Fatalf("%s: %v", c.gvr.Resource, err)
		}
	}
	// Both ClusterNetworkPolicy versions are served from one storage.
	if _, err := dyn.Resource(cluster.GVRClusterPolicyV1alpha2).Get(ctx, "kc-beta", metav1.GetOptions{}); err != nil {
		t.Errorf("kc-beta read at v1alpha2: %v", err)
	}
	// The experimental channel keeps fields the standard one prunes.
	u, err := dyn.Resource(cluster.GVRClusterPolicyV1beta1).Get(ctx, "kc-beta", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if peers, _, _ := unstructured.NestedSlice(u.Object, "spec", "egress"); len(peers) != 2 {
		t.Errorf("kc-beta egress rules: %v", peers)
	} else if _, ok, _ := unstructured.NestedFieldNoCopy(peers[1].(map[string]any), "to"); !ok {
		t.Errorf("kc-beta egress rule without its peers (pruned?): %v", peers[1])
	}
}

// testWatch: watches and informers against etcd 3.4 (the informers first
// try a WatchList stream, which needs etcd >= 3.4.31, and fall back to
// list+watch).
func testWatch(t *testing.T, env *testenv.Env) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e-watch"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := env.Client.CoreV1().Pods("e2e-watch").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	factory := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace("e2e-watch"))
	pods := factory.Core().V1().Pods().Informer()
	stop := make(chan struct{})
	factory.Start(stop)
	defer factory.Shutdown()
	defer close(stop) // before Shutdown, which waits for the informers
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced) {
		t.Fatal("informer did not sync")
	}

	if _, err := env.Client.CoreV1().Pods("e2e-watch").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "w"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added {
			t.Fatalf("first watch event %s %v", ev.Type, ev.Object)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	for {
		if _, ok, _ := pods.GetStore().GetByKey("e2e-watch/w"); ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the informer never saw the pod")
		case <-time.After(20 * time.Millisecond):
		}
	}

	// A dynamic informer on a CRD-backed resource too (the agent's path).
	start := time.Now()
	if err := createFrom(ctx, env.Dynamic, cluster.GVRClusterPolicyV1beta1, cnpYAML("watch-cnp", "v1beta1")); err != nil {
		t.Fatal(err)
	}
	dw, err := env.Dynamic.Resource(cluster.GVRClusterPolicyV1beta1).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=watch-cnp"})
	if err != nil {
		t.Fatal(err)
	}
	defer dw.Stop()
	if err := env.Dynamic.Resource(cluster.GVRClusterPolicyV1beta1).Delete(ctx, "watch-cnp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for ev := range dw.ResultChan() {
		if ev.Type == watch.Deleted {
			t.Logf("CNP delete seen by a watch in %v", time.Since(start).Round(time.Millisecond))
			return
		}
	}
	t.Fatal("watch closed before the delete")
}

// testApplyErrors: a broken manifest fails ApplyFiles with the object's
// name, in dry-run mode too.
func testApplyErrors(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	for name, c := range map[string]struct{ yaml, want string }{
		"typo in a field": {`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: typo, namespace: netpol-system}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      hostNetwrk: true
      containers: [{name: c, image: i}]
`, "DaemonSet netpol-system/typo"},
		"invalid object": {`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: mismatch, namespace: netpol-system}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: c}}
    spec: {containers: [{name: c, image: i}]}
`, "DaemonSet netpol-system/mismatch"},
		"missing namespace": {`apiVersion: v1
kind: ServiceAccount
metadata: {name: x, namespace: no-such-namespace}
`, "ServiceAccount no-such-namespace/x"},
		"unserved kind": {`apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
`, "Widget w"},
		"invalid CNP": {`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: bad}
spec: {tier: Middle, priority: 1, subject: {namespaces: {}}}
`, "ClusterNetworkPolicy bad"},
	} {
		err := env.ApplyYAML(ctx, true, c.yaml)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error naming %q, got %v", name, c.want, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// testRestart stops and starts kube-apiserver on the same port and etcd:
// clients fail meanwhile, and the data survives.
func testRestart(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	if _, err := env.Client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "survivor"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	etcdPID, apiPID := env.PIDs()
	if etcdPID <= 0 || apiPID <= 0 || !processAlive(etcdPID) || !processAlive(apiPID) {
		t.Fatalf("PIDs() = %d, %d: want both children's, alive", etcdPID, apiPID)
	}
	start := time.Now()
	env.StopAPIServer()
	t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
	if e, a := env.PIDs(); e != etcdPID || a != 0 {
		t.Errorf("PIDs() with the apiserver stopped = %d, %d: want %d, 0", e, a, etcdPID)
	}
	if _, err := env.Client.CoreV1().ConfigMaps("default").Get(ctx, "survivor", metav1.GetOptions{}); err == nil {
		t.Fatal("a request succeeded while the apiserver was stopped")
	}
	start = time.Now()
	if err := env.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted and ready in %v", time.Since(start).Round(time.Millisecond))
	if _, a := env.PIDs(); a <= 0 || a == apiPID || !processAlive(a) {
		t.Errorf("PIDs() after the restart: apiserver %d, want a new live process (was %d)", a, apiPID)
	}
	cm, err := env.Client.CoreV1().ConfigMaps("default").Get(ctx, "survivor", metav1.GetOptions{})
	if err != nil || cm.Data["k"] != "v" {
		t.Fatalf("after restart: %v %v", cm, err)
	}
	if err := env.StartAPIServer(ctx); err == nil {
		t.Error("StartAPIServer while running: want an error")
	}
}

// processAlive reports whether pid is a running process (signal 0).
func processAlive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func cnpYAML(name, version string) string {
	return `apiVersion: policy.networking.k8s.io/` + version + `
kind: ClusterNetworkPolicy
metadata:
  name: ` + name + `
spec:
  tier: Admin
  priority: 10
  subject:
    namespaces:
      matchLabels:
        team: a
  ingress:
    - name: deny-from-b
      action: Deny
      from:
        - namespaces:
            matchLabels:
              team: b
  egress:
    - name: allow-dns
      action: Accept
      to:
        - pods:
            namespaceSelector: {}
            podSelector:
              matchLabels:
                k8s-app: kube-dns
      protocols:
        - udp:
            destinationPort:
              number: 53
    - name: allow-nodes
      action: Accept
      to:
        - nodes:
            matchLabels:
              kubernetes.io/hostname: node-1
`
}

func anpYAML(name string) string {
	return `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: ` + name + `
spec:
  priority: 5
  subject:
    namespaces:
      matchLabels:
        team: a
  ingress:
    - name: allow-from-b
      action: Allow
      from:
        - namespaces:
            matchLabels:
              team: b
      ports:
        - portNumber:
            protocol: TCP
            port: 80
`
}

const banpYAML = `apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata:
  name: default
spec:
  subject:
    namespaces: {}
  ingress:
    - name: deny-all
      action: Deny
      from:
        - namespaces: {}
`

func decodeOne(t testing.TB, y string) *unstructured.Unstructured {
	t.Helper()
	u, err := unstructuredFrom(y)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func unstructuredFrom(y string) (*unstructured.Unstructured, error) {
	docs, err := testenv.DecodeYAML("test", y)
	if err != nil {
		return nil, err
	}
	return docs[0].Object, nil
}

func createFrom(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, y string) error {
	u, err := unstructuredFrom(y)
	if err != nil {
		return err
	}
	_, err = dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	return err
}

func mustCreate(t testing.TB, dyn dynamic.Interface, gvr schema.GroupVersionResource, y string) {
	t.Helper()
	if _, err := dyn.Resource(gvr).Create(t.Context(), decodeOne(t, y), metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating %s: %v", gvr.Resource, err)
	}
}

// patchStatus writes a condition as the agent does: a server-side apply
// patch of the status subresource.
func patchStatus(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, name string) error {
	kind := map[string]string{"clusternetworkpolicies": "ClusterNetworkPolicy", "adminnetworkpolicies": "AdminNetworkPolicy",
		"baselineadminnetworkpolicies": "BaselineAdminNetworkPolicy"}[gvr.Resource]
	patch := `{"apiVersion":"` + gvr.GroupVersion().String() + `","kind":"` + kind + `","metadata":{"name":"` + name + `"},` +
		`"status":{"conditions":[{"type":"Accepted","status":"True","reason":"Programmed","message":"enforced on node-1",` +
		`"lastTransitionTime":"` + time.Now().UTC().Format(time.RFC3339) + `"}]}}`
	force := true
	_, err := dyn.Resource(gvr).Patch(ctx, name, types.ApplyPatchType, []byte(patch),
		metav1.PatchOptions{FieldManager: "netpol-agent", Force: &force}, "status")
	return err
}

func watchOnce(ctx context.Context, ri dynamic.ResourceInterface) error {
	w, err := ri.Watch(ctx, metav1.ListOptions{})
	if err == nil {
		w.Stop()
	}
	return err
}
