package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The environment runs the kube-apiserver that hack/build-kube-apiserver.sh
// builds, whose version comes from hack/tools/go.mod.
func TestKubeVersionMatchesToolsModule(t *testing.T) {
	data, err := os.ReadFile("../../hack/tools/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var required string
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "require" && f[1] == "k8s.io/kubernetes" {
			required = f[2]
		}
	}
	if required != KubeVersion {
		t.Fatalf("hack/tools/go.mod requires k8s.io/kubernetes %q, testenv.KubeVersion is %q", required, KubeVersion)
	}
	// Every staging module is replaced by its published tag of the same
	// release (v1.37.2 -> v0.37.2).
	staging := "v0" + strings.TrimPrefix(KubeVersion, "v1")
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[1] == "=>" && strings.HasPrefix(f[0], "k8s.io/") && f[3] != staging {
			t.Errorf("hack/tools/go.mod: %s", strings.TrimSpace(line))
		}
	}
}

func TestAPIServerArgs(t *testing.T) {
	p := &pki{servingCert: "s.crt", servingKey: "s.key", serviceAccountKey: "sa.key", serviceAccountPub: "sa.pub"}
	args := apiserverArgs("/d", "http://127.0.0.1:1", "3.6.0", 6443, p, "/d/tokens.csv", []string{"--v=4", "--authorization-mode=RBAC"})
	if got := flagValue(args, "--authorization-mode"); got != "RBAC" {
		t.Errorf("--authorization-mode = %q, want the override RBAC", got)
	}
	if got := flagValue(args, "--v"); got != "4" {
		t.Errorf("--v = %q, want the added 4", got)
	}
	if got := flagValue(args, "--secure-port"); got != "6443" {
		t.Errorf("--secure-port = %q", got)
	}
	n := 0
	for _, a := range args {
		if strings.HasPrefix(a, "--authorization-mode=") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("--authorization-mode appears %d times", n)
	}
	if got := flagValue(args, "--feature-gates"); got != "" {
		t.Errorf("--feature-gates = %q with etcd 3.6.0", got)
	}
	old := apiserverArgs("/d", "http://127.0.0.1:1", "3.4.23", 6443, p, "/d/tokens.csv", nil)
	if got := flagValue(old, "--feature-gates"); got != "WatchList=false" {
		t.Errorf("--feature-gates = %q with etcd 3.4.23, want WatchList=false", got)
	}
}

func TestEtcdSupportsWatchProgress(t *testing.T) {
	for v, want := range map[string]bool{"3.4.23": false, "3.4.31": true, "3.5.0": false, "3.5.12": false,
		"3.5.13": true, "3.6.0": true, "3.7.1": true, "4.0.0": true, "2.3.8": false, "garbage": false} {
		if got := etcdSupportsWatchProgress(v); got != want {
			t.Errorf("etcdSupportsWatchProgress(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestDecode(t *testing.T) {
	docs, err := decode("x.yaml", []byte(`# comment only
---
apiVersion: v1
kind: Namespace
metadata: {name: a}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: ConfigMap, metadata: {name: b, namespace: a}, data: {n: "1"}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range docs {
		got = append(got, d.Source+" "+d.Name())
	}
	want := []string{"x.yaml#2 Namespace a", "x.yaml#3 ConfigMap a/b", "x.yaml#3 ConfigMap c"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := decode("bad.yaml", []byte("a: [")); err == nil || !strings.Contains(err.Error(), "bad.yaml#1") {
		t.Fatalf("want an error naming bad.yaml#1, got %v", err)
	}
}

// Every manifest in deploy/ is listed in its kustomization.yaml (so the
// e2e test, which applies what the kustomization lists, covers it) and
// decodes.
func TestDeployKustomizationListsEveryManifest(t *testing.T) {
	resources, err := KustomizationResources("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir("../../deploy", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Base(path) == "kustomization.yaml" {
			return err
		}
		if ext := filepath.Ext(path); ext == ".yaml" || ext == ".yml" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	listed := slices.Clone(resources)
	slices.Sort(listed)
	if !slices.Equal(files, listed) {
		t.Fatalf("deploy/kustomization.yaml lists %q,\nthe directory has %q", listed, files)
	}
	docs, err := ReadFiles(resources...)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, d := range docs {
		kinds[d.Object.GetKind()]++
	}
	for kind, n := range map[string]int{"CustomResourceDefinition": 3, "Namespace": 1, "ServiceAccount": 1, "ClusterRole": 2,
		"ClusterRoleBinding": 1, "Role": 1, "RoleBinding": 1, "DaemonSet": 1} {
		if kinds[kind] != n {
			t.Errorf("deploy/ has %d %s, want %d", kinds[kind], kind, n)
		}
	}
	// The file header names the source module; keep it when refreshing.
	for _, r := range resources {
		if strings.Contains(r, "/crds/") {
			data, err := os.ReadFile(r)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(string(data), "# Copied unmodified from the Go module sigs.k8s.io/network-policy-api@") {
				t.Errorf("%s: no header naming its source module", r)
			}
		}
	}
}
