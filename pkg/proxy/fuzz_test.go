package proxy_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/proxy"
)

// FuzzSyncer drives the incremental Syncer through random changes (Services
// and EndpointSlices added, replaced and removed; endpoints shared between
// Services; affinity, traffic policies, NodePorts, UDP) and checks after
// every step that its table equals a from-scratch Compile of the same
// snapshot, and that each set's Changes take the previous list to the new
// one (so an Applier that trusts them stays right).
func FuzzSyncer(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 42, 1000} {
		f.Add(seed, uint8(40))
	}
	f.Fuzz(func(t *testing.T, seed uint64, steps uint8) {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		snap := cluster.New()
		for i := 1; i <= 2; i++ {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i),
				Labels: map[string]string{corev1.LabelTopologyZone: fmt.Sprintf("z%d", i)}}}
			n.Spec.PodCIDR = fmt.Sprintf("10.244.%d.0/24", i)
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.0.%d", i)}}
			snap.Nodes = append(snap.Nodes, n)
		}
		s := proxy.NewSyncer("n1", proxy.Options{}, proxy.CompileOptions{})
		// A second Syncer is given the slices parsed, as the agent's
		// informer stores them: each parsed once, then shared by every
		// model it builds, and never changed by them.
		sp := proxy.NewSyncer("n1", proxy.Options{}, proxy.CompileOptions{})
		parsed := map[*discoveryv1.EndpointSlice]*proxy.Slice{}
		var prev *nft.Table
		for step := 0; step <= int(steps); step++ {
			next := *snap
			next.Services, next.EndpointSlices = slices.Clone(snap.Services), slices.Clone(snap.EndpointSlices)
			mutate(rng, &next)
			snap = &next

			m, table := s.Sync(snap)
			want, err := proxy.Compile(proxy.Build(snap, "n1", proxy.Options{}), proxy.CompileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Errors) > 0 {
				t.Fatalf("step %d: %v", step, m.Errors)
			}
			if p := kernel.Diff(table, want); !p.Empty() {
				t.Fatalf("step %d: Syncer and Compile differ:\n%s", step, p)
			}
			var list []*proxy.Slice
			for _, es := range snap.EndpointSlices {
				if parsed[es] == nil {
					parsed[es] = proxy.ParseSlice(es, "n1")
				}
				list = append(list, parsed[es])
			}
			mp, tp := sp.SyncParsed(snap, list)
			if p := kernel.Diff(tp, want); !p.Empty() {
				t.Fatalf("step %d: SyncParsed and Compile differ:\n%s", step, p)
			}
			if got, exp := fmt.Sprint(mp.Services), fmt.Sprint(m.Services); got != exp {
				t.Fatalf("step %d: SyncParsed's model\n%s\nSync's\n%s", step, got, exp)
			}
			for es, ps := range parsed {
				if !reflect.DeepEqual(ps, proxy.ParseSlice(es, "n1")) {
					t.Fatalf("step %d: slice %s was changed by a sync: %+v", step, es.Name, ps)
				}
			}
			for name, set := range table.Sets {
				if prev == nil || set.Changes == nil || prev.Sets[name] == nil {
					continue
				}
				if set.Changes.From != prev.Sets[name].Revision {
					t.Fatalf("step %d: set %s: changes from %d, previous revision %d", step, name, set.Changes.From, prev.Sets[name].Revision)
				}
				if !sameElements(applyChanges(prev.Sets[name].Elements, set.Changes), set.Elements) {
					t.Fatalf("step %d: set %s: previous elements plus changes are not the new elements", step, name)
				}
			}
			prev = cloneSets(table)
		}
	})
}

// mutate makes one random change, as an informer would see it: objects
// are replaced, never modified.
func mutate(rng *rand.Rand, s *cluster.Snapshot) {
	const services = 6
	i := rng.IntN(services)
	name := fmt.Sprintf("s%d", i)
	si := slices.IndexFunc(s.Services, func(x *corev1.Service) bool { return x.Name == name })
	ei := slices.IndexFunc(s.EndpointSlices, func(x *discoveryv1.EndpointSlice) bool { return x.Name == name })
	switch rng.IntN(5) {
	case 0, 1: // (re)write the Service
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		cip := fmt.Sprintf("10.96.0.%d", 10+i)
		svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: cip, ClusterIPs: []string{cip},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}
		proto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[rng.IntN(2)]
		port := corev1.ServicePort{Name: "p", Protocol: proto, Port: int32(80 + rng.IntN(2)), TargetPort: intstr.FromInt32(8080)}
		if rng.IntN(2) == 0 {
			svc.Spec.Type = corev1.ServiceTypeNodePort
			port.NodePort = int32(30000 + i)
			if rng.IntN(2) == 0 {
				svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
		}
		if rng.IntN(3) == 0 {
			svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		}
		if rng.IntN(4) == 0 {
			local := corev1.ServiceInternalTrafficPolicyLocal
			svc.Spec.InternalTrafficPolicy = &local
		}
		svc.Spec.Ports = []corev1.ServicePort{port}
		if si >= 0 {
			s.Services[si] = svc
		} else {
			s.Services = append(s.Services, svc)
		}
	case 2, 3: // (re)write one of its two slices: endpoints drawn from a small pool, so Services and slices share them
		sliceName := name + []string{"", "-b"}[rng.IntN(2)]
		ei := slices.IndexFunc(s.EndpointSlices, func(x *discoveryv1.EndpointSlice) bool { return x.Name == sliceName })
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: sliceName,
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
		// One port (its endpoints' list is the slice's own, shared by
		// the models) or two (a list per port, made at each build).
		for _, proto := range [][]corev1.Protocol{{corev1.ProtocolTCP}, {corev1.ProtocolUDP}, {corev1.ProtocolTCP, corev1.ProtocolUDP}}[rng.IntN(3)] {
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: ptr("p"), Protocol: ptr(proto), Port: ptr(int32(8080))})
		}
		for range rng.IntN(4) {
			e := rng.IntN(5)
			node := fmt.Sprintf("n%d", 1+e%2)
			ready, terminating := rng.IntN(4) != 0, rng.IntN(4) == 0
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.%d.%d", 1+e%2, 10+e)},
				NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: ptr(true), Terminating: &terminating}})
		}
		if ei >= 0 {
			s.EndpointSlices[ei] = es
		} else {
			s.EndpointSlices = append(s.EndpointSlices, es)
		}
	default: // remove one of the two
		if si >= 0 && rng.IntN(2) == 0 {
			s.Services = slices.Delete(s.Services, si, si+1)
		} else if ei >= 0 {
			s.EndpointSlices = slices.Delete(s.EndpointSlices, ei, ei+1)
		}
	}
}
