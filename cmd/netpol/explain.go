package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/report"
)

func newExplainCommand(in *inputFlags) *cobra.Command {
	var (
		port, output, family string
		learned              string
		exitCode, staged     bool
		agent                agentPortFlags
	)
	cmd := &cobra.Command{
		Use:   "explain SRC DST",
		Short: "Explain why a connection is allowed or denied",
		Long: `Explain evaluates one connection in both directions (the source's egress, the
destination's ingress) and says which tier, policy and rule decided, and why
each earlier rule did not (with what it wanted: peers, ports, named ports as
the destination declares them).

SRC is a pod (namespace/name) or an IP address. DST is a pod, an IP address, or
a Service, explained after DNAT as the kernel sees it (see below).

An address that a domainNames rule admits is matched against what DNS taught:
--learned names a node agent's /debug/dns (a URL, or a file holding its JSON),
and explain says which name's answer taught the address, when, and when it
expires; offline, a state with the lab's zone (ConfigMap
kube-system/netpol-lab-dns) teaches every name of the zone. Without either,
domainNames match nothing.

Services:
  svc/NAMESPACE/NAME or service/NAMESPACE/NAME   its ClusterIP; --port is the service port
  nodeport/NODE/NAMESPACE/NAME                   its NodePort on NODE's address; --port is the node port
  an address that is a Service's ClusterIP, load-balancer IP or external IP
  (with one of its ports), or a node's address with a NodePort
Each endpoint the DNATing node may choose is explained at its target port,
from the client or, when the Service masquerades it, from the node. A Service
is allowed iff every such endpoint is.

With --staged, the connection is explained twice: as enforced, and with the
staged policies (annotation netpol.io/staged: "true", which netpol does not
enforce) enforced too; the output says whether the verdict differs.

Exit status: 0 when the explanation was printed (whatever the verdict), 1 on
an error or when some input object was invalid (reported on stderr); with
--exit-code, also 1 when the connection is denied (as enforced).`,
		Example: "  netpol explain -f cluster.yaml x/a y/b --port tcp/80\n" +
			"  netpol explain x/a 10.0.0.7 --port udp/53 -o json\n" +
			"  netpol explain x/a svc/y/web --port tcp/80\n" +
			"  netpol explain x/a 203.0.113.10 --port tcp/443 --learned http://127.0.0.1:9755/debug/dns\n" +
			"  netpol explain 192.168.77.254 nodeport/node-1/y/web --port tcp/30080\n" +
			"  netpol explain x/a y/b --exit-code >/dev/null && echo allowed\n" +
			"  netpol explain x/a y/b --staged       # and with the staged policies enforced",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeEndpoints(in),
		RunE: func(cmd *cobra.Command, args []string) error {
			probe, err := connectionArgs(output, port)
			if err != nil {
				return err
			}
			fam, err := ipfamily.Parse(family)
			if err != nil {
				return err
			}
			if _, _, err := parseServiceName(args[1]); err != nil {
				return err // before reading the cluster
			}
			l, ap, err := loadGuarded(cmd, in, &agent)
			if err != nil {
				return err
			}
			if err := learnDomains(cmd.Context(), l, learned); err != nil {
				return err
			}
			target, isService, err := serviceDestination(l.snap, args[1], probe)
			if err != nil {
				return err
			}
			if isService {
				// First: explaining may fail for want of the entries left out.
				l.reportErrors(cmd.ErrOrStderr(), serviceErrors(l.snap, target.namespace, target.name))
			}
			out := cmd.OutOrStdout()
			style := terminalStyle(out)
			// explainIn explains the connection with l's policies.
			explainIn := func(l *loaded) (allowed bool, result any, text func(), err error) {
				rules := report.NewRules(l.model, l.snap)
				if isService {
					sv, err := explainService(l, args[0], target, probe, fam)
					if err != nil {
						return false, nil, nil, err
					}
					return sv.Allowed, sv, func() { writeServiceVerdict(out, sv, style, rules) }, nil
				}
				v, err := l.evaluator.Explain(args[0], args[1], probe, fam)
				if err != nil {
					return false, nil, nil, err
				}
				return v.Allowed, v, func() { report.ExplainRules(out, v, style, rules) }, nil
			}
			allowed, result, text, err := explainIn(l)
			if err != nil {
				return err
			}
			if staged {
				lp := l.promoted(ap)
				if err := learnDomains(cmd.Context(), lp, learned); err != nil {
					return err
				}
				wouldAllow, stagedResult, stagedText, err := explainIn(lp)
				if err != nil {
					return err
				}
				result, text = stagedExplanation(out, l.model, allowed, wouldAllow, result, stagedResult, text, stagedText)
			}
			if ok, err := writeStructured(out, output, result); ok {
				if err != nil {
					return err
				}
			} else {
				text()
			}
			if err := l.done(); err != nil {
				return err
			}
			if exitCode && !allowed {
				return &deniedError{}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&port, "port", "tcp/80", "protocol/port of the connection (tcp, udp or sctp)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	cmd.Flags().StringVar(&family, "family", "", "address family for dual-stack pods: ipv4 or ipv6 (default: the destination's primary address)")
	agent.register(cmd)
	cmd.Flags().StringVar(&learned, "learned", "", "what the source's node learned from DNS for domainNames rules: its agent's /debug/dns URL (on the node: http://127.0.0.1:9755/debug/dns) or a file with that JSON")
	cmd.Flags().BoolVar(&exitCode, "exit-code", false, "exit with status 1 when the connection is denied (for scripts)")
	cmd.Flags().BoolVar(&staged, "staged", false, `also explain it with the staged policies (netpol.io/staged: "true") enforced, and say whether the verdict differs`)
	return cmd
}

// stagedVerdicts is explain --staged's structured output.
type stagedVerdicts struct {
	// Staged are the staged policies; Differs says whether enforcing them
	// changes the verdict.
	Staged   []string `json:"stagedPolicies"`
	Differs  bool     `json:"differs"`
	Enforced any      `json:"enforced"`
	// WithStaged is the explanation with the staged policies enforced.
	WithStaged any `json:"withStaged"`
}

// stagedExplanation is explain --staged's result and text: the enforced
// explanation, then the one with the staged policies enforced.
func stagedExplanation(out io.Writer, model *policy.Model, allowed, wouldAllow bool, enforced, withStaged any, text, stagedText func()) (any, func()) {
	sv := stagedVerdicts{Staged: []string{}, Differs: allowed != wouldAllow, Enforced: enforced, WithStaged: withStaged}
	for _, p := range model.Staged {
		sv.Staged = append(sv.Staged, p.Ref())
	}
	return sv, func() {
		text()
		fmt.Fprintln(out)
		switch {
		case len(sv.Staged) == 0:
			fmt.Fprintln(out, "No policy is staged (netpol.io/staged: \"true\"): the verdict is the same.")
			return
		case sv.Differs:
			fmt.Fprintf(out, "With the staged policies enforced (%s), the verdict DIFFERS: %s instead of %s.\n\n",
				strings.Join(sv.Staged, ", "), allowedWord(wouldAllow), allowedWord(allowed))
		default:
			fmt.Fprintf(out, "With the staged policies enforced (%s), the verdict is the same: %s.\n\n", strings.Join(sv.Staged, ", "), allowedWord(wouldAllow))
		}
		stagedText()
	}
}
