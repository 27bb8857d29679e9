package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/agent"
	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/report"
)

// labPrefix is what every lab namespace name starts with.
const labPrefix = "netpol-"

func newLabCommand(in *inputFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A cluster data plane on this machine: nodes and pods as network namespaces, enforced by the real kernel",
		Long: "The lab turns a cluster state file into network namespaces (an underlay, one per node, one per pod),\n" +
			"programs each node's nftables ruleset as the agent would, and runs probe servers in every pod.\n" +
			"It needs root. Every namespace name starts with \"" + labPrefix + "\".",
	}
	cmd.AddCommand(newLabUpCommand(in), newLabProbeCommand(in), newLabStatusCommand(), newLabDownCommand())
	return cmd
}

// signalContext is cancelled on SIGINT and SIGTERM, so labs are torn down
// on every exit path.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// startLab brings a lab up from the input and programs every node. Every
// pod serves the ports of probes (default: every port any pod declares),
// as upstream's test servers do, so a closed port is never mistaken for a
// policy denial.
func startLab(ctx context.Context, cmd *cobra.Command, in *inputFlags, prefix string, probes []l4.Port) (*loaded, *lab.Lab, *conformance.Enforcer, error) {
	l, lb, enf, _, err := startLabWith(ctx, cmd, in, prefix, probes, false, nil)
	return l, lb, enf, err
}

// startLabWith is startLab, and returns the probes served; with domains
// the outside serves them on the zone's addresses and the nodes learn
// from DNS answers, as the agent does.
func startLabWith(ctx context.Context, cmd *cobra.Command, in *inputFlags, prefix string, probes []l4.Port, domains bool, configure func(*conformance.Enforcer)) (*loaded, *lab.Lab, *conformance.Enforcer, []l4.Port, error) {
	if len(in.files) == 0 {
		return nil, nil, nil, nil, errors.New("the lab is built from a state file: give -f PATH")
	}
	l, err := in.load(ctx, cmd.InOrStdin(), cmd.ErrOrStderr())
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if len(l.snap.Nodes) == 0 {
		return nil, nil, nil, nil, fmt.Errorf("the state in %s has no Node objects: the lab makes one network namespace per Node and puts each pod on its spec.nodeName; add the Nodes (kubectl get nodes -o yaml)", strings.Join(in.files, ", "))
	}
	if os.Geteuid() != 0 {
		return nil, nil, nil, nil, errors.New("the lab needs root (network namespaces and nftables)")
	}
	if probes, err = probesOrDeclared(l, probes); err != nil {
		return nil, nil, nil, nil, err
	}
	// The lab names its namespaces PREFIX-underlay, PREFIX-n-0, ...: a
	// prefix given with its dash ("netpol-x-") must not double it.
	prefix = strings.TrimRight(prefix, "-")
	if prefix != "" && !strings.HasPrefix(prefix+"-", labPrefix) {
		return nil, nil, nil, nil, fmt.Errorf("--prefix %q: lab prefixes start with %q", prefix, labPrefix)
	}
	stderr := cmd.ErrOrStderr()
	fmt.Fprintf(stderr, "lab: bringing up %d node(s) and %d pod(s) as network namespaces...\n", len(l.snap.Nodes), len(l.snap.Pods))
	opts := lab.Options{Prefix: prefix, ExtraPorts: probes}
	if domains {
		opts.OutsidePorts = probes
	}
	lb, err := lab.Up(ctx, l.snap, opts)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	fmt.Fprintf(stderr, "lab %s is up: %s\n", lb.Prefix(), labSize(lb))
	for _, n := range lb.Notes() {
		fmt.Fprintln(stderr, "note:", n)
	}
	fmt.Fprintf(stderr, "lab %s: programming %d node(s)\n", lb.Prefix(), len(lb.Nodes()))
	enf := conformance.NewEnforcer(lb)
	enf.Layout = compiler.DefaultLayout // the agent's
	if domains {
		enf.DNS = &node.DNSOptions{}
	}
	if configure != nil {
		configure(enf)
	}
	if _, err := enf.Sync(l.snap); err != nil {
		enf.Close()
		return nil, nil, nil, nil, errors.Join(err, lb.Down())
	}
	return l, lb, enf, probes, nil
}

