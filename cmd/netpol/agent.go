package main

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/netpol/netpol/pkg/agent"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/node"
)

func newAgentCommand(in *inputFlags) *cobra.Command {
	opts := agent.Options{}
	var (
		cleanup      bool
		logFormat    string
		logLevel     string
		nodePortAddr []string
		clusterCIDRs []string
		serviceCIDRs []string
		portsAllow   []string
		dnsServers   []string
		memoryRatio  float64
		verbosity    int
		layout       = layoutFlag{compiler.DefaultLayout}
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: watch the API server, program this node's nftables",
		Long: "Run the node agent (a DaemonSet on every node): watch Pods, Namespaces, Nodes, NetworkPolicies and\n" +
			"the policy.networking.k8s.io APIs the server serves, and after every burst of changes apply the\n" +
			"difference to this node's nftables table in one transaction (what it adds in one just before it).\n" +
			"If the agent stops or the API server is unreachable, the kernel keeps enforcing the last\n" +
			"programmed state; a restart adopts it.",
		Example: "  netpol agent --node-name \"$NODE_NAME\" --secure-port 10253 --protect-agent-ports --agent-ports-allow 10.244.3.0/24\n" +
			"  netpol agent --node-name \"$NODE_NAME\"   # metrics 127.0.0.1:9753, debug 127.0.0.1:9755, health :9754\n" +
			"  netpol agent --cleanup   # remove the table and exit",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if verbosity >= 2 && !cmd.Flags().Changed("log-level") {
				logLevel = "debug"
			}
			logger, err := newLogger(cmd, logFormat, logLevel)
			if err != nil {
				return err
			}
			opts.Logger = logger
			opts.Kubeconfig = in.kubeconfig
			if err := opts.Audit.Validate(); err != nil {
				return err
			}
			opts.Layout = layout.layout
			if opts.NoProxy && opts.Layout == compiler.LayoutIdentities {
				// The identity layout writes the packet mark of a new
				// connection between prerouting and postrouting, where
				// kube-proxy keeps its masquerade bit (0x4000): beside
				// kube-proxy, peers stay sets of addresses unless asked.
				if !cmd.Flags().Changed("layout") {
					opts.Layout = compiler.LayoutAddresses
				} else {
					logger.Warn("--layout identities with --no-proxy: the policy table rewrites the packet mark of new connections, " +
						"so a Service proxy that marks packets for masquerade (kube-proxy's 0x4000) loses the mark on connections to and from policed pods")
				}
			}
			if opts.NodePortAddresses, err = parseList(nodePortAddr, netip.ParseAddr); err != nil {
				return fmt.Errorf("--nodeport-addresses: %w", err)
			}
			if opts.ClusterCIDRs, err = parseList(clusterCIDRs, netip.ParsePrefix); err != nil {
				return fmt.Errorf("--cluster-cidr: %w", err)
			}
			if opts.ServiceCIDRs, err = parseList(serviceCIDRs, netip.ParsePrefix); err != nil {
				return fmt.Errorf("--service-cidr: %w", err)
			}
			if opts.DNSServers, err = parseList(dnsServers, parseDNSServer); err != nil {
				return fmt.Errorf("--dns-server: %w", err)
			}
			if opts.AgentPortsAllow, err = parseList(portsAllow, parsePrefixOrAddr); err != nil {
				return fmt.Errorf("--agent-ports-allow: %w", err)
			}
			if opts.Serving.SecurePort < 0 || opts.Serving.SecurePort > 65535 {
				return fmt.Errorf("--secure-port %d: 0 (off) or a port", opts.Serving.SecurePort)
			}
			// With secure serving, metrics are served there (authorized);
			// the plain listener only when asked for.
			if opts.Serving.SecurePort > 0 && !cmd.Flags().Changed("metrics-bind-address") {
				opts.MetricsAddr = ""
			}
			if cleanup {
				if err := agent.Cleanup(opts); err != nil {
					return err
				}
				logger.Info("removed the nftables tables", "policy", opts.Table, "services", opts.ProxyTable)
				return nil
			}
			limit, err := agent.SetMemoryLimit(memoryRatio, logger)
			if err != nil {
				return fmt.Errorf("--memory-limit-ratio: %w", err)
			}
			if limit.Source == "none" {
				logger.Info("no memory limit: the garbage collector paces by GOGC alone")
			} else {
				logger.Info("soft memory limit", "bytes", limit.Bytes, "source", limit.Source)
			}
			a, err := agent.New(opts)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return a.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.NodeName, "node-name", agent.Hostname(), "the Node this agent programs: NODE_NAME, else the host name")
	f.StringVar(&opts.NetNS, "netns", "", "program this network namespace (a name under /run/netns or a path) instead of the agent's own; for the lab")
	f.StringVar(&opts.Table, "table", "", "nftables table name (default netpol)")
	f.StringVar(&opts.HealthAddr, "health-bind-address", ":9754", "/healthz and /readyz (plain HTTP, what the kubelet probes; says nothing about the cluster) listen address (empty: off)")
	f.StringVar(&opts.MetricsAddr, "metrics-bind-address", "127.0.0.1:9753", "plain HTTP /metrics listen address (empty: off; with --secure-port, off unless set: metrics are on the secure port)")
	f.StringVar(&opts.DebugAddr, "debug-bind-address", "127.0.0.1:9755", "plain HTTP /debug/model (and its watch stream) listen address, for people on the node (empty: off)")
	f.BoolVar(&opts.Profiling, "profiling", false, "serve Go's /debug/pprof/ on --debug-bind-address and the secure port (a CPU profile must take under 30 s: ?seconds=20)")
	f.IntVar(&opts.Serving.SecurePort, "secure-port", 0, "HTTPS port serving /metrics and /debug/* to callers the API server authenticates (TokenReview) and authorizes (SubjectAccessReview), and /healthz, /readyz (0: off)")
	f.StringVar(&opts.Serving.BindAddress, "bind-address", "0.0.0.0", "the secure port's listen address")
	f.StringVar(&opts.Serving.CertFile, "tls-cert-file", "", "the secure port's serving certificate (PEM); without it, a self-signed one is made at start")
	f.StringVar(&opts.Serving.KeyFile, "tls-private-key-file", "", "the key of --tls-cert-file (PEM)")
	f.IntVar(&opts.Serving.MaxWatchers, "max-model-watchers", agent.DefaultMaxWatchers, "most concurrent /debug/model watch streams; more are answered 503")
	f.BoolVar(&opts.ProtectAgentPorts, "protect-agent-ports", false, "the policy table accepts the agent's metrics, debug and secure ports (those not on loopback) only from the node itself and --agent-ports-allow")
	f.StringSliceVar(&portsAllow, "agent-ports-allow", nil, "with --protect-agent-ports: networks (CIDRs or addresses, comma-separated) that may reach the agent's ports, such as Prometheus'")
	f.BoolVar(&opts.ListenInNetNS, "listen-in-netns", false, "open the listeners inside --netns (the lab: the agent's ports on the lab node's addresses)")
	f.MarkHidden("listen-in-netns")
	f.DurationVar(&opts.MinSyncInterval, "min-sync-interval", 0, "least time between two syncs; changes in between are coalesced (default 100ms)")
	f.DurationVar(&opts.ResyncPeriod, "resync-period", 0, "re-sync with no change this often: each table is checked for changes made behind the agent's back (the ruleset generation) and, if it moved, read back and repaired (default 5m)")
	f.StringVar(&opts.StatusNamespace, "status-namespace", "", "namespace of the Lease that elects the one agent writing policy status (default: POD_NAMESPACE, else netpol-system)")
	f.BoolVar(&opts.NoStatus, "no-status", false, "do not write policy status")
	f.BoolVar(&opts.NoProxy, "no-proxy", false, "do not load balance Services (policy only; run kube-proxy beside it)")
	f.StringVar(&opts.ProxyTable, "proxy-table", "", "nftables table name for Service NAT (default netpol-proxy)")
	f.StringSliceVar(&nodePortAddr, "nodeport-addresses", nil, "node addresses that serve NodePorts, comma-separated (default: the Node's InternalIP and ExternalIP addresses)")
	f.StringSliceVar(&clusterCIDRs, "cluster-cidr", nil, "pod networks, comma-separated; other clients of ClusterIPs are masqueraded (default: every Node's spec.podCIDRs)")
	f.StringSliceVar(&serviceCIDRs, "service-cidr", nil, "ranges ClusterIPs come from besides the cluster's ServiceCIDR objects (networking.k8s.io/v1, read when the API server serves them and the agent may list them), comma-separated: new connections to an address of them that no Service holds are dropped, as kube-proxy's nftables mode does (for an API server without ServiceCIDRs; default: none)")
	layout.register(cmd, "")
	f.Lookup("layout").Usage += "; with --no-proxy the default is addresses (the identity layout rewrites the packet mark, where kube-proxy keeps its masquerade bit)"
	f.BoolVar(&opts.NoDNS, "no-dns", false, "do not learn domainNames addresses from the cluster DNS's answers (domainNames rules then admit nothing)")
	f.Uint16Var(&opts.DNSQueue, "dns-queue", node.DefaultDNSQueue, "NFQUEUE queue number the cluster DNS's answers to pods with domainNames rules are sent to")
	f.StringSliceVar(&dnsServers, "dns-server", nil, "DNS servers besides the endpoints of Service kube-system/kube-dns whose answers teach domainNames addresses, as ADDRESS or ADDRESS:PORT (port 53 by default), comma-separated (a node-local cache)")
	f.DurationVar(&opts.DNSTTLCeiling, "dns-ttl-ceiling", 0, "keep a learned address at most this long (default 0: its record's TTL, however long)")
	f.Float64Var(&memoryRatio, "memory-limit-ratio", agent.DefaultMemoryLimitRatio, "the Go runtime's soft memory limit, as a share of the container's (cgroup's) memory limit: the garbage collector works harder near it instead of letting garbage grow the heap to twice what is live (0: off; GOMEMLIMIT, when set, wins)")
	f.BoolVar(&opts.Strict, "strict", true, "after each policy change the kernel takes, end the open connections (TCP, UDP, SCTP; their conntrack entries) that the new table denies; connections it still allows are never touched (--strict=false: a tightened policy applies to new connections only)")
	f.BoolVar(&opts.RuleCounters, "rule-counters", true, "count each policy rule's decisions in the kernel (a named nftables counter per rule), exported as netpol_policy_rule_packets_total and netpol_policy_rule_bytes_total and shown by netpol model watch and trace --live")
	f.DurationVar(&opts.StrictInterval, "strict-interval", agent.DefaultStrictInterval, "with --strict: the least time between two checks of the open connections; changes sooner are checked together when it ends (0: after every change)")
	f.StringVar(&opts.Audit.Mode, "audit", "off", "the verdict log: which decisions of policy it writes, one JSON line per new connection's deciding side: off, deny or all (a policy's annotation netpol.io/audit: off|deny|all wins for its rules; needs --layout identities)")
	f.Uint16Var(&opts.Audit.Group, "audit-group", compiler.DefaultAuditGroup, "NFLOG group the policy table's deciding rules log to")
	f.StringVar(&opts.Audit.Log, "audit-log", "", "file the verdict log is written to, rotated by size (default: standard output)")
	f.IntVar(&opts.Audit.MaxSizeMB, "audit-log-max-size", 100, "size in MB at which --audit-log is rotated")
	f.IntVar(&opts.Audit.MaxFiles, "audit-log-max-files", 5, "rotated --audit-log files kept")
	f.Float64Var(&opts.Audit.Rate, "audit-rate", 1000, "most verdict log lines a second (twice that at once); the same decision within a second is one line with \"repeats\"; lines past the rate are counted (netpol_audit_lines_dropped_total), never held against traffic")
	f.BoolVar(&cleanup, "cleanup", false, "remove everything the agent programmed (both tables) and exit")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.IntVarP(&verbosity, "v", "v", 0, "klog-style verbosity: 2 or more logs at debug level (each connection strict mode ends, among others) unless --log-level says otherwise")
	// --kubeconfig is the root command's; without it the agent uses the
	// in-cluster config.
	return cmd
}

// newLogger makes the slog logger and routes client-go's klog output to it.
func newLogger(cmd *cobra.Command, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	hopts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(cmd.ErrOrStderr(), hopts)
	case "json":
		h = slog.NewJSONHandler(cmd.ErrOrStderr(), hopts)
	default:
		return nil, fmt.Errorf("--log-format %q: text or json", format)
	}
	logger := slog.New(h)
	klog.SetSlogLogger(logger)
	return logger, nil
}

// parseDNSServer parses ADDRESS or ADDRESS:PORT ([v6]:PORT); the port
// is 53 by default.
func parseDNSServer(s string) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a.Unmap(), 53), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: an address or address:port", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// parseList parses a list flag's values; nil when there are none.
func parseList[T any](values []string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, v := range values {
		x, err := parse(strings.TrimSpace(v))
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, nil
}

// parsePrefixOrAddr parses a CIDR, or an address as its single-address
// prefix.
func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}
