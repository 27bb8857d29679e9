package conformance_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/proxy"
)

// serviceSnapshot is a cluster of three nodes and n ClusterIP Services
// (TCP 80 -> 8080), each with eps ready endpoints spread over the nodes.
// Service i is 10.96.0.0 + i + 1; endpoints come from 10.244.0.0/16.
func serviceSnapshot(n, eps int) *cluster.Snapshot {
	snap := cluster.New()
	for i := range 3 {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i)}}
		node.Spec.PodCIDR = fmt.Sprintf("10.%d.0.0/16", 244+i)
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("192.168.0.%d", 10+i)}}
		snap.Nodes = append(snap.Nodes, node)
	}
	for i := range n {
		addService(snap, i, eps)
	}
	return snap
}

// addService adds Service i (see serviceSnapshot) and its EndpointSlice.
func addService(snap *cluster.Snapshot, i, eps int) {
	name := fmt.Sprintf("svc-%d", i)
	cip := nthAddr(netip.MustParseAddr("10.96.0.0"), i+1).String()
	snap.Services = append(snap.Services, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: cip, ClusterIPs: []string{cip},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	})
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	ready := true
	for e := range eps {
		node := fmt.Sprintf("node-%d", (i+e)%3)
		addr := nthAddr(netip.MustParseAddr("10.244.0.0"), (i*eps+e)%65000+1)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr.String()},
			NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	snap.EndpointSlices = append(snap.EndpointSlices, slice)
}

func ptr[T any](v T) *T { return &v }

func nthAddr(base netip.Addr, n int) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func compileServices(b *testing.B, snap *cluster.Snapshot) *nft.Table {
	m, t := proxy.NewSyncer(benchNode, proxy.Options{}, proxy.CompileOptions{}).Sync(snap)
	if len(m.Errors) > 0 {
		b.Fatal(m.Errors[0])
	}
	return t
}

// BenchmarkServicesFullSync is a node's first service sync at scale: the
// service model, the NAT table, and the whole table applied as one kernel
// transaction into an empty namespace. heap-MB is the live heap after the
// sync with the snapshot, model and table reachable.
func BenchmarkServicesFullSync(b *testing.B) {
	requireRoot(b)
	for _, sc := range []struct{ services, endpoints int }{{10000, 10}, {30000, 2}} {
		b.Run(fmt.Sprintf("%dx%d", sc.services, sc.endpoints), func(b *testing.B) {
			snap := serviceSnapshot(sc.services, sc.endpoints)
			l := nodeOnlyLab(b, serviceSnapshot(0, 0))
			a, err := kernel.NewApplier(int(l.Node(benchNode).Handle), proxy.DefaultTable)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			var compile, apply time.Duration
			var table *nft.Table
			for b.Loop() {
				if err := a.Delete(); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				table = compileServices(b, snap)
				compile = time.Since(start)
				start = time.Now()
				if _, err := a.Apply(table); err != nil {
					b.Fatal(err)
				}
				apply = time.Since(start)
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			c := table.Count()
			b.ReportMetric(float64(compile.Microseconds())/1000, "compile-ms")
			b.ReportMetric(float64(apply.Microseconds())/1000, "apply-ms")
			b.ReportMetric(float64(c.Elements), "elements")
			b.ReportMetric(float64(c.Rules), "rules")
			b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "heap-MB")
			runtime.KeepAlive(snap)
			runtime.KeepAlive(table)
		})
	}
}