func newLabUpCommand(in *inputFlags) *cobra.Command {
	var (
		prefix     string
		watch      bool
		auditMode  string
		auditPath  string
		auditGroup uint16
		auditRate  float64
	)
	cmd := &cobra.Command{
		Use:   "up -f PATH",
		Short: "Bring a lab up from a state file and keep it until interrupted",
		Long: "Bring a lab up from a state file, program every node, print where everything is, and keep\n" +
			"the probe servers running until SIGINT or SIGTERM (or until `netpol lab down` removes its\n" +
			"namespaces); then tear everything down and say what was removed.\n\n" +
			"The probe servers are not HTTP: on TCP (and SCTP) they write the pod's namespace/name and\n" +
			"close; on UDP they answer each datagram with it. So a connection test is, from a pod's\n" +
			"namespace (bash's /dev/tcp needs no other tool):\n" +
			"  sudo ip netns exec POD-NETNS timeout 2 bash -c 'cat </dev/tcp/POD-IP/PORT'\n" +
			"which prints the answering pod, or fails after 2 seconds when policy drops it.",
		Example: "  sudo netpol lab up -f examples/demo\n" +
			"  sudo netpol lab up -f examples/demo --watch   # edit the files: each change is programmed, open flows it denies ended\n" +
			"  sudo netpol lab status -o json                 # each pod's network namespace and addresses, for scripts\n" +
			"  # in another terminal (lab up prints the namespaces and addresses):\n" +
			"  sudo ip netns exec netpol-1a2b3c-p-0 timeout 2 bash -c 'cat </dev/tcp/10.244.2.10/8080'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			// The verdict log runs whatever --audit says, as the agent's: a
			// policy's netpol.io/audit asks for its own lines.
			a := agent.AuditOptions{Mode: auditMode, Group: auditGroup, Log: auditPath, Rate: auditRate}
			if err := a.Validate(); err != nil {
				return err
			}
			w, err := labAuditWriter(cmd, auditPath)
			if err != nil {
				return err
			}
			defer w.Close()
			auditLog := audit.NewLogger(w, audit.LoggerOptions{Rate: auditRate})
			defer auditLog.Close()
			configure := func(e *conformance.Enforcer) {
				e.Audit = &node.AuditOptions{Audit: compiler.Audit{Mode: auditMode, Group: auditGroup}, Logger: auditLog}
			}
			l, lb, enf, _, err := startLabWith(ctx, cmd, in, prefix, nil, false, configure)
			if err != nil {
				return err
			}
			defer enf.Close()
			defer lb.Down()
			out := cmd.OutOrStdout()
			writeLabStatus(out, lb)
			if try := tryCommand(lb); try != "" {
				fmt.Fprintf(out, "try (in another terminal):\n  %s\n", try)
			}
			status := lb.Status()
			status.PID, status.Files, status.Synced = os.Getpid(), absPaths(in.files), time.Now().UTC()
			if err := lab.WriteStatus(status); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", err)
			}
			fmt.Fprintf(out, "lab is up; press Ctrl-C (or run `netpol lab down --prefix %s`) to tear it down\n", lb.Prefix())
			size := labSize(lb)
			watchCtx, stopWatch := context.WithCancel(ctx)
			watched := make(chan error, 1)
			if watch {
				go func() { watched <- watchLabFiles(watchCtx, in, lb, enf, status, out, cmd.ErrOrStderr()) }()
			} else {
				watched <- nil
			}
			gone := waitLab(ctx, lb, time.Second)
			stopWatch()
			if err := <-watched; err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "error:", err)
			}
			enf.Close()
			if err := lb.Down(); err != nil {
				return err
			}
			if gone != "" {
				fmt.Fprintf(out, "%s; stopped the probe servers and removed the rest of lab %s (%s)\n", gone, lb.Prefix(), size)
			} else {
				fmt.Fprintf(out, "removed lab %s: %s\n", lb.Prefix(), size)
			}
			return l.done()
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "namespace name prefix for this lab (default: "+labPrefix+"<random>)")
	cmd.Flags().StringVar(&auditMode, "audit", policy.AuditOff, "the verdict log, as the agent's --audit: off, deny or all (netpol.io/audit on a policy wins for its rules, whatever this says)")
	cmd.Flags().StringVar(&auditPath, "audit-log", "", "file the verdict log is written to (default: standard output)")
	cmd.Flags().Uint16Var(&auditGroup, "audit-group", compiler.DefaultAuditGroup, "NFLOG group the nodes' deciding rules log to")
	cmd.Flags().Float64Var(&auditRate, "audit-rate", audit.DefaultRate, "most verdict log lines a second")
	cmd.Flags().BoolVar(&watch, "watch", false, "re-read the files when they change and program the running lab from them, as the agent does (a difference applied; strict mode ends the open flows a change denies); files that do not load without an error are not synced")
	return cmd
}

