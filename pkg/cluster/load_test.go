package cluster

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// counts is the number of objects of each kind in the snapshot.
func counts(s *Snapshot) map[string]int {
	out := map[string]int{}
	add := func(kind string, n int) {
		if n > 0 {
			out[kind] = n
		}
	}
	add(KindNamespace, len(s.Namespaces))
	add(KindNode, len(s.Nodes))
	add(KindPod, len(s.Pods))
	add(KindService, len(s.Services))
	add(KindEndpointSlice, len(s.EndpointSlices))
	add(KindNetworkPolicy, len(s.NetworkPolicies))
	add(KindAdminPolicy, len(s.AdminPolicies))
	add(KindBaselinePolicy, len(s.BaselinePolicies))
	add(KindClusterPolicy, len(s.ClusterPolicies))
	add(KindConfigMap, len(s.ConfigMaps))
	return out
}

const kubectlList = `apiVersion: v1
items:
- apiVersion: v1
  kind: Pod
  metadata:
    creationTimestamp: "2024-05-01T10:00:00Z"
    generateName: web-7d4b9c-
    labels:
      app: web
      pod-template-hash: 7d4b9c
    managedFields:
    - apiVersion: v1
      fieldsType: FieldsV1
      fieldsV1:
        f:metadata:
          f:generateName: {}
          f:labels:
            .: {}
            f:app: {}
      manager: kube-controller-manager
      operation: Update
      time: "2024-05-01T10:00:00Z"
    name: web-7d4b9c-abcde
    namespace: x
    ownerReferences:
    - apiVersion: apps/v1
      blockOwnerDeletion: true
      controller: true
      kind: ReplicaSet
      name: web-7d4b9c
      uid: 0b7c3c5e-1111-2222-3333-444455556666
    resourceVersion: "123456"
    uid: 9f1c2d3e-1111-2222-3333-444455556666
  spec:
    containers:
    - image: nginx
      name: web
      ports:
      - containerPort: 80
        name: http
        protocol: TCP
    nodeName: node-1
  status:
    conditions:
    - lastProbeTime: null
      lastTransitionTime: "2024-05-01T10:00:01Z"
      status: "True"
      type: Ready
    phase: Running
    podIP: 10.244.1.5
    podIPs:
    - ip: 10.244.1.5
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata:
    creationTimestamp: "2024-05-01T10:00:00Z"
    generation: 1
    name: allow-web
    namespace: x
    resourceVersion: "123457"
    uid: 1f1c2d3e-1111-2222-3333-444455556666
  spec:
    podSelector:
      matchLabels:
        app: web
    policyTypes:
    - Ingress
    ingress:
    - ports:
      - port: 80
        protocol: TCP
kind: List
metadata:
  resourceVersion: ""
`

// duplicatePods are two documents of pod x/a, told apart by the label
// which: the second is a duplicate, or with replace the one kept.
const duplicatePods = `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {which: first}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {which: second}}
`

