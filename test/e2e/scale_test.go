//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/internal/testenv"
	"github.com/netpol/netpol/pkg/cluster"
)

// BenchmarkAgentScale (issue 14) runs one `netpol agent` process against
// the real test API server holding a synthetic cluster of each size in
// NETPOL_SCALE_PODS (comma-separated; default 10,000, `make bench-scale`
// runs 10,000 and 100,000; internal/synth as bench-agent: 100 pods per
// namespace and per node, one NetworkPolicy per 10 pods, one admin or
// baseline policy per 100, one Service per 5 pods with its EndpointSlice),
// programming node-1 into a network namespace of its own (scaleStates: the
// realistic shape's node-001, or a dump's node). It reports the
// time from the process's start to ready (the informers' initial lists
// from the API server, then the first full sync of both tables, as a node
// restart pays it), the agent's own first-sync duration (its
// netpol_sync_duration_seconds sum), and its peak and current resident
// memory (VmHWM, VmRSS) — the whole process, nothing left out — and,
// sampled every 5 ms, the peak of its anonymous part (RssAnon: VmHWM
// also counts the binary's file pages).
// NETPOL_SCALE_BINS ("name=path,...") runs other agent binaries too, one
// after the other against the same objects (an earlier build, for ratios
// in one run); the metrics carry each one's name. NETPOL_SCALE_VARIANTS
// ("name=flags,...", e.g. "ratio80=--memory-limit-ratio=0.8") runs this tree's
// agent again with those flags, named so. NETPOL_SCALE_PROFILE=DIR
// runs this tree's agent with --profiling and GODEBUG=gctrace=1 and keeps, in DIR,
// its heap profiles every 250 ms until ready (as of the last collection)
// and once settled (after a collection: in-use, and allocated since the
// start), a CPU profile of its first 20 s (the informers' lists and the
// first sync), and its log (one line per garbage collection: the heap's
// size at each); NETPOL_SCALE_PROFILE_GC=1 collects before each heap
// profile (the live heap exactly; the agent's times suffer).
// NETPOL_SCALE_KEEP=DIR keeps etcd's data in DIR (on tmpfs: /dev/shm/...)
// and a later run with the same DIR and size starts on the objects written
// then, in seconds instead of the 10 minutes writing 100,000 pods takes.
// NETPOL_SCALE_RESTART=1 runs each binary a second time on the tables the
// first one left (it is killed, as a crash or an upgrade stops it): the
// restart reads the kernel's tables back and diffs against them; its
// figures carry the name with "-restart". NETPOL_SCALE_MEMORY_LIMITS
// ("512Mi,400Mi"; "none" for a cgroup without a limit) runs each binary
// again in a memory cgroup with each limit, as the kubelet runs a
// container with resources.limits.memory (the agent's soft limit follows
// it: --memory-limit-ratio); its figures carry the name with "-limit" and
// the limit, and add the cgroup's peak usage and, on cgroup v1, the peak of
// the kernel memory charged to it (the nftables objects of the tables).
func BenchmarkAgentScale(b *testing.B) {
	requireRoot(b)
	for _, st := range scaleStates(b) {
		b.Run(st.name, func(b *testing.B) { agentScale(b, st) })
	}
}

// scaleState is one cluster the harness writes to the API server: its
// name in the figures and file names, and the node the agent runs as.
type scaleState struct {
	name, node string
	snap       *cluster.Snapshot
}

