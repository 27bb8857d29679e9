package synth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

var realisticSpecs = []Spec{
	{Shape: ShapeRealistic, Namespaces: 4, Pods: 60, Nodes: 2, NetworkPolicies: 12, AdminPolicies: 5, Services: 40, Seed: 3},
	{Shape: ShapeRealistic, Namespaces: 12, Pods: 600, Nodes: 6, NetworkPolicies: 150, AdminPolicies: 20, Services: 40, Seed: 1},
	// More NetworkPolicies than a namespace's catalogue (per workload
	// ones), more Admin policies than the families of a round.
	{Shape: ShapeRealistic, Namespaces: 40, Pods: 2000, Nodes: 20, NetworkPolicies: 800, AdminPolicies: 60, Services: 300, Seed: 2},
}

func load(t *testing.T, y string) *cluster.Snapshot {
	t.Helper()
	snap := cluster.New()
	r := snap.AddDocuments([]byte(y), "synth", false)
	if len(r.Errors) > 0 {
		t.Fatalf("%d load errors, first: %v", len(r.Errors), r.Errors[0])
	}
	if len(r.Notes) > 0 || len(r.Skipped) > 0 {
		t.Fatalf("load notes %v, skipped %v", r.Notes, r.Skipped)
	}
	if len(snap.UnknownFields) > 0 {
		t.Fatalf("unknown fields: %v", snap.UnknownFields)
	}
	return snap
}

func TestRealistic(t *testing.T) {
	for _, s := range realisticSpecs {
		t.Run(fmt.Sprintf("pods=%d", s.Pods), func(t *testing.T) {
			y := YAML(s)
			snap := load(t, y)

			// Counts.
			admin := len(snap.AdminPolicies) + len(snap.BaselinePolicies) + len(snap.ClusterPolicies)
			for _, c := range []struct {
				what      string
				got, want int
			}{
				{"nodes", len(snap.Nodes), s.Nodes},
				{"namespaces", len(snap.Namespaces), s.Namespaces},
				{"pods", len(snap.Pods), s.Pods},
				{"NetworkPolicies", len(snap.NetworkPolicies), s.NetworkPolicies},
				{"admin policies", admin, s.AdminPolicies},
				{"BaselineAdminNetworkPolicies", len(snap.BaselinePolicies), 1},
				{"Services", len(snap.Services), s.Services},
				{"EndpointSlices", len(snap.EndpointSlices), s.Services},
			} {
				if c.got != c.want {
					t.Errorf("%s: %d, want %d", c.what, c.got, c.want)
				}
			}
			if b := snap.BaselinePolicies; len(b) == 1 && b[0].Name != "default" {
				t.Errorf("BANP named %q", b[0].Name)
			}
			baseline := 0
			for _, p := range snap.ClusterPolicies {
				if p.Spec.Tier == "Baseline" {
					baseline++
				}
			}
			if want := (2*(s.AdminPolicies-1) + 5) / 10; baseline != want {
				t.Errorf("%d Baseline ClusterNetworkPolicies, want %d (20%%)", baseline, want)
			}
			if s.AdminPolicies > 10 && len(snap.AdminPolicies) == 0 {
				t.Errorf("no v1alpha1 AdminNetworkPolicy")
			}
			if s.Nodes > 0 && snap.Nodes[0].Name != "node-001" {
				t.Errorf("first node %q, want node-001", snap.Nodes[0].Name)
			}

			// Pods: Running, unique addresses (but host-network pods,
			// which have their node's), identities well below pods.
			ips := map[string]string{}
			idents := map[string]bool{}
			host := 0
			for _, p := range snap.Pods {
				if p.Status.Phase != corev1.PodRunning {
					t.Errorf("pod %s/%s is %s", p.Namespace, p.Name, p.Status.Phase)
				}
				if p.Spec.HostNetwork {
					host++
					continue
				}
				if other, dup := ips[p.Status.PodIP]; dup {
					t.Errorf("pods %s and %s/%s share %s", other, p.Namespace, p.Name, p.Status.PodIP)
				}
				ips[p.Status.PodIP] = p.Namespace + "/" + p.Name
				idents[p.Namespace+"|"+labels.Set(p.Labels).String()] = true
			}
			if host > s.Pods/10 {
				t.Errorf("%d host-network pods of %d", host, s.Pods)
			}
			if n := len(idents); n < s.Pods/15 || n > s.Pods/2 {
				t.Errorf("%d distinct (namespace, labels) identities for %d pods, want %d-%d", n, s.Pods, s.Pods/15, s.Pods/2)
			}

			// EndpointSlices list at most 10 Running pods their Service
			// selects.
			pods := map[string]*corev1.Pod{}
			for _, p := range snap.Pods {
				pods[p.Namespace+"/"+p.Name] = p
			}
			services := map[string]*corev1.Service{}
			for _, svc := range snap.Services {
				services[svc.Namespace+"/"+svc.Name] = svc
			}
			for _, es := range snap.EndpointSlices {
				svc := services[es.Namespace+"/"+es.Labels["kubernetes.io/service-name"]]
				if svc == nil {
					t.Fatalf("EndpointSlice %s/%s: no Service", es.Namespace, es.Name)
				}
				if len(es.Endpoints) > 10 {
					t.Errorf("EndpointSlice %s/%s: %d endpoints", es.Namespace, es.Name, len(es.Endpoints))
				}
				for _, ep := range es.Endpoints {
					p := pods[ep.TargetRef.Namespace+"/"+ep.TargetRef.Name]
					if p == nil || p.Namespace != svc.Namespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(p.Labels)) ||
						ep.Addresses[0] != p.Status.PodIP {
						t.Errorf("EndpointSlice %s/%s: endpoint %v is not a pod of the Service", es.Namespace, es.Name, ep.TargetRef)
					}
				}
			}

			// Every policy builds, without error or warning; so do the
			// Services.
			m := policy.Build(snap)
			if len(m.Errors) > 0 || len(m.Warnings) > 0 {
				t.Fatalf("policy model: %d errors (%v), %d warnings (%v)", len(m.Errors), first(m.Errors), len(m.Warnings), m.Warnings)
			}
			if got, want := len(m.Policies), s.NetworkPolicies+s.AdminPolicies; got != want {
				t.Errorf("%d policies in the model, want %d", got, want)
			}
			if s.Nodes > 0 {
				if pm := proxy.Build(snap, "node-001", proxy.Options{}); len(pm.Errors) > 0 {
					t.Errorf("Service model: %d errors, first %v", len(pm.Errors), pm.Errors[0])
				}
			}

			// Deterministic for a seed, not across seeds.
			if YAML(s) != y {
				t.Errorf("two renderings of one spec differ")
			}
			other := s
			other.Seed++
			if YAML(other) == y {
				t.Errorf("seeds %d and %d give the same cluster", s.Seed, other.Seed)
			}
		})
	}
}

