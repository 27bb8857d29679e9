package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/netpol/netpol/pkg/nft"
)

// metrics are the agent's Prometheus metrics, in their own registry.
type metrics struct {
	registry *prometheus.Registry
	// syncDuration: snapshot + compile + kernel transactions.
	syncDuration prometheus.Histogram
	// programmingLatency: from the first event of a change to the commit of
	// the transaction that carries it.
	programmingLatency *prometheus.HistogramVec // table=policy|services
	syncs              *prometheus.CounterVec   // result=success|error|unchanged
	events             *prometheus.CounterVec   // resource
	kernelObjects      *prometheus.GaugeVec     // kind=chains|rules|sets|elements
	transactionSize    prometheus.Histogram     // netlink messages per transaction
	lastSuccess        prometheus.Gauge
	policyErrors       prometheus.Gauge
	serviceErrors      prometheus.Gauge
	// policySyncs counts policy table syncs by path: incremental (Live),
	// rebase (the node's classes compiled again) or full (a compile of
	// the whole snapshot).
	policySyncs *prometheus.CounterVec
	// liveMismatches counts periodic resyncs whose full compile differed
	// from the incremental state (a bug: the full table is applied).
	liveMismatches prometheus.Counter
}

func newMetrics() *metrics {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	m := &metrics{
		registry: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "netpol_sync_duration_seconds",
			Help: "Time of one sync: snapshot, compile and the kernel transaction.", Buckets: buckets}),
		programmingLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "netpol_programming_latency_seconds",
			Help: "Time from an object change seen by the agent to the commit of the kernel transaction that carries it, by table.", Buckets: buckets}, []string{"table"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "netpol_syncs_total",
			Help: "Syncs by result: success (a transaction was committed), unchanged (nothing to send), error."}, []string{"result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "netpol_informer_events_total",
			Help: "Informer events (add, update, delete) by resource."}, []string{"resource"}),
		kernelObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "netpol_kernel_objects",
			Help: "Objects in the node's nftables table after the last successful sync."}, []string{"kind"}),
		transactionSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "netpol_transaction_messages",
			Help: "Netlink messages per kernel transaction.", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "netpol_last_successful_sync_timestamp_seconds",
			Help: "Unix time of the last successful sync."}),
		policyErrors: prometheus.NewGauge(prometheus.GaugeOpts{Name: "netpol_policy_errors",
			Help: "Problems found in the cluster's policies at the last sync (rejected objects, rules failing closed)."}),
		serviceErrors: prometheus.NewGauge(prometheus.GaugeOpts{Name: "netpol_service_errors",
			Help: "Problems found in the cluster's Services at the last sync of the NAT table, and failures after its commit (conntrack cleanup, health checks)."}),
		policySyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "netpol_policy_syncs_total",
			Help: "Policy table syncs by path: incremental (only the elements of the pods and namespaces that changed), rebase (the classes of this node's pods compiled again, for a policy or a pod of this node) or full (the whole snapshot compiled)."}, []string{"path"}),
		liveMismatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "netpol_incremental_mismatches_total",
			Help: "Periodic resyncs whose full compile differed from the incremental table (always a bug; the full table is applied)."}),
	}
	m.registry.MustRegister(m.syncDuration, m.programmingLatency, m.syncs, m.events, m.kernelObjects,
		m.transactionSize, m.lastSuccess, m.policyErrors, m.serviceErrors, m.policySyncs, m.liveMismatches,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) setCounts(c nft.Counts) {
	m.kernelObjects.WithLabelValues("chains").Set(float64(c.Chains))
	m.kernelObjects.WithLabelValues("rules").Set(float64(c.Rules))
	m.kernelObjects.WithLabelValues("sets").Set(float64(c.Sets))
	m.kernelObjects.WithLabelValues("elements").Set(float64(c.Elements))
}
