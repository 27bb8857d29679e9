package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	cnpv1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	policyfake "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned/fake"
)

func coreObjects() []runtime.Object {
	return []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"team": "a"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "y"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a", Labels: map[string]string{"pod": "a"}},
			Status: corev1.PodStatus{PodIP: "10.0.0.1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "y", Name: "b"}, Status: corev1.PodStatus{PodIP: "10.0.0.2"}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web"}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "web-abc"}, AddressType: discoveryv1.AddressTypeIPv4},
		&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "deny-all"}},
	}
}

func cnpSpec() cnpv1beta1.ClusterNetworkPolicySpec {
	return cnpv1beta1.ClusterNetworkPolicySpec{
		Tier: cnpv1beta1.AdminTier, Priority: 10,
		Subject: cnpv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
		Ingress: []cnpv1beta1.ClusterNetworkPolicyIngressRule{{
			Name: "deny-y", Action: cnpv1beta1.ClusterNetworkPolicyRuleActionDeny,
			From: []cnpv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": "y"}}}},
		}},
	}
}

func anpObjects() []runtime.Object {
	return []runtime.Object{
		&anpv1alpha1.AdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "anp-1"},
			Spec: anpv1alpha1.AdminNetworkPolicySpec{Priority: 5,
				Subject: anpv1alpha1.AdminNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}}},
		&anpv1alpha1.BaselineAdminNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
			Spec: anpv1alpha1.BaselineAdminNetworkPolicySpec{
				Subject: anpv1alpha1.AdminNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}}},
	}
}

func resources(gv string, names ...string) *metav1.APIResourceList {
	l := &metav1.APIResourceList{GroupVersion: gv}
	for _, n := range names {
		l.APIResources = append(l.APIResources, metav1.APIResource{Name: n})
	}
	return l
}

func hasNote(r *Report, parts ...string) bool {
	for _, n := range r.Notes {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(n, p)
		}
		if ok {
			return true
		}
	}
	return false
}

