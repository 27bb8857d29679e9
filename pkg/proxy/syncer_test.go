package proxy_test

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/proxy"
)

// syncSteps are successive snapshots of testdata/services.yaml: each step
// replaces some objects (new pointers, as an informer does) and keeps the
// others.
func syncSteps(t *testing.T) []*cluster.Snapshot {
	base, report := cluster.LoadPaths([]string{"testdata/services.yaml"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	step := func(prev *cluster.Snapshot, mutate func(s *cluster.Snapshot)) *cluster.Snapshot {
		next := *prev
		next.Services = slices.Clone(prev.Services)
		next.EndpointSlices = slices.Clone(prev.EndpointSlices)
		next.Nodes = slices.Clone(prev.Nodes)
		mutate(&next)
		return &next
	}
	replaceSlice := func(s *cluster.Snapshot, name string, f func(*discoveryv1.EndpointSlice)) {
		replaceNamed(t, s.EndpointSlices, name, func(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
			c := es.DeepCopy()
			f(c)
			return c
		})
	}
	replaceService := func(s *cluster.Snapshot, name string, f func(*corev1.Service)) {
		replaceNamed(t, s.Services, name, func(svc *corev1.Service) *corev1.Service {
			c := svc.DeepCopy()
			f(c)
			return c
		})
	}
	s1 := step(base, func(s *cluster.Snapshot) { // an endpoint goes
		replaceSlice(s, "web-1", func(es *discoveryv1.EndpointSlice) { es.Endpoints = es.Endpoints[:2] })
	})
	s2 := step(s1, func(s *cluster.Snapshot) { // the empty service gets one
		es := s.EndpointSlices[0].DeepCopy()
		es.Name, es.Namespace, es.Labels = "empty-1", "shop", map[string]string{discoveryv1.LabelServiceName: "empty"}
		es.AddressType = discoveryv1.AddressTypeIPv4
		es.Ports = []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}}
		es.Endpoints = es.Endpoints[:1]
		es.Endpoints[0].Addresses = []string{"10.244.1.40"}
		s.EndpointSlices = append(s.EndpointSlices, es)
	})
	s3 := step(s2, func(s *cluster.Snapshot) { // affinity off, a port renumbered
		replaceService(s, "cart", func(svc *corev1.Service) { svc.Spec.SessionAffinity = corev1.ServiceAffinityNone })
		replaceService(s, "web", func(svc *corev1.Service) { svc.Spec.Ports[0].NodePort = 30090 })
	})
	s4 := step(s3, func(s *cluster.Snapshot) { // a service deleted
		s.Services = slices.DeleteFunc(s.Services, func(svc *corev1.Service) bool { return svc.Name == "dns" })
	})
	s5 := step(s4, func(s *cluster.Snapshot) { // the node's addresses change: full rebuild
		n := s.Nodes[0].DeepCopy()
		n.Status.Addresses[0].Address = "192.168.0.100"
		s.Nodes[0] = n
	})
	return []*cluster.Snapshot{base, s1, s2, s3, s4, s5, base}
}

func ptr[T any](v T) *T { return &v }

// replaceNamed replaces the object called name in list by replace(it), as
// an informer replaces an updated object.
func replaceNamed[T interface{ GetName() string }](t *testing.T, list []T, name string, replace func(T) T) {
	t.Helper()
	for i, o := range list {
		if o.GetName() == name {
			list[i] = replace(o)
			return
		}
	}
	t.Fatalf("no object %s", name)
}

// TestSyncerMatchesCompile: after every step the incremental Syncer's
// model and table equal a from-scratch Build and Compile of the same
// snapshot, and each set's Changes take the previous table's set to the
// new one.
func TestSyncerMatchesCompile(t *testing.T) {
	s := proxy.NewSyncer("n1", proxy.Options{}, proxy.CompileOptions{})
	var prev *nft.Table
	for i, snap := range syncSteps(t) {
		m, table := s.Sync(snap)
		want := proxy.Build(snap, "n1", proxy.Options{})
		if got, exp := fmt.Sprint(m.Services), fmt.Sprint(want.Services); got != exp {
			t.Fatalf("step %d: model\n%s\nwant\n%s", i, got, exp)
		}
		wantTable, err := proxy.Compile(want, proxy.CompileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p := kernel.Diff(table, wantTable); !p.Empty() {
			t.Fatalf("step %d: the Syncer's table differs from Compile's:\n%s", i, p)
		}
		for name, set := range table.Sets {
			if prev == nil || set.Changes == nil || prev.Sets[name] == nil {
				continue
			}
			old := prev.Sets[name]
			if set.Changes.From != old.Revision {
				t.Errorf("step %d: set %s: changes from revision %d, previous table had %d", i, name, set.Changes.From, old.Revision)
			}
			replayed := applyChanges(old.Elements, set.Changes)
			if !sameElements(replayed, set.Elements) {
				t.Errorf("step %d: set %s: previous elements plus changes are not the new elements", i, name)
			}
		}
		prev = cloneSets(table) // the next Sync reuses the table's element lists
	}
}

func applyChanges(elems []nft.Element, ch *nft.SetChanges) []nft.Element {
	out := map[string]nft.Element{}
	for _, e := range elems {
		out[string(e.Key)+"|"+string(e.KeyEnd)] = e
	}
	for _, e := range ch.Delete {
		delete(out, string(e.Key)+"|"+string(e.KeyEnd))
	}
	for _, e := range ch.Add {
		out[string(e.Key)+"|"+string(e.KeyEnd)] = e
	}
	res := make([]nft.Element, 0, len(out))
	for _, e := range out {
		res = append(res, e)
	}
	return res
}

func sameElements(a, b []nft.Element) bool {
	if len(a) != len(b) {
		return false
	}
	ids := map[string]int{}
	for _, e := range a {
		ids[fmt.Sprintf("%x|%x|%x|%v", e.Key, e.KeyEnd, e.Data, e.Verdict)]++
	}
	for _, e := range b {
		ids[fmt.Sprintf("%x|%x|%x|%v", e.Key, e.KeyEnd, e.Data, e.Verdict)]--
	}
	for _, n := range ids {
		if n != 0 {
			return false
		}
	}
	return true
}

func cloneSets(t *nft.Table) *nft.Table {
	c := nft.NewTable(t.Name)
	for name, s := range t.Sets {
		cs := *s
		cs.Elements = slices.Clone(s.Elements)
		c.Sets[name] = &cs
	}
	return c
}
