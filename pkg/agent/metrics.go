package agent

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/node"
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
	// policySyncs counts policy table syncs by path: incremental (Incremental),
	// rebase (the node's classes compiled again) or full (a compile of
	// the whole snapshot).
	policySyncs *prometheus.CounterVec
	// liveMismatches counts periodic resyncs whose full compile differed
	// from the incremental state (a bug: the full table is applied).
	liveMismatches prometheus.Counter
	// strictEnded counts the flows strict mode ended.
	strictEnded prometheus.Counter
}

// newDNSLatency is the histogram of the DNS queue's verdict latency.
func newDNSLatency() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "netpol_dns_queue_latency_seconds",
		Help:    "Time a queued DNS answer spends in the agent (parse, learn, commit) before its verdict.",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1}})
}

// dnsCollector reports the DNS side's counts at each scrape.
type dnsCollector struct{ prog *node.Programmer }

var (
	dnsAnswers  = prometheus.NewDesc("netpol_dns_answers_total", "DNS answers (messages) read from the queue.", nil, nil)
	dnsLearned  = prometheus.NewDesc("netpol_dns_addresses_learned_total", "Learned (domain pattern set, address) elements added or refreshed.", nil, nil)
	dnsExpired  = prometheus.NewDesc("netpol_dns_addresses_expired_total", "Learned elements whose TTL ran out without a new answer.", nil, nil)
	dnsKnown    = prometheus.NewDesc("netpol_dns_addresses", "Learned elements not expired.", nil, nil)
	dnsFailures = prometheus.NewDesc("netpol_dns_answer_errors_total", "Answers that taught nothing: unreadable, or their transaction failed (the answer still went on).", nil, nil)
	dnsPackets  = prometheus.NewDesc("netpol_dns_queue_packets_total", "Packets read from the DNS queue.", nil, nil)
	dnsQueued   = prometheus.NewDesc("netpol_dns_answers_queued_total", "Answers the queue rules handed to the queue, read or not: past the queue's length the kernel lets them pass unread (fail-open), which is this minus netpol_dns_queue_packets_total.", nil, nil)
	dnsQErrors  = prometheus.NewDesc("netpol_dns_queue_errors_total", "Queue socket errors (ENOBUFS: the kernel lost messages to the agent) and failed verdicts.", nil, nil)
)

func (c dnsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dnsAnswers, dnsLearned, dnsExpired, dnsKnown, dnsFailures, dnsPackets, dnsQueued, dnsQErrors} {
		ch <- d
	}
}