func TestAddDocuments(t *testing.T) {
	cases := []struct {
		name    string
		input   string
		replace bool
		want    map[string]int
		errs    [][]string // each error must contain all of these, in order of errors
		skipped map[string]int
		notes   [][]string
		check   func(t *testing.T, s *Snapshot, r *Report)
	}{
		{
			name: "multi-document YAML",
			input: `# leading comment
---
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
status: {podIP: 10.0.0.1}
---
apiVersion: v1
kind: Pod
metadata: {name: b}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}}
...
`,
			want: map[string]int{KindNamespace: 1, KindPod: 2, KindNetworkPolicy: 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				if got := s.Namespace("x").Labels[namespaceNameLabel]; got != "x" {
					t.Errorf("namespace label = %q", got)
				}
				if s.Pod("default", "b") == nil {
					t.Errorf("pod without namespace not put in default")
				}
				if got := s.Origin[ObjectKey{Kind: KindPod, Namespace: "x", Name: "a"}]; got != (Source{APIVersion: "v1", File: "in.yaml", Document: 3}) {
					t.Errorf("origin = %+v", got)
				}
			},
		},
		{
			name: "JSON object",
			input: `{"apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "j", "namespace": "x"},
  "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 8080}]}]},
  "status": {"podIP": "10.0.0.9"}}`,
			want: map[string]int{KindPod: 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				p := s.Pod("x", "j")
				if p == nil || p.Status.PodIP != "10.0.0.9" || p.Spec.Containers[0].Ports[0].ContainerPort != 8080 {
					t.Errorf("pod = %+v", p)
				}
			},
		},
		{
			name:  "kind: List as kubectl prints it",
			input: kubectlList,
			want:  map[string]int{KindPod: 1, KindNetworkPolicy: 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				p := s.Pod("x", "web-7d4b9c-abcde")
				if p == nil || p.Status.PodIP != "10.244.1.5" || p.Labels["app"] != "web" || p.ResourceVersion != "123456" {
					t.Fatalf("pod = %+v", p)
				}
				if got := s.Origin[ObjectKey{Kind: KindNetworkPolicy, Namespace: "x", Name: "allow-web"}]; got.APIVersion != "networking.k8s.io/v1" || got.Document != 1 {
					t.Errorf("origin = %+v", got)
				}
				if len(s.UnknownFields) != 0 {
					t.Errorf("unknown fields = %v", s.UnknownFields)
				}
			},
		},
		{
			name: "JSON List",
			input: `{"apiVersion":"v1","kind":"List","items":[
  {"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}},
  {"apiVersion":"v1","kind":"NamespaceList","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"b"}}]}]}`,
			want: map[string]int{KindNamespace: 2},
		},
		{
			name: "unknown kinds skipped",
			input: `apiVersion: v1
kind: Secret
metadata: {name: c}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d1}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: d2}
---
apiVersion: example.com/v1
kind: Pod
metadata: {name: not-a-core-pod}
---
apiVersion: v1
kind: Namespace
metadata: {name: x}
`,
			want:    map[string]int{KindNamespace: 1},
			skipped: map[string]int{"v1 Secret": 1, "apps/v1 Deployment": 2, "example.com/v1 Pod": 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				want := "skipped 4 object(s) of kinds netpol does not use: apps/v1 Deployment (2), example.com/v1 Pod (1), v1 Secret (1)"
				if got := r.SkippedNote(); got != want {
					t.Errorf("SkippedNote() = %q, want %q", got, want)
				}
			},
		},
		{
			// The lab reads its DNS zone from one (see pkg/lab).
			name: "ConfigMaps are kept",
			input: `apiVersion: v1
kind: ConfigMap
metadata: {name: netpol-lab-dns, namespace: kube-system}
data:
  zone: |
    www.example.com. 300 IN A 192.0.2.1
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}, data: {k: "1"}, binaryData: {b: AAE=}, immutable: true}
---
apiVersion: v2
kind: ConfigMap
metadata: {name: future}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: typo, namespace: kube-system}
date: {zone: ""}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: c}
`,
			want: map[string]int{KindConfigMap: 3},
			errs: [][]string{
				{"in.yaml (document 3)", `ConfigMap "future"`, `unsupported apiVersion "v2"`, "v1"},
				{"in.yaml (document 5)", "duplicate ConfigMap default/c", "in.yaml (document 2)"},
			},
			notes: [][]string{{"in.yaml (document 4)", "ConfigMap kube-system/typo", "date"}},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				c := s.ConfigMap("kube-system", "netpol-lab-dns")
				if c == nil || c.Data["zone"] != "www.example.com. 300 IN A 192.0.2.1\n" {
					t.Fatalf("ConfigMap = %+v", c)
				}
				if got := s.Origin[ObjectKey{Kind: KindConfigMap, Namespace: "kube-system", Name: "netpol-lab-dns"}]; got != (Source{APIVersion: "v1", File: "in.yaml", Document: 1}) {
					t.Errorf("origin = %+v", got)
				}
				if c := s.ConfigMap("default", "c"); c == nil || c.Data["k"] != "1" || string(c.BinaryData["b"]) != "\x00\x01" {
					t.Errorf("ConfigMap default/c = %+v", c)
				}
				if got := s.UnknownFields[ObjectKey{Kind: KindConfigMap, Namespace: "kube-system", Name: "typo"}]; len(got) != 1 || got[0] != "date" {
					t.Errorf("unknown fields = %v", got)
				}
				if !s.Delete(ObjectKey{Kind: KindConfigMap, Namespace: "default", Name: "c"}) || s.ConfigMap("default", "c") != nil || len(s.ConfigMaps) != 2 {
					t.Errorf("Delete left %v", s.ConfigMaps)
				}
			},
		},
		{
			name: "unknown apiVersion of a known kind",
			input: `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: networking.k8s.io/v1beta1
kind: NetworkPolicy
metadata: {name: old-np, namespace: x}
spec: {podSelector: {}}
---
apiVersion: policy.networking.k8s.io/v1alpha3
kind: ClusterNetworkPolicy
metadata: {name: future-cnp}
`,
			want: map[string]int{KindNamespace: 1},
			errs: [][]string{
				{"in.yaml", "document 2", "NetworkPolicy", "old-np", `"networking.k8s.io/v1beta1"`, "networking.k8s.io/v1"},
				{"in.yaml", "document 3", "ClusterNetworkPolicy", "future-cnp", `"policy.networking.k8s.io/v1alpha3"`,
					"policy.networking.k8s.io/v1alpha2, policy.networking.k8s.io/v1beta1"},
			},
		},
		{
			name: "truncated YAML",
			input: `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata:
  name: [broken
`,
			want: map[string]int{KindNamespace: 1},
			errs: [][]string{{"in.yaml", "document 2"}},
		},
		{
			name: "truncated JSON",
			input: `{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
---
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name"`,
			want: map[string]int{KindNamespace: 1},
			errs: [][]string{{"in.yaml", "document 2"}},
		},
		{
			name:  "tab-indented YAML",
			input: "apiVersion: v1\nkind: Pod\nmetadata:\n\tname: x\n",
			errs:  [][]string{{"in.yaml", "document 1"}},
		},
		{
			name: "wrong field type",
			input: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: x}
spec: {containers: "not a list"}
`,
			errs: [][]string{{"in.yaml", "document 1", "Pod x/p", "spec.containers"}},
		},
		{
			name: "duplicate objects",
			input: duplicatePods + `---
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Namespace
metadata: {name: x, namespace: ignored-for-cluster-scoped}
`,
			want: map[string]int{KindPod: 1, KindNamespace: 1},
			errs: [][]string{
				{"in.yaml (document 2)", "duplicate", "Pod x/a", "in.yaml (document 1)", "keeping the first"},
				{"in.yaml (document 4)", "duplicate", "Namespace x", "in.yaml (document 3)"},
			},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				if got := s.Pod("x", "a").Labels["which"]; got != "first" {
					t.Errorf("kept the %s pod", got)
				}
			},
		},
		{
			name:    "duplicate with replace",
			replace: true,
			input:   duplicatePods,
			want:    map[string]int{KindPod: 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				if got := s.Pod("x", "a").Labels["which"]; got != "second" {
					t.Errorf("kept the %s pod", got)
				}
				if got := s.Origin[ObjectKey{Kind: KindPod, Namespace: "x", Name: "a"}].Document; got != 2 {
					t.Errorf("origin document = %d", got)
				}
			},
		},
		{
			name: "objects without name, apiVersion or kind",
			input: `apiVersion: v1
kind: Pod
metadata: {namespace: x}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {generateName: np-}
---
kind: Pod
metadata: {name: no-version}
---
apiVersion: v1
metadata: {name: no-kind}
---
just a string
`,
			errs: [][]string{
				{"document 1", "Pod without metadata.name"},
				{"document 2", "NetworkPolicy without metadata.name"},
				{"document 3", "no-version", "no apiVersion or kind"},
				{"document 4", "no-kind", "no apiVersion or kind"},
				{"document 5", "not a Kubernetes object"},
			},
		},
		{
			name: "v1alpha2 ClusterNetworkPolicy",
			input: `apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Baseline
  priority: 7
  subject: {namespaces: {}}
  egress:
  - name: dns
    action: Accept
    to: [{networks: [10.96.0.10/32]}]
    protocols: [{udp: {destinationPort: {number: 53}}}]
`,
			want: map[string]int{KindClusterPolicy: 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				c := s.ClusterPolicies[0]
				if c.Spec.Tier != "Baseline" || c.Spec.Priority != 7 || len(c.Spec.Egress) != 1 ||
					c.Spec.Egress[0].Protocols[0].UDP.DestinationPort.Number != 53 || c.Spec.Egress[0].To[0].Networks[0] != "10.96.0.10/32" {
					t.Errorf("spec = %+v", c.Spec)
				}
				if got := s.Origin[ObjectKey{Kind: KindClusterPolicy, Name: "cnp"}].APIVersion; got != "policy.networking.k8s.io/v1alpha2" {
					t.Errorf("origin apiVersion = %q", got)
				}
			},
		},
		{
			name: "unknown field in a Pod",
			input: `apiVersion: v1
kind: Pod
metadata: {name: p, namespace: x}
spec:
  containers: [{name: c, portz: [80]}]
  bogusField: true
`,
			want:  map[string]int{KindPod: 1},
			notes: [][]string{{"in.yaml (document 1)", "Pod x/p", "spec.containers[0].portz", "spec.bogusField"}},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				key := ObjectKey{Kind: KindPod, Namespace: "x", Name: "p"}
				if got := s.UnknownFields[key]; !slices.Equal(got, []string{"spec.bogusField", "spec.containers[0].portz"}) {
					t.Errorf("UnknownFields = %q", got)
				}
			},
		},
		{
			name: "unknown field in a policy",
			input: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{podSelector: {}, serviceAccount: sa}]
`,
			want: map[string]int{KindNetworkPolicy: 1},
			check: func(t *testing.T, s *Snapshot, r *Report) {
				key := ObjectKey{Kind: KindNetworkPolicy, Namespace: "x", Name: "np"}
				if got := s.UnknownFields[key]; !slices.Equal(got, []string{"spec.ingress[0].from[0].serviceAccount"}) {
					t.Errorf("UnknownFields = %q", got)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			r := s.AddDocuments([]byte(tc.input), "in.yaml", tc.replace)
			want := tc.want
			if want == nil {
				want = map[string]int{}
			}
			if got := counts(s); !maps.Equal(got, want) {
				t.Errorf("counts = %v, want %v", got, want)
			}
			if len(r.Errors) != len(tc.errs) {
				t.Errorf("%d errors, want %d: %v", len(r.Errors), len(tc.errs), r.Errors)
			}
			for i, parts := range tc.errs {
				if i >= len(r.Errors) {
					break
				}
				for _, p := range parts {
					if !strings.Contains(r.Errors[i].Error(), p) {
						t.Errorf("error %d %q does not contain %q", i, r.Errors[i], p)
					}
				}
			}
			skipped := tc.skipped
			if skipped == nil {
				skipped = map[string]int{}
			}
			if !maps.Equal(r.Skipped, skipped) {
				t.Errorf("skipped = %v, want %v", r.Skipped, skipped)
			}
			if len(tc.skipped) == 0 && r.SkippedNote() != "" {
				t.Errorf("SkippedNote() = %q", r.SkippedNote())
			}
			if len(r.Notes) != len(tc.notes) {
				t.Errorf("notes = %q, want %d", r.Notes, len(tc.notes))
			}
			for _, parts := range tc.notes {
				if !hasNote(r, parts...) {
					t.Errorf("no note with %q in %q", parts, r.Notes)
				}
			}
			// Every loaded object has an origin, and nothing else has one.
			total := 0
			for _, n := range counts(s) {
				total += n
			}
			if len(s.Origin) != total {
				t.Errorf("%d origins for %d objects", len(s.Origin), total)
			}
			if tc.check != nil {
				tc.check(t, s, r)
			}
		})
	}
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func ns(name string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", name)
}

