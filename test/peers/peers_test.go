//go:build bench_peers

// Package peers runs netpol's agent next to kube-proxy v1.37.2 (nftables
// and iptables modes), one system at a time in the same run, against the
// same Services and EndpointSlices in a real kube-apiserver + etcd
// (internal/testenv), each system programming a network namespace of its
// own. `make bench-peers` runs it (root, under the lab lock); it writes
// _output/bench/peers.json and peers.md (the ratio table for
// docs/history/benchmarks-journal.md), and keeps each proxy's log in
// _output/bench/peers-logs/.
//
// Every "programmed" below is observed on the data path, polled: a new TCP
// connection to the ClusterIP from inside the namespace is answered by an
// endpoint (every endpoint address is local there, one listener serves
// them all; an unprogrammed ClusterIP is routed to a dead veth and times
// out). This costs the machine nothing while a proxy works, unlike
// listing 100,000 rules every few milliseconds; the rules are listed once
// after the full sync as a check.
//
// Environment: BENCH_PEERS_TIMEOUT bounds each full sync (default 10m;
// "did not finish" is recorded, the run goes on); BENCH_PEERS_SYSTEMS
// (comma-separated names) and BENCH_PEERS_SIZES ("10000x10,30000x2") pick
// a subset; NETPOL_BIN and KUBE_PROXY_BIN override the binaries;
// NETPOL_BASE_BIN adds an earlier netpol build as the system netpol-base;
// BENCH_PEERS_CONN_ROUNDS is the number of interleaved connection rounds
// (default 5: every programmed system's tables stay, its proxy stopped
// but in its own rounds).
package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/netpol/netpol/internal/benchstat"
	"github.com/netpol/netpol/internal/testenv"
)

// result is one system at one size; nil: not measured or not finished.
type result struct {
	System                  string   `json:"system"`
	Services                int      `json:"services"`
	Endpoints               int      `json:"endpoints"`
	FullSyncSeconds         *float64 `json:"fullSyncSeconds"`
	AddOneServiceP50Seconds *float64 `json:"addOneServiceP50Seconds"`
	PeakRSSBytes            *int64   `json:"peakRSSBytes"`
	// ConnPerSecond is the median of the interleaved rounds' rates
	// (ConnRounds, one window each); ConnCPUSeconds the proxy process's
	// own CPU in each window (its background work competes with the
	// connections on 2 cores).
	ConnPerSecond  *float64  `json:"connPerSecond"`
	ConnRounds     []float64 `json:"connRounds,omitempty"`
	ConnCPUSeconds []float64 `json:"connCPUSeconds,omitempty"`
	Note           string    `json:"note,omitempty"`
}

func (r *result) note(format string, args ...any) {
	if r.Note != "" {
		r.Note += "; "
	}
	r.Note += fmt.Sprintf(format, args...)
}

type size struct {
	services, endpoints int
	adds                bool // measure single Service adds at this size
}

const (
	adds        = 12              // single-Service adds per system (p50 over them)
	addTimeout  = time.Minute     // each
	addSpacing  = 2 * time.Second // after one is programmed: kube-proxy's min-sync-period is 1 s
	connWindow  = 5 * time.Second // connection rate, one round
	connClients = 4               // concurrent clients for it
	connRounds  = 5               // interleaved rounds (BENCH_PEERS_CONN_ROUNDS)
	settle      = 3 * time.Second // after the full sync, before measuring connections
	fullPoll    = 20 * time.Millisecond
	addPoll     = 2 * time.Millisecond
)

