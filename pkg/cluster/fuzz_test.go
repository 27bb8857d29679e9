package cluster_test

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// seedFiles are the fuzz seeds: this package's testdata, the policy
// package's, the repository's base snapshots, and the manifests that the
// corpus cases apply.
func seedFiles(f *testing.F) [][]byte {
	var seeds [][]byte
	for _, pattern := range []string{"testdata/*.yaml", "testdata/*.json", "../policy/testdata/*.yaml", "../../testdata/base/*.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			seeds = append(seeds, data)
		}
	}
	cases, _ := filepath.Glob("../../testdata/cases/*/*.yaml")
	for _, file := range cases {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var c struct {
			Steps []struct {
				Apply string `json:"apply"`
			} `json:"steps"`
		}
		if yaml.Unmarshal(data, &c) != nil {
			continue
		}
		for _, st := range c.Steps {
			if st.Apply != "" {
				seeds = append(seeds, []byte(st.Apply))
			}
		}
	}
	if len(seeds) == 0 {
		f.Fatal("no seed files found")
	}
	return seeds
}

// FuzzAddDocuments: no input makes the loader, the policy builder or the
// evaluator panic; whatever loads is consistent (every object has its
// origin); the model keeps its contract (selectors always set).
func FuzzAddDocuments(f *testing.F) {
	for _, s := range seedFiles(f) {
		f.Add(s)
	}
	for _, s := range []string{
		"", "---", "---\n---\n", "null", "[]", "{}", "- a\n- b", "kind: List\napiVersion: v1\nitems: [1, null, {}]",
		"apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items: []",
		`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"`,
		"apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: x}\nstatus: {podIP: 10.0.0.1, podIPs: [{ip: 'fd00::1'}]}\nspec: {hostNetwork: true}",
		"apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: c}\nspec: {tier: Admin, priority: 1, subject: {namespaces: {}}, ingress: [{action: Deny, from: [{}]}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		snap := cluster.New()
		r := snap.AddDocuments(data, "fuzz.yaml", false)
		_ = r.SkippedNote()
		// Loading the same stream again, replacing, must not panic either.
		snap.AddDocuments(data, "fuzz.yaml", true)
		checkOrigins(t, snap)

		m := policy.Build(snap)
		for _, p := range m.Policies {
			if p.Subject.Namespaces == nil || p.Subject.Pods == nil {
				t.Fatalf("%s: subject selector unset", p.Ref())
			}
			for _, d := range policy.Directions {
				for _, rule := range p.Rules[d] {
					for _, pe := range rule.Peers {
						switch {
						case pe.Kind == policy.PeerPods && (pe.Namespaces == nil || pe.Pods == nil),
							pe.Kind == policy.PeerNodes && pe.Nodes == nil:
							t.Fatalf("%s %s: peer selector unset: %+v", p.Ref(), rule.Ref(d), pe)
						}
					}
				}
			}
		}
		if len(snap.Pods) > 16 {
			return
		}
		ev := eval.New(snap, m)
		ev.TruthTable(eval.TruthTableOptions{Probes: []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}})
		ev.TruthTable(eval.TruthTableOptions{Family: ipfamily.IPv6})
	})
}

// checkOrigins: every object in the snapshot has a name and an Origin under
// its key, and there is no Origin without an object.
func checkOrigins(t *testing.T, s *cluster.Snapshot) {
	t.Helper()
	n := 0
	check := func(kind, namespace, name string) {
		n++
		key := cluster.ObjectKey{Kind: kind, Namespace: namespace, Name: name}
		if name == "" {
			t.Fatalf("%s loaded without a name", kind)
		}
		if _, ok := s.Origin[key]; !ok {
			t.Fatalf("%s has no Origin", key)
		}
	}
	for _, o := range s.Namespaces {
		check(cluster.KindNamespace, "", o.Name)
	}
	for _, o := range s.Nodes {
		check(cluster.KindNode, "", o.Name)
	}
	for _, o := range s.Pods {
		check(cluster.KindPod, o.Namespace, o.Name)
	}
	for _, o := range s.Services {
		check(cluster.KindService, o.Namespace, o.Name)
	}
	for _, o := range s.EndpointSlices {
		check(cluster.KindEndpointSlice, o.Namespace, o.Name)
	}
	for _, o := range s.NetworkPolicies {
		check(cluster.KindNetworkPolicy, o.Namespace, o.Name)
	}
	for _, o := range s.AdminPolicies {
		check(cluster.KindAdminPolicy, "", o.Name)
	}
	for _, o := range s.BaselinePolicies {
		check(cluster.KindBaselinePolicy, "", o.Name)
	}
	for _, o := range s.ClusterPolicies {
		check(cluster.KindClusterPolicy, "", o.Name)
	}
	for _, o := range s.ConfigMaps {
		check(cluster.KindConfigMap, o.Namespace, o.Name)
	}
	if n != len(s.Origin) {
		t.Fatalf("%d objects but %d origins", n, len(s.Origin))
	}
}
