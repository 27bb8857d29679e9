//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/netpol/netpol/pkg/lab"
)

var gvrEndpointSlice = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}

// TestAgentServices: the agents load-balance a Service written to the API
// server (as an EndpointSlice controller would write its slice): a pod
// reaches the ClusterIP and, from outside the nodes, the NodePort; moving
// the endpoint moves the traffic; with no endpoint left the connection is
// refused; an address of the Service range (the API server's ServiceCIDR
// object, read by the agents) that no Service holds is dropped. Each step
// is polled until the kernel does it.
func TestAgentServices(t *testing.T) {
	w := newWorld(t, "e2e")
	podAddr := map[string]string{}
	for _, p := range w.lab.Pods() {
		podAddr[p.Name] = p.Addrs[0].String()
	}
	slice := func(pod string) string {
		ns, name := pod[:1], pod[2:]
		return fmt.Sprintf(`
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: x, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- addresses: [%s]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: "%s", name: "%s"}
`, podAddr[pod], ns, name)
	}
	const service = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: x}
spec:
  type: NodePort
  clusterIP: 10.96.0.50
  ports: [{name: http, port: 80, targetPort: 80, protocol: TCP, nodePort: 30080}]
`
	clusterIP := netip.MustParseAddrPort("10.96.0.50:80")
	unallocated := netip.MustParseAddrPort("10.96.0.99:80")
	nodePort := netip.MustParseAddrPort("172.18.0.2:30080")

	written := w.apply(service + "---" + slice("x/b"))
	w.serviceAnswers("Service created, endpoint x/b", written, "x/a", clusterIP, "x/b")
	w.serviceAnswers("the NodePort from outside", written, lab.ExternalSource, nodePort, "x/b")
	w.serviceDropped("an unallocated ClusterIP", "x/a", unallocated)
	written = w.apply(slice("y/c"))
	w.serviceAnswers("endpoint moved to y/c", written, "x/a", clusterIP, "y/c")
	written = w.delete(gvrEndpointSlice, "x", "web-1")
	w.serviceAnswers("no endpoint left", written, "x/a", clusterIP, lab.ResultRefused)
}

// serviceAnswers polls from -> to until the answer is from want, a pod
// (namespace/name), or until the dial's result is want (lab.ResultRefused),
// and logs how long after written that took.
func (w *world) serviceAnswers(what string, written time.Time, from string, to netip.AddrPort, want string) {
	w.t.Helper()
	deadline := written.Add(15 * time.Second)
	var o lab.Observation
	var seen []string
	for time.Now().Before(deadline) {
		o = w.lab.Dial(context.Background(), from, to, corev1.ProtocolTCP, lab.DialOptions{Timeout: 200 * time.Millisecond})
		if r := o.Result + " " + o.Reply; len(seen) == 0 || seen[len(seen)-1] != r {
			seen = append(seen, fmt.Sprintf("%s@%v", r, time.Since(written).Round(time.Millisecond)))
		}
		if o.Result == want || (o.Result == lab.ResultOK && o.Reply == want) {
			w.t.Logf("%s: %s -> %s answered as expected %v after the write (%v)", what, from, to, time.Since(written).Round(time.Millisecond), seen)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.t.Fatalf("%s: %s -> %s: last result %s from %q, want %q", what, from, to, o.Result, o.Reply, want)
}

// serviceDropped dials from -> to three times: each must time out. Not
// polled: the tables have synced (a step before answered), and without
// the drop the first dials meet the node's "unreachable" at once (later
// ones may time out too, once the kernel rate-limits its ICMP errors).
func (w *world) serviceDropped(what, from string, to netip.AddrPort) {
	w.t.Helper()
	for i := range 3 {
		o := w.lab.Dial(context.Background(), from, to, corev1.ProtocolTCP, lab.DialOptions{Timeout: 200 * time.Millisecond})
		if o.Result != lab.ResultTimeout {
			w.t.Fatalf("%s: %s -> %s: dial %d: %s %q, want a timeout (dropped)", what, from, to, i+1, o.Result, o.Reply)
		}
	}
	w.t.Logf("%s: %s -> %s: dropped (3 dials timed out)", what, from, to)
}