func TestLoadPaths(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"a.yaml":            ns("a"),
		"b.yml":             ns("b") + "---\n" + ns("b2"),
		"c.json":            `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"c"}}`,
		"notes.txt":         ns("ignored-txt"),
		"sub/d.YAML":        ns("d"),
		"sub/deeper/e.yaml": ns("e"),
		"dup.yaml":          ns("a"),
	})
	cases := []struct {
		name   string
		paths  []string
		stdin  string
		want   []string // namespaces
		errs   [][]string
		origin map[string]Source
	}{
		{
			name:  "directory of files, recursively, sorted",
			paths: []string{dir},
			want:  []string{"a", "b", "b2", "c", "d", "e"},
			errs:  [][]string{{filepath.Join(dir, "dup.yaml"), "duplicate", "Namespace a", filepath.Join(dir, "a.yaml")}},
			origin: map[string]Source{
				"b2": {APIVersion: "v1", File: filepath.Join(dir, "b.yml"), Document: 2},
				"e":  {APIVersion: "v1", File: filepath.Join(dir, "sub/deeper/e.yaml"), Document: 1},
			},
		},
		{
			name:   "single file",
			paths:  []string{filepath.Join(dir, "c.json")},
			want:   []string{"c"},
			origin: map[string]Source{"c": {APIVersion: "v1", File: filepath.Join(dir, "c.json"), Document: 1}},
		},
		{
			name:  "a file with another extension named explicitly",
			paths: []string{filepath.Join(dir, "notes.txt")},
			want:  []string{"ignored-txt"},
		},
		{
			name:   "stdin",
			paths:  []string{"-"},
			stdin:  ns("s1") + "---\n" + ns("s2"),
			want:   []string{"s1", "s2"},
			origin: map[string]Source{"s2": {APIVersion: "v1", File: "<stdin>", Document: 2}},
		},
		{
			name:  "stdin and a file, duplicate across them",
			paths: []string{"-", filepath.Join(dir, "a.yaml")},
			stdin: ns("a"),
			want:  []string{"a"},
			errs:  [][]string{{filepath.Join(dir, "a.yaml"), "duplicate", "Namespace a", "<stdin> (document 1)"}},
		},
		{
			name:  "missing path",
			paths: []string{filepath.Join(dir, "absent.yaml"), filepath.Join(dir, "a.yaml")},
			want:  []string{"a"},
			errs:  [][]string{{"absent.yaml"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, r := LoadPaths(tc.paths, strings.NewReader(tc.stdin))
			var got []string
			for _, n := range s.Namespaces {
				got = append(got, n.Name)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("namespaces = %v, want %v", got, tc.want)
			}
			if len(r.Errors) != len(tc.errs) {
				t.Errorf("errors = %v, want %d", r.Errors, len(tc.errs))
			}
			for i, parts := range tc.errs {
				if i >= len(r.Errors) {
					break
				}
				for _, p := range parts {
					if !strings.Contains(r.Errors[i].Error(), p) {
						t.Errorf("error %q does not contain %q", r.Errors[i], p)
					}
				}
			}
			for name, want := range tc.origin {
				if got := s.Origin[ObjectKey{Kind: KindNamespace, Name: name}]; got != want {
					t.Errorf("origin of %s = %+v, want %+v", name, got, want)
				}
			}
		})
	}
}

