// Package agent is the node agent: it watches the API server, keeps a
// snapshot of the cluster, and after every burst of changes compiles the
// node's ruleset and applies the difference to the kernel in one
// transaction. Between syncs, and whenever the API server is unreachable or
// the agent is down, the kernel keeps enforcing the last programmed state;
// a restarted agent adopts that state (pkg/nft reads it back) instead of
// flushing it.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/proxy/proxier"
)

// Options configure the agent.
type Options struct {
	// Kubeconfig is a kubeconfig file; empty means the in-cluster config.
	Kubeconfig string
	// NodeName is the Node this agent programs.
	NodeName string
	// NetNS, when set, is the network namespace to program (a name under
	// /run/netns or a path) instead of the agent's own: the lab runs one
	// agent per lab node this way.
	NetNS string
	// Table is the nftables table (default compiler.DefaultTable).
	Table string
	// MetricsAddr and HealthAddr are listen addresses; empty disables.
	MetricsAddr, HealthAddr string
	// MinSyncInterval is the least time between two syncs: changes that
	// arrive meanwhile are coalesced into the next one (default 100ms).
	MinSyncInterval time.Duration
	// ResyncPeriod is how often the agent re-syncs with no change (it
	// repairs a kernel table changed behind its back; default 5m).
	ResyncPeriod time.Duration
	// HealthTimeout is how long a change may stay unprogrammed, and how
	// far past ResyncPeriod the last successful sync may be, before
	// /healthz fails (default 1m).
	HealthTimeout time.Duration
	// StatusNamespace holds the Lease that elects the one agent writing
	// policy status (default: POD_NAMESPACE, else netpol-system).
	StatusNamespace string
	// NoStatus turns policy status writing off.
	NoStatus bool
	// NoProxy turns Service load balancing off (policy only).
	NoProxy bool
	// ProxyTable is the service NAT table (default proxy.DefaultTable).
	ProxyTable string
	// NodePortAddresses are the node addresses that serve NodePorts and
	// health-check node ports; nil means the Node's InternalIP and
	// ExternalIP addresses.
	NodePortAddresses []netip.Addr
	// ClusterCIDRs are the pod networks (clients outside them are
	// masqueraded to ClusterIPs); nil means every Node's spec.podCIDRs.
	ClusterCIDRs []netip.Prefix
	Logger       *slog.Logger
}

func (o *Options) defaults() {
	if o.Table == "" {
		o.Table = compiler.DefaultTable
	}
	if o.ProxyTable == "" {
		o.ProxyTable = proxy.DefaultTable
	}
	if o.MinSyncInterval == 0 {
		o.MinSyncInterval = 100 * time.Millisecond
	}
	if o.ResyncPeriod == 0 {
		o.ResyncPeriod = 5 * time.Minute
	}
	if o.HealthTimeout == 0 {
		o.HealthTimeout = time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.StatusNamespace == "" {
		o.StatusNamespace = os.Getenv("POD_NAMESPACE")
	}
	if o.StatusNamespace == "" {
		o.StatusNamespace = "netpol-system"
	}
}

// Agent programs one node.
type Agent struct {
	opts    Options
	log     *slog.Logger
	src     *sources
	applier *nft.Applier
	proxy   *proxier.Proxier // nil with NoProxy
	metrics *metrics
	status  *statusWriter
	ctx     context.Context

	kick chan struct{}

	mu           sync.Mutex
	pendingSince time.Time // first change not yet programmed
	lastSuccess  time.Time
	ready        atomic.Bool
	// programmed is the table of the last successful sync; /debug/model
	// renders it on request, not on every sync.
	programmed atomic.Pointer[programmedTable]
	generation int64
	reported   map[string]bool // policy problems already logged
}

// RestConfig loads the client configuration: the kubeconfig file, or the
// in-cluster config when it is empty.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("client config: %w", err)
	}
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " netpol-agent"
	cfg.QPS, cfg.Burst = 20, 40
	return cfg, nil
}

