package agent

import (
	"errors"
	"slices"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
)

// TestServiceCIDRWatch: the NAT table's Service ranges follow the
// cluster's ServiceCIDR objects, added or deleted while the agent runs;
// an API server that does not serve them, or a role that does not grant
// them, leaves them out without holding the agent's start, and an API
// server not reachable yet is asked again.
func TestServiceCIDRWatch(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}
	listFails := func(errs ...error) func(k8stesting.Action) (bool, runtime.Object, error) {
		return func(k8stesting.Action) (bool, runtime.Object, error) {
			if len(errs) == 0 {
				return false, nil, nil // the fake's store answers
			}
			err := errs[0]
			errs = errs[1:]
			return true, nil, err
		}
	}
	cases := []struct {
		name    string
		errs    []error // what the first lists of ServiceCIDRs get
		watched bool
	}{
		{"served", nil, true},
		{"not reachable yet, then served", []error{errors.New("connection refused"), apierrors.NewServiceUnavailable("starting")}, true},
		{"not served (before Kubernetes 1.33)", []error{apierrors.NewNotFound(gr, "")}, false},
		{"not granted", []error{apierrors.NewForbidden(gr, "", errors.New("RBAC"))}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, loadSnapshot(t, "e2e.yaml"), Options{NoStatus: true})
			create := func(name string, cidrs ...string) {
				t.Helper()
				_, err := h.kube.NetworkingV1().ServiceCIDRs().Create(t.Context(), &networkingv1.ServiceCIDR{
					ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
			}
			create("kubernetes", "10.96.0.0/16", "fd00:96::/108")
			h.kube.PrependReactor("list", "servicecidrs", listFails(c.errs...))
			h.run()
			ranges := func(want ...string) func() bool {
				return func() bool { return slices.Equal(h.serviceRanges(), want) }
			}
			if !c.watched {
				h.waitFor("the first sync", 5*time.Second, func() bool { return h.agent.ready.Load() })
				if got := h.serviceRanges(); len(got) != 0 {
					t.Errorf("Service ranges %v, want none", got)
				}
				if h.logs.count("not watching ServiceCIDRs") != 1 {
					t.Errorf("no warning that ServiceCIDRs are not watched:\n%s", h.logs.String())
				}
				return
			}
			h.waitFor("the ranges of ServiceCIDR kubernetes", 5*time.Second, ranges("10.96.0.0/16", "fd00:96::/108"))
			create("more", "10.97.0.0/24")
			h.waitFor("a ServiceCIDR added", 5*time.Second, ranges("10.96.0.0/16", "10.97.0.0/24", "fd00:96::/108"))
			if err := h.kube.NetworkingV1().ServiceCIDRs().Delete(t.Context(), "kubernetes", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			h.waitFor("a ServiceCIDR deleted", 5*time.Second, ranges("10.97.0.0/24"))
		})
	}
}

// serviceRanges are the elements of the NAT table's service-cidrs sets,
// IPv4 first.
func (h *harness) serviceRanges() []string {
	table := h.nat.Kernel()
	if table == nil {
		return nil
	}
	var out []string
	for _, name := range []string{"service-cidrs.4", "service-cidrs.6"} {
		if s := table.Sets[name]; s != nil {
			for _, e := range s.Elements {
				out = append(out, s.ElementText(e))
			}
		}
	}
	return out
}