// TestLoadTestdataDir loads this package's testdata directory: one object
// of each kind plus kubectl's List output in YAML and JSON.
func TestLoadTestdataDir(t *testing.T) {
	s, r := LoadPaths([]string{"testdata"}, nil)
	if len(r.Errors) > 0 || len(r.Notes) > 0 || len(r.Skipped) > 0 {
		t.Fatalf("errors %v, notes %q, skipped %v", r.Errors, r.Notes, r.Skipped)
	}
	want := map[string]int{
		KindNamespace: 1, KindNode: 1, KindPod: 2, KindService: 1, KindEndpointSlice: 1,
		KindNetworkPolicy: 3, KindAdminPolicy: 1, KindBaselinePolicy: 1, KindClusterPolicy: 2,
	}
	if got := counts(s); !maps.Equal(got, want) {
		t.Errorf("counts = %v, want %v", got, want)
	}
	if len(s.Origin) != 13 {
		t.Errorf("%d origins", len(s.Origin))
	}
	for key, want := range map[ObjectKey]Source{
		{Kind: KindClusterPolicy, Name: "baseline-sctp"}:             {APIVersion: "policy.networking.k8s.io/v1alpha2", File: "testdata/all-kinds.yaml", Document: 10},
		{Kind: KindNetworkPolicy, Namespace: "z", Name: "deny-all"}:  {APIVersion: "networking.k8s.io/v1", File: "testdata/kubectl-list.json", Document: 1},
		{Kind: KindPod, Namespace: "x", Name: "web-7d4b9c-abcde"}:    {APIVersion: "v1", File: "testdata/kubectl-list.yaml", Document: 1},
		{Kind: KindEndpointSlice, Namespace: "x", Name: "web-abcde"}: {APIVersion: "discovery.k8s.io/v1", File: "testdata/all-kinds.yaml", Document: 5},
	} {
		if got := s.Origin[key]; got != want {
			t.Errorf("Origin[%s] = %+v, want %+v", key, got, want)
		}
	}
	if ns := s.Namespace("x"); ns.Labels["team"] != "a" || ns.Labels[namespaceNameLabel] != "x" {
		t.Errorf("namespace labels = %v", ns.Labels)
	}
}