func (c dnsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.prog.DNS(false)
	if st == nil || st.QueueNum == 0 {
		return
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	counter(dnsAnswers, float64(st.Stats.Answers))
	counter(dnsLearned, float64(st.Stats.Learned))
	counter(dnsExpired, float64(st.Stats.Expired))
	counter(dnsFailures, float64(st.Stats.Errors))
	counter(dnsPackets, float64(st.QueuePackets))
	counter(dnsQErrors, float64(st.QueueErrors))
	counter(dnsQueued, float64(st.QueuedAnswers))
	ch <- prometheus.MustNewConstMetric(dnsKnown, prometheus.GaugeValue, float64(st.Stats.Known))
}

func newMetrics(prog *node.Programmer, dnsLatency prometheus.Histogram) *metrics {
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
		strictEnded: prometheus.NewCounter(prometheus.CounterOpts{Name: "netpol_strict_connections_ended_total",
			Help: "Open connections (TCP, UDP, SCTP) whose conntrack entries strict mode deleted because a policy change the kernel took denies them."}),
	}
	m.registry.MustRegister(m.syncDuration, m.programmingLatency, m.syncs, m.events, m.kernelObjects,
		m.transactionSize, m.lastSuccess, m.policyErrors, m.serviceErrors, m.policySyncs, m.liveMismatches, m.strictEnded,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if prog != nil {
		m.registry.MustRegister(dnsCollector{prog})
	}
	if dnsLatency != nil {
		m.registry.MustRegister(dnsLatency)
	}
	return m
}

// auditCollector exports the verdict log's counts: the decisions its
// rules made (the kernel counts them), the lines written and folded, and
// the rest, dropped.
type auditCollector struct {
	l    *audit.Logger
	prog *node.Programmer
	mu   sync.Mutex
	// dropped is the last value exported (the decisions' count is read
	// after the lines': a copy on its way makes the difference dip).
	dropped uint64
}

var (
	auditDecisionsDesc = prometheus.NewDesc("netpol_audit_decisions_total",
		"Decisions of the policy rules the verdict log writes (the kernel counts each, logged or not).", nil, nil)
	auditLinesDesc = prometheus.NewDesc("netpol_audit_lines_total",
		"Lines of the verdict log: written, or folded into a line's repeats (the same decision within a second).", []string{"result"}, nil)
	auditDroppedDesc = prometheus.NewDesc("netpol_audit_lines_dropped_total",
		"Decisions the verdict log did not write nor fold: past a rule's copy rate or --audit-rate, or copies the kernel or the reader lost (the packets themselves are never held).", nil, nil)
)

func (c *auditCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- auditDecisionsDesc
	ch <- auditLinesDesc
	ch <- auditDroppedDesc
}

func (c *auditCollector) Collect(ch chan<- prometheus.Metric) {
	st := &c.l.Stats
	written, folded := st.Written.Load(), st.Folded.Load()
	decisions, _ := c.prog.AuditDecisions() // a chain that went keeps its count
	c.mu.Lock()
	if decisions > written+folded && decisions-written-folded > c.dropped {
		c.dropped = decisions - written - folded
	}
	dropped := c.dropped
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(auditDecisionsDesc, prometheus.CounterValue, float64(decisions))
	ch <- prometheus.MustNewConstMetric(auditLinesDesc, prometheus.CounterValue, float64(written), "written")
	ch <- prometheus.MustNewConstMetric(auditLinesDesc, prometheus.CounterValue, float64(folded), "folded")
	ch <- prometheus.MustNewConstMetric(auditDroppedDesc, prometheus.CounterValue, float64(dropped))
}

// ruleCountsCollector exports the per-rule counters, read from the kernel
// at each scrape.
type ruleCountsCollector struct{ prog *node.Programmer }

var (
	ruleLabels      = []string{"kind", "namespace", "name", "rule", "action", "direction"}
	rulePacketsDesc = prometheus.NewDesc("netpol_policy_rule_packets_total",
		"Packets the policy rule decided on this node: a connection's first packet (later ones are accepted as established before any policy rule), so about its new connections, and each attempt of one it denies. rule is as netpol explain names it; \""+compiler.IsolationRule+"\" counts the connections a NetworkPolicy denied by isolating the pod, no rule allowing them.", ruleLabels, nil)
	ruleBytesDesc = prometheus.NewDesc("netpol_policy_rule_bytes_total",
		"Bytes of the packets of netpol_policy_rule_packets_total.", ruleLabels, nil)
)

func (c ruleCountsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rulePacketsDesc
	ch <- ruleBytesDesc
}

func (c ruleCountsCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.prog.RuleCounts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(rulePacketsDesc, err)
		return
	}
	for _, rc := range counts {
		labels := []string{rc.Kind, rc.Namespace, rc.Name, rc.Rule, rc.Action, rc.Direction}
		ch <- prometheus.MustNewConstMetric(rulePacketsDesc, prometheus.CounterValue, float64(rc.Packets), labels...)
		ch <- prometheus.MustNewConstMetric(ruleBytesDesc, prometheus.CounterValue, float64(rc.Bytes), labels...)
	}
}

// stagedCountsCollector exports the staged policies' would-be verdicts,
// read from the kernel at each scrape.
type stagedCountsCollector struct{ prog *node.Programmer }

var stagedChangesDesc = prometheus.NewDesc("netpol_staged_verdict_changes_total",
	"New connections on this node whose verdict the staged policy (netpol.io/staged: \"true\") would change were it enforced: verdict is the would-be verdict (the enforced one is the other). Each also has a line with \"staged\": true in the verdict log.",
	[]string{"kind", "namespace", "name", "verdict"}, nil)

func (c stagedCountsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- stagedChangesDesc }

func (c stagedCountsCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.prog.StagedCounts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(stagedChangesDesc, err)
		return
	}
	for _, sc := range counts {
		ch <- prometheus.MustNewConstMetric(stagedChangesDesc, prometheus.CounterValue, float64(sc.Packets), sc.Kind, sc.Namespace, sc.Name, sc.Verdict)
	}
}

func (m *metrics) setCounts(c nft.Counts) {
	m.kernelObjects.WithLabelValues("chains").Set(float64(c.Chains))
	m.kernelObjects.WithLabelValues("rules").Set(float64(c.Rules))
	m.kernelObjects.WithLabelValues("sets").Set(float64(c.Sets))
	m.kernelObjects.WithLabelValues("elements").Set(float64(c.Elements))
}