func first(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

// TestRealisticPeers checks the policies are the kind that blows the
// table up: most pod peers select whole namespaces, many of them.
func TestRealisticPeers(t *testing.T) {
	s := realisticSpecs[2]
	snap := load(t, YAML(s))
	m := policy.Build(snap)
	whole, several, peers := 0, 0, 0
	for _, p := range m.Policies {
		for _, rules := range p.Rules {
			for _, r := range rules {
				for _, pe := range r.Peers {
					if pe.Kind != policy.PeerPods {
						continue
					}
					peers++
					if pe.Pods.Empty() {
						whole++
						if pe.Namespace == "" {
							several++
						}
					}
				}
			}
		}
	}
	if whole*2 < peers || several*3 < peers {
		t.Errorf("of %d pod peers, %d select whole namespaces and %d whole namespaces by label: want most and a third at least", peers, whole, several)
	}
}

// TestEasyUnchanged pins the easy shape's output: benchmarks compare
// against numbers measured on it.
func TestEasyUnchanged(t *testing.T) {
	for _, c := range []struct {
		s    Spec
		want string
	}{
		{Spec{Namespaces: 10, Pods: 300, Nodes: 5, NetworkPolicies: 50, AdminPolicies: 10, Services: 20, Seed: 1}, "1644cda9c28e82132f4748d714051ecf644f8d1e51cf8b1062bc98600cc85dff"},
		{Spec{Shape: ShapeEasy, Namespaces: 10, Pods: 300, Nodes: 5, NetworkPolicies: 50, AdminPolicies: 10, Services: 20, Seed: 1}, "1644cda9c28e82132f4748d714051ecf644f8d1e51cf8b1062bc98600cc85dff"},
	} {
		sum := sha256.Sum256([]byte(YAML(c.s)))
		if got := hex.EncodeToString(sum[:]); got != c.want {
			t.Errorf("%+v: sha256 %s, want %s", c.s, got, c.want)
		}
	}
}

// TestRealisticShapeNames: unknown shapes are refused.
func TestRealisticShapeNames(t *testing.T) {
	for _, shape := range []string{"", ShapeEasy, ShapeRealistic} {
		if err := CheckShape(shape); err != nil {
			t.Errorf("%q: %v", shape, err)
		}
	}
	if err := CheckShape("Realistic"); err == nil || !strings.Contains(err.Error(), "unknown shape") {
		t.Errorf("Realistic: %v", err)
	}
}