// labAuditWriter is where `lab up --audit` writes: the file, or standard
// output.
func labAuditWriter(cmd *cobra.Command, path string) (io.WriteCloser, error) {
	if path == "" || path == "-" {
		return nopWriteCloser{cmd.OutOrStdout()}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--audit-log: %w", err)
	}
	return f, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// absPaths are paths made absolute (the lab's status names its files for
// other directories' processes).
func absPaths(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = p
		if abs, err := filepath.Abs(p); err == nil && p != "-" {
			out[i] = abs
		}
	}
	return out
}

func writeLabStatus(w io.Writer, lb *lab.Lab) {
	fmt.Fprintf(w, "lab %s\n", lb.Prefix())
	for _, n := range lb.Nodes() {
		fmt.Fprintf(w, "  node %-20s netns %-28s %v\n", n.Name, n.NetNS, n.Addrs)
	}
	for _, p := range lb.Pods() {
		where := p.NetNS
		if p.HostNetwork {
			where = "(host network of " + p.Node + ")"
		}
		fmt.Fprintf(w, "  pod  %-20s netns %-28s %v\n", p.Name, where, p.Addrs)
	}
	ext := lb.External()
	fmt.Fprintf(w, "  %-25s netns %-28s %v\n", "outside ("+lab.ExternalSource+")", ext.NetNS, ext.Addrs)
	for _, r := range ext.Routes {
		fmt.Fprintf(w, "    %s -> node %s (%s)\n", r.Dst, r.Node, r.Via)
	}
}

