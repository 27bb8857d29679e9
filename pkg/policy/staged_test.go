package policy_test

import (
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// TestStagedAnnotation: netpol.io/staged "true" keeps a policy of any kind
// out of the enforced policies (Model.Staged), through Build and Cache;
// "false" or no annotation enforces it, and any other value enforces it
// with a warning that names the object and the annotation. Promoted
// enforces the staged ones too.
func TestStagedAnnotation(t *testing.T) {
	doc := func(kind, name, value string) string {
		ann := ""
		if value != "" {
			ann = `, annotations: {netpol.io/staged: "` + value + `"}`
		}
		if kind == "NetworkPolicy" {
			return `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ` + name + `, namespace: x` + ann + `}
spec: {podSelector: {}}
`
		}
		return `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: ` + name + ann + `}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]
`
	}
	snap := cluster.New()
	docs := []string{doc("NetworkPolicy", "np-staged", "true"), doc("NetworkPolicy", "np-false", "false"), doc("NetworkPolicy", "np-plain", ""),
		doc("ClusterNetworkPolicy", "cnp-staged", "true"), doc("ClusterNetworkPolicy", "cnp-typo", "yes")}
	if r := snap.AddDocuments([]byte(strings.Join(docs, "---\n")), "staged.yaml", false); len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	refs := func(ps []*policy.Policy) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Ref())
		}
		return strings.Join(out, ", ")
	}
	var cache policy.Cache
	cached, _ := cache.Build(snap.PolicyObjects(), func(obj any) (*cluster.Snapshot, []error) { return snap.PolicyAlone(obj), nil })
	for name, m := range map[string]*policy.Model{"Build": policy.Build(snap), "Cache": cached} {
		if got, want := refs(m.Policies), "ClusterNetworkPolicy cnp-typo, NetworkPolicy x/np-false, NetworkPolicy x/np-plain"; got != want {
			t.Errorf("%s: enforced %q, want %q", name, got, want)
		}
		if got, want := refs(m.Staged), "ClusterNetworkPolicy cnp-staged, NetworkPolicy x/np-staged"; got != want {
			t.Errorf("%s: staged %q, want %q", name, got, want)
		}
		if len(m.Warnings) != 1 || !strings.Contains(m.Warnings[0], `ClusterNetworkPolicy cnp-typo: metadata.annotations[netpol.io/staged]: unknown value "yes"`) ||
			!strings.Contains(m.Warnings[0], "the policy is enforced") {
			t.Errorf("%s: warnings %q", name, m.Warnings)
		}
		p := policy.Promoted(m)
		if len(p.Staged) != 0 || refs(p.Policies) != "ClusterNetworkPolicy cnp-staged, ClusterNetworkPolicy cnp-typo, NetworkPolicy x/np-false, NetworkPolicy x/np-plain, NetworkPolicy x/np-staged" {
			t.Errorf("%s: promoted %q, staged %q", name, refs(p.Policies), refs(p.Staged))
		}
	}
}