// scaleStates are the clusters to run: the YAML/JSON dump in
// NETPOL_SCALE_STATE (with NETPOL_SCALE_NODE, default its first Node by
// name), else internal/synth at each size of NETPOL_SCALE_PODS in each
// shape of NETPOL_SCALE_SHAPES (comma-separated: easy, realistic; default
// easy), the easy shape's runs named pods=N as before.
func scaleStates(b *testing.B) []scaleState {
	if file := os.Getenv("NETPOL_SCALE_STATE"); file != "" {
		snap, report := cluster.LoadPaths([]string{file}, nil)
		if len(report.Errors) > 0 {
			b.Fatalf("NETPOL_SCALE_STATE %s: %v", file, report.Errors)
		}
		node := os.Getenv("NETPOL_SCALE_NODE")
		if node == "" && len(snap.Nodes) > 0 {
			node = slices.MinFunc(snap.Nodes, func(x, y *corev1.Node) int { return strings.Compare(x.Name, y.Name) }).Name
		}
		if !slices.ContainsFunc(snap.Nodes, func(n *corev1.Node) bool { return n.Name == node }) {
			b.Fatalf("NETPOL_SCALE_STATE %s has no Node %q (NETPOL_SCALE_NODE)", file, node)
		}
		return []scaleState{{name: "state=" + strings.TrimSuffix(filepath.Base(file), filepath.Ext(file)), node: node, snap: snap}}
	}
	sizes, err := benchstat.EnvInts("NETPOL_SCALE_PODS", []int{10000})
	if err != nil {
		b.Fatal(err)
	}
	var out []scaleState
	for _, shape := range strings.Split(cmp.Or(os.Getenv("NETPOL_SCALE_SHAPES"), synth.ShapeEasy), ",") {
		if err := synth.CheckShape(shape); err != nil {
			b.Fatalf("NETPOL_SCALE_SHAPES: %v", err)
		}
		for _, pods := range sizes {
			spec := synth.Spec{Shape: shape, Namespaces: pods / 100, Pods: pods, Nodes: pods / 100, NetworkPolicies: pods / 10,
				AdminPolicies: pods / 100, Services: pods / 5, Seed: 1}
			snap, err := synth.Snapshot(spec)
			if err != nil {
				b.Fatal(err)
			}
			st := scaleState{name: fmt.Sprintf("pods=%d", pods), node: "node-1", snap: snap}
			if shape == synth.ShapeRealistic {
				st.name, st.node = shape+"-"+st.name, "node-001"
			}
			out = append(out, st)
		}
	}
	return out
}

func agentScale(b *testing.B, st scaleState) {
	snap, pods := st.snap, len(st.snap.Pods)
	// NETPOL_SCALE_KEEP=DIR keeps etcd's data in DIR/etcd-NAME: a later
	// run starts on the objects this one wrote instead of writing them again.
	var opts testenv.Options
	var written string
	if dir := os.Getenv("NETPOL_SCALE_KEEP"); dir != "" {
		opts.EtcdDataDir = filepath.Join(dir, "etcd-"+st.name)
		written = filepath.Join(dir, "etcd-"+st.name+".written")
	}
	env := testenv.Start(b, opts)
	installCRDs(b, env)
	kcfg := agentKubeconfig(b, env)
	if _, err := os.Stat(written); written != "" && err == nil {
		b.Logf("the objects of %d pods are in %s from an earlier run", pods, opts.EtcdDataDir)
	} else {
		start := time.Now()
		writeSnapshot(b, env, snap)
		b.Logf("wrote %d pods, %d Services, %d NetworkPolicies, %d admin policies in %v", len(snap.Pods), len(snap.Services),
			len(snap.NetworkPolicies), len(snap.AdminPolicies)+len(snap.BaselinePolicies)+len(snap.ClusterPolicies), time.Since(start).Round(time.Second))
		if written != "" {
			if err := os.WriteFile(written, nil, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}

	removeStaleScaleNamespaces(b)
	ns := fmt.Sprintf("%s%d", scaleNetNSPrefix, os.Getpid())
	b.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() }) // after a failed run
	bins := []scaleRun{{name: "netpol", path: netpolBin}}
	if v := os.Getenv("NETPOL_SCALE_VARIANTS"); v != "" {
		for _, f := range strings.Split(v, ",") {
			name, flags, ok := strings.Cut(f, "=")
			if !ok {
				b.Fatalf("NETPOL_SCALE_VARIANTS: %q is not name=flags", f)
			}
			bins = append(bins, scaleRun{name: name, path: netpolBin, args: strings.Fields(flags)})
		}
	}
	if v := os.Getenv("NETPOL_SCALE_BINS"); v != "" {
		for _, f := range strings.Split(v, ",") {
			name, path, ok := strings.Cut(f, "=")
			if !ok {
				b.Fatalf("NETPOL_SCALE_BINS: %q is not name=path", f)
			}
			bins = append(bins, scaleRun{name: name, path: path})
		}
	}
	restart := os.Getenv("NETPOL_SCALE_RESTART") != ""
	runs := slices.Clone(bins)
	if v := os.Getenv("NETPOL_SCALE_MEMORY_LIMITS"); v != "" {
		for _, f := range strings.Split(v, ",") {
			limit := int64(-1) // "none": a cgroup without a limit, to read its peak
			if f != "none" {
				q, err := resource.ParseQuantity(f)
				if err != nil {
					b.Fatalf("NETPOL_SCALE_MEMORY_LIMITS: %q: %v", f, err)
				}
				limit = q.Value()
			}
			dir := memoryCgroup(b, fmt.Sprintf("netpol-scale-limit-%s", f), limit)
			for _, bin := range bins {
				bin.name += "-limit" + f
				bin.cgroup, bin.limited = dir, limit >= 0
				runs = append(runs, bin)
			}
		}
	}
	for b.Loop() {
		for _, r := range runs {
			// A network namespace of its own for each binary: one that
			// found the tables of the one before would adopt them (a
			// restart's read-back and diff), not program them.
			if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
				b.Fatalf("ip netns add: %v: %s", err, out)
			}
			runScaleAgent(b, st, r, kcfg, ns)
			if restart {
				// The same binary again, on the tables the first left
				// (it was killed): an upgrade's or a crash's restart,
				// which reads the kernel's tables back and diffs.
				again := r
				again.name += "-restart"
				runScaleAgent(b, st, again, kcfg, ns)
			}
			if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
				b.Fatalf("ip netns delete: %v: %s", err, out)
			}
		}
	}
}

