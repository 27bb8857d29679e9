package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/report"
)

func newTableCommand(in *inputFlags) *cobra.Command {
	var (
		ports         []string
		output        string
		family        string
		namespaces    []string
		allNamespaces bool
		denied        bool
		engine        string
		layout        = layoutFlag{compiler.DefaultLayout}
		agent         agentPortFlags
		domains       bool
		dnsTCP        bool
	)
	cmd := &cobra.Command{
		Use:   "table",
		Short: "Print the truth table of what policy allows, pod to pod, per port",
		Example: "  netpol table -f cluster.yaml --ports tcp/80,udp/53\n" +
			"  netpol table -n prod -o json | jq '.results[] | select(.allowed == false)'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			probes, fam, err := parseTableFlags(output, ports, family)
			if err != nil {
				return err
			}
			if allNamespaces {
				namespaces = nil
			}
			l, ap, err := loadGuarded(cmd, in, &agent)
			if err != nil {
				return err
			}
			if domains {
				rows, err := expectedDomains(l, probes, dnsTCP)
				if err != nil {
					return err
				}
				if err := writeDomainRows(cmd.OutOrStdout(), rows, output); err != nil {
					return err
				}
				return l.done()
			}
			t, err := truthTable(l, engine, dataplane.Options{AgentPorts: ap, Layout: layout.layout}, eval.TruthTableOptions{Probes: probes, Namespaces: namespaces, Family: fam})
			if err != nil {
				return err
			}
			if len(t.Skipped) > 0 {
				what := "an address"
				if family != "" {
					what = "an " + family + " address"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %d pod(s) left out, without %s: %s\n", len(t.Skipped), what, strings.Join(t.Skipped, ", "))
			}
			noPodsNotes(cmd.ErrOrStderr(), l, namespaces)
			if denied {
				t = deniedOnly(t)
			}
			if err := writeTable(cmd.OutOrStdout(), t, output); err != nil {
				return err
			}
			return l.done()
		},
	}
	f := cmd.Flags()
	agent.register(cmd)
	f.StringVar(&engine, "engine", "eval", "who decides each cell: eval (the policy evaluator) or nft (each packet traced through the nftables tables compiled for its nodes)")
	layout.register(cmd, "with --engine nft: ")
	f.StringSliceVar(&ports, "ports", nil, "probes as protocol/port, comma-separated (default: every port the pods declare)")
	f.StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	f.StringVar(&family, "family", "", "address family for dual-stack pods: ipv4 or ipv6 (default: each pod's primary address)")
	f.StringSliceVarP(&namespaces, "namespace", "n", nil, "only pods of these namespaces (default: all)")
	f.BoolVarP(&allNamespaces, "all-namespaces", "A", false, "pods of every namespace")
	f.BoolVar(&denied, "denied", false, "show only the denied cells (text: one per line)")
	f.BoolVar(&domains, "domains", false, "instead of the pod table: every pod to every name of the lab's zone (ConfigMap kube-system/netpol-lab-dns), resolved from the zone, as `lab probe --domains` probes it")
	f.BoolVar(&dnsTCP, "dns-tcp", false, "with --domains: the pods resolve over TCP (the cluster DNS must admit tcp/53)")
	return cmd
}

// truthTable computes the table with the engine asked for: the evaluator,
// or the compiled tables of every node traced packet by packet (what the
// kernels would do).
func truthTable(l *loaded, engine string, dpOpts dataplane.Options, opts eval.TruthTableOptions) (*eval.TruthTable, error) {
	switch engine {
	case "eval":
		return l.evaluator.TruthTable(opts), nil
	case "nft":
		dp, err := dataplane.NewWith(l.snap, l.evaluator, dpOpts)
		if err != nil {
			return nil, fmt.Errorf("compiling the nodes' tables: %w", err)
		}
		return dp.TruthTable(opts)
	}
	return nil, fmt.Errorf("--engine %q: want eval or nft", engine)
}

// writeTable prints a truth table (the evaluator's or the kernel's) in the
// format asked for; the JSON shape is the CLI contract.
func writeTable(out io.Writer, t *eval.TruthTable, format string) error {
	if format == "json" {
		return report.TruthTableJSON(out, t)
	}
	if ok, err := writeStructured(out, format, t); ok {
		return err
	}
	report.TruthTable(out, t, terminalStyle(out))
	return nil
}

// parseTableFlags checks the flags every truth-table command shares.
func parseTableFlags(output string, ports []string, family string) ([]l4.Port, ipfamily.Family, error) {
	if err := checkFormat(output, "table", "json", "yaml"); err != nil {
		return nil, "", err
	}
	probes, err := l4.ParsePorts(ports)
	if err != nil {
		return nil, "", err
	}
	fam, err := ipfamily.Parse(family)
	return probes, fam, err
}
