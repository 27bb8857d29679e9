// Package agent is the node agent: it watches the API server, keeps a
// snapshot of the cluster, and after every burst of changes compiles the
// node's ruleset and applies the difference to the kernel in one
// transaction. Between syncs, and whenever the API server is unreachable or
// the agent is down, the kernel keeps enforcing the last programmed state;
// a restarted agent adopts that state (pkg/nft/kernel reads it back) instead of
// flushing it.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dnssnoop"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
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
	// MetricsAddr, HealthAddr and DebugAddr are plain HTTP listen
	// addresses (server.go); empty disables.
	MetricsAddr, HealthAddr, DebugAddr string
	// Serving is the secure port (serving.go).
	Serving ServingOptions
	// Profiling serves Go's /debug/pprof/ next to /debug/model (the
	// debug address and the secure port), as kube-proxy's --profiling.
	Profiling bool
	// ListenInNetNS opens the listeners inside NetNS (the lab).
	ListenInNetNS bool
	// ProtectAgentPorts makes the policy table accept the agent's
	// metrics, debug and secure ports only from the node itself and
	// AgentPortsAllow (compiler.AgentPorts).
	ProtectAgentPorts bool
	AgentPortsAllow   []netip.Prefix
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
	// ServiceCIDRs are ranges ClusterIPs come from besides the cluster's
	// ServiceCIDR objects: connections to an address of them that no
	// Service holds are dropped.
	ServiceCIDRs []netip.Prefix
	// Layout is the policy table's layout (netpol agent's default is
	// compiler.DefaultLayout, identities: pods as identities, a table
	// that grows with pods plus policies; the zero value is addresses).
	Layout compiler.Layout
	// NoDNS turns domainNames learning off: the cluster DNS's answers are
	// not queued, and domainNames rules admit nothing.
	NoDNS bool
	// DNSQueue is the NFQUEUE queue of the DNS answers (default
	// node.DefaultDNSQueue); DNSServers are DNS servers besides the
	// endpoints of kube-system/kube-dns; DNSTTLCeiling, when set, bounds
	// how long a learned address is kept (default: its record's TTL).
	DNSQueue      uint16
	DNSServers    []netip.AddrPort
	DNSTTLCeiling time.Duration
	// Strict ends the open flows a policy change denies, at most once per
	// StrictInterval (node.Options; netpol agent --strict, on by default,
	// and --strict-interval, default DefaultStrictInterval).
	Strict         bool
	StrictInterval time.Duration
	// Audit is the verdict log (--audit ...; audit.go).
	Audit AuditOptions
	// RuleCounters counts each policy rule's decisions in the kernel
	// (netpol agent --rule-counters, on by default; the identity layout
	// only): netpol_policy_rule_packets_total and _bytes_total.
	RuleCounters bool
	Logger       *slog.Logger

	// dnsLatency observes the queue's verdict latency (New makes it
	// before the programmer, which reports to it).
	dnsLatency prometheus.Histogram
	// auditLog writes the verdict log's lines (New makes it).
	auditLog *audit.Logger
}

func (o *Options) defaults() {
	o.Audit.defaults()
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
	// closeAudit flushes and closes the verdict log (nil: none).
	closeAudit func()
	opts       Options
	log        *slog.Logger
	kube       kubernetes.Interface // the secure port's TokenReviews and SubjectAccessReviews
	models     modelHub             // /debug/model watchers
	// healthConns bounds the health listener's connections.
	healthConns connLimit
	// ruleCounts is the per-rule counters the model's watchers share.
	ruleCounts sharedRuleCounts
	src        *sources
	prog       *node.Programmer
	metrics    *metrics
	status     *statusWriter
	// tables are the node's tables (services absent with NoProxy), each
	// with its own pending changes and backoff.
	tables []*tableState

	kick chan struct{}

	mu          sync.Mutex
	lastSuccess time.Time
	ready       atomic.Bool
	// programmed is the table of the last successful sync; /debug/model
	// renders it on request, not on every sync.
	programmed atomic.Pointer[programmedTable]
	generation int64
	// tableMu is held while the policy table is updated (the incremental
	// path changes it in place) and while a copy of it is taken for
	// /debug/model.
	tableMu sync.Mutex
	// policyModels builds the policy model object by object (held with
	// tableMu): unchanged objects keep their policies, which Rebase
	// reuses the allow-lists of.
	policyModels policy.Cache
	// reported are the problems already logged, by kind (policy,
	// services): each kind is re-found only when its table syncs.
	reported map[string]map[string]bool
	// changes are what changed for the policy table since its last sync.
	changes *node.PolicyChanges
}