func TestPeers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("bench-peers needs root (network namespaces, nftables, iptables)")
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins, err := findBinaries(root)
	if err != nil {
		t.Fatal(err)
	}
	syncTimeout := 10 * time.Minute
	if v := os.Getenv("BENCH_PEERS_TIMEOUT"); v != "" {
		if syncTimeout, err = time.ParseDuration(v); err != nil || syncTimeout <= 0 {
			t.Fatalf("BENCH_PEERS_TIMEOUT=%q: want a positive duration such as 10m", v)
		}
	}
	sizes, err := parseSizes(os.Getenv("BENCH_PEERS_SIZES"))
	if err != nil {
		t.Fatal(err)
	}
	selected, err := selectSystems(os.Getenv("BENCH_PEERS_SYSTEMS"), bins)
	if err != nil {
		t.Fatal(err)
	}
	outDir := filepath.Join(root, "_output", "bench")
	logDir := filepath.Join(outDir, "peers-logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Ctrl-C or SIGTERM: end the phase at hand, then every cleanup runs.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	removeStaleNamespaces()

	var results []result
	save := func() {
		data, _ := json.MarshalIndent(results, "", "  ")
		if err := os.WriteFile(filepath.Join(outDir, "peers.json"), append(data, '\n'), 0o644); err != nil {
			t.Error(err)
		}
		md := markdown(results, syncTimeout)
		if err := os.WriteFile(filepath.Join(outDir, "peers.md"), []byte(md), 0o644); err != nil {
			t.Error(err)
		}
	}
	start := time.Now()
	for _, sz := range sizes {
		runSize(t, ctx, root, sz, selected, bins, logDir, syncTimeout, func(r result) {
			results = append(results, r)
			save()
		})
		if ctx.Err() != nil {
			t.Fatal("interrupted")
		}
	}
	save()
	t.Logf("wrote %s and peers.md (%v in all)\n%s", filepath.Join(outDir, "peers.json"), time.Since(start).Round(time.Second), markdown(results, syncTimeout))
}

// runSize starts an apiserver, writes the size's objects once and runs
// every system against them.
func runSize(t *testing.T, ctx context.Context, root string, sz size, selected []int, bins binaries, logDir string, syncTimeout time.Duration, report func(result)) {
	t.Logf("== %d Services x %d endpoints", sz.services, sz.endpoints)
	env, err := testenv.New(ctx, testenv.Options{StartTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("starting the API server: %v", err)
	}
	defer env.Stop()
	crds, _ := filepath.Glob(filepath.Join(root, "deploy", "crds", "*.yaml"))
	if len(crds) > 0 {
		// As installed with netpol (the agent watches these APIs).
		if err := env.InstallCRDs(ctx, crds...); err != nil {
			t.Fatalf("installing the policy CRDs: %v", err)
		}
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 5000, 5000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := publishNode(ctx, client); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", benchNamespace, err)
	}
	svcs := bulkServices(sz.services, sz.endpoints)
	written := time.Now()
	// The last Service is written after all the others: the full sync is
	// timed until it is programmed.
	if err := createAll(ctx, client, svcs[:len(svcs)-1], t.Logf); err != nil {
		t.Fatalf("writing the Services: %v", err)
	}
	last := svcs[len(svcs)-1]
	if err := last.create(ctx, client); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d Services and EndpointSlices in %v; the last is %s at %s", len(svcs), time.Since(written).Round(time.Millisecond), last.svc.Name, last.frontend())

	kubeconfig := filepath.Join(env.Dir, "kubeconfig-netns")
	if err := writeKubeconfig(kubeconfig, env); err != nil {
		t.Fatal(err)
	}
	upstream := strings.TrimPrefix(env.Config.Host, "https://")
	var results []result
	var ks []*kept
	defer func() {
		for _, k := range ks {
			k.p.stop()
			k.n.close()
		}
	}()
	for _, idx := range selected {
		sys := systems[idx]
		r, k := runSystem(t, ctx, idx, sys, sz, client, upstream, kubeconfig, bins, last, logDir, syncTimeout)
		if k != nil {
			k.result = len(results)
			ks = append(ks, k)
		}
		results = append(results, r)
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() == nil {
		interleavedRates(t, ctx, ks, results, last.frontend())
	}
	for _, r := range results {
		t.Logf("%s at %dx%d: %s", r.System, sz.services, sz.endpoints, summary(r))
		report(r)
	}
}

// kept is a system whose proxy programmed its namespace: it stays,
// stopped (SIGSTOP) but for its own connection rounds.
type kept struct {
	n      *node
	p      *proc
	name   string
	result int // its index in the size's results
}

// interleavedRates measures each kept system's connection rate in rounds,
// the systems' order rotating from round to round, so that a slow minute
// of the machine falls on every system alike: in its turn a system's
// proxy is resumed and left to settle (until its own CPU is quiet), its
// conntrack table flushed, and connections opened for connWindow; the
// other proxies are stopped meanwhile. Each result gets the median rate,
// every round's rate and the proxy's CPU in each window.
func interleavedRates(t *testing.T, ctx context.Context, ks []*kept, results []result, addr netip.AddrPort) {
	rounds := connRounds
	if v := os.Getenv("BENCH_PEERS_CONN_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BENCH_PEERS_CONN_ROUNDS=%q: want a positive count", v)
		}
		rounds = n
	}
	for round := range rounds {
		for j := range ks {
			k := ks[(round+j)%len(ks)]
			r := &results[k.result]
			rate, cpu, warning, err := k.measure(ctx, addr, t.Logf)
			if warning != "" {
				r.note("connection round %d: %s", round+1, warning)
			}
			if err != nil {
				r.note("connection round %d: %v", round+1, err)
				t.Errorf("%s: connection round %d: %v", k.name, round+1, err)
				continue
			}
			r.ConnRounds = append(r.ConnRounds, rate)
			r.ConnCPUSeconds = append(r.ConnCPUSeconds, cpu)
			t.Logf("%s: round %d: %.0f connections/s through %s, the proxy's CPU %.2f s", k.name, round+1, rate, addr, cpu)
			if ctx.Err() != nil {
				return
			}
		}
	}
	for i := range results {
		if rs := results[i].ConnRounds; len(rs) > 0 {
			results[i].ConnPerSecond = ptr(median(rs))
		}
	}
}