func newLabProbeCommand(in *inputFlags) *cobra.Command {
	var (
		prefix   string
		ports    []string
		family   string
		output   string
		compare  bool
		services bool
		domains  bool
		dnsTCP   bool
	)
	cmd := &cobra.Command{
		Use:   "probe -f PATH",
		Short: "Bring a lab up, probe every pod pair on every port, tear it down; print what the kernel did",
		Long: "Bring a lab up from a state file, program every node, probe the full pods x pods x ports\n" +
			"matrix with real connections, tear the lab down and print the OBSERVED table, in the same\n" +
			"shape as `netpol table` (so the two can be diffed). With --compare, print the evaluator's\n" +
			"table next to it and every difference; the exit status is 1 if there is one.\n\n" +
			"With --services, also probe every Service port: its ClusterIP from every pod, and its NodePort\n" +
			"(if any) on every node address from every pod and from outside the cluster (\"external\": the\n" +
			"lab's underlay). Each probe is one more object in the results array, with the pod-table fields\n" +
			"(to: service/NAMESPACE/NAME or nodeport/NODE/NAMESPACE/NAME; port: the port dialed) plus\n" +
			"endpoint (the pod that answered), result (ok, timeout, refused, ...) and address (the address\n" +
			"dialed). --family picks the ClusterIP of dual-stack Services (default: each one's primary).\n" +
			"--compare also checks each ClusterIP probe from a pod against policy after DNAT (the endpoints\n" +
			"the source's node would choose, as the evaluator judges them); NodePort probes are printed only.",
		Example: "  sudo netpol lab probe -f examples/demo -o json\n" +
			"  sudo netpol lab probe -f examples/demo --compare\n" +
			"  sudo netpol lab probe -f examples/demo --services -o json | jq '.results[] | select(.endpoint != null)'\n" +
			"  sudo netpol lab probe -f examples/lab-dns.yaml --domains --ports tcp/80 --compare",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			probes, fam, err := parseTableFlags(output, ports, family)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			if domains {
				return probeDomains(ctx, cmd, in, prefix, probes, dnsTCP, compare, output)
			}
			l, lb, enf, err := startLab(ctx, cmd, in, prefix, probes)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			nPorts := len(probes)
			if nPorts == 0 { // the default: every port the pods declare, as startLab chose
				nPorts = len(l.evaluator.TruthTable(eval.TruthTableOptions{Family: fam}).Ports)
			}
			fmt.Fprintf(stderr, "lab %s: probing %d pod(s) x %d pod(s) x %d port(s)\n", lb.Prefix(), len(lb.Pods()), len(lb.Pods()), nPorts)
			observed, notes, probeErr := lb.Probe(ctx, lab.ProbeOptions{Probes: probes, Family: fam, SkipUnsupported: true})
			var svcRows []report.ServiceResult
			var svcObs []lab.ServiceObservation
			if services && probeErr == nil {
				fmt.Fprintf(stderr, "lab %s: probing every Service port\n", lb.Prefix())
				var svcNotes []string
				svcObs, svcNotes, probeErr = lb.ProbeServices(ctx, lab.ServiceProbeOptions{Family: fam})
				notes = append(notes, svcNotes...)
				svcRows = serviceRows(svcObs)
				for i := range svcRows {
					svcRows[i].Why = serviceWhy(l, svcObs[i])
				}
			}
			enf.Close()
			size := labSize(lb)
			if err := errors.Join(probeErr, lb.Down()); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "lab %s removed: %s\n", lb.Prefix(), size)
			for _, n := range notes {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", n)
			}
			out := cmd.OutOrStdout()
			if !compare {
				if err := writeLabTable(out, observed, svcRows, services, output); err != nil {
					return err
				}
				return l.done()
			}
			// Compare on exactly the probes the kernel answered.
			answered, err := tableProbes(observed)
			if err != nil {
				return err
			}
			expected := l.evaluator.TruthTable(eval.TruthTableOptions{Probes: answered, Family: fam})
			diffs, err := conformance.Compare(expected, observed)
			if err != nil {
				return err
			}
			svcDiffs, compared, err := conformance.CompareServices(l.snap, l.evaluator, svcObs)
			if err != nil {
				return err
			}
			if err := writeComparison(out, comparisonInput{expected, observed, diffs, svcRows, svcDiffs, compared, services}, output); err != nil {
				return err
			}
			if n := len(diffs) + len(svcDiffs); n > 0 {
				return fmt.Errorf("the kernel disagrees with the evaluator on %d cell(s) and %d Service probe(s)", len(diffs), len(svcDiffs))
			}
			return l.done()
		},
	}
	f := cmd.Flags()
	f.StringVar(&prefix, "prefix", "", "namespace name prefix for this lab (default: "+labPrefix+"<random>)")
	f.StringSliceVar(&ports, "ports", nil, "probes as protocol/port, comma-separated (default: every port the pods declare)")
	f.StringVar(&family, "family", "", "address family for dual-stack pods: ipv4 or ipv6 (default: each pod's primary address)")
	f.StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	f.BoolVar(&compare, "compare", false, "also print the evaluator's table and every difference (with --services, ClusterIP probes too)")
	f.BoolVar(&services, "services", false, "also probe every Service port: ClusterIP from every pod, NodePort from every pod and from outside")
	f.BoolVar(&domains, "domains", false, "instead of the pod table: from every pod, resolve every name of the lab's zone (ConfigMap kube-system/netpol-lab-dns) through the cluster DNS and connect to its first address on each port; rows {from, to: dns/NAME, protocol, port, allowed, address, result}")
	f.BoolVar(&dnsTCP, "dns-tcp", false, "with --domains: resolve over TCP instead of UDP")
	return cmd
}

