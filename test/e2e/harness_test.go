//go:build e2e

// Package e2e runs netpol agents against a real kube-apiserver and etcd
// (internal/testenv) while the lab plays kubelet: it creates the Node and
// Pod objects, patches their status as it builds the namespaces, and runs
// one `netpol agent` process per lab node, programming that node's
// network namespace. After each change the kernel must converge to what
// the compiler makes of the live cluster, and the probed matrix must equal
// the evaluator's table.
package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/testenv"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

const repo = "../.."

// netpolBin is the agent binary, built once by TestMain.
var netpolBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "netpol-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	netpolBin = filepath.Join(dir, "netpol")
	build := exec.Command("go", "build", "-o", netpolBin, "./cmd/netpol")
	build.Dir = repo
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building netpol:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func requireRoot(t testing.TB) {
	kerneltest.Require(t, "the e2e tests create network namespaces and program nftables")
}

// cluster is one test's world: the API server, the lab, the agents.
type world struct {
	t     testing.TB
	ctx   context.Context
	env   *testenv.Env
	lab   *lab.Lab
	kcfg  string // the agents' kubeconfig (deploy/'s service account)
	agent map[string]*agentProc
	// agentCgroup, when set, is the cgroup startAgent starts agents in
	// (memoryCgroup: a container's memory limit).
	agentCgroup string
	// convergence records, per change, the time from the API write to the
	// kernel of every node matching the compiled live state.
	convergence []time.Duration
}

// newWorld starts the API server with deploy/ applied (CRDs, namespace,
// RBAC; the DaemonSet server-side dry-run), publishes the base cluster as
// a kubelet would, brings the lab up and starts one agent per node with
// the agent's service account.
func newWorld(t testing.TB, base string) *world {
	return newWorldWith(t, base, true)
}