// measure is one round of k: its proxy resumed and quiet, then the rate.
func (k *kept) measure(ctx context.Context, addr netip.AddrPort, logf func(string, ...any)) (rate, cpu float64, warning string, err error) {
	k.p.resume()
	defer k.p.pause()
	pctx, done := k.p.watch(ctx)
	defer done()
	if err := k.p.quiet(pctx, settle); err != nil {
		return 0, 0, "", fmt.Errorf("settling: %w", err)
	}
	if err := k.n.flushConntrack(); err != nil {
		return 0, 0, "", err
	}
	before := k.n.netStats()
	cpu0 := k.p.cpuSeconds()
	rate, failed, err := k.n.connRate(pctx, addr, connWindow, connClients)
	cpu = k.p.cpuSeconds() - cpu0
	logf("%s: counters during the round: %s", k.name, statsDelta(before, k.n.netStats(),
		"ct_insert_failed", "ct_drop", "ct_invalid", "ct_clashres", "ct_early_drop", "TcpExt_ListenOverflows", "TcpExt_ListenDrops",
		"TcpExt_TCPTimeWaitOverflow", "Tcp_AttemptFails", "Tcp_RetransSegs", "Tcp_ActiveOpens", "Tcp_PassiveOpens", "Tcp_OutRsts"))
	if pctx.Err() != nil {
		return 0, 0, "", context.Cause(pctx)
	}
	if failed > 0 {
		warning = fmt.Sprintf("%d connections failed (first: %v)", failed, err)
	}
	return rate, cpu, warning, nil
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// runSystem measures one system in a fresh namespace: the proxy's first
// full sync, the connection rate through the last Service, single adds,
// its peak RSS. Everything it made is gone when it returns: the proxy,
// the namespace, the Services it added.
func runSystem(t *testing.T, ctx context.Context, idx int, sys system, sz size, client kubernetes.Interface, upstream, kubeconfig string, bins binaries, last service, logDir string, syncTimeout time.Duration) (result, *kept) {
	r := result{System: sys.name, Services: sz.services, Endpoints: sz.endpoints}
	nsName := fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), sys.name)
	n, err := newNode(nsName, upstream)
	if err != nil {
		t.Fatal(err)
	}
	programmed := false
	defer func() {
		if !programmed {
			n.close()
		}
	}()
	logPath := filepath.Join(logDir, fmt.Sprintf("%s-%dx%d.log", sys.name, sz.services, sz.endpoints))
	var added []service
	deleteAdded := func() {
		// After the proxy is gone, so the next system starts with the
		// same objects.
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, s := range added {
			if err := s.delete(dctx, client); err != nil {
				t.Errorf("%v", err)
			}
		}
		added = nil
	}
	defer deleteAdded()
	start := time.Now()
	p, err := startProc(nsName, sys.command(bins, kubeconfig), logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !programmed {
			p.stop()
		}
	}()
	pctx, done := p.watch(ctx)
	defer done()

	fail := func(what string, err error) {
		if ctx.Err() != nil {
			t.Fatalf("%s: %s: interrupted", sys.name, what)
		}
		r.note("%s: %v", what, err)
		t.Errorf("%s at %dx%d: %s: %v", sys.name, sz.services, sz.endpoints, what, err)
	}
	// The phases, in order; a phase that fails or does not finish ends
	// the measurement (the peak RSS is read either way).
	func() {
		sctx, cancel := context.WithTimeoutCause(pctx, syncTimeout, errNotFinished)
		at, attempts, err := n.firstConnect(sctx, last.frontend(), fullPoll, 500*time.Millisecond)
		cancel()
		if errors.Is(err, errNotFinished) {
			r.note("full sync did not finish in %v (the last Service's ClusterIP never answered); nothing else measured; peakRSSBytes is the peak over those %v",
				syncTimeout, syncTimeout)
			t.Logf("%s: the full sync did not finish in %v", sys.name, syncTimeout)
			return
		}
		if err != nil {
			fail("full sync", err)
			return
		}
		full := at.Sub(start)
		r.FullSyncSeconds = ptr(full.Seconds())
		t.Logf("%s: full sync %v (%d probe connections)", sys.name, full.Round(time.Millisecond), attempts)

		// The check: the ClusterIP is in the ruleset as the system's own
		// tools list it.
		if count, took, err := countInRules(pctx, nsName, sys.rules, last.frontend().Addr().String()); err != nil {
			r.note("ruleset check failed: %v", err)
		} else if count == 0 {
			r.note("ruleset check: %s answered but `%s` does not mention it", last.frontend(), strings.Join(sys.rules, " "))
		} else {
			t.Logf("%s: `%s` lists %s in %d lines (took %v)", sys.name, strings.Join(sys.rules, " "), last.frontend().Addr(), count, took.Round(time.Millisecond))
		}

		// Programmed: its tables stay for the connection rounds.
		programmed = true

		if !sz.adds {
			return
		}
		// lat: from the first write to the ClusterIP answering; writes:
		// the two API calls alone, which the apiserver's own work (its
		// ClusterIP allocator) makes part of every system's figure.
		var lat, writes []time.Duration
		defer func() {
			if len(lat) == 0 {
				return
			}
			p50 := benchstat.Percentile(lat, 0.5)
			r.AddOneServiceP50Seconds = ptr(p50.Seconds())
			if len(lat) < 10 {
				r.note("the add p50 is over %d adds only", len(lat))
			}
			r.note("the API writes (EndpointSlice, then Service) took p50 %v of each add", benchstat.Percentile(writes, 0.5).Round(100*time.Microsecond))
			t.Logf("%s: one Service added: p50 %v over %d adds (min %v, max %v); the writes alone p50 %v", sys.name, p50.Round(100*time.Microsecond), len(lat),
				slices.Min(lat).Round(100*time.Microsecond), slices.Max(lat).Round(100*time.Microsecond), benchstat.Percentile(writes, 0.5).Round(100*time.Microsecond))
		}()
		for k := range adds {
			s := newService(fmt.Sprintf("add-%d-%02d", idx, k), addedIP(idx, k), sz.endpoints, 64000+k*sz.endpoints)
			written := time.Now()
			if err := s.create(pctx, client); err != nil {
				fail("adding a Service", err)
				return
			}
			writes = append(writes, time.Since(written))
			added = append(added, s)
			actx, cancel := context.WithTimeoutCause(pctx, addTimeout, errNotFinished)
			at, _, err := n.firstConnect(actx, s.frontend(), addPoll, 200*time.Millisecond)
			cancel()
			if errors.Is(err, errNotFinished) {
				r.note("added Service %d was not programmed within %v", k+1, addTimeout)
				return
			}
			if err != nil {
				fail("adding a Service", err)
				return
			}
			lat = append(lat, at.Sub(written))
			if !sleep(pctx, addSpacing) {
				fail("adding Services", context.Cause(pctx))
				return
			}
		}
	}()

	if rss, err := p.peakRSS(); err == nil {
		r.PeakRSSBytes = &rss
	} else {
		r.note("peak RSS not read: %v", err)
	}
	if b, name := p.helperPeak(); b > 0 {
		r.note("largest helper process seen (%s) peaked at %d MiB (sampled every 100 ms; not in peakRSSBytes)", name, b>>20)
	}
	deleteAdded()
	if !programmed || ctx.Err() != nil {
		programmed = false // the deferred cleanup stops it
		return r, nil
	}
	// Stopped until its connection rounds: a proxy at rest costs the
	// next system's measurements nothing.
	p.pause()
	return r, &kept{n: n, p: p, name: sys.name}
}

