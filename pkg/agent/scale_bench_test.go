package agent

import (
	"context"
	"fmt"
	"os"
	goruntime "runtime"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	fakediscovery "k8s.io/client-go/discovery/fake"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// BenchmarkAgentEvents is the agent scale harness (issue 14): a synthetic
// cluster (internal/synth: 100 pods per namespace and per node, one
// NetworkPolicy per 10 pods, one admin or baseline policy per 100 pods,
// one Service per 5 pods with up to 5 endpoints)
// served by fake API clients, and node-1's agent fed every object through
// its real informers and event handlers into fake kernel tables. It
// reports the first full sync, then for each kind of event the time from
// the API write to the committed transactions (the informer's delivery,
// the event handler, the policy pipeline (incremental or full), the diff
// and the commit): wall and CPU (the process's, which includes the fake
// API's share), the agent's sync alone (sync-ms: from the event handler's
// mark to the commit), p50 and p99, and the transaction size. After the
// events the kernel must hold what a from-scratch compile of the
// informers' state gives.
//
// Sizes: NETPOL_BENCH_PODS (comma-separated, default 10000); events per
// kind: NETPOL_BENCH_EVENTS (default 200); shapes: NETPOL_BENCH_SHAPES
// (easy, realistic; default easy: the realistic shape's events are
// realisticEvents); layouts: NETPOL_BENCH_LAYOUTS (addresses, identities;
// default addresses). NETPOL_BENCH_HEAP_PROFILE=FILE writes a heap profile
// after the first sync. make bench-agent runs 10,000 and 100,000 pods in one
// run.
func BenchmarkAgentEvents(b *testing.B) {
	sizes := envInts(b, "NETPOL_BENCH_PODS", []int{10000})
	events := envInts(b, "NETPOL_BENCH_EVENTS", []int{200})[0]
	shapes := envList("NETPOL_BENCH_SHAPES", synth.ShapeEasy)
	layouts := envList("NETPOL_BENCH_LAYOUTS", compiler.LayoutAddresses.String())
	for _, pods := range sizes {
		for _, shape := range shapes {
			for _, name := range layouts {
				layout, err := compiler.ParseLayout(name)
				if err != nil {
					b.Fatal(err)
				}
				b.Run(fmt.Sprintf("pods=%d,shape=%s,layout=%s", pods, shape, layout), func(b *testing.B) {
					sb := newScaleBench(b, pods, shape, layout)
					b.Run("first-sync", func(b *testing.B) {
						for range b.N {
							sb.firstSync(b)
						}
					})
					for _, kind := range sb.events {
						b.Run(kind.name, func(b *testing.B) {
							for range b.N {
								sb.measure(b, kind, events)
							}
						})
					}
					sb.checkKernel(b)
				})
			}
		}
	}
}

// envList is a comma-separated environment variable's values (def when
// unset).
func envList(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	return strings.Split(v, ",")
}

func envInts(b *testing.B, name string, def []int) []int {
	v, err := benchstat.EnvInts(name, def)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

type scaleBench struct {
	h           *harness
	spec        synth.Spec
	events      []scaleEvent
	messages    atomic.Int64 // netlink messages committed since the last reset
	firstDone   bool
	baseHeap    uint64   // live heap with the fake API loaded, before the agent starts
	added       []string // pods added by pod-add, deleted by pod-delete
	eventsSoFar int
	// The realistic shape's events copy its pods (replicas) and relabel
	// its namespaces; free gives each node's next unused host number in
	// its pod network.
	models     []*corev1.Pod
	namespaces []string
	free       map[string]int
}

func newScaleBench(b *testing.B, pods int, shape string, layout compiler.Layout) *scaleBench {
	spec := synth.Spec{Shape: shape, Namespaces: pods / 100, Pods: pods, Nodes: pods / 100, NetworkPolicies: pods / 10,
		AdminPolicies: pods / 100, Services: pods / 5, Seed: 1}
	snap, err := synth.Snapshot(spec)
	if err != nil {
		b.Fatal(err)
	}
	sb := &scaleBench{spec: spec, events: scaleEvents, free: map[string]int{}}
	nodeName := "node-1"
	if shape == synth.ShapeRealistic {
		nodeName, sb.events = "node-001", realisticEvents
		for _, p := range snap.Pods {
			if !p.Spec.HostNetwork && p.Status.PodIP != "" {
				sb.models = append(sb.models, p)
			}
		}
		for _, ns := range snap.Namespaces {
			if ns.Labels["team"] != "" {
				sb.namespaces = append(sb.namespaces, ns.Name)
			}
		}
	}
	var admin []runtime.Object
	add := func(obj any, apiVersion, kind string) {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			b.Fatal(err)
		}
		o := &unstructured.Unstructured{Object: u}
		o.SetAPIVersion(apiVersion)
		o.SetKind(kind)
		admin = append(admin, o)
	}
	for _, p := range snap.AdminPolicies {
		add(p, cluster.GVRAdminPolicy.GroupVersion().String(), "AdminNetworkPolicy")
	}
	for _, p := range snap.BaselinePolicies {
		add(p, cluster.GVRBaselinePolicy.GroupVersion().String(), "BaselineAdminNetworkPolicy")
	}
	for _, p := range snap.ClusterPolicies {
		add(p, cluster.GVRClusterPolicyV1beta1.GroupVersion().String(), "ClusterNetworkPolicy")
	}
	sb.h = newHarness(b, snap, Options{NoStatus: true, ResyncPeriod: time.Hour, NodeName: nodeName, Layout: layout}, admin...)
	var served []*metav1.APIResourceList
	for _, gvr := range []struct{ gv, resource string }{
		{cluster.GVRAdminPolicy.GroupVersion().String(), cluster.GVRAdminPolicy.Resource},
		{cluster.GVRBaselinePolicy.GroupVersion().String(), cluster.GVRBaselinePolicy.Resource},
		{cluster.GVRClusterPolicyV1beta1.GroupVersion().String(), cluster.GVRClusterPolicyV1beta1.Resource},
	} {
		i := slices.IndexFunc(served, func(l *metav1.APIResourceList) bool { return l.GroupVersion == gvr.gv })
		if i < 0 {
			served = append(served, &metav1.APIResourceList{GroupVersion: gvr.gv})
			i = len(served) - 1
		}
		served[i].APIResources = append(served[i].APIResources, metav1.APIResource{Name: gvr.resource})
	}
	sb.h.kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = served
	count := func(p *kernel.Plan) error { sb.messages.Add(int64(p.Stats.Messages)); return nil }
	sb.h.pol.FailWith(count)
	sb.h.nat.FailWith(count)
	sb.baseHeap = liveHeap()
	sb.h.startSources()
	return sb
}

// firstSync programs both tables from nothing (once; later runs of b.N
// re-sync unchanged tables and are not reported).
func (sb *scaleBench) firstSync(b *testing.B) {
	if sb.firstDone {
		return
	}
	sb.firstDone = true
	sb.messages.Store(0)
	// The informers' initial lists leave garbage behind (the fake API's
	// copies of every object); collecting it is not the sync's work.
	goruntime.GC()
	peak := watchPeakHeap()
	wall, cpu := time.Now(), cpuTime()
	sb.h.agent.syncTables(node.All, false)
	b.ReportMetric(time.Since(wall).Seconds(), "wall-s")
	// The heap's high-water mark during the sync, garbage included (what
	// the process's RSS follows), over the heap before the agent started.
	b.ReportMetric((float64(peak())-float64(sb.baseHeap))/(1<<20), "agent-peak-heap-MB")
	b.ReportMetric((cpuTime() - cpu).Seconds(), "cpu-s")
	b.ReportMetric(float64(sb.messages.Load()), "messages")
	// The live heap after the sync holds the agent and the fake API
	// server's copies of every object (heap-MB); what it grew by since
	// the fake API was loaded is the agent's share: its informer caches
	// and programming state (agent-heap-MB).
	heap := liveHeap()
	if path := os.Getenv("NETPOL_BENCH_HEAP_PROFILE"); path != "" {
		// What is live after the first sync, the fake API's objects
		// included (go tool pprof -sample_index=inuse_space).
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.ReportMetric(float64(heap)/(1<<20), "heap-MB")
	b.ReportMetric((float64(heap)-float64(sb.baseHeap))/(1<<20), "agent-heap-MB")
	if sb.h.pol.Transactions() == 0 || sb.h.nat.Transactions() == 0 {
		b.Fatalf("the first sync committed %d policy and %d NAT transactions, want both", sb.h.pol.Transactions(), sb.h.nat.Transactions())
	}
}

// scaleEvent is one kind of event: prepare reads and builds what the
// i-th event needs (outside the measurement) and returns its write, which
// makes the change through the API.
type scaleEvent struct {
	name    string
	prepare func(sb *scaleBench, i int) (write func() error, err error)
}

var scaleEvents = []scaleEvent{
	{"pod-add", func(sb *scaleBench, i int) (func() error, error) {
		p := sb.benchPod(i)
		sb.added = append(sb.added, p.Namespace+"/"+p.Name)
		return func() error {
			_, err := sb.h.kube.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
			return err
		}, nil
	}},
	{"pod-delete", func(sb *scaleBench, i int) (func() error, error) {
		if len(sb.added) == 0 {
			return nil, fmt.Errorf("no pod left to delete")
		}
		ns, name, _ := strings.Cut(sb.added[0], "/")
		sb.added = sb.added[1:]
		return func() error {
			return sb.h.kube.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}, nil
	}},
	{"pod-label", func(sb *scaleBench, i int) (func() error, error) {
		j := (i * 7919) % sb.spec.Pods
		p, err := sb.h.kube.CoreV1().Pods(fmt.Sprintf("ns-%d", j%sb.spec.Namespaces)).Get(context.Background(), fmt.Sprintf("pod-%d", j), metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		// Another app: the pod leaves some policies' selectors and joins
		// others'.
		nextLabel(p.Labels, "app", 7)
		return func() error {
			_, err := sb.h.kube.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{})
			return err
		}, nil
	}},
	{"namespace-label", func(sb *scaleBench, i int) (func() error, error) {
		ns, err := sb.h.kube.CoreV1().Namespaces().Get(context.Background(), fmt.Sprintf("ns-%d", i%sb.spec.Namespaces), metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		nextLabel(ns.Labels, "team", 10)
		return func() error {
			_, err := sb.h.kube.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{})
			return err
		}, nil
	}},
	{"networkpolicy-add", func(sb *scaleBench, i int) (func() error, error) {
		return sb.createAllow(i, fmt.Sprintf("ns-%d", i%sb.spec.Namespaces), map[string]string{"app": fmt.Sprintf("app-%d", i%7)}, fmt.Sprintf("team-%d", i%10)), nil
	}},
	{"clusternetworkpolicy-add", func(sb *scaleBench, i int) (func() error, error) {
		return sb.createDevDeny(i, fmt.Sprintf("team-%d", i%10)), nil
	}},
}

// createAllow is the write of a NetworkPolicy (the i-th) in namespace ns
// that lets the namespaces of team reach the pods with podLabels on one
// TCP port.
func (sb *scaleBench) createAllow(i int, ns string, podLabels map[string]string, team string) func() error {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(int32(8000 + i%1000))
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-np-%d", i), Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: podLabels},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}}}}
	return func() error {
		_, err := sb.h.kube.NetworkingV1().NetworkPolicies(np.Namespace).Create(context.Background(), np, metav1.CreateOptions{})
		return err
	}
}

// createDevDeny is the write of an Admin ClusterNetworkPolicy (the i-th)
// denying the dev namespaces one TCP port of team's namespaces.
func (sb *scaleBench) createDevDeny(i int, team string) func() error {
	cnp := policyObjects(sb.h.t, fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: bench-cnp-%d}
spec:
  tier: Admin
  priority: %d
  subject:
    namespaces:
      matchLabels: {team: %s}
  ingress:
  - name: deny-from-dev
    action: Deny
    from:
    - namespaces:
        matchLabels: {env: dev}
    protocols:
    - tcp: {destinationPort: {number: %d}}`, i, i%1000, team, 10000+i))[0].(*unstructured.Unstructured)
	return func() error {
		_, err := sb.h.dyn.Resource(cluster.GVRClusterPolicyV1beta1).Create(context.Background(), cnp, metav1.CreateOptions{})
		return err
	}
}

// nextLabel moves labels[key] = "KEY-N" to "KEY-(N+1 mod n)".
func nextLabel(labels map[string]string, key string, n int) {
	v, _ := strconv.Atoi(strings.TrimPrefix(labels[key], key+"-"))
	labels[key] = fmt.Sprintf("%s-%d", key, (v+1)%n)
}

// benchPod is pod-add's i-th pod: on node i of the cluster (node-1, the
// agent's, holds one in Nodes), labelled as synth's pods are.
func (sb *scaleBench) benchPod(i int) *corev1.Pod {
	tiers := []string{"frontend", "backend", "db", "cache"}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i), Namespace: fmt.Sprintf("ns-%d", (i*7)%sb.spec.Namespaces),
		Labels: map[string]string{"app": fmt.Sprintf("app-%d", i%7), "tier": tiers[i%len(tiers)]}},
		Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%d", i%sb.spec.Nodes), Containers: []corev1.Container{{Name: "main",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.200.%d.%d", i>>8&255, i&255),
			PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.200.%d.%d", i>>8&255, i&255)}}}}
}

// measure runs n events of one kind, each written through the API, seen
// by the agent's informer and synced into the fake kernel before the next.
func (sb *scaleBench) measure(b *testing.B, kind scaleEvent, n int) {
	var walls, cpus, syncs, sizes []float64
	for i := range n {
		write, err := kind.prepare(sb, sb.eventsSoFar+i)
		if err != nil {
			b.Fatalf("%s %d: %v", kind.name, i, err)
		}
		sb.messages.Store(0)
		wall, cpu := time.Now(), cpuTime()
		if err := write(); err != nil {
			b.Fatalf("%s %d: %v", kind.name, i, err)
		}
		due := sb.waitPending(b, kind.name)
		syncStart := time.Now()
		sb.h.agent.syncTables(due, false)
		syncs = append(syncs, time.Since(syncStart).Seconds()*1000)
		walls = append(walls, time.Since(wall).Seconds()*1000)
		cpus = append(cpus, (cpuTime()-cpu).Seconds()*1000)
		sizes = append(sizes, float64(sb.messages.Load()))
		if failed := sb.failedTables(); failed != 0 {
			b.Fatalf("%s %d: the %s table failed to sync", kind.name, i, failed)
		}
	}
	sb.eventsSoFar += n
	for _, m := range []struct {
		unit string
		vals []float64
	}{{"ms-p50", walls}, {"cpu-ms-p50", cpus}, {"sync-ms-p50", syncs}, {"messages-p50", sizes}} {
		b.ReportMetric(benchstat.Percentile(m.vals, 0.5), m.unit)
		b.ReportMetric(benchstat.Percentile(m.vals, 0.99), strings.Replace(m.unit, "p50", "p99", 1))
	}
}

// waitPending waits for the agent's event handler to mark a table
// pending, and returns the tables marked.
func (sb *scaleBench) waitPending(b *testing.B, what string) node.Tables {
	deadline := time.Now().Add(time.Minute)
	for {
		var due node.Tables
		sb.h.agent.mu.Lock()
		for _, ts := range sb.h.agent.tables {
			if !ts.pending.IsZero() {
				due |= ts.table
			}
		}
		sb.h.agent.mu.Unlock()
		if due != 0 {
			return due
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s: the agent saw no event within a minute", what)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (sb *scaleBench) failedTables() node.Tables {
	var failed node.Tables
	sb.h.agent.mu.Lock()
	defer sb.h.agent.mu.Unlock()
	for _, ts := range sb.h.agent.tables {
		if ts.backoff > 0 {
			failed |= ts.table
		}
	}
	return failed
}

// checkKernel: after every event the fake kernel holds exactly what a
// from-scratch compile of the informers' state gives.
func (sb *scaleBench) checkKernel(b *testing.B) {
	in, err := sb.h.agent.src.snapshot(true)
	if err != nil {
		b.Fatal(err)
	}
	snap := in.Snapshot
	for p := range in.Pods { // copies: the sequence reuses one pod
		snap.Pods = append(snap.Pods, p.DeepCopy())
	}
	sources, _, err := sb.h.agent.src.policySources()
	if err != nil {
		b.Fatal(err)
	}
	var fresh policy.Cache // nothing shared with the agent's
	model, _ := fresh.Build(sources, loadPolicy)
	numbering := sb.h.agent.prog.Identities() // the identity layout numbers as the agent did
	want, err := compiler.Compile(eval.New(snap, model).Resolved(),
		compiler.Options{Node: sb.h.agent.opts.NodeName, Layout: sb.h.agent.opts.Layout, Identities: &numbering})
	if err != nil {
		b.Fatal(err)
	}
	if d := kernel.Diff(sb.h.pol.Kernel(), want); !d.Empty() {
		plan := d.String()
		b.Fatalf("after the events the kernel's policy table differs from a full compile: %d operations:\n%s", len(d.Ops), plan[:min(len(plan), 3000)])
	}
}

// liveHeap is the heap in use after a collection.
// watchPeakHeap samples the heap (live objects and garbage not yet
// collected) every 2 ms until the returned function is called, which
// returns the largest sample.
func watchPeakHeap() func() uint64 {
	sample := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 { rtmetrics.Read(sample); return sample[0].Value.Uint64() }
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return max(peak.Load(), read())
	}
}

func liveHeap() uint64 {
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