// newWorldWith is newWorld, installing the policy CRDs first or not.
func newWorldWith(t testing.TB, base string, withCRDs bool) *world {
	requireRoot(t)
	ctx := context.Background()
	env := testenv.Start(t, testenv.Options{})
	if withCRDs {
		installCRDs(t, env)
	}
	kcfg := agentKubeconfig(t, env)
	snap, report := cluster.LoadPaths([]string{filepath.Join(repo, "testdata", "base", base+".yaml")}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	w := &world{t: t, ctx: ctx, env: env, kcfg: kcfg, agent: map[string]*agentProc{}}
	for _, ns := range snap.Namespaces {
		w.create(ns.DeepCopy())
	}
	for _, n := range snap.Nodes {
		w.publishNode(n)
	}
	w.lab = labtest.Up(t, snap, lab.Options{})
	for _, p := range snap.Pods {
		w.publishPod(p)
	}
	for _, n := range w.lab.Nodes() {
		w.startAgent(n)
	}
	w.converged("initial state", time.Now())
	return w
}

// agentKubeconfig applies deploy/'s namespace and RBAC (not its CRDs or
// DaemonSet) and returns a kubeconfig of the agent's service account.
func agentKubeconfig(t testing.TB, env *testenv.Env) string {
	resources, err := testenv.KustomizationResources(filepath.Join(repo, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	var real []string
	for _, r := range resources {
		if !strings.Contains(r, "crds") && !strings.Contains(r, "daemonset") {
			real = append(real, r)
		}
	}
	if err := env.ApplyFiles(context.Background(), false, real...); err != nil {
		t.Fatal(err)
	}
	kcfg, _, err := env.ServiceAccountConfig(context.Background(), "netpol-system", "netpol-agent")
	if err != nil {
		t.Fatal(err)
	}
	return kcfg
}

func installCRDs(t testing.TB, env *testenv.Env) {
	crds, err := filepath.Glob(filepath.Join(repo, "deploy", "crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs under deploy/crds: %v", err)
	}
	if err := env.InstallCRDs(context.Background(), crds...); err != nil {
		t.Fatal(err)
	}
}

func (w *world) create(obj interface{ GetName() string }) {
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		o.ResourceVersion = ""
		_, err = w.env.Client.CoreV1().Namespaces().Create(w.ctx, o, metav1.CreateOptions{})
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatalf("creating %s: %v", obj.GetName(), err)
	}
}

// publishNode creates the Node and sets its status addresses, as kubelet.
func (w *world) publishNode(n *corev1.Node) {
	n = n.DeepCopy()
	n.ResourceVersion = ""
	created, err := w.env.Client.CoreV1().Nodes().Create(w.ctx, n, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatalf("creating node %s: %v", n.Name, err)
	}
	created.Status = n.Status
	if _, err := w.env.Client.CoreV1().Nodes().UpdateStatus(w.ctx, created, metav1.UpdateOptions{}); err != nil {
		w.t.Fatalf("node %s status: %v", n.Name, err)
	}
}

// publishPod creates the Pod and, once the lab has its namespace, reports
// it Running with its addresses, as kubelet.
func (w *world) publishPod(p *corev1.Pod) {
	p = p.DeepCopy()
	p.ResourceVersion = ""
	status := p.Status
	created, err := w.env.Client.CoreV1().Pods(p.Namespace).Create(w.ctx, p, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatalf("creating pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	created.Status = status
	if _, err := w.env.Client.CoreV1().Pods(p.Namespace).UpdateStatus(w.ctx, created, metav1.UpdateOptions{}); err != nil {
		w.t.Fatalf("pod %s/%s status: %v", p.Namespace, p.Name, err)
	}
}

// agentProc is one `netpol agent` process programming one lab node.
type agentProc struct {
	node    *lab.Node
	cmd     *exec.Cmd
	health  string
	metrics string
	debug   string
	log     string
}

// handedOut holds the addresses freeAddrs gave: the kernel hands a port
// just closed out again, and two listeners of the agents must not get the
// same one (an agent's health and metrics addresses once did, in CI).
var handedOut sync.Map

// freeAddrs returns n loopback addresses with free ports, none given
// before; the listeners that found them stay open until all are found.
func freeAddrs(t testing.TB, n int) []string {
	var out []string
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for len(out) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		if _, given := handedOut.LoadOrStore(l.Addr().String(), true); !given {
			out = append(out, l.Addr().String())
		}
	}
	return out
}

// startAgent starts (or restarts) the agent of a lab node and waits until
// it is ready. The process runs in the host namespace, where the API
// server listens on loopback, and programs the node's namespace (--netns).
func (w *world) startAgent(n *lab.Node, extra ...string) *agentProc {
	addrs := freeAddrs(w.t, 3)
	a := &agentProc{node: n, health: addrs[0], metrics: addrs[1], debug: addrs[2]}
	if old := w.agent[n.Name]; old != nil {
		a.health, a.metrics, a.debug = old.health, old.metrics, old.debug
	}
	a.cmd = exec.Command(netpolBin, "agent", "--kubeconfig", w.kcfg, "--node-name", n.Name, "--netns", n.NetNS,
		"--health-bind-address", a.health, "--metrics-bind-address", a.metrics, "--debug-bind-address", a.debug,
		"--log-format", "json")
	a.cmd.Args = append(a.cmd.Args, extra...)
	if w.agentCgroup != "" {
		a.cmd = inCgroup(a.cmd, w.agentCgroup)
	}
	w.launch(a, "agent "+n.Name, a.ready)
	return a
}

// launch starts a.cmd, an agent of a.node called what in messages, with
// its output in a temporary log, makes it the node's agent, and waits
// until ready (60s at most). The agent is killed when the test ends, and
// the tail of its log shown if the test failed.
func (w *world) launch(a *agentProc, what string, ready func() bool) {
	logf, err := os.CreateTemp("", "netpol-agent-"+a.node.Name+"-*.log")
	if err != nil {
		w.t.Fatal(err)
	}
	a.log = logf.Name()
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	logf.Close()
	w.agent[a.node.Name] = a
	w.t.Cleanup(func() {
		a.kill()
		if w.t.Failed() {
			data, _ := os.ReadFile(a.log)
			w.t.Logf("%s log:\n%s", what, tail(string(data), 30))
		}
		os.Remove(a.log)
	})
	deadline := time.Now().Add(60 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			data, _ := os.ReadFile(a.log)
			w.t.Fatalf("%s not ready after 60s:\n%s", what, tail(string(data), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (a *agentProc) ready() bool {
	resp, err := http.Get("http://" + a.health + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// kill stops the agent with SIGKILL (no chance to clean anything up).
func (a *agentProc) kill() {
	if a.cmd.Process != nil {
		syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		a.cmd.Wait()
	}
}

// metric reads one sample (name with labels, as exposed) from /metrics.
func (a *agentProc) metric(t testing.TB, sample string) float64 {
	resp, err := http.Get("http://" + a.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, sample+" ") {
			v, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, sample)), 64)
			return v
		}
	}
	return 0
}

// expected is the live cluster state and what every node must hold for
// it, given what its kernel holds (expectation.holds).
func (w *world) expected() (*cluster.Snapshot, *policy.Model, expectation) {
	snap, _, err := cluster.LoadFromAPI(w.ctx, cluster.APIOptions{Kubeconfig: w.env.Kubeconfig})
	if err != nil {
		w.t.Fatal(err)
	}
	model := policy.Build(snap)
	return snap, model, expectation{t: w.t, snap: snap, resolved: eval.New(snap, model).Resolved(), staged: model.Staged, nodes: w.lab.Nodes()}
}

// expectation is what the nodes must hold for one cluster state.
type expectation struct {
	t        testing.TB
	snap     *cluster.Snapshot
	resolved *eval.Resolved
	staged   []*policy.Policy // evaluated beside the enforced ones
	nodes    []*lab.Node
}

// holds reports whether each node's kernel table (by node name) is the
// agent's table for the state: the compile of the agent's default layout,
// identities, which numbers the pods as the kernel's table does (an
// agent numbers them as its earlier syncs did; no other difference is
// allowed).
func (e expectation) holds(tables map[string]*nft.Table) bool {
	for _, n := range e.nodes {
		got := tables[n.Name]
		if got == nil {
			return false
		}
		want := agentTable(e.t, e.resolved, n, compiler.Options{DNS: agentDNS(e.t, e.snap, n), Staged: e.staged}, got)
		if !kernel.Diff(got, want).Empty() {
			return false
		}
	}
	return true
}

// agentTable compiles node n's table as its agent does by default, with
// the extra options opts and the numbering of held (the table the
// kernel holds).
func agentTable(t testing.TB, r *eval.Resolved, n *lab.Node, opts compiler.Options, held *nft.Table) *nft.Table {
	t.Helper()
	opts.Node, opts.Layout, opts.Adopt, opts.RuleCounters = n.Name, compiler.LayoutIdentities, held, true
	table, err := compiler.Compile(r, opts)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// agentDNS is the DNS part of an agent's table by default: the queue
// statement the node's kernel takes, and the cluster DNS of snap (nil:
// none).
func agentDNS(t testing.TB, snap *cluster.Snapshot, n *lab.Node) *compiler.DNS {
	queue, err := kernel.DetectQueue(int(n.Handle))
	if err != nil {
		t.Fatal(err)
	}
	d := &compiler.DNS{Queue: queue, QueueNum: node.DefaultDNSQueue}
	if snap != nil {
		d.Servers = node.ClusterDNS(snap.EndpointSlices)
	}
	return d
}

// converged waits until every node's kernel table equals the compiled
// live state, records the time since the change was written, then probes
// the full matrix and compares it with the evaluator's table.
func (w *world) converged(change string, written time.Time) {
	w.t.Helper()
	took, snap, model := w.kernelLatency(written)
	w.convergence = append(w.convergence, took)
	w.t.Logf("%s: converged in %v", change, took.Round(time.Millisecond))
	w.matrixMatches(change, snap, model)
}

// kernelLatency returns the time from written until every node's kernel
// table first equalled what the compiler makes of the live cluster, and
// that live state. A
// poller reads the kernels every millisecond from the start, keeping each
// new state with when it was first seen, so the time it takes to compute
// the expected state does not count.
func (w *world) kernelLatency(written time.Time) (time.Duration, *cluster.Snapshot, *policy.Model) {
	w.t.Helper()
	type state struct {
		at     time.Time
		tables map[string]*nft.Table
	}
	var (
		mu     sync.Mutex
		states []state
	)
	done := make(chan struct{})
	defer close(done)
	read := func() map[string]*nft.Table {
		out := map[string]*nft.Table{}
		for _, n := range w.lab.Nodes() {
			t, _ := kernel.Read(int(n.Handle), compiler.DefaultTable)
			out[n.Name] = t
		}
		return out
	}
	same := func(a, b map[string]*nft.Table) bool {
		for name, t := range b {
			if a[name] == nil || t == nil || !kernel.Diff(a[name], t).Empty() {
				return false
			}
		}
		return true
	}
	go func() {
		var last map[string]*nft.Table
		for {
			at := time.Now()
			cur := read()
			if last == nil || !same(last, cur) {
				mu.Lock()
				states = append(states, state{at, cur})
				mu.Unlock()
				last = cur
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	snap, model, want := w.expected()
	deadline := written.Add(30 * time.Second)
	for {
		mu.Lock()
		for _, st := range states {
			if want.holds(st.tables) {
				mu.Unlock()
				return max(st.at.Sub(written), 0), snap, model
			}
		}
		mu.Unlock()
		if time.Now().After(deadline) {
			w.t.Fatalf("the nodes' kernels did not converge within 30s of the change")
		}
		time.Sleep(time.Millisecond)
	}
}

var probes = []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 81}, {Protocol: "UDP", Port: 80}, {Protocol: "UDP", Port: 81}}

// matrixMatches probes every pod pair (new connections only) and compares
// with the evaluator.
func (w *world) matrixMatches(what string, snap *cluster.Snapshot, model *policy.Model) {
	w.t.Helper()
	if err := w.lab.FlushConntrack(); err != nil {
		w.t.Fatal(err)
	}
	want := eval.New(snap, model).TruthTable(eval.TruthTableOptions{Probes: probes, Family: ipfamily.IPv4})
	got, _, err := w.lab.Probe(w.ctx, lab.ProbeOptions{Probes: probes, Family: ipfamily.IPv4, Timeout: 250 * time.Millisecond, RetryTimeout: time.Second})
	if err != nil {
		w.t.Fatal(err)
	}
	diffs, err := conformance.Compare(want, got)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, d := range diffs {
		w.t.Errorf("%s: %s", what, d)
	}
}

// podAddr is a lab pod's first address, or the end of the test.
func (w *world) podAddr(pod string) netip.Addr {
	w.t.Helper()
	for _, p := range w.lab.Pods() {
		if p.Name == pod {
			return p.Addrs[0]
		}
	}
	w.t.Fatalf("no pod %s in the lab", pod)
	return netip.Addr{}
}

// apply writes manifests (server-side apply) and returns when.
func (w *world) apply(manifests string) time.Time {
	w.t.Helper()
	written := time.Now()
	if err := w.env.ApplyYAML(w.ctx, false, manifests); err != nil {
		w.t.Fatal(err)
	}
	return written
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