// tableState is one table's share of the loop. A table that fails is
// retried with its own exponential backoff; the other table keeps
// syncing at the normal pace meanwhile. Guarded by Agent.mu.
type tableState struct {
	table node.Tables
	// pending is when the first change not yet programmed into this
	// table was seen (zero: none).
	pending time.Time
	// resync asks for a sync without a change (the periodic resync).
	resync  bool
	backoff time.Duration
	retryAt time.Time // after a failure: no attempt before this
	synced  bool      // programmed at least once
}

// maxBackoff caps the retry interval of a failing table.
const maxBackoff = 30 * time.Second

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

// New prepares an agent: API clients and the node's kernel tables.
func New(opts Options) (*Agent, error) {
	opts.defaults()
	if opts.NodeName == "" {
		return nil, errors.New("the node name is required (--node-name, or NODE_NAME from the downward API)")
	}
	cfg, err := RestConfig(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	// Core kinds as protobuf, as kube-proxy reads them: every node's
	// agent lists every pod, and decoding protobuf takes a fraction of
	// JSON's time and garbage. The policy CRDs are JSON only (dynamic).
	protoCfg := rest.CopyConfig(cfg)
	protoCfg.ContentType = runtime.ContentTypeProtobuf
	protoCfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	kube, err := kubernetes.NewForConfig(protoCfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ns := netns.None()
	if opts.NetNS != "" {
		if ns, err = netns.GetFromPath(netnsPath(opts.NetNS)); err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", opts.NetNS, err)
		}
		defer ns.Close() // the programmer keeps its own copies
	}
	opts.dnsLatency = newDNSLatency()
	popts := programmerOptions(opts, ns)
	// The verdict log runs in the identity layout whatever --audit says:
	// a policy's netpol.io/audit asks for its own lines.
	var names *addrNames
	var auditOut io.WriteCloser
	if opts.Layout == compiler.LayoutIdentities {
		auditOut = opts.Audit.writer()
		opts.auditLog = audit.NewLogger(auditOut, audit.LoggerOptions{Rate: opts.Audit.Rate})
		names = &addrNames{at: map[netip.Addr]cachedName{}}
		popts.Audit = opts.Audit.programmerAudit(opts.auditLog, names)
	} else if opts.Audit.Mode != policy.AuditOff {
		return nil, errors.New("--audit needs --layout identities (the default)")
	}
	if opts.RuleCounters && opts.Layout != compiler.LayoutIdentities {
		opts.Logger.Warn("per-rule counters need --layout identities (the default): none are kept")
	}
	popts.RuleCounters = opts.RuleCounters && opts.Layout == compiler.LayoutIdentities
	prog, err := node.New(popts)
	if err != nil {
		return nil, err
	}
	a := newAgent(opts, kube, dyn, prog)
	if popts.RuleCounters {
		a.metrics.registry.MustRegister(ruleCountsCollector{prog})
	}
	if names != nil {
		a.metrics.registry.MustRegister(stagedCountsCollector{prog})
		names.src = a.src
		a.metrics.registry.MustRegister(&auditCollector{l: opts.auditLog, prog: prog})
		a.closeAudit = func() {
			opts.auditLog.Close()
			auditOut.Close()
		}
	}
	return a, nil
}

// programmerOptions are the node programmer's options for the agent's.
func programmerOptions(opts Options, ns netns.NsHandle) node.Options {
	return node.Options{Node: opts.NodeName, NetNS: ns, Table: opts.Table, NoProxy: opts.NoProxy,
		ProxyTable: opts.ProxyTable, HealthChecks: true, AgentPorts: opts.agentPorts(), Layout: opts.Layout, Strict: opts.Strict, StrictInterval: opts.StrictInterval, Logger: opts.Logger.With("node", opts.NodeName),
		Build: proxy.Options{NodePortAddresses: opts.NodePortAddresses, ClusterCIDRs: opts.ClusterCIDRs, ServiceCIDRs: opts.ServiceCIDRs}, DNS: opts.dnsOptions()}
}

// dnsOptions are the programmer's DNS options; nil with NoDNS.
func (o *Options) dnsOptions() *node.DNSOptions {
	if o.NoDNS {
		return nil
	}
	d := &node.DNSOptions{QueueNum: o.DNSQueue, Servers: o.DNSServers, Learner: dnssnoop.LearnerOptions{Ceiling: o.DNSTTLCeiling}}
	if o.dnsLatency != nil {
		d.Latency = func(t time.Duration) { o.dnsLatency.Observe(t.Seconds()) }
	}
	return d
}

// newAgent wires an agent from its parts: tests pass fake clients and a
// programmer over kernel.Fake tables. The agent owns prog from now on.
func newAgent(opts Options, kube kubernetes.Interface, dyn dynamic.Interface, prog *node.Programmer) *Agent {
	opts.defaults()
	a := &Agent{opts: opts, log: opts.Logger.With("node", opts.NodeName), kube: kube, prog: prog, metrics: newMetrics(prog, opts.dnsLatency),
		kick: make(chan struct{}, 1), reported: map[string]map[string]bool{}, changes: &node.PolicyChanges{}}
	// The first sync is a full one: the informers' first lists are not
	// recorded change by change.
	a.changes.NeedFull("the first sync")
	a.tables = []*tableState{{table: node.Policy}}
	if !opts.NoProxy {
		a.tables = append(a.tables, &tableState{table: node.Services})
	}
	a.src = newSources(kube, dyn, a.opts.NodeName, a.log, a.changed)
	if !opts.NoStatus {
		a.status = newStatusWriter(kube, dyn, opts.StatusNamespace, opts.NodeName,
			func(msg string, args ...any) { a.log.Info(msg, args...) }, func() {
				// A new leader writes the status of every policy at the
				// next sync, a full one.
				a.forceFull("a new status writer writes every policy's status")
				a.markPending(time.Now(), node.Policy)
				a.trigger()
			})
	}
	return a
}

// openApplier opens the applier for the network namespace named by netns
// ("" = the agent's own).
func openApplier(netns, table string) (*kernel.Applier, error) {
	if netns == "" {
		return kernel.NewApplier(-1, table)
	}
	path := netnsPath(netns)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	return kernel.NewApplier(fd, table)
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

// changed records an informer event (and its objects, for the policy
// table's incremental path) and asks for a sync of the tables the
// resource feeds.
func (a *Agent) changed(resource string, objs ...any) {
	a.metrics.events.WithLabelValues(resource).Inc()
	tables := tablesFed(resource)
	if resource == "endpointslices" && a.opts.NoProxy && !a.opts.NoDNS && clusterDNSSlice(objs) {
		// With no NAT table to sync, the policy table's DNS servers
		// follow kube-dns through a full sync (a rare event).
		tables = node.Policy
	}
	if tables&node.Policy != 0 {
		a.recordChange(objs)
	}
	a.markPending(time.Now(), tables)
	a.trigger()
}

// clusterDNSSlice reports whether one of objs is an EndpointSlice of the
// cluster DNS (node.ClusterDNSService), deleted ones included.
func clusterDNSSlice(objs []any) bool {
	ns, name, _ := strings.Cut(node.ClusterDNSService, "/")
	for _, o := range objs {
		if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if s, ok := o.(*leanSlice); ok && s.slice.Namespace == ns && s.slice.Service == name {
			return true
		}
	}
	return false
}

// tablesFed are the tables a resource's objects feed: Services,
// EndpointSlices and ServiceCIDRs only the NAT table (a Service change
// must not recompile policy), pods, namespaces and policies only the
// policy table; nodes both (node addresses and pod CIDRs count for the
// NAT table too).
func tablesFed(resource string) node.Tables {
	switch resource {
	case "services", "endpointslices", "servicecidrs":
		return node.Services
	case "nodes":
		return node.All
	}
	return node.Policy
}

// markPending notes a change not yet programmed into the given tables.
func (a *Agent) markPending(now time.Time, tables node.Tables) {
	a.mu.Lock()
	for _, ts := range a.tables {
		if ts.pending.IsZero() && tables&ts.table != 0 {
			ts.pending = now
		}
	}
	a.mu.Unlock()
}

func (a *Agent) trigger() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Run serves health and metrics, waits for the caches, and syncs until ctx
// ends. The kernel tables are left in place on return (fail-static).
func (a *Agent) Run(ctx context.Context) error {
	if a.closeAudit != nil {
		defer a.closeAudit() // after the programmer closes: its reader writes to it
	}
	defer a.prog.Close()
	stopServers, err := a.serve()
	if err != nil {
		return err
	}
	defer stopServers()
	a.log.Info("starting", "table", a.opts.Table, "netns", a.opts.NetNS)
	if err := a.src.start(ctx); err != nil {
		return fmt.Errorf("starting the watches: %w", err)
	}
	if a.status != nil {
		go a.status.run(ctx)
		go a.status.writeLoop(ctx)
	}
	a.markPending(time.Now(), node.All)
	return a.loop(ctx)
}

// loop runs coalesced syncs: a change triggers a sync, but no sooner than
// MinSyncInterval after the previous one started, so a burst of events
// becomes a handful of transactions. Each table is synced when it has a
// change to program and is not backing off after a failure; the kernel
// keeps a failed table's previous state meanwhile. Every ResyncPeriod (from
// the previous resync, however busy the loop is) both tables are checked
// for changes made behind the agent's back and repaired.
func (a *Agent) loop(ctx context.Context) error {
	wake := time.NewTimer(0) // the first sync runs at once
	defer wake.Stop()
	var last time.Time
	nextResync := time.Now().Add(a.opts.ResyncPeriod)
	for {
		select {
		case <-ctx.Done():
			a.log.Info("stopping; the kernel keeps enforcing the last programmed state")
			return nil
		case <-a.kick:
		case <-wake.C:
		}
		if wait := time.Until(last.Add(a.opts.MinSyncInterval)); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		now := time.Now()
		resync := !now.Before(nextResync)
		if resync {
			nextResync = now.Add(a.opts.ResyncPeriod)
			a.mu.Lock()
			for _, ts := range a.tables {
				ts.resync = true
			}
			a.mu.Unlock()
		}
		if due := a.due(now); due != 0 {
			last = now
			a.syncTables(due, resync)
		}
		next := a.nextWake(nextResync)
		if at := a.strictCheck(time.Now()); !at.IsZero() && at.Before(next) {
			next = at
		}
		stopTimer(wake)
		wake.Reset(time.Until(next))
	}
}

// DefaultStrictInterval is netpol agent's --strict-interval: a check
// costs a trace per open flow and a tracer of the table (at 100,000
// realistic pods 14 ms and 4 ms per 1,000 flows, docs/benchmarks.md), so
// a burst of changes is checked once.
const DefaultStrictInterval = time.Second

// strictCheck runs strict mode's pending check when it is due (a change
// came within --strict-interval of the last check) and returns when the
// next is due (zero: none pending).
func (a *Agent) strictCheck(now time.Time) time.Time {
	a.tableMu.Lock()
	defer a.tableMu.Unlock()
	if _, due := a.prog.StrictDue(now); due {
		a.reportStrict(a.prog.EndDeniedFlows())
	}
	at, _ := a.prog.StrictDue(now)
	return at
}

// reportStrict counts and logs what a strict check did.
func (a *Agent) reportStrict(r node.StrictResult) {
	if n := len(r.Ended); n > 0 {
		a.metrics.strictEnded.Add(float64(n))
		a.log.Info("strict mode ended the open flows the new policy denies", "flows", n)
	}
	if r.Err != nil {
		a.log.Warn("strict mode: flows the new policy denies may still be open (the next change tries again)", "err", r.Err)
	}
}

func stopTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// due lists the tables with pending changes that are not backing off.
func (a *Agent) due(now time.Time) node.Tables {
	a.mu.Lock()
	defer a.mu.Unlock()
	var due node.Tables
	for _, ts := range a.tables {
		if (!ts.pending.IsZero() || ts.resync) && !now.Before(ts.retryAt) {
			due |= ts.table
		}
	}
	return due
}

// nextWake is when the loop must run without an event: the next resync,
// or the retry of a failed table.
func (a *Agent) nextWake(resync time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	next := resync
	for _, ts := range a.tables {
		if (!ts.pending.IsZero() || ts.resync) && ts.retryAt.After(time.Now()) && ts.retryAt.Before(next) {
			next = ts.retryAt
		}
	}
	return next
}

// syncTables syncs the due tables and keeps each table's pending changes
// and backoff.
func (a *Agent) syncTables(due node.Tables, verify bool) {
	type taken struct {
		pending time.Time
		resync  bool
	}
	since := map[node.Tables]taken{}
	a.mu.Lock()
	for _, ts := range a.tables {
		if due&ts.table != 0 {
			since[ts.table] = taken{ts.pending, ts.resync}
			ts.pending, ts.resync = time.Time{}, false
		}
	}
	a.mu.Unlock()
	failed := a.sync(due, verify)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ts := range a.tables {
		s, ok := since[ts.table]
		if !ok {
			continue
		}
		if failed&ts.table != 0 {
			if !s.pending.IsZero() && (ts.pending.IsZero() || s.pending.Before(ts.pending)) {
				ts.pending = s.pending
			}
			ts.resync = ts.resync || s.resync
			ts.backoff = min(max(2*ts.backoff, 100*time.Millisecond), maxBackoff)
			ts.retryAt = now.Add(ts.backoff)
			continue
		}
		ts.backoff, ts.retryAt, ts.synced = 0, time.Time{}, true
		if !s.pending.IsZero() {
			a.metrics.programmingLatency.WithLabelValues(ts.table.String()).Observe(now.Sub(s.pending).Seconds())
		}
	}
	// Healthy and ready mean every table: one that keeps failing shows.
	for _, ts := range a.tables {
		if !ts.synced || ts.backoff > 0 {
			return
		}
	}
	a.lastSuccess = now
	if !a.ready.Swap(true) {
		a.log.Info("initial sync done")
	}
}

// sync builds the snapshot from the caches, compiles the node's ruleset
// and applies the difference to each due table, and returns the tables
// that failed. With verify (the periodic resync) it first checks the
// tables for changes made behind its back, so that they are read back and
// repaired. Status writes are queued for their own goroutine: they never
// hold up kernel programming.
func (a *Agent) sync(due node.Tables, verify bool) node.Tables {
	start := time.Now()
	var res node.Result
	var policies map[cluster.ObjectKey]policyObject
	var model *policy.Model
	checkLive := false // the incremental table is up to date: compare it
	a.tableMu.Lock()
	defer a.tableMu.Unlock()
	if verify {
		if drifted, err := a.prog.Verify(due); err != nil {
			a.log.Warn("checking the kernel tables", "err", err)
		} else if drifted != 0 {
			a.log.Debug("re-reading the kernel tables (the ruleset changed since the last sync)", "tables", drifted.String())
		}
	}
	if due&node.Policy != 0 {
		// Changes to pods, namespaces and policies update the last table
		// without a snapshot when they can (node.PolicyChanges). The
		// periodic resync applies them too, then compiles in full and
		// checks that both agree.
		if ps := a.syncPolicyChanges(a.takeChanges()); ps.Kind != node.SyncFull {
			r := ps.PolicyResult
			a.metrics.policySyncs.WithLabelValues(ps.Kind.String()).Inc()
			model, policies = ps.model, ps.objects
			if r.Err != nil {
				a.forceFull("the last sync failed") // the retry compiles in full
			}
			if !verify || r.Err != nil {
				res.Policy = r
				due &^= node.Policy
			}
			checkLive = r.Err == nil
		}
	}
	if due != 0 {
		in, err := a.src.snapshot(due&node.Policy != 0)
		var sources []any
		if err == nil && due&node.Policy != 0 {
			sources, policies, err = a.src.policySources()
		}
		if err != nil {
			a.metrics.syncs.WithLabelValues("error").Inc()
			a.log.Error("sync failed; the kernel keeps the previous state", "err", fmt.Errorf("snapshot: %w", err))
			if due&node.Policy != 0 {
				a.forceFull("the last sync failed")
			}
			return due | res.Failed()
		}
		// A Service or EndpointSlice change syncs the NAT table only: the
		// policy model is not rebuilt for it.
		in.CheckIncremental = checkLive
		var problems []error
		if due&node.Policy != 0 {
			in.Model, problems = a.policyModels.Build(sources, loadPolicy)
		}
		full := a.prog.Sync(in, due)
		if full.Policy.Ran {
			model = in.Model
			a.reportProblems("policy", append(problems, in.Model.Errors...), in.Model.Warnings)
			a.metrics.policySyncs.WithLabelValues(node.SyncFull.String()).Inc()
			res.Policy = full.Policy
			if full.Policy.Err != nil {
				a.forceFull("the last sync failed")
			}
			if full.Policy.IncrementalDiffers {
				a.metrics.liveMismatches.Inc()
				a.log.Error("the incremental policy table differed from a full compile; the full one is applied (a bug: please report it)")
			}
		}
		res.Services = full.Services
	}
	failed := res.Failed()
	var messages int
	if r := res.Policy; r.Ran && r.Err == nil {
		messages += r.Stats.Messages
		a.metrics.setCounts(r.Counts)
		a.reportStrict(r.Strict)
		if r.Stats.Messages > 0 {
			a.metrics.transactionSize.Observe(float64(r.Stats.Messages))
			a.log.Info("programmed", "messages", r.Stats.Messages, "transactions", r.Stats.Transactions, "elements-added", r.Stats.ElementsAdded,
				"elements-deleted", r.Stats.ElementsDeleted, "chains-rewritten", r.Stats.ChainsRewritten,
				"chains-added", r.Stats.ChainsAdded, "rules", r.Counts.Rules, "incremental", r.Incremental)
		}
		a.mu.Lock()
		a.generation++
		gen := a.generation
		a.mu.Unlock()
		a.programmed.Store(&programmedTable{generation: gen, view: a.policyView})
		a.models.publish()
		if model != nil && a.status != nil && a.status.leader.Load() {
			problems := objectProblems(model)
			a.status.enqueue(queuedStatus{statuses: desiredStatus(policies, problems, stagedKeys(model)),
				events: desiredEvents(policies, a.src.networkPolicyRef, model, problems)})
		}
	}
	if r := res.Services; r.Ran {
		problems := r.Failures
		if r.Model != nil {
			problems = append(slices.Clip(r.Model.Errors), r.Failures...)
		}
		a.reportProblems("services", problems, nil)
		if r.Err == nil {
			messages += r.Stats.Messages
			if r.Stats.Messages > 0 {
				a.metrics.transactionSize.Observe(float64(r.Stats.Messages))
				a.log.Info("programmed services", "messages", r.Stats.Messages, "transactions", r.Stats.Transactions, "elements-added", r.Stats.ElementsAdded,
					"elements-deleted", r.Stats.ElementsDeleted, "chains-added", r.Stats.ChainsAdded, "sets", r.Counts.Sets)
			}
		}
	}
	for _, err := range []error{res.Policy.Err, res.Services.Err} {
		if err != nil {
			a.log.Error("sync failed; the kernel keeps the previous state of this table", "err", err)
		}
	}
	a.metrics.syncDuration.Observe(time.Since(start).Seconds())
	switch {
	case failed != 0:
		a.metrics.syncs.WithLabelValues("error").Inc()
	case messages > 0:
		a.metrics.syncs.WithLabelValues("success").Inc()
	default:
		a.metrics.syncs.WithLabelValues("unchanged").Inc()
	}
	if failed == 0 {
		a.metrics.lastSuccess.SetToCurrentTime()
	}
	return failed
}

// programmedTable is a table the kernel holds and the sync that applied
// it: the table itself (never changed), or view, which copies the current
// table and gives its generation (the agent's policy table changes in
// place).
type programmedTable struct {
	generation int64
	table      *nft.Table
	view       func() (*nft.Table, int64)
}

func (p *programmedTable) read() (*nft.Table, int64) {
	if p.table != nil || p.view == nil {
		return p.table, p.generation
	}
	return p.view()
}

// policyView copies the programmed policy table and its generation.
func (a *Agent) policyView() (*nft.Table, int64) {
	a.tableMu.Lock()
	defer a.tableMu.Unlock()
	a.mu.Lock()
	gen := a.generation
	a.mu.Unlock()
	return a.prog.PolicyTable(), gen
}

// reportProblems logs each problem of one kind once (they are re-found at
// every sync of that kind's table) and counts them: policy problems in
// netpol_policy_errors, Service problems in netpol_service_errors.
func (a *Agent) reportProblems(kind string, errs []error, warnings []string) {
	gauge := a.metrics.policyErrors
	if kind == "services" {
		gauge = a.metrics.serviceErrors
	}
	gauge.Set(float64(len(errs) + len(warnings)))
	reported := a.reported[kind]
	seen := map[string]bool{}
	for _, e := range errs {
		msg := e.Error()
		seen[msg] = true
		if !reported[msg] {
			a.log.Warn(kind+" error", "err", msg)
		}
	}
	for _, w := range warnings {
		seen[w] = true
		if !reported[w] {
			a.log.Warn(kind+" warning", "warning", w)
		}
	}
	a.reported[kind] = seen
}

// health reports whether the agent keeps the kernel up to date.
func (a *Agent) health() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	for _, ts := range a.tables {
		if !ts.pending.IsZero() && a.ready.Load() && now.Sub(ts.pending) > a.opts.HealthTimeout {
			return fmt.Errorf("changes seen %v ago are not programmed into the %s table yet", now.Sub(ts.pending).Round(time.Second), ts.table)
		}
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
