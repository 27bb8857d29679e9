package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	nodepkg "github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/proxy"
)

func newCompileCommand(in *inputFlags) *cobra.Command {
	var (
		node     string
		table    string
		stats    bool
		services bool
		agent    agentPortFlags
		dns      string
		dnsQueue uint16
		counters bool
		layout   = layoutFlag{compiler.DefaultLayout}
	)
	cmd := &cobra.Command{
		Use:   "compile --node NAME",
		Short: "Print the nftables ruleset the agent programs on a node, in nft syntax",
		Long: "Print the nftables ruleset (table inet netpol) that enforces the cluster's policies on one node,\n" +
			"or with --services the Service NAT table (inet netpol-proxy) the agent programs there.\n" +
			"The text is generated without the nft binary; `nft -f` accepts it.",
		Example: "  netpol compile -f examples/demo --node node-1\n" +
			"  netpol compile -f examples/demo --node node-1 --services\n" +
			"  netpol compile -f cluster.yaml --node node-2 --stats\n" +
			"  netpol compile -f cluster.yaml --node node-1 --protect-agent-ports 9756 --agent-ports-allow 10.244.3.0/24\n" +
			"  netpol compile -f examples/lab-dns.yaml --node node-1 --dns native",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if node == "" {
				return fmt.Errorf("--node is required: the ruleset is per node")
			}
			l, err := in.load(cmd.Context(), cmd.InOrStdin(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			var t *nft.Table
			if services {
				if table == compiler.DefaultTable {
					table = proxy.DefaultTable
				}
				m := proxy.Build(l.snap, node, proxy.Options{})
				l.reportErrors(cmd.ErrOrStderr(), m.Errors)
				if t, err = proxy.Compile(m, proxy.CompileOptions{Table: table}); err != nil {
					return err
				}
			} else {
				opts := compiler.Options{Node: node, Table: table, Layout: layout.layout, RuleCounters: counters}
				if layout.layout == compiler.LayoutIdentities {
					opts.Staged = l.model.Staged // evaluated beside the enforced ones, logged where they differ
				}
				if opts.AgentPorts, err = agent.parse(); err != nil {
					return err
				}
				switch dns {
				case "none":
				case "native", "xtables":
					kind := nft.QueueNative
					if dns == "xtables" {
						kind = nft.QueueXtables
					}
					opts.DNS = &compiler.DNS{Queue: kind, QueueNum: dnsQueue, Servers: nodepkg.ClusterDNS(l.snap.EndpointSlices)}
				default:
					return fmt.Errorf("--dns %q: none, native or xtables", dns)
				}
				if t, err = compiler.Compile(l.evaluator.Resolved(), opts); err != nil {
					return err
				}
			}
			if stats {
				n := t.Count()
				fmt.Fprintf(cmd.ErrOrStderr(), "node %s: %d chains, %d rules, %d sets, %d set elements\n", node, n.Chains, n.Rules, n.Sets, n.Elements)
			}
			if err := t.Render(cmd.OutOrStdout()); err != nil {
				return err
			}
			return l.done()
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "the node to compile for (a Node in the cluster state)")
	f.StringVar(&table, "table", compiler.DefaultTable, "name of the inet table")
	f.BoolVar(&stats, "stats", false, "print the kernel object counts to stderr")
	layout.register(cmd, "")
	f.BoolVar(&services, "services", false, "print the Service NAT table instead of the policy table")
	f.StringVar(&dns, "dns", "none", "the agent's DNS chains for domainNames (on by default in the agent): none, native (the nftables queue statement) or xtables (the NFQUEUE target through nft compat, for kernels without nft_queue; not nft syntax)")
	f.Uint16Var(&dnsQueue, "dns-queue", nodepkg.DefaultDNSQueue, "with --dns: the queue number, as the agent's --dns-queue")
	f.BoolVar(&counters, "rule-counters", false, "the agent's per-rule counters (on by default in the agent): a named counter per policy rule on each rule that decides for it, NetworkPolicy rules laid out one at a time")
	agent.register(cmd)
	return cmd
}

// layoutFlag is --layout: the policy table's layout (compiler.Layout).
type layoutFlag struct{ layout compiler.Layout }

func (l *layoutFlag) register(cmd *cobra.Command, prefix string) {
	cmd.Flags().Var(l, "layout", prefix+"the policy table's layout: identities (the agent's: pods as identities in the packet mark, "+
		"peers as sets of identities, a table that grows with pods plus policies) or addresses (peers as sets of pod addresses)")
}

func (l *layoutFlag) String() string { return l.layout.String() }

func (l *layoutFlag) Set(s string) (err error) {
	l.layout, err = compiler.ParseLayout(s)
	return err
}

func (l *layoutFlag) Type() string { return "layout" }