func publishNode(ctx context.Context, c kubernetes.Interface) error {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", nodeName, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}, {Type: corev1.NodeHostName, Address: nodeName}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", nodeName, err)
	}
	return nil
}

// writeKubeconfig: the admin's token, the server as the namespaces reach it
// (the forwarder on their loopback), verified with the environment's CA.
func writeKubeconfig(path string, env *testenv.Env) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["peers"] = &clientcmdapi.Cluster{Server: fmt.Sprintf("https://127.0.0.1:%d", apiPort), CertificateAuthorityData: env.CAData}
	cfg.AuthInfos["peers"] = &clientcmdapi.AuthInfo{Token: env.AdminToken}
	cfg.Contexts["peers"] = &clientcmdapi.Context{Cluster: "peers", AuthInfo: "peers"}
	cfg.CurrentContext = "peers"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing the namespaces' kubeconfig: %w", err)
	}
	return nil
}

func findBinaries(root string) (binaries, error) {
	b := binaries{netpol: os.Getenv("NETPOL_BIN"), netpolBase: os.Getenv("NETPOL_BASE_BIN"), kubeProxy: os.Getenv("KUBE_PROXY_BIN")}
	if b.netpol == "" {
		b.netpol = filepath.Join(root, "bin", "netpol")
	}
	if b.kubeProxy == "" {
		b.kubeProxy = filepath.Join(root, "_output", "tools", testenv.KubeVersion, "kube-proxy")
	}
	if b.netpolBase != "" {
		if _, err := os.Stat(b.netpolBase); err != nil {
			return b, fmt.Errorf("NETPOL_BASE_BIN: %w", err)
		}
	}
	if _, err := os.Stat(b.netpol); err != nil {
		return b, fmt.Errorf("netpol binary: %w (run `make build`, or set NETPOL_BIN)", err)
	}
	if _, err := os.Stat(b.kubeProxy); err != nil {
		return b, fmt.Errorf("kube-proxy %s: %w (run `hack/build-kube-tools.sh kube-proxy`, or set KUBE_PROXY_BIN)", testenv.KubeVersion, err)
	}
	return b, nil
}