// New prepares an agent: API clients and the node's kernel applier.
func New(opts Options) (*Agent, error) {
	opts.defaults()
	if opts.NodeName == "" {
		return nil, errors.New("the node name is required (--node-name, or NODE_NAME from the downward API)")
	}
	cfg, err := RestConfig(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	applier, err := openApplier(opts.NetNS, opts.Table)
	if err != nil {
		return nil, err
	}
	a := &Agent{opts: opts, log: opts.Logger.With("node", opts.NodeName), applier: applier, metrics: newMetrics(),
		kick: make(chan struct{}, 1), reported: map[string]bool{}}
	if !opts.NoProxy {
		if a.proxy, err = newProxier(opts, a); err != nil {
			applier.Close()
			return nil, err
		}
	}
	a.src = newSources(kube, dyn, a.log, a.changed)
	if !opts.NoStatus {
		a.status = &statusWriter{kube: kube, dyn: dyn, namespace: opts.StatusNamespace, identity: opts.NodeName,
			log: func(msg string, args ...any) { a.log.Info(msg, args...) }, onLeader: a.trigger}
	}
	return a, nil
}

// openApplier opens the applier for the network namespace named by netns
// ("" = the agent's own).
func openApplier(netns, table string) (*nft.Applier, error) {
	if netns == "" {
		return nft.NewApplier(-1, table)
	}
	path := netnsPath(netns)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	return nft.NewApplier(fd, table)
}

// Cleanup removes everything the agent programmed (both tables) and returns.
func Cleanup(opts Options) error {
	opts.defaults()
	var errs []error
	for _, table := range []string{opts.Table, opts.ProxyTable} {
		a, err := openApplier(opts.NetNS, table)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, a.Delete())
		a.Close()
	}
	return errors.Join(errs...)
}

// changed records an informer event and asks for a sync.
func (a *Agent) changed(resource string) {
	a.metrics.events.WithLabelValues(resource).Inc()
	a.mu.Lock()
	if a.pendingSince.IsZero() {
		a.pendingSince = time.Now()
	}
	a.mu.Unlock()
	a.trigger()
}

func (a *Agent) trigger() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Run serves health and metrics, waits for the caches, and syncs until ctx
// ends. The kernel table is left in place on return (fail-static).
func (a *Agent) Run(ctx context.Context) error {
	defer a.applier.Close()
	if a.proxy != nil {
		defer a.proxy.Close()
	}
	stopServers, err := a.serve()
	if err != nil {
		return err
	}
	defer stopServers()
	a.log.Info("starting", "table", a.opts.Table, "netns", a.opts.NetNS)
	a.ctx = ctx
	if err := a.src.start(ctx); err != nil {
		return fmt.Errorf("starting the watches: %w", err)
	}
	if a.status != nil {
		go a.status.run(ctx)
	}
	a.mu.Lock()
	if a.pendingSince.IsZero() {
		a.pendingSince = time.Now()
	}
	a.mu.Unlock()
	return a.loop(ctx)
}

// loop runs coalesced syncs: a change triggers a sync, but no sooner than
// MinSyncInterval after the previous one started, so a burst of events
// becomes a handful of transactions. A failed sync is retried with
// exponential backoff; the kernel keeps the previous state meanwhile.
func (a *Agent) loop(ctx context.Context) error {
	const maxBackoff = 30 * time.Second
	backoff := time.Duration(0)
	resync := time.NewTimer(0) // the first sync runs at once
	defer resync.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			a.log.Info("stopping; the kernel keeps enforcing the last programmed state")
			return nil
		case <-a.kick:
		case <-resync.C:
		}
		wait := time.Until(last.Add(a.opts.MinSyncInterval))
		if backoff > wait {
			wait = time.Until(last.Add(backoff))
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		last = time.Now()
		a.mu.Lock()
		since := a.pendingSince
		a.pendingSince = time.Time{}
		a.mu.Unlock()
		err := a.sync()
		if err != nil {
			a.mu.Lock()
			if a.pendingSince.IsZero() || (!since.IsZero() && since.Before(a.pendingSince)) {
				a.pendingSince = since
			}
			a.mu.Unlock()
			backoff = min(max(2*backoff, 100*time.Millisecond), maxBackoff)
			a.log.Error("sync failed; the kernel keeps the previous state", "err", err, "retry-in", backoff)
			a.trigger()
			continue
		}
		backoff = 0
		if !since.IsZero() {
			a.metrics.programmingLatency.Observe(time.Since(since).Seconds())
		}
		if !a.ready.Swap(true) {
			a.log.Info("initial sync done")
		}
		resync.Reset(a.opts.ResyncPeriod)
	}
}

