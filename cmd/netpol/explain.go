package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/report"
)

func newExplainCommand(in *inputFlags) *cobra.Command {
	var port, output, family string
	cmd := &cobra.Command{
		Use:   "explain SRC DST",
		Short: "Explain why a connection is allowed or denied",
		Long: `Explain evaluates one connection in both directions (the source's egress, the
destination's ingress) and says which tier, policy and rule decided, and why
each earlier rule did not. SRC and DST are pods (namespace/name) or IP
addresses; DST may also be a Service, svc/NAMESPACE/NAME, with --port its
service port: each endpoint the source's node would send the connection to
is explained at its target port (policy sees the endpoint, after DNAT).`,
		Example: "  netpol explain -f cluster.yaml x/a y/b --port tcp/80\n  netpol explain x/a 10.0.0.7 --port udp/53 -o json\n  netpol explain x/a svc/y/web --port tcp/80",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "text", "json", "yaml"); err != nil {
				return err
			}
			probe, err := eval.ParseProbe(port)
			if err != nil {
				return err
			}
			fam, err := eval.ParseFamily(family)
			if err != nil {
				return err
			}
			l, err := in.load(cmd.Context(), cmd.InOrStdin(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if strings.HasPrefix(args[1], "svc/") {
				sv, err := explainService(l, args[0], args[1], probe, fam)
				if err != nil {
					return err
				}
				if ok, err := writeStructured(out, output, sv); ok {
					if err != nil {
						return err
					}
					return l.done()
				}
				writeServiceVerdict(out, sv, terminalStyle(out))
				return l.done()
			}
			v, err := l.evaluator.Explain(args[0], args[1], probe, fam)
			if err != nil {
				return err
			}
			if ok, err := writeStructured(out, output, v); ok {
				if err != nil {
					return err
				}
				return l.done()
			}
			report.Explain(out, v, terminalStyle(out))
			return l.done()
		},
	}
	cmd.Flags().StringVar(&port, "port", "tcp/80", "protocol/port of the connection (tcp, udp or sctp)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	cmd.Flags().StringVar(&family, "family", "", "address family for dual-stack pods: ipv4 or ipv6 (default: the destination's primary address)")
	return cmd
}