// scaleNetNSPrefix names the benchmark's network namespace, the test
// process's pid after it.
const scaleNetNSPrefix = "netpol-scale-"

// removeStaleScaleNamespaces deletes the namespaces of earlier runs whose
// process is gone: a run killed before its cleanup left them.
func removeStaleScaleNamespaces(b *testing.B) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), scaleNetNSPrefix)
		pid, err := strconv.Atoi(rest)
		if !ok || err != nil || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if out, err := exec.Command("ip", "netns", "delete", e.Name()).CombinedOutput(); err != nil {
			b.Fatalf("removing %s, left by a killed run: %v: %s", e.Name(), err, out)
		}
		b.Logf("removed %s, left by a killed run", e.Name())
	}
}

// scaleRun is one agent run: its name in the figures, the binary and
// flags of its own, and the memory cgroup it runs in (none: ""), which has
// a limit when limited.
type scaleRun struct {
	name, path, cgroup string
	args               []string
	limited            bool
}

// runScaleAgent starts one agent binary as st's node (in its cgroup, when
// set), waits for it to be ready, reports its figures and stops it.
func runScaleAgent(b *testing.B, st scaleState, r scaleRun, kcfg, ns string) {
	pods := len(st.snap.Pods)
	name, bin, cgroup := r.name, r.path, r.cgroup
	addrs := freeAddrs(b, 3)
	a := &agentProc{health: addrs[0], metrics: addrs[1], debug: addrs[2]}
	logf, err := os.CreateTemp("", "netpol-agent-scale-*.log")
	if err != nil {
		b.Fatal(err)
	}
	a.log = logf.Name()
	defer os.Remove(a.log)
	args := []string{"agent", "--kubeconfig", kcfg, "--node-name", st.node, "--netns", ns, "--no-status",
		"--health-bind-address", a.health, "--metrics-bind-address", a.metrics, "--debug-bind-address", a.debug, "--log-format", "json"}
	args = append(args, r.args...)
	profileDir := os.Getenv("NETPOL_SCALE_PROFILE")
	if bin != netpolBin {
		profileDir = "" // an earlier build may not know --profiling
	}
	if profileDir != "" {
		args = append(args, "--profiling")
	}
	a.cmd = exec.Command(bin, args...)
	if profileDir != "" {
		a.cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	}
	if cgroup != "" {
		resetCgroupPeaks(b, cgroup)
		a.cmd = inCgroup(a.cmd, cgroup)
	}
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := time.Now()
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	logf.Close()
	defer a.kill()
	// VmHWM also counts the binary's file pages (50-67 MiB here, present
	// before the first list), which the container is charged for only if
	// it read them first; the kernel keeps no high-water mark of the
	// anonymous pages alone, so they are sampled every 5 ms until the
	// figures are read (a lower bound of their peak).
	var anonPeak atomic.Int64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			if kib, _ := benchstat.ProcStatusKiB(a.cmd.Process.Pid, "RssAnon"); kib > anonPeak.Load() {
				anonPeak.Store(kib)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	defer sampling.Wait()
	defer close(stopSampling) // deferred after Wait, so it runs before it
	var cpuProfile sync.WaitGroup
	defer cpuProfile.Wait()
	if profileDir != "" {
		// The CPU from the start to well after ready: the informers'
		// lists and the first sync (both tables, and the kernel's share).
		path := filepath.Join(profileDir, fmt.Sprintf("%s-%s-cpu.pprof", name, st.name))
		cpuProfile.Go(func() {
			// Asked for as soon as the debug listener answers.
			for time.Since(started) < 10*time.Second {
				if saveProfileIfUp("http://"+a.debug+"/debug/pprof/profile?seconds=20", path) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	heapProfile := "http://" + a.debug + "/debug/pprof/heap"
	if os.Getenv("NETPOL_SCALE_PROFILE_GC") != "" {
		heapProfile += "?gc=1"
	}
	startup := 0
	for !a.ready() {
		if profileDir != "" && time.Since(started) > time.Duration(startup)*250*time.Millisecond {
			// The heap as of the last collection, every 250 ms until
			// ready: what the informers' initial lists and the first sync
			// hold (the debug listener is up from the start). With
			// NETPOL_SCALE_PROFILE_GC each profile collects first: the
			// live heap exactly, at the cost of the agent's times.
			startup++
			saveProfileIfUp(heapProfile, filepath.Join(profileDir, fmt.Sprintf("%s-%s-startup-%02d.pprof", name, st.name, startup)))
		}
		if processExited(a.cmd.Process.Pid) {
			data, _ := os.ReadFile(a.log)
			if !r.limited {
				b.Fatalf("%s: agent exited before ready:\n%s", name, tail(string(data), 20))
			}
			// Under a memory limit that is a result: the limit is below
			// what the agent needs at this size.
			b.ReportMetric(1, "killed-"+name)
			b.Logf("%s, %d pods: the agent exited %v after start, before ready: killed at its cgroup's memory limit (memory.failcnt %s); its log ends:\n%s",
				name, pods, time.Since(started).Round(time.Millisecond), readTrimmed(filepath.Join(cgroup, "memory.failcnt")), tail(string(data), 3))
			return
		}
		if time.Since(started) > 10*time.Minute {
			data, _ := os.ReadFile(a.log)
			b.Fatalf("%s: agent not ready after %v:\n%s", name, time.Since(started).Round(time.Second), tail(string(data), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	ready := time.Since(started)
	syncSeconds := a.metric(b, "netpol_sync_duration_seconds_sum")
	time.Sleep(5 * time.Second) // settled: nothing changes any more
	hwm, _ := benchstat.ProcStatusKiB(a.cmd.Process.Pid, "VmHWM")
	rss, _ := benchstat.ProcStatusKiB(a.cmd.Process.Pid, "VmRSS")
	// The mapped binary's pages count in VmRSS, but the cgroup is charged
	// for them only if it read them first.
	rssFile, _ := benchstat.ProcStatusKiB(a.cmd.Process.Pid, "RssFile")
	anon := anonPeak.Load()
	if profileDir != "" {
		saveProfile(b, "http://"+a.debug+"/debug/pprof/heap?gc=1", filepath.Join(profileDir, fmt.Sprintf("%s-%s-heap.pprof", name, st.name)))
		if data, err := os.ReadFile(a.log); err == nil {
			os.WriteFile(filepath.Join(profileDir, fmt.Sprintf("%s-%s.log", name, st.name)), data, 0o644)
		}
	}
	b.ReportMetric(ready.Seconds(), "ready-s-"+name)
	b.ReportMetric(syncSeconds, "first-sync-s-"+name)
	b.ReportMetric(float64(hwm)/1024, "peak-rss-MB-"+name)
	b.ReportMetric(float64(rss)/1024, "rss-MB-"+name)
	b.ReportMetric(float64(anon)/1024, "peak-anon-MB-"+name)
	b.Logf("%s, %d pods: ready %v after start (first sync %.2f s); VmHWM %.0f MiB, VmRSS %.0f MiB (file-backed %.0f MiB); RssAnon peak (sampled) %.0f MiB",
		name, pods, ready.Round(time.Millisecond), syncSeconds, float64(hwm)/1024, float64(rss)/1024, float64(rssFile)/1024, float64(anon)/1024)
	if cgroup != "" {
		// What the container's limit is held against: the process's
		// memory and the kernel memory charged to it, the tables'
		// nftables objects among them.
		peak, kernel := cgroupPeaks(cgroup)
		if peak > 0 {
			b.ReportMetric(float64(peak)/(1<<20), "cgroup-peak-MB-"+name)
		}
		if kernel > 0 {
			b.ReportMetric(float64(kernel)/(1<<20), "cgroup-kernel-peak-MB-"+name)
		}
		b.Logf("%s: the cgroup's peak usage %.0f MiB, of it kernel memory %.0f MiB", name, float64(peak)/(1<<20), float64(kernel)/(1<<20))
	}
}

// resetCgroupPeaks starts a memory cgroup's high-water marks again (cgroup
// v1's max_usage files; v2's memory.peak, where the kernel lets it be
// reset).
func resetCgroupPeaks(b *testing.B, cgroup string) {
	for _, f := range []string{"memory.max_usage_in_bytes", "memory.kmem.max_usage_in_bytes", "memory.peak"} {
		path := filepath.Join(cgroup, f)
		if _, err := os.Stat(path); err == nil {
			if err := os.WriteFile(path, []byte("0"), 0o644); err != nil && f != "memory.peak" {
				b.Fatalf("resetting %s: %v", path, err)
			}
		}
	}
}

// cgroupPeaks reads a memory cgroup's peak usage and, on cgroup v1, the
// peak of the kernel memory charged to it (0: not known).
func cgroupPeaks(cgroup string) (peak, kernel int64) {
	read := func(f string) int64 {
		v, _ := strconv.ParseInt(readTrimmed(filepath.Join(cgroup, f)), 10, 64)
		return v
	}
	if peak = read("memory.max_usage_in_bytes"); peak == 0 {
		peak = read("memory.peak")
	}
	return peak, read("memory.kmem.max_usage_in_bytes")
}

func saveProfile(b *testing.B, url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
}

// saveProfileIfUp saves the profile at url when the agent answers, and
// reports whether it did.
func saveProfileIfUp(url, path string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && os.WriteFile(path, data, 0o644) == nil
}

// writeSnapshot creates every object of snap through the API, 32 writers
// at a time (pods and nodes get their status in a second write, as a
// kubelet reports it).
func writeSnapshot(b *testing.B, env *testenv.Env, snap *cluster.Snapshot) {
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.ContentType = runtime.ContentTypeProtobuf
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(rest.CopyConfig(env.Config))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	opts := metav1.CreateOptions{}
	var written atomic.Int64
	each := func(what string, n int, write func(i int) error) {
		start := time.Now()
		work := make(chan int)
		var wg sync.WaitGroup
		var failed atomic.Value
		for range 32 {
			wg.Go(func() {
				for i := range work {
					if err := write(i); err != nil && !apierrors.IsAlreadyExists(err) {
						failed.CompareAndSwap(nil, fmt.Errorf("%s %d: %w", what, i, err))
					}
					written.Add(1)
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		b.Logf("  %d %s in %v", n, what, time.Since(start).Round(time.Millisecond))
	}
	each("namespaces", len(snap.Namespaces), func(i int) error {
		o := snap.Namespaces[i].DeepCopy()
		_, err := kube.CoreV1().Namespaces().Create(ctx, o, opts)
		return err
	})
	each("nodes", len(snap.Nodes), func(i int) error {
		n := snap.Nodes[i].DeepCopy()
		created, err := kube.CoreV1().Nodes().Create(ctx, n, opts)
		if err != nil {
			return err
		}
		created.Status = snap.Nodes[i].Status
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
	each("pods", len(snap.Pods), func(i int) error {
		p := snap.Pods[i].DeepCopy()
		if len(p.Spec.Containers) == 0 {
			p.Spec.Containers = []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}
		}
		for j := range p.Spec.Containers {
			if p.Spec.Containers[j].Name == "" {
				p.Spec.Containers[j].Name = fmt.Sprint("c", j)
			}
			if p.Spec.Containers[j].Image == "" {
				p.Spec.Containers[j].Image = "registry.k8s.io/pause:3.10"
			}
		}
		created, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, p, opts)
		if err != nil {
			return err
		}
		created.Status = snap.Pods[i].Status
		_, err = kube.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	})
	each("Services", len(snap.Services), func(i int) error {
		_, err := kube.CoreV1().Services(snap.Services[i].Namespace).Create(ctx, snap.Services[i].DeepCopy(), opts)
		return err
	})
	each("EndpointSlices", len(snap.EndpointSlices), func(i int) error {
		_, err := kube.DiscoveryV1().EndpointSlices(snap.EndpointSlices[i].Namespace).Create(ctx, snap.EndpointSlices[i].DeepCopy(), opts)
		return err
	})
	each("NetworkPolicies", len(snap.NetworkPolicies), func(i int) error {
		_, err := kube.NetworkingV1().NetworkPolicies(snap.NetworkPolicies[i].Namespace).Create(ctx, snap.NetworkPolicies[i].DeepCopy(), opts)
		return err
	})
	var admin []*unstructured.Unstructured
	add := func(obj any, gvr schema.GroupVersionResource, kind string) {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			b.Fatal(err)
		}
		o := &unstructured.Unstructured{Object: u}
		o.SetAPIVersion(gvr.GroupVersion().String())
		o.SetKind(kind)
		admin = append(admin, o)
	}
	for _, p := range snap.AdminPolicies {
		add(p, cluster.GVRAdminPolicy, "AdminNetworkPolicy")
	}
	for _, p := range snap.BaselinePolicies {
		add(p, cluster.GVRBaselinePolicy, "BaselineAdminNetworkPolicy")
	}
	for _, p := range snap.ClusterPolicies {
		add(p, cluster.GVRClusterPolicyV1beta1, "ClusterNetworkPolicy")
	}
	each("admin policies", len(admin), func(i int) error {
		gvr := map[string]schema.GroupVersionResource{"AdminNetworkPolicy": cluster.GVRAdminPolicy,
			"BaselineAdminNetworkPolicy": cluster.GVRBaselinePolicy, "ClusterNetworkPolicy": cluster.GVRClusterPolicyV1beta1}[admin[i].GetKind()]
		_, err := dyn.Resource(gvr).Create(ctx, admin[i], opts)
		return err
	})
}

// processExited reports whether the child pid has exited (a zombie not
// yet waited for).
func processExited(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// pid (comm) state ...: comm may hold spaces, the state follows its ")".
	rest := stat[strings.LastIndexByte(string(stat), ')')+1:]
	return len(rest) > 1 && rest[1] == 'Z'
}

// readTrimmed is a small file's content without surrounding space, or
// "unknown".
func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}