func TestLoadFromClients(t *testing.T) {
	v1beta1CNP := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cnp-beta"}, Spec: cnpSpec()}
	v1alpha2CNP := &cnpv1alpha2.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cnp-alpha"}}
	// The v1alpha2 struct has the v1beta1 schema under another type.
	v1alpha2CNP.Spec = cnpv1alpha2.ClusterNetworkPolicySpec{
		Tier: cnpv1alpha2.AdminTier, Priority: 20,
		Subject: cnpv1alpha2.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
		Egress: []cnpv1alpha2.ClusterNetworkPolicyEgressRule{{
			Action: cnpv1alpha2.ClusterNetworkPolicyRuleActionAccept,
			To:     []cnpv1alpha2.ClusterNetworkPolicyEgressPeer{{Networks: []cnpv1alpha2.CIDR{"10.0.0.0/8"}}},
		}},
	}

	cases := []struct {
		name      string
		served    []*metav1.APIResourceList
		policies  []runtime.Object
		wantCNP   []string // names, with the apiVersion they came from
		wantANP   int
		wantBANP  int
		wantNotes [][]string
	}{
		{
			name: "v1beta1 and v1alpha1 served",
			served: []*metav1.APIResourceList{
				resources(gvPolicyV1beta1, resourceCNP),
				resources(gvPolicyV1alpha2, resourceCNP), // v1beta1 wins
				resources(gvPolicyV1alpha1, resourceANP, resourceBANP),
			},
			policies: append([]runtime.Object{v1beta1CNP, v1alpha2CNP}, anpObjects()...),
			wantCNP:  []string{"cnp-beta " + gvPolicyV1beta1},
			wantANP:  1, wantBANP: 1,
		},
		{
			name: "only v1alpha2 served: fallback",
			served: []*metav1.APIResourceList{
				resources(gvPolicyV1alpha2, resourceCNP),
				resources(gvPolicyV1alpha1, resourceANP), // no BANP resource
			},
			policies:  append([]runtime.Object{v1beta1CNP, v1alpha2CNP}, anpObjects()...),
			wantCNP:   []string{"cnp-alpha " + gvPolicyV1alpha2},
			wantANP:   1,
			wantNotes: [][]string{{"ClusterNetworkPolicy", gvPolicyV1alpha2, "not served"}, {"BaselineAdminNetworkPolicy", "none loaded"}},
		},
		{
			name:     "no policy CRDs served",
			policies: append([]runtime.Object{v1beta1CNP, v1alpha2CNP}, anpObjects()...),
			wantNotes: [][]string{
				{"ClusterNetworkPolicy", "none loaded"},
				{"AdminNetworkPolicy", "none loaded"},
				{"BaselineAdminNetworkPolicy", "none loaded"},
			},
		},
		{
			name: "group version served without the resource",
			served: []*metav1.APIResourceList{
				resources(gvPolicyV1beta1, "somethingelse"),
			},
			policies: []runtime.Object{v1beta1CNP},
			wantNotes: [][]string{
				{"ClusterNetworkPolicy", "none loaded"},
				{"AdminNetworkPolicy", "none loaded"},
				{"BaselineAdminNetworkPolicy", "none loaded"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kube := kubefake.NewClientset(coreObjects()...)
			disc := kube.Discovery().(*fakediscovery.FakeDiscovery)
			disc.Resources = tc.served
			pol := policyfake.NewClientset(tc.policies...)
			snap, report, err := LoadFromClients(context.Background(), kube, pol, disc)
			if err != nil {
				t.Fatal(err)
			}
			if len(report.Errors) != 0 {
				t.Fatalf("report errors: %v", report.Errors)
			}
			// Core objects land in the snapshot with their origin.
			if got := []int{len(snap.Namespaces), len(snap.Nodes), len(snap.Pods), len(snap.Services), len(snap.EndpointSlices), len(snap.NetworkPolicies)}; !slices.Equal(got, []int{2, 1, 2, 1, 1, 1}) {
				t.Errorf("core counts (ns, nodes, pods, svc, slices, np) = %v", got)
			}
			for key, apiVersion := range map[ObjectKey]string{
				{Kind: KindNamespace, Name: "x"}:                            "v1",
				{Kind: KindNode, Name: "node-1"}:                            "v1",
				{Kind: KindPod, Namespace: "y", Name: "b"}:                  "v1",
				{Kind: KindService, Namespace: "x", Name: "web"}:            "v1",
				{Kind: KindEndpointSlice, Namespace: "x", Name: "web-abc"}:  "discovery.k8s.io/v1",
				{Kind: KindNetworkPolicy, Namespace: "x", Name: "deny-all"}: "networking.k8s.io/v1",
			} {
				if got, ok := snap.Origin[key]; !ok || got != (Source{APIVersion: apiVersion}) {
					t.Errorf("Origin[%s] = %+v, %v; want APIVersion %s, no file", key, got, ok, apiVersion)
				}
			}
			for _, ns := range snap.Namespaces {
				if ns.Labels[namespaceNameLabel] != ns.Name {
					t.Errorf("namespace %s: %s label = %q", ns.Name, namespaceNameLabel, ns.Labels[namespaceNameLabel])
				}
			}
			if snap.Namespace("x").Labels["team"] != "a" {
				t.Errorf("namespace x lost its labels: %v", snap.Namespace("x").Labels)
			}
			if p := snap.Pod("x", "a"); p == nil || p.Status.PodIP != "10.0.0.1" {
				t.Errorf("pod x/a = %+v", p)
			}

			var gotCNP []string
			for _, c := range snap.ClusterPolicies {
				gotCNP = append(gotCNP, c.Name+" "+snap.Origin[ObjectKey{Kind: KindClusterPolicy, Name: c.Name}].APIVersion)
			}
			if !slices.Equal(gotCNP, tc.wantCNP) {
				t.Errorf("ClusterPolicies = %v, want %v", gotCNP, tc.wantCNP)
			}
			for _, c := range snap.ClusterPolicies {
				switch c.Name {
				case "cnp-alpha":
					if c.Spec.Priority != 20 || len(c.Spec.Egress) != 1 || len(c.Spec.Egress[0].To) != 1 ||
						len(c.Spec.Egress[0].To[0].Networks) != 1 || c.Spec.Egress[0].To[0].Networks[0] != "10.0.0.0/8" {
						t.Errorf("v1alpha2 CNP not converted: %+v", c.Spec)
					}
				case "cnp-beta":
					if c.Spec.Priority != 10 || len(c.Spec.Ingress) != 1 || c.Spec.Ingress[0].Name != "deny-y" {
						t.Errorf("v1beta1 CNP spec: %+v", c.Spec)
					}
				}
			}
			if len(snap.AdminPolicies) != tc.wantANP || len(snap.BaselinePolicies) != tc.wantBANP {
				t.Errorf("ANPs %d, BANPs %d; want %d, %d", len(snap.AdminPolicies), len(snap.BaselinePolicies), tc.wantANP, tc.wantBANP)
			}
			if tc.wantANP > 0 {
				if got := snap.Origin[ObjectKey{Kind: KindAdminPolicy, Name: "anp-1"}]; got != (Source{APIVersion: gvPolicyV1alpha1}) {
					t.Errorf("ANP origin = %+v", got)
				}
				if snap.AdminPolicies[0].Spec.Priority != 5 {
					t.Errorf("ANP priority = %d", snap.AdminPolicies[0].Spec.Priority)
				}
			}
			for _, want := range tc.wantNotes {
				if !hasNote(report, want...) {
					t.Errorf("no note containing %q in %q", want, report.Notes)
				}
			}
			if len(report.Notes) != len(tc.wantNotes) {
				t.Errorf("notes = %q, want %d", report.Notes, len(tc.wantNotes))
			}
		})
	}
}

func TestLoadFromClientsErrors(t *testing.T) {
	t.Run("core list error", func(t *testing.T) {
		kube := kubefake.NewClientset(coreObjects()...)
		kube.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("forbidden by test")
		})
		_, _, err := LoadFromClients(context.Background(), kube, policyfake.NewClientset(), kube.Discovery())
		if err == nil || !strings.Contains(err.Error(), "listing pods") || !strings.Contains(err.Error(), "forbidden by test") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("discovery error other than not found", func(t *testing.T) {
		kube := kubefake.NewClientset()
		kube.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("discovery broke")
		})
		_, _, err := LoadFromClients(context.Background(), kube, policyfake.NewClientset(), kube.Discovery())
		if err == nil || !strings.Contains(err.Error(), "discovery broke") || !strings.Contains(err.Error(), gvPolicyV1beta1) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("policy list error", func(t *testing.T) {
		kube := kubefake.NewClientset()
		kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{resources(gvPolicyV1alpha1, resourceANP)}
		pol := policyfake.NewClientset()
		pol.PrependReactor("list", resourceANP, func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("anp list failed")
		})
		_, _, err := LoadFromClients(context.Background(), kube, pol, kube.Discovery())
		if err == nil || !strings.Contains(err.Error(), "anp list failed") || !strings.Contains(err.Error(), resourceANP) {
			t.Fatalf("err = %v", err)
		}
	})
}