// sync builds the snapshot from the caches, compiles the node's ruleset
// and applies the difference as one transaction.
func (a *Agent) sync() error {
	start := time.Now()
	snap, policies, report, err := a.src.snapshot()
	if err != nil {
		a.metrics.syncs.WithLabelValues("error").Inc()
		return fmt.Errorf("snapshot: %w", err)
	}
	model := policy.Build(snap)
	a.reportProblems(append(report.Errors, model.Errors...), model.Warnings)
	table, err := compiler.Compile(eval.New(snap, model).Resolved(), compiler.Options{Node: a.opts.NodeName, Table: a.opts.Table})
	if err != nil {
		a.metrics.syncs.WithLabelValues("error").Inc()
		return err
	}
	stats, err := a.applier.Apply(table)
	if err != nil {
		a.metrics.syncs.WithLabelValues("error").Inc()
		return err
	}
	if a.proxy != nil {
		res, err := a.proxy.Sync(snap)
		a.reportProblems(append(res.Model.Errors, res.Failures...), nil)
		if err != nil {
			a.metrics.syncs.WithLabelValues("error").Inc()
			return fmt.Errorf("services: %w", err)
		}
		stats.Messages += res.Stats.Messages
		if res.Stats.Messages > 0 {
			a.log.Info("programmed services", "messages", res.Stats.Messages, "elements-added", res.Stats.ElementsAdded,
				"elements-deleted", res.Stats.ElementsDeleted, "chains-added", res.Stats.ChainsAdded, "sets", res.Counts.Sets)
		}
	}
	took := time.Since(start)
	a.metrics.syncDuration.Observe(took.Seconds())
	counts := table.Count()
	a.metrics.setCounts(counts)
	result := "unchanged"
	if stats.Messages > 0 {
		result = "success"
		a.metrics.transactionSize.Observe(float64(stats.Messages))
		a.log.Info("programmed", "took", took.Round(time.Microsecond), "messages", stats.Messages,
			"elements-added", stats.ElementsAdded, "elements-deleted", stats.ElementsDeleted,
			"chains-rewritten", stats.ChainsRewritten, "chains-added", stats.ChainsAdded, "rules", counts.Rules)
	}
	a.metrics.syncs.WithLabelValues(result).Inc()
	a.metrics.lastSuccess.SetToCurrentTime()
	a.mu.Lock()
	a.lastSuccess = time.Now()
	a.generation++
	gen := a.generation
	a.mu.Unlock()
	a.programmed.Store(&programmedTable{generation: gen, table: table})
	if a.status != nil && a.status.leader.Load() {
		// Status is best effort: the next sync retries what failed.
		if err := a.status.write(a.ctx, desiredStatus(policies, model)); err != nil {
			a.log.Warn("writing policy status", "err", err)
		}
	}
	return nil
}

// programmedTable is a table the kernel holds and the sync that applied
// it. Tables are never changed once compiled.
type programmedTable struct {
	generation int64
	table      *nft.Table
}

// reportProblems logs each policy problem once (they are re-found at every
// sync) and counts them.
func (a *Agent) reportProblems(errs []error, warnings []string) {
	a.metrics.policyErrors.Set(float64(len(errs) + len(warnings)))
	seen := map[string]bool{}
	for _, e := range errs {
		msg := e.Error()
		seen[msg] = true
		if !a.reported[msg] {
			a.log.Warn("policy error", "err", msg)
		}
	}
	for _, w := range warnings {
		seen[w] = true
		if !a.reported[w] {
			a.log.Warn("policy warning", "warning", w)
		}
	}
	a.reported = seen
}

// health reports whether the agent keeps the kernel up to date.
func (a *Agent) health() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if !a.pendingSince.IsZero() && a.ready.Load() && now.Sub(a.pendingSince) > a.opts.HealthTimeout {
		return fmt.Errorf("changes seen %v ago are not programmed yet", now.Sub(a.pendingSince).Round(time.Second))
	}
	if !a.lastSuccess.IsZero() && now.Sub(a.lastSuccess) > a.opts.ResyncPeriod+a.opts.HealthTimeout {
		return fmt.Errorf("the last successful sync was %v ago", now.Sub(a.lastSuccess).Round(time.Second))
	}
	return nil
}

// Hostname is the default node name: NODE_NAME, else the host name.
func Hostname() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}
