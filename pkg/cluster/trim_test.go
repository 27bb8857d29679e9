package cluster

import (
	"maps"
	"testing"
)

// TestTrimKeepsOwnAnnotations: a loaded object keeps netpol.io/
// annotations (policies are staged and audited through them) and drops the
// others, with managedFields.
func TestTrimKeepsOwnAnnotations(t *testing.T) {
	snap := New()
	rep := snap.AddDocuments([]byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: np
  namespace: x
  annotations:
    netpol.io/staged: "true"
    kubectl.kubernetes.io/last-applied-configuration: "{}"
  managedFields:
  - manager: kubectl
    operation: Apply
spec:
  podSelector: {}
`), "t.yaml", false)
	if len(rep.Errors) > 0 {
		t.Fatal(rep.Errors)
	}
	np := snap.NetworkPolicies[0]
	if want := map[string]string{"netpol.io/staged": "true"}; !maps.Equal(np.Annotations, want) {
		t.Errorf("annotations %v, want %v", np.Annotations, want)
	}
	if np.ManagedFields != nil {
		t.Errorf("managedFields kept: %v", np.ManagedFields)
	}
}
