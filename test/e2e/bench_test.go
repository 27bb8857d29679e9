//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netpol/netpol/internal/benchstat"
)

// BenchmarkPodBurst creates 1,000 pods (API objects, as a deployment
// scale-up would; 2,000 writes with their status) as fast as the API
// server takes them, while a policy makes every one of them a peer, and
// measures: how many kernel transactions each agent made, the time from
// the first write to both kernels matching the final state, and each
// agent's resident memory.
func BenchmarkPodBurst(b *testing.B) {
	const pods = 1000
	for b.Loop() {
		w := newWorld(b, "e2e")
		w.converged("policy", w.apply(podsOfYArePeers))
		before := map[string]float64{}
		for name, a := range w.agent {
			before[name] = a.metric(b, `netpol_syncs_total{result="success"}`)
		}
		client := w.fastClient(2000)
		start := time.Now()
		var wg sync.WaitGroup
		work := make(chan int)
		for g := 0; g < 16; g++ {
			wg.Go(func() {
				for i := range work {
					if err := createRunningPod(w, client, i); err != nil {
						b.Error(err)
					}
				}
			})
		}
		for i := 0; i < pods; i++ {
			work <- i
		}
		close(work)
		wg.Wait()
		written := time.Since(start)
		// The burst pods are API objects only (the lab has no namespaces
		// for them), so the check is the kernels, not a probed matrix.
		total, _, _ := w.kernelLatency(start)
		var tx []string
		var rss []string
		for name, a := range w.agent {
			n := a.metric(b, `netpol_syncs_total{result="success"}`) - before[name]
			tx = append(tx, fmt.Sprintf("%s %v", name, n))
			b.ReportMetric(n, "transactions-"+name)
			mb := rssMB(a)
			rss = append(rss, fmt.Sprintf("%s %.0f MB", name, mb))
			b.ReportMetric(mb, "rss-MB-"+name)
		}
		b.ReportMetric(written.Seconds(), "s-writes")
		b.ReportMetric(total.Seconds(), "s-converged")
		b.Logf("%d pods: writes took %v, converged %v after the first write; transactions: %s; agent RSS: %s",
			pods, written.Round(time.Millisecond), total.Round(time.Millisecond), strings.Join(tx, ", "), strings.Join(rss, ", "))
	}
}

func createRunningPod(w *world, client kubernetes.Interface, i int) error {
	ns := []string{"y", "z"}[i%2]
	node := []string{"node-1", "node-2"}[i%2]
	ip := fmt.Sprintf("10.244.%d.%d", 100+i/250, i%250+1)
	return createPod(w, client, apiOnlyPod(ns, fmt.Sprintf("burst-%d", i), node, "burst"), ip)
}

// podsOfYArePeers makes every pod of namespace y a peer of the pods of x:
// each pod of y that comes or goes changes a set on every node.
const podsOfYArePeers = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}
`

// fastClient is a client of the test API server limited to qps requests
// per second (the default 5 would throttle a burst).
func (w *world) fastClient(qps int) kubernetes.Interface {
	cfg := rest.CopyConfig(w.env.Config)
	cfg.QPS, cfg.Burst = float32(qps), qps
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	return client
}

// apiOnlyPod is a pod that exists only as an API object (no lab
// namespace), as the burst and churn benchmarks make them.
func apiOnlyPod(ns, name, node, app string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
}

// createPod creates p and reports it Running with ip, as a kubelet.
func createPod(w *world, client kubernetes.Interface, p *corev1.Pod, ip string) error {
	created, err := client.CoreV1().Pods(p.Namespace).Create(w.ctx, p, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	created.Status = runningStatus(ip)
	_, err = client.CoreV1().Pods(p.Namespace).UpdateStatus(w.ctx, created, metav1.UpdateOptions{})
	return err
}

// reportRunning sets a pod's status to Running with ip, knowing only its
// name (the status subresource keeps the pod's spec and labels).
func reportRunning(w *world, client kubernetes.Interface, ns, name, ip string) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Status: runningStatus(ip)}
	_, err := client.CoreV1().Pods(ns).UpdateStatus(w.ctx, p, metav1.UpdateOptions{})
	return err
}

func runningStatus(ip string) corev1.PodStatus {
	return corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
}

// BenchmarkPolicyLatency measures the programming latency of single policy
// changes: from the API write to the kernels holding the new state (polled
// every millisecond), over 30 changes a quarter of a second apart. (Changes
// closer together than the agent's --min-sync-interval, 100ms, are
// coalesced and wait for the next sync by design.)
func BenchmarkPolicyLatency(b *testing.B) {
	const changes = 30
	for b.Loop() {
		w := newWorld(b, "e2e")
		lat := w.policyLatencies(changes, new(int), "{matchLabels: {pod: a}}")
		p50, p99 := benchstat.Percentile(lat, 0.5), benchstat.Percentile(lat, 0.99)
		b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		b.Logf("programming latency over %d single-policy changes: p50 %v, p99 %v", changes, p50, p99)
	}
}

// policyLatencies makes n single-policy changes a quarter of a second
// apart and returns how long each took to reach the kernels. The changes
// go on counting from *count: on an odd count a NetworkPolicy x/latency
// that admits TCP port 8000+count to the pods of selector, on an even one
// its deletion.
func (w *world) policyLatencies(n int, count *int, selector string) []time.Duration {
	var lat []time.Duration
	for range n {
		*count++
		var written time.Time
		if *count%2 == 1 {
			written = w.apply(fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: latency, namespace: x}
spec:
  podSelector: %s
  ingress:
  - from:
    - podSelector: {}
    ports:
    - {protocol: TCP, port: %d}
`, selector, 8000+*count))
		} else {
			written = w.delete(gvrNetworkPolicy, "x", "latency")
		}
		took, _, _ := w.kernelLatency(written)
		lat = append(lat, took)
		time.Sleep(250 * time.Millisecond)
	}
	return lat
}
