//go:build bench_peers

package peers

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

const (
	benchNamespace = "bench"
	nodeName       = "peers-node"
	// nodeIP is the namespace's own address (on svc0), the Node's
	// InternalIP and the source of every probe.
	nodeIP = "192.168.77.2"
	// endpointPort is where the namespace's one listener answers, on every
	// address of endpointRange (a local route: AnyIP).
	endpointPort  = 8080
	servicePort   = 80
	endpointRange = "10.244.0.0/16"
)

// service is one Service and its EndpointSlice, as the EndpointSlice
// controller would write it (no controller runs here).
type service struct {
	svc   *corev1.Service
	slice *discoveryv1.EndpointSlice
}

func (s service) frontend() netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(s.svc.Spec.ClusterIP), servicePort)
}

// clusterIP of bulk Service i: 10.96.0.16 + i. The first 16 addresses stay
// free: the apiserver gives 10.96.0.1 to the kubernetes Service.
func clusterIP(i int) netip.Addr { return nthAddr(netip.MustParseAddr("10.96.0.16"), i) }

// addedIP is the ClusterIP of the k-th Service added one at a time while
// system sys runs: 10.96.(200+sys).(k+1), apart from the bulk range and
// from the other systems' (their Services are deleted afterwards, and the
// apiserver need not have released the addresses yet).
func addedIP(sys, k int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 96, byte(200 + sys), byte(k + 1)})
}

// newService builds a ClusterIP Service (TCP 80 -> 8080) with eps ready
// endpoints on this node, numbered from first in 10.244.0.0/16 (as
// conformance/services_bench_test.go numbers them), all of which answer.
func newService(name string, ip netip.Addr, eps, first int) service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(endpointPort)}}},
	}
	node, ready, portName, proto, port := nodeName, true, "http", corev1.ProtocolTCP, int32(endpointPort)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: benchNamespace, Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "netpol-bench-peers"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	base := netip.MustParsePrefix(endpointRange).Addr()
	for e := range eps {
		addr := nthAddr(base, (first+e)%65000+1)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr.String()},
			NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return service{s, slice}
}

// bulkServices are the n Services of a size, eps endpoints each.
func bulkServices(n, eps int) []service {
	out := make([]service, n)
	for i := range n {
		out[i] = newService(fmt.Sprintf("svc-%05d", i), clusterIP(i), eps, i*eps)
	}
	return out
}

func nthAddr(base netip.Addr, n int) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// create writes the slice, then the Service: when a proxy sees the Service
// its endpoints are already there, so a connection is answered as soon as
// the ClusterIP is programmed (not refused for lack of endpoints).
func (s service) create(ctx context.Context, c kubernetes.Interface) error {
	if _, err := c.DiscoveryV1().EndpointSlices(benchNamespace).Create(ctx, s.slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating EndpointSlice %s/%s: %w", benchNamespace, s.slice.Name, err)
	}
	if _, err := c.CoreV1().Services(benchNamespace).Create(ctx, s.svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Service %s/%s (ClusterIP %s): %w", benchNamespace, s.svc.Name, s.svc.Spec.ClusterIP, err)
	}
	return nil
}

func (s service) delete(ctx context.Context, c kubernetes.Interface) error {
	if err := c.CoreV1().Services(benchNamespace).Delete(ctx, s.svc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Service %s/%s: %w", benchNamespace, s.svc.Name, err)
	}
	if err := c.DiscoveryV1().EndpointSlices(benchNamespace).Delete(ctx, s.slice.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting EndpointSlice %s/%s: %w", benchNamespace, s.slice.Name, err)
	}
	return nil
}

// createAll writes the Services with parallel clients (the apiserver, not
// the client's rate limiter, is the limit) and returns the first error.
func createAll(ctx context.Context, c kubernetes.Interface, svcs []service, logf func(string, ...any)) error {
	const workers = 32
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		next, done atomic.Int64
		wg         sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(svcs) || ctx.Err() != nil {
					return
				}
				if err := svcs[i].create(ctx, c); err != nil {
					cancel(err)
					return
				}
				if n := done.Add(1); n%5000 == 0 {
					logf("  %d/%d Services written (%v)", n, len(svcs), time.Since(start).Round(time.Second))
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