// TestLoadRepoTestdata loads the repository's base snapshots: they must
// load without errors, notes or skipped kinds.
func TestLoadRepoTestdata(t *testing.T) {
	files, err := filepath.Glob("../../testdata/base/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no base files: %v", err)
	}
	for _, f := range files {
		s, r := LoadPaths([]string{f}, nil)
		if len(r.Errors) > 0 || len(r.Notes) > 0 || len(r.Skipped) > 0 {
			t.Errorf("%s: errors %v, notes %q, skipped %v", f, r.Errors, r.Notes, r.Skipped)
		}
		if len(s.Pods) == 0 || len(s.Namespaces) == 0 {
			t.Errorf("%s: %v", f, counts(s))
		}
	}
}

// Regressions found by FuzzAddDocuments and review: each document is an
// error naming the problem, and nothing is loaded under a wrong key.
func TestAddDocumentsRejectsMalformedIdentity(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"metadata key in the wrong case", "apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetAdAtA: {nAme: A}\n", "without metadata.name"},
		{"name that is not a DNS subdomain", "apiVersion: v1\nkind: Pod\nmetadata: {name: a/b, namespace: x}\n", `metadata.name "a/b"`},
		{"namespace that is not a DNS label", "apiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: x/a}\n", `metadata.namespace "x/a"`},
		{"duplicate YAML key", "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\nmetadata: {name: y}\n", `key "metadata" already set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New()
			r := s.AddDocuments([]byte(tc.doc), "f.yaml", false)
			if len(r.Errors) != 1 || !strings.Contains(r.Errors[0].Error(), tc.want) {
				t.Fatalf("errors = %v, want one containing %q", r.Errors, tc.want)
			}
			if len(s.Origin) != 0 || len(s.Pods)+len(s.Namespaces)+len(s.ClusterPolicies) != 0 {
				t.Errorf("something was loaded: %v", s.Origin)
			}
		})
	}
}

// Report.Objects and Report.Empty say what each path held, so that a
// command can refuse input with no object at all and name the paths.
func TestLoadPathsCountsObjects(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"empty.yaml":      "",
		"comments.yaml":   "# a comment\n---\n---\n",
		"list.yaml":       "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: apps/v1, kind: Deployment, metadata: {name: d}}\n",
		"bad.yaml":        "just words\n",
		"text/readme.txt": "kind: Pod\n",
		"yamls/a.yaml":    "",
		"yamls/b.yml":     "---\n",
	})
	empty, comments := filepath.Join(dir, "empty.yaml"), filepath.Join(dir, "comments.yaml")
	list, bad := filepath.Join(dir, "list.yaml"), filepath.Join(dir, "bad.yaml")
	tests := []struct {
		name      string
		paths     []string
		objects   int
		empty     []string
		errSubstr string
	}{
		{"empty file", []string{empty}, 0, []string{empty + ": no object (an empty file, or only comments and empty documents)"}, ""},
		{"comments only", []string{comments}, 0, []string{comments + ": no object"}, ""},
		{"directory without YAML", []string{filepath.Join(dir, "text")}, 0, []string{filepath.Join(dir, "text") + ": a directory without .yaml, .yml or .json files"}, ""},
		{"directory of empty YAML", []string{filepath.Join(dir, "yamls")}, 0, []string{filepath.Join(dir, "yamls") + ": no object in its 2 .yaml/.yml/.json file(s)"}, ""},
		{"a List counts its items, skipped kinds too", []string{list, empty}, 2, []string{empty + ": no object"}, ""},
		{"a document that is not an object counts, as an error", []string{bad}, 1, nil, "not a Kubernetes object: the document is a string, not a mapping with apiVersion and kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, r := LoadPaths(tt.paths, strings.NewReader(""))
			if r.Objects != tt.objects {
				t.Errorf("Objects = %d, want %d", r.Objects, tt.objects)
			}
			if len(r.Empty) != len(tt.empty) {
				t.Fatalf("Empty = %q, want %q", r.Empty, tt.empty)
			}
			for i, w := range tt.empty {
				if !strings.HasPrefix(r.Empty[i], w) {
					t.Errorf("Empty[%d] = %q, want %q", i, r.Empty[i], w)
				}
			}
			if tt.errSubstr == "" && len(r.Errors) > 0 || tt.errSubstr != "" && (len(r.Errors) != 1 || !strings.Contains(r.Errors[0].Error(), tt.errSubstr)) {
				t.Errorf("errors %v, want one with %q", r.Errors, tt.errSubstr)
			}
		})
	}
}

// Decoding errors are plain sentences, not Go types.
func TestNotAnObjectIsAPlainSentence(t *testing.T) {
	tests := []struct{ doc, want string }{
		{`"hello"`, "the document is a string, not a mapping with apiVersion and kind"},
		{"- a\n- b\n", "the document is a list, not a mapping"},
		{"42\n", "the document is a number"},
		{"apiVersion: v1\nkind: Pod\nmetadata: x\n", "metadata is a string, not a mapping"},
		{"apiVersion: 1\nkind: Pod\nmetadata: {name: a}\n", "apiVersion is a number, not a string"},
		{"apiVersion: v1\nkind: List\nitems: {a: b}\n", "items is a mapping, not a list"},
	}
	for _, tt := range tests {
		r := New().AddDocuments([]byte(tt.doc), "f.yaml", false)
		if len(r.Errors) != 1 {
			t.Errorf("%q: errors %v, want one", tt.doc, r.Errors)
			continue
		}
		got := r.Errors[0].Error()
		if !strings.Contains(got, "f.yaml (document 1): not a Kubernetes object: "+tt.want) || strings.Contains(got, "Go value") || strings.Contains(got, "struct") {
			t.Errorf("%q: got %q, want %q", tt.doc, got, tt.want)
		}
	}
}

// An object's fields that do not decode are plain sentences too, after the
// file, document and object: no Go struct or type names.
func TestFieldErrorsArePlainSentences(t *testing.T) {
	tests := []struct{ name, doc, want string }{
		{"a string for a list", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: x}\nspec: {containers: oops}\n",
			"Pod x/a: spec.containers is a string, not a list"},
		{"a string for a number", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\nspec: {ports: [{port: \"80\"}]}\n",
			"Service x/s: spec.ports.port is a string, not a number"},
		{"a string for a boolean", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: x}\nspec: {hostNetwork: \"yes\"}\n",
			"Pod x/a: spec.hostNetwork is a string, not a boolean"},
		{"a list for a mapping", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: np, namespace: x}\nspec: {podSelector: []}\n",
			"NetworkPolicy x/np: spec.podSelector is a list, not a mapping"},
		{"a number for a label value", "apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {a: 1}}\n",
			"Namespace x: metadata.labels is a number, not a string"},
		{"a fraction for a whole number", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\nspec: {ports: [{port: 8.5}]}\n",
			"Service x/s: spec.ports.port is 8.5, not a whole number"},
		{"a number out of range", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: x}\nspec: {ports: [{port: 99999999999}]}\n",
			"Service x/s: spec.ports.port is 99999999999, out of range for a 32-bit whole number"},
		{"a string for a list of addresses", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: e, namespace: x}\naddressType: IPv4\nendpoints: [{addresses: 10.0.0.1}]\n",
			"EndpointSlice x/e: endpoints.addresses is a string, not a list"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			r := s.AddDocuments([]byte(tt.doc), "f.yaml", false)
			if len(r.Errors) != 1 {
				t.Fatalf("errors %v, want one", r.Errors)
			}
			got := r.Errors[0].Error()
			if want := "f.yaml (document 1): " + tt.want; got != want {
				t.Errorf("got  %q\nwant %q", got, want)
			}
			if len(s.Origin) != 0 {
				t.Errorf("the object was loaded: %v", s.Origin)
			}
		})
	}
}

func TestSupportedKinds(t *testing.T) {
	got := SupportedKinds()
	for _, w := range []string{"NetworkPolicy networking.k8s.io/v1", "Pod v1", "EndpointSlice discovery.k8s.io/v1", "ConfigMap v1"} {
		if !slices.Contains(got, w) {
			t.Errorf("SupportedKinds() = %q lacks %q", got, w)
		}
	}
}