// serviceRows turns Service probes into result rows.
func serviceRows(obs []lab.ServiceObservation) []report.ServiceResult {
	rows := make([]report.ServiceResult, len(obs))
	for i, o := range obs {
		rows[i] = report.ServiceResult{From: o.From, To: o.To, Protocol: o.Protocol, Port: o.Port, Allowed: o.Allowed,
			Endpoint: o.Endpoint, Result: o.Result, Address: o.ToAddr.String()}
	}
	return rows
}

// serviceWhy says why a Service probe timed out: the Service's traffic
// policy (no endpoint for that node) or policy after DNAT, from the client
// or (NodePort, externalTrafficPolicy Cluster) its masqueraded address;
// "" for probes that did not time out.
func serviceWhy(l *loaded, o lab.ServiceObservation) string {
	if o.Allowed || o.Result != lab.ResultTimeout {
		return ""
	}
	t, ok, err := parseServiceName(o.To)
	if !ok || err != nil {
		return ""
	}
	t.addr = o.ToAddr
	from := o.From
	if from == lab.ExternalSource {
		from = o.FromAddr.String()
	}
	sv, err := explainService(l, from, t, l4.Port{Protocol: o.Protocol, Port: o.Port}, ipfamily.FromKubernetes(o.Family))
	if err != nil {
		return "not explained: " + err.Error()
	}
	if w := sv.why(); w != "" {
		return w
	}
	return "policy and the Service's traffic policy allow it: not explained by either"
}

// labSize counts what a lab is made of, for progress messages.
func labSize(lb *lab.Lab) string {
	pods, hostNet := 0, 0
	for _, p := range lb.Pods() {
		if p.HostNetwork {
			hostNet++
		} else {
			pods++
		}
	}
	s := fmt.Sprintf("%d network namespaces (underlay, %d node(s), %d pod(s))", 1+len(lb.Nodes())+pods, len(lb.Nodes()), pods)
	if hostNet > 0 {
		s += fmt.Sprintf(", %d host-network pod(s) in their nodes'", hostNet)
	}
	return s
}

// tryCommand is a connection test that works in the lab: from the first
// pod's namespace to the first other pod's first served TCP port.
func tryCommand(lb *lab.Lab) string {
	pods := lb.Pods()
	for _, from := range pods {
		if from.HostNetwork {
			continue
		}
		for _, to := range pods {
			if to.Name == from.Name || len(to.Addrs) == 0 {
				continue
			}
			for _, p := range to.Serves {
				if p.Protocol == "TCP" {
					return fmt.Sprintf("sudo ip netns exec %s timeout 2 bash -c 'cat </dev/tcp/%s/%d'   # %s -> %s: prints %s, or fails if denied",
						from.NetNS, to.Addrs[0], p.Port, from.Name, to.Name, to.Name)
				}
			}
		}
	}
	return ""
}

// waitLab returns when ctx is done ("") or when some of the lab's
// namespaces were removed from elsewhere (`netpol lab down`): then it says
// so.
func waitLab(ctx context.Context, lb *lab.Lab, every time.Duration) string {
	want := map[string]bool{}
	for _, n := range lb.Nodes() {
		want[n.NetNS] = true
	}
	for _, p := range lb.Pods() {
		want[p.NetNS] = true
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-tick.C:
		}
		labs, err := lab.List(lb.Prefix() + "-")
		if err != nil {
			continue
		}
		have := map[string]bool{}
		for _, names := range labs {
			for _, n := range names {
				have[n] = true
			}
		}
		var missing []string
		for n := range want {
			if !have[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Sprintf("%d of the lab's network namespaces were removed from elsewhere (%s ...; `netpol lab down`?)", len(missing), missing[0])
		}
	}
}

// writeLabTable prints the observed table and, with --services, the
// Service probes: in the same results array for json and yaml, as a
// second section for text.
func writeLabTable(out io.Writer, t *eval.TruthTable, rows []report.ServiceResult, services bool, format string) error {
	switch {
	case !services:
		return writeTable(out, t, format)
	case format == "json":
		return report.TruthTableJSON(out, t, rows...)
	case format == "yaml":
		_, err := writeStructured(out, format, report.TruthTableDocument(t, rows))
		return err
	}
	if err := writeTable(out, t, format); err != nil {
		return err
	}
	writeServiceSection(out, rows)
	return nil
}