// fakeAPIServer serves the few paths LoadFromAPI reads, as JSON.
type fakeAPIServer struct {
	mu    sync.Mutex
	paths []string
	body  map[string]string
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.paths = append(f.paths, r.URL.Path)
	f.mu.Unlock()
	body, ok := f.body[r.URL.Path]
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"%s not found"}`, r.URL.Path)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, body)
}

func (f *fakeAPIServer) requested(path string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.paths, path)
}

func newFakeAPIServer(t *testing.T) (*fakeAPIServer, *httptest.Server) {
	f := &fakeAPIServer{body: map[string]string{
		"/api/v1/namespaces": `{"kind":"NamespaceList","apiVersion":"v1","metadata":{},"items":[
			{"metadata":{"name":"x","labels":{"kubernetes.io/metadata.name":"x"}}}]}`,
		"/api/v1/nodes": `{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":[]}`,
		"/api/v1/pods": `{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
			{"metadata":{"name":"a","namespace":"x"},"spec":{"containers":[{"name":"c"}]},"status":{"podIP":"10.0.0.1"}}]}`,
		"/api/v1/services":                           `{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`,
		"/apis/discovery.k8s.io/v1/endpointslices":   `{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","metadata":{},"items":[]}`,
		"/apis/networking.k8s.io/v1/networkpolicies": `{"kind":"NetworkPolicyList","apiVersion":"networking.k8s.io/v1","metadata":{},"items":[]}`,
		"/apis/" + gvPolicyV1beta1: `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"` + gvPolicyV1beta1 + `",
			"resources":[{"name":"clusternetworkpolicies","singularName":"clusternetworkpolicy","namespaced":false,"kind":"ClusterNetworkPolicy","verbs":["list"]}]}`,
		// A newer CRD than netpol's structs: an unknown field inside a peer
		// must reach UnknownFields, not be dropped by a typed decoder.
		"/apis/" + gvPolicyV1beta1 + "/clusternetworkpolicies": `{"kind":"ClusterNetworkPolicyList","apiVersion":"` + gvPolicyV1beta1 + `","metadata":{},"items":[
			{"apiVersion":"` + gvPolicyV1beta1 + `","kind":"ClusterNetworkPolicy","metadata":{"name":"future","resourceVersion":"7"},
			 "spec":{"tier":"Admin","priority":3,"subject":{"namespaces":{}},
			   "egress":[{"action":"Accept","to":[{"serviceAccounts":{"name":"x"}}]}]}}]}`,
	}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func writeKubeconfig(t *testing.T, server, currentContext string) string {
	t.Helper()
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster: {server: %q}
users:
- name: nobody
  user: {token: not-a-secret}
contexts:
- name: test
  context: {cluster: fake, user: nobody}
- name: other
  context: {cluster: nowhere, user: nobody}
current-context: %s
`, server, currentContext)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadFromAPI(t *testing.T) {
	check := func(t *testing.T, f *fakeAPIServer, snap *Snapshot, report *Report) {
		t.Helper()
		if len(snap.Namespaces) != 1 || len(snap.Pods) != 1 || len(snap.ClusterPolicies) != 1 {
			t.Fatalf("snapshot: %d namespaces, %d pods, %d CNPs", len(snap.Namespaces), len(snap.Pods), len(snap.ClusterPolicies))
		}
		key := ObjectKey{Kind: KindClusterPolicy, Name: "future"}
		if got := snap.Origin[key]; got != (Source{APIVersion: gvPolicyV1beta1}) {
			t.Errorf("Origin[%s] = %+v", key, got)
		}
		if got := snap.UnknownFields[key]; !slices.Equal(got, []string{"spec.egress[0].to[0].serviceAccounts"}) {
			t.Errorf("UnknownFields[%s] = %q", key, got)
		}
		if f.requested("/apis/" + gvPolicyV1alpha2) {
			t.Errorf("v1alpha2 discovered although v1beta1 is served")
		}
		if !hasNote(report, "AdminNetworkPolicy", "none loaded") || !hasNote(report, "BaselineAdminNetworkPolicy", "none loaded") {
			t.Errorf("notes = %q", report.Notes)
		}
		if len(report.Errors) != 0 {
			t.Errorf("errors = %v", report.Errors)
		}
	}
	t.Run("explicit kubeconfig and context", func(t *testing.T) {
		f, srv := newFakeAPIServer(t)
		path := writeKubeconfig(t, srv.URL, "other")
		t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
		snap, report, err := LoadFromAPI(context.Background(), APIOptions{Kubeconfig: path, Context: "test"})
		if err != nil {
			t.Fatal(err)
		}
		check(t, f, snap, report)
	})
	t.Run("KUBECONFIG", func(t *testing.T) {
		f, srv := newFakeAPIServer(t)
		t.Setenv("KUBECONFIG", writeKubeconfig(t, srv.URL, "test"))
		snap, report, err := LoadFromAPI(context.Background(), APIOptions{})
		if err != nil {
			t.Fatal(err)
		}
		check(t, f, snap, report)
	})
	t.Run("missing explicit kubeconfig", func(t *testing.T) {
		_, _, err := LoadFromAPI(context.Background(), APIOptions{Kubeconfig: filepath.Join(t.TempDir(), "nope")})
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unknown context", func(t *testing.T) {
		_, srv := newFakeAPIServer(t)
		_, _, err := LoadFromAPI(context.Background(), APIOptions{Kubeconfig: writeKubeconfig(t, srv.URL, "test"), Context: "absent"})
		if err == nil || !strings.Contains(err.Error(), "absent") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("core list fails", func(t *testing.T) {
		f, srv := newFakeAPIServer(t)
		delete(f.body, "/api/v1/nodes")
		_, _, err := LoadFromAPI(context.Background(), APIOptions{Kubeconfig: writeKubeconfig(t, srv.URL, "test")})
		if err == nil || !strings.Contains(err.Error(), "listing nodes") {
			t.Fatalf("err = %v", err)
		}
	})
}