// BenchmarkServiceAdd adds one Service (10 endpoints) to a node that has
// `at` of them programmed, then removes it, as the agent syncs: the
// incremental Syncer (model and table for the changed Service only) and
// the Applier (the set changes only). sync-ms is the whole sync per
// change, apply-ms the kernel transaction alone. The baseline is the same
// change at 100 Services, in the same run.
func BenchmarkServiceAdd(b *testing.B) {
	requireRoot(b)
	for _, at := range []int{100, 10000} {
		b.Run(fmt.Sprintf("at-%d", at), func(b *testing.B) {
			base := serviceSnapshot(at, 10)
			// The same objects plus one Service, as an informer cache
			// would hold them.
			grown := serviceSnapshot(0, 0)
			addService(grown, at, 10)
			more := *base
			more.Services = append(slices.Clone(base.Services), grown.Services...)
			more.EndpointSlices = append(slices.Clone(base.EndpointSlices), grown.EndpointSlices...)
			l := nodeOnlyLab(b, serviceSnapshot(0, 0))
			a, err := kernel.NewApplier(int(l.Node(benchNode).Handle), proxy.DefaultTable)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			syncer := proxy.NewSyncer(benchNode, proxy.Options{}, proxy.CompileOptions{})
			if _, t := syncer.Sync(base); true {
				if _, err := a.Apply(t); err != nil {
					b.Fatal(err)
				}
			}
			var syncs, txs time.Duration
			var changes, messages, elements int
			for b.Loop() {
				for _, snap := range []*cluster.Snapshot{&more, base} {
					start := time.Now()
					_, table := syncer.Sync(snap)
					txStart := time.Now()
					stats, err := a.Apply(table)
					if err != nil {
						b.Fatal(err)
					}
					txs += time.Since(txStart)
					syncs += time.Since(start)
					changes++
					messages += stats.Messages
					elements += stats.ElementsAdded + stats.ElementsDeleted
				}
			}
			b.ReportMetric(float64(syncs.Microseconds())/1000/float64(changes), "sync-ms/change")
			b.ReportMetric(float64(txs.Microseconds())/1000/float64(changes), "apply-ms/change")
			b.ReportMetric(float64(messages)/float64(changes), "messages/change")
			b.ReportMetric(float64(elements)/float64(changes), "elements/change")
		})
	}
}

// BenchmarkServiceConnRate measures TCP connections per second from a pod
// to a ClusterIP (one endpoint, a pod on the same node) with 10 and with
// 10,000 Services (10 endpoints each) programmed, in the same run: the
// per-connection cost must not grow with the number of Services. A third
// table has 10,000 Services with 64 distinct endpoint counts, the cost the
// layout does have (one set lookup per distinct count per new connection).
func BenchmarkServiceConnRate(b *testing.B) {
	requireRoot(b)
	base := serviceSnapshot(0, 0)
	base.Nodes = base.Nodes[:1]
	for _, name := range []string{"client", "server"} {
		ip := map[string]string{"client": "10.244.0.250", "server": "10.244.0.251"}[name]
		base.Pods = append(base.Pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec:       corev1.PodSpec{NodeName: benchNode, Containers: []corev1.Container{{Name: "c"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	// The measured Service: 10.96.255.1:80 -> server:8080.
	vip := netip.MustParseAddrPort("10.96.255.1:80")
	node, ready := benchNode, true
	base.Services = append(base.Services, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "measured"},
		Spec: corev1.ServiceSpec{ClusterIP: vip.Addr().String(), ClusterIPs: []string{vip.Addr().String()},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	})
	base.EndpointSlices = append(base.EndpointSlices, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: "measured-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "measured"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(8080))}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.251"}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: "server"}}},
	})
	l := labtest.Up(b, base, lab.Options{})
	a, err := kernel.NewApplier(int(l.Node(benchNode).Handle), proxy.DefaultTable)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	// withServices programs the measured Service and n-1 others with eps(i)
	// endpoints each.
	withServices := func(n int, eps func(i int) int) *nft.Table {
		snap := *base
		snap.Services, snap.EndpointSlices = slices.Clone(base.Services), slices.Clone(base.EndpointSlices)
		for i := range n - 1 {
			addService(&snap, i, eps(i))
		}
		return compileServices(b, &snap)
	}
	ten := func(int) int { return 10 }
	small, large := withServices(10, ten), withServices(10000, ten)
	// The worst case of the layout: 64 distinct endpoint counts, so a new
	// connection may be tested against 64 count sets before its DNAT rule.
	counts := withServices(10000, func(i int) int { return 1 + i%64 })
	rate := func() float64 {
		return connRate(b, func() error {
			o := l.Dial(context.Background(), "bench/client", vip, corev1.ProtocolTCP, lab.DialOptions{Timeout: time.Second})
			if o.Result != lab.ResultOK || o.Reply != "bench/server" {
				return fmt.Errorf("client -> %s: %s from %q", vip, o.Result, o.Reply)
			}
			return nil
		})
	}
	var r10, r10k, r64 float64
	for b.Loop() {
		for _, m := range []struct {
			table *nft.Table
			rate  *float64
		}{{small, &r10}, {large, &r10k}, {counts, &r64}} {
			if _, err := a.Apply(m.table); err != nil {
				b.Fatal(err)
			}
			*m.rate = rate()
		}
	}
	b.ReportMetric(r10, "conn/s-10-services")
	b.ReportMetric(r10k, "conn/s-10000-services")
	b.ReportMetric(r10k/r10, "ratio")
	b.ReportMetric(r64, "conn/s-10000-services-64-counts")
	b.ReportMetric(r64/r10, "ratio-64-counts")
}