func writeServiceSection(out io.Writer, rows []report.ServiceResult) {
	fmt.Fprintln(out, "\n== "+serviceHeader(rows)+" ==")
	report.ServiceProbes(out, rows, terminalStyle(out))
}

// serviceHeader says what the Service probes were: ClusterIPs from every
// pod and, only when the Services have them, NodePorts.
func serviceHeader(rows []report.ServiceResult) string {
	clusterIP, nodePort := 0, 0
	for _, r := range rows {
		if strings.HasPrefix(r.To, "nodeport/") {
			nodePort++
		} else {
			clusterIP++
		}
	}
	if nodePort == 0 {
		return fmt.Sprintf("Services: ClusterIP from every pod (%d probes); no NodePorts", clusterIP)
	}
	return fmt.Sprintf("Services: ClusterIP from every pod (%d probes), NodePort from every pod and from outside (%d probes)", clusterIP, nodePort)
}

// comparison is the --compare output for json and yaml. Differences
// include those of ClusterIP probes (with --services).
type comparison struct {
	Expected    *eval.TruthTable       `json:"expected"`
	Observed    *eval.TruthTable       `json:"observed"`
	Differences []string               `json:"differences"`
	Services    []report.ServiceResult `json:"services,omitempty"`
}

// comparisonInput is what --compare prints.
type comparisonInput struct {
	expected, observed *eval.TruthTable
	diffs              []conformance.Difference
	rows               []report.ServiceResult
	serviceDiffs       []conformance.ServiceDifference
	servicesCompared   int
	services           bool
}

func writeComparison(out io.Writer, c comparisonInput, format string) error {
	lines := make([]string, 0, len(c.diffs)+len(c.serviceDiffs))
	for _, d := range c.diffs {
		lines = append(lines, d.String())
	}
	for _, d := range c.serviceDiffs {
		lines = append(lines, d.String())
	}
	if ok, err := writeStructured(out, format, comparison{c.expected, c.observed, lines, c.rows}); ok {
		return err
	}
	fmt.Fprintln(out, "== Evaluator (what policy says) ==")
	if err := writeTable(out, c.expected, format); err != nil {
		return err
	}
	fmt.Fprintln(out, "\n== Kernel (what the lab's packets did) ==")
	if err := writeTable(out, c.observed, format); err != nil {
		return err
	}
	if len(c.diffs) == 0 {
		fmt.Fprintf(out, "\nno differences: the kernel agrees with the evaluator on all %d cells\n", len(c.expected.Results))
	} else {
		fmt.Fprintf(out, "\n%d difference(s):\n  %s\n", len(c.diffs), strings.Join(lines[:len(c.diffs)], "\n  "))
	}
	if !c.services {
		return nil
	}
	writeServiceSection(out, c.rows)
	if len(c.serviceDiffs) == 0 {
		fmt.Fprintf(out, "no differences: the %d ClusterIP probes from pods are what policy after DNAT says\n", c.servicesCompared)
	} else {
		fmt.Fprintf(out, "%d Service difference(s):\n  %s\n", len(c.serviceDiffs), strings.Join(lines[len(c.diffs):], "\n  "))
	}
	return nil
}

