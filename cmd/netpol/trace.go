package main

import (
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/report"
)

// traceDisagrees is the exit status of `netpol trace` when the traced
// tables and explain reach different verdicts.
const traceDisagrees = 3

func newTraceCommand(in *inputFlags) *cobra.Command {
	var (
		port, output, family string
		allRules             bool
		live                 liveTraceOptions
		agent                agentPortFlags
		layout               = layoutFlag{compiler.DefaultLayout}
	)
	cmd := &cobra.Command{
		Use:   "trace SRC DST",
		Short: "Trace a connection's first packet through the nftables tables of its nodes, rule by rule, next to explain",
		Long: `Trace compiles the tables the agent programs on every node (the policy table
and the Service NAT table) and runs the connection's first packet through
them with an exact interpreter of the expressions sent to the kernel: each
hook it crosses on the source's node and the destination's node, each rule it
is evaluated against (in nft syntax, with the policy and rule it came from),
the set element that matched, and the verdict. Explain's verdict is printed
beside it. A Service destination is traced through DNAT; with several
endpoints, every one the node may choose is a path of its own.

SRC and DST are as for explain: namespace/pod, an IP address, svc/NS/NAME,
service/NS/NAME, nodeport/NODE/NS/NAME.

Exit status: 0 when trace and explain agree, 3 when they disagree, 1 on an
error.

With --live (root, on a node running the agent), the kernel's own trace is
shown instead: nftrace is armed for packets of that tuple for --duration, each
real packet's path is printed as the kernel reports it, then it is disarmed.`,
		Example: "  netpol trace -f examples/demo web/frontend api/orders --port tcp/8080\n" +
			"  netpol trace -f examples/demo sandbox/toolbox svc/api/orders --port tcp/80 -o json\n" +
			"  sudo netpol trace --live 10.244.1.5 10.244.2.7 --port tcp/8080 --duration 30s",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: completeEndpoints(in),
		RunE: func(cmd *cobra.Command, args []string) error {
			probe, err := connectionArgs(output, port)
			if err != nil {
				return err
			}
			if live.enabled {
				return liveTrace(cmd.Context(), cmd.OutOrStdout(), args[0], args[1], probe, output, live)
			}
			fam, err := ipfamily.Parse(family)
			if err != nil {
				return err
			}
			l, ap, err := loadGuarded(cmd, in, &agent)
			if err != nil {
				return err
			}
			tr, err := traceConnection(l, args[0], args[1], probe, fam, dataplane.Options{AgentPorts: ap, Layout: layout.layout})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if ok, err := writeStructured(out, output, tr); ok {
				if err != nil {
					return err
				}
			} else {
				writeTrace(out, tr, allRules, terminalStyle(out), report.NewRules(l.model, l.snap))
			}
			if err := l.done(); err != nil {
				return err
			}
			if !tr.Agree {
				return &exitError{code: traceDisagrees, msg: fmt.Sprintf("the traced tables say %s, explain says %s", verdictWord(tr.Allowed), verdictWord(tr.explainAllowed))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&port, "port", "tcp/80", "protocol/port of the connection (tcp, udp or sctp)")
	f.StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	f.StringVar(&family, "family", "", "address family for dual-stack pods: ipv4 or ipv6 (default: the destination's primary address)")
	agent.register(cmd)
	layout.register(cmd, "")
	f.BoolVar(&allRules, "all-rules", false, "text: also every rule the packet was checked against that did not match (default: only those that matched; JSON always has every rule)")
	f.BoolVar(&live.enabled, "live", false, "show the kernel's own trace of real packets on this node (root; the agent's tables)")
	f.DurationVar(&live.duration, "duration", 10*time.Second, "with --live: how long to trace")
	f.StringVar(&live.netns, "netns", "", "with --live: the network namespace to trace in (a name under /run/netns or a path; default: this one)")
	return cmd
}

// traceResult is `netpol trace -o json`.
type traceResult struct {
	// Allowed is the traced tables' verdict: every path accepted.
	Allowed bool `json:"allowed"`
	// Agree says explain reached the same verdict.
	Agree   bool `json:"agree"`
	Explain any  `json:"explain"`
	// Path is the first path's steps; Alternatives lists every path when
	// there are several (a Service's endpoints).
	Path           []report.TraceStep  `json:"path"`
	Alternatives   []report.TracedPath `json:"alternatives,omitempty"`
	explainText    func(io.Writer, report.Style, *report.Rules)
	explainAllowed bool
	paths          []report.TracedPath // every path, also when there is one
}

// traceConnection explains src -> dst and traces it through the compiled
// tables of every node.
func traceConnection(l *loaded, src, dst string, probe l4.Port, fam ipfamily.Family, opts dataplane.Options) (*traceResult, error) {
	target, isService, err := serviceDestination(l.snap, dst, probe)
	if err != nil {
		return nil, err
	}
	tr := &traceResult{}
	var srcEp, dstEp eval.Endpoint
	if isService {
		sv, err := explainService(l, src, target, probe, fam)
		if err != nil {
			return nil, err
		}
		tr.Explain, tr.explainAllowed = sv, sv.Allowed
		tr.explainText = func(w io.Writer, s report.Style, r *report.Rules) { writeServiceVerdict(w, sv, s, r) }
		addr, err := dialAddress(l.snap, target, sv)
		if err != nil {
			return nil, err
		}
		if srcEp, err = l.evaluator.Endpoint(src, fam, addr); err != nil {
			return nil, fmt.Errorf("source: %w", err)
		}
		dstEp = l.evaluator.Resolved().EndpointOf(addr)
	} else {
		v, err := l.evaluator.Explain(src, dst, probe, fam)
		if err != nil {
			return nil, err
		}
		tr.Explain, tr.explainAllowed = v, v.Allowed
		tr.explainText = func(w io.Writer, s report.Style, r *report.Rules) { report.ExplainRules(w, v, s, r) }
		if dstEp, err = l.evaluator.Endpoint(dst, fam, netip.Addr{}); err != nil {
			return nil, fmt.Errorf("destination: %w", err)
		}
		if srcEp, err = l.evaluator.Endpoint(src, fam, dstEp.Addr); err != nil {
			return nil, fmt.Errorf("source: %w", err)
		}
	}
	dp, err := dataplane.NewWith(l.snap, l.evaluator, opts)
	if err != nil {
		return nil, fmt.Errorf("compiling the nodes' tables: %w", err)
	}
	paths, err := dp.Paths(srcEp, dstEp, probe)
	if err != nil {
		return nil, err
	}
	tr.Allowed = len(paths) > 0
	for _, p := range paths {
		tp := report.Traced(p)
		tr.Allowed = tr.Allowed && p.Allowed
		tr.Alternatives = append(tr.Alternatives, tp)
	}
	if len(tr.Alternatives) > 0 {
		tr.Path = tr.Alternatives[0].Path
	}
	tr.paths = tr.Alternatives
	if len(tr.Alternatives) == 1 {
		tr.Alternatives = nil
	}
	tr.Agree = tr.Allowed == tr.explainAllowed
	return tr, nil
}

// dialAddress is the address a Service connection is sent to: the address
// given, the node's for a NodePort, else the ClusterIP of the family
// explain chose.
func dialAddress(snap *cluster.Snapshot, t serviceTarget, sv *serviceVerdict) (netip.Addr, error) {
	if a, err := netip.ParseAddr(sv.Address); err == nil {
		return a.Unmap(), nil
	}
	if t.addr.IsValid() {
		return t.addr, nil
	}
	return netip.Addr{}, fmt.Errorf("%s: no address to dial (explain found none)", t.given)
}

func verdictWord(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// writeTrace prints the explanation, then each path hook by hook: the
// rules that matched, with their verdicts and elements (with all, also
// those that did not; explain above already names the policy rules that
// did not decide).
func writeTrace(w io.Writer, tr *traceResult, all bool, s report.Style, rules *report.Rules) {
	tr.explainText(w, s, rules)
	fmt.Fprintln(w)
	paths := tr.Alternatives
	if paths == nil {
		paths = []report.TracedPath{{Allowed: tr.Allowed, Path: tr.Path}}
		if len(tr.paths) == 1 {
			paths[0] = tr.paths[0]
		}
	}
	report.Paths(w, paths, all, s)
	if tr.Agree {
		fmt.Fprintf(w, "explain and the traced tables agree: %s\n", verdictWord(tr.Allowed))
	} else {
		fmt.Fprintf(w, "DISAGREEMENT: the traced tables say %s, explain says %s\n", verdictWord(tr.Allowed), verdictWord(tr.explainAllowed))
	}
}