func parseSizes(v string) ([]size, error) {
	if v == "" {
		v = "10000x10,30000x2"
	}
	var out []size
	for _, f := range strings.Split(v, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(f), "x")
		s, err1 := strconv.Atoi(a)
		e, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || s < 1 || s > 60000 || e < 1 || e > 100 {
			return nil, fmt.Errorf("BENCH_PEERS_SIZES: %q is not SERVICESxENDPOINTS (1-60000 x 1-100)", f)
		}
		// Adds at the 10,000 size, or at the only size asked for.
		out = append(out, size{services: s, endpoints: e})
	}
	for i := range out {
		out[i].adds = out[i].services == 10000 || len(out) == 1
	}
	return out, nil
}

func selectSystems(v string, bins binaries) ([]int, error) {
	var out []int
	for i, s := range systems {
		if s.name == "netpol-base" && bins.netpolBase == "" {
			continue
		}
		if v == "" || slices.Contains(strings.Split(v, ","), s.name) {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		var names []string
		for _, s := range systems {
			names = append(names, s.name)
		}
		return nil, fmt.Errorf("BENCH_PEERS_SYSTEMS=%q names none of %s", v, strings.Join(names, ", "))
	}
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func ptr[T any](v T) *T { return &v }

func summary(r result) string {
	f := func(p *float64, unit string, scale float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.3g %s", *p*scale, unit)
	}
	rss := "-"
	if r.PeakRSSBytes != nil {
		rss = fmt.Sprintf("%d MiB", *r.PeakRSSBytes>>20)
	}
	s := fmt.Sprintf("full sync %s, add p50 %s, peak RSS %s, %s", f(r.FullSyncSeconds, "s", 1), f(r.AddOneServiceP50Seconds, "ms", 1000), rss, f(r.ConnPerSecond, "conn/s", 1))
	if r.Note != "" {
		s += " (" + r.Note + ")"
	}
	return s
}