func newLabStatusCommand() *cobra.Command {
	var prefix, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the labs on this machine: their nodes and pods, with network namespaces and addresses",
		Long: "List the labs on this machine. A lab that `netpol lab up` runs describes itself (its nodes\n" +
			"and pods, each with its network namespace and addresses, and the files it was made from);\n" +
			"for any other (a leftover of a process that died, or a test's) only its namespaces are known.\n" +
			"-o json prints {\"labs\": [{\"prefix\", \"running\", \"namespaces\", \"pid\", \"files\", \"synced\",\n" +
			"\"nodes\": [{\"name\", \"netns\", \"addresses\"}], \"pods\": [{\"name\", \"node\", \"hostNetwork\", \"netns\",\n" +
			"\"addresses\", \"serves\"}], \"outside\": {\"netns\", \"addresses\"}}]}, so that scripts can open\n" +
			"connections from a given pod.",
		Example: "  sudo netpol lab status\n" +
			"  sudo netpol lab status -o json | jq -r '.labs[0].pods[] | select(.name == \"x/a\") | .netns'\n" +
			"  sudo ip netns exec \"$NETNS\" timeout 2 bash -c 'cat </dev/tcp/10.244.2.10/80'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "table", "json", "yaml"); err != nil {
				return err
			}
			labs, err := labStatuses(prefix)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if ok, err := writeStructured(out, output, struct {
				Labs []labStatus `json:"labs"`
			}{labs}); ok {
				return err
			}
			if len(labs) == 0 {
				fmt.Fprintln(out, "no labs")
				return nil
			}
			for _, l := range labs {
				if l.Status == nil {
					fmt.Fprintf(out, "lab %s: %d namespaces (no status: not run by a live `netpol lab up`)\n", l.Prefix, len(l.Namespaces))
					for _, ns := range l.Namespaces {
						fmt.Fprintf(out, "  %s\n", ns)
					}
					continue
				}
				fmt.Fprintf(out, "lab %s: %d namespaces, run by pid %d from %s\n", l.Prefix, len(l.Namespaces), l.PID, strings.Join(l.Files, ", "))
				for _, n := range l.Nodes {
					fmt.Fprintf(out, "  node %-20s netns %-28s %v\n", n.Name, n.NetNS, n.Addrs)
				}
				for _, p := range l.Pods {
					fmt.Fprintf(out, "  pod  %-20s netns %-28s %v\n", p.Name, p.NetNS, p.Addrs)
				}
				fmt.Fprintf(out, "  %-25s netns %-28s %v\n", "outside ("+lab.ExternalSource+")", l.Outside.NetNS, l.Outside.Addrs)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", labPrefix, "only labs whose namespaces start with this")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

// labStatus is a lab as `lab status` lists it: its namespaces, and its
// status when a live process wrote one.
type labStatus struct {
	Prefix     string   `json:"prefix"`
	Running    bool     `json:"running"`
	Namespaces []string `json:"namespaces"`
	*lab.Status
}

// labStatuses lists the labs whose namespaces start with prefix, sorted,
// each with its status when the process that wrote it still runs.
func labStatuses(prefix string) ([]labStatus, error) {
	labs, err := lab.List(prefix)
	if err != nil {
		return nil, err
	}
	out := []labStatus{}
	for name, namespaces := range labs {
		l := labStatus{Prefix: name, Namespaces: namespaces}
		st, ok, err := lab.ReadStatus(name)
		if err != nil {
			return nil, err
		}
		if ok && st.Running() {
			l.Status, l.Running = &st, true
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Prefix < out[j].Prefix })
	return out, nil
}

func newLabDownCommand() *cobra.Command {
	var (
		prefix string
		all    bool
	)
	cmd := &cobra.Command{
		Use:   "down (--prefix PREFIX | --all)",
		Short: "Remove a lab's network namespaces (--all: every lab's, including leftovers)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case all:
				prefix = labPrefix
			case prefix == "":
				return errors.New("say which lab: --prefix PREFIX (see `netpol lab status`), or --all")
			case !strings.HasPrefix(prefix, labPrefix):
				return fmt.Errorf("lab prefixes start with %q", labPrefix)
			}
			removed, err := lab.DownAll(prefix)
			for _, ns := range removed {
				fmt.Fprintln(cmd.OutOrStdout(), "removed", ns)
			}
			if err == nil && len(removed) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to remove")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&prefix, "prefix", "", "the lab's namespace prefix")
	cmd.Flags().BoolVar(&all, "all", false, "remove every lab namespace ("+labPrefix+"*)")
	return cmd
}

// tableProbes reads back the probes a table's columns stand for.
// probesOrDeclared is probes, or when there are none every port the pods
// declare (the evaluator's table's).
func probesOrDeclared(l *loaded, probes []l4.Port) ([]l4.Port, error) {
	if len(probes) > 0 {
		return probes, nil
	}
	return tableProbes(l.evaluator.TruthTable(eval.TruthTableOptions{}))
}

func tableProbes(t *eval.TruthTable) ([]l4.Port, error) {
	return l4.ParsePorts(t.Ports)
}
