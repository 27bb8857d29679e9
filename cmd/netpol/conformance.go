package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/conformance/generator"
	creport "github.com/netpol/netpol/conformance/report"
	"github.com/netpol/netpol/pkg/cluster"
)

func newConformanceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "A cyclonus-style conformance suite: generated policy cases, real probes, compared cell by cell with the evaluator",
		Long: `The conformance suite generates cases (NetworkPolicy in cyclonus's families,
the admin tiers: AdminNetworkPolicy, BaselineAdminNetworkPolicy and
ClusterNetworkPolicy, and churn), applies each step to a cluster, probes every
pod pair on every port (TCP and UDP 80 and 81, SCTP where the kernel has it)
and compares what the data plane did with what the evaluator says, cell by
cell. A mismatching cell is probed again; the report shows explain's reason
and the path through the compiled nftables tables for every mismatch.`,
	}
	cmd.AddCommand(newConformanceListCommand(), newConformanceRunCommand())
	annotate(cmd, inputNone)
	return cmd
}

// selection is the flags that choose cases.
type selection struct {
	include, exclude []string
	random           int
	seed             uint64
}

func (s *selection) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringSliceVar(&s.include, "include", nil, "only cases with any of these tags (comma-separated)")
	f.StringSliceVar(&s.exclude, "exclude", nil, "no case with any of these tags")
	f.IntVar(&s.random, "random", 0, "instead of the generated families, N random policy sets drawn within them")
	f.Uint64Var(&s.seed, "seed", 1, "with --random: the seed (the same seed gives the same cases)")
}

func (s *selection) cases() []generator.Case {
	all := generator.All()
	if s.random > 0 {
		all = generator.Random(s.random, s.seed)
	}
	return generator.Select(all, s.include, s.exclude)
}

func newConformanceListCommand() *cobra.Command {
	var (
		sel    selection
		output string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the cases with their tags",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "text", "json"); err != nil {
				return err
			}
			cases := sel.cases()
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(cases)
			}
			perTag := map[string]int{}
			for _, c := range cases {
				fmt.Fprintf(out, "%-50s %s\n", c.Name, strings.Join(c.Tags, ","))
				for _, t := range c.Tags {
					perTag[t]++
				}
			}
			fmt.Fprintf(out, "\n%d cases;%s\n", len(cases), tagCounts(perTag))
			return nil
		},
	}
	sel.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func tagCounts(perTag map[string]int) string {
	var b strings.Builder
	for _, t := range slices.Sorted(maps.Keys(perTag)) {
		fmt.Fprintf(&b, " %s %d", t, perTag[t])
	}
	return b.String()
}

func newConformanceRunCommand() *cobra.Command {
	var (
		sel        selection
		runner     string
		reportDir  string
		output     string
		prefix     string
		timeout    time.Duration
		kubeconfig string
		kubeCtx    string
		image      string
		settle     time.Duration
		noHostNet  bool
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the cases and compare every probed cell with the evaluator (exit status 1 iff any mismatch)",
		Long: `Run the selected cases.

The lab runner (the default; root) brings up one lab of network namespaces for
the whole run (namespaces x, y, z with pods a, b, c on two nodes and a
host-network pod), programs every step through the agent's node programmer and
probes it in the real kernel.

The cluster runner (--runner cluster) runs on any cluster through a kubeconfig:
it creates namespaces PREFIX-RUN-x, -y, -z with probe pods a, b, c (--image,
netpol's own: netpol probe serve) and PREFIX-RUN-h with the host-network pod h
(ports 80 and 81 on the first node's own addresses; --no-host-network leaves it
out), labels the first two nodes with the base's rack under a label of the
run's own, writes each step's objects (pods added, moved and removed too),
probes every pod pair from inside the pods (one exec per source pod running
netpol probe dial), re-probes until the cells agree with the evaluator fed the
live objects or --settle passes, and deletes everything it made on every way
out (Ctrl-C included). Cases the cluster cannot express (node selectors on a
one-node cluster, the host-network pod with --no-host-network, CIDRs holding
part of a node's pods) are left out and counted in the notes.

--report-dir DIR writes report.json, junit.xml and index.html (a static page:
the summary, every case's matrices of expected vs observed, and for every
mismatching cell explain's reason and the nftables trace). An interrupted run
(Ctrl-C) still writes the report of the cases it finished.

A failing case of --random is shrunk to a 1-minimal failing case, printed as
YAML that netpol explain -f and netpol lab probe -f read.

Exit status: 0 when every cell agreed, 1 when some cell mismatched, 2 when a
case or the run could not be run to the end (or was interrupted).`,
		Example: "  sudo netpol conformance run --include admin,pass --report-dir /tmp/report\n" +
			"  sudo netpol conformance run --random 50 --seed 7 -o json\n" +
			"  netpol conformance run --runner cluster --kubeconfig ~/.kube/config --exclude churn",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "text", "json"); err != nil {
				return err
			}
			if runner != "lab" && runner != "cluster" {
				return fmt.Errorf("--runner %q: want lab or cluster", runner)
			}
			if runner == "lab" && os.Geteuid() != 0 {
				return fmt.Errorf("the lab runner needs root (network namespaces and nftables); --runner cluster runs on a cluster instead")
			}
			cases := sel.cases()
			if len(cases) == 0 {
				return fmt.Errorf("no case matches --include %v --exclude %v", sel.include, sel.exclude)
			}
			ctx, cancel := signalContext(cmd.Context())
			defer cancel()
			stderr := cmd.ErrOrStderr()
			fmt.Fprintf(stderr, "conformance: %d cases on the %s\n", len(cases), runner)
			progress := creport.NewProgress(stderr, len(cases), isTerminal(stderr))
			var (
				rep *conformance.Report
				err error
			)
			if runner == "lab" {
				rep, err = conformance.RunLab(ctx, cases, conformance.LabOptions{Prefix: prefix, Timeout: timeout, CaseDone: progress.CaseDone})
			} else {
				cfg, cerr := cluster.RESTConfig(cluster.APIOptions{Kubeconfig: kubeconfig, Context: kubeCtx})
				if emptyConfig(cerr) {
					return errors.New("--runner cluster: no kubeconfig found (looked at --kubeconfig, KUBECONFIG, ~/.kube/config and the in-cluster service account): give one with --kubeconfig PATH")
				}
				if cerr != nil {
					return fmt.Errorf("--runner cluster: %w", cerr)
				}
				rep, err = conformance.RunCluster(ctx, cases, conformance.ClusterOptions{Config: cfg, Image: image, Prefix: prefix,
					Settle: settle, Timeout: timeout, NoHostNetwork: noHostNet, CaseDone: progress.CaseDone,
					Logf: func(format string, a ...any) { progress.Note(fmt.Sprintf(format, a...)) }})
			}
			progress.Done()
			if rep == nil {
				return &exitError{code: 2, msg: fmt.Sprintf("conformance: %v", err)}
			}
			if reportDir != "" {
				if werr := creport.WriteDir(reportDir, rep); werr != nil {
					return errors.Join(err, werr)
				}
				fmt.Fprintf(stderr, "report written to %s (index.html, report.json, junit.xml)\n", reportDir)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				if werr := creport.JSON(out, rep); werr != nil {
					return werr
				}
			} else {
				creport.Text(out, rep)
			}
			if sel.random > 0 && runner == "lab" {
				shrinkFailures(ctx, stderr, out, cases, rep, prefix, timeout)
			}
			return runStatus(rep, err)
		},
	}
	sel.register(cmd)
	f := cmd.Flags()
	f.StringVar(&runner, "runner", "lab", "where to run: lab (network namespaces on this machine, root) or cluster (the cluster --kubeconfig reaches)")
	f.StringVar(&reportDir, "report-dir", "", "write report.json, junit.xml and index.html there")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json (report.json's shape)")
	f.StringVar(&prefix, "prefix", "", "the lab's namespace prefix (default netpol-<random>); with --runner cluster, the namespaces' (default netpol-conf)")
	f.DurationVar(&timeout, "timeout", 0, "one probe attempt's timeout (default 300ms on the lab, 500ms on a cluster; a failed cell is retried with 3-4x)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "with --runner cluster: the kubeconfig (default: KUBECONFIG, then ~/.kube/config, then in-cluster)")
	f.StringVar(&kubeCtx, "context", "", "with --runner cluster: the kubeconfig context")
	f.StringVar(&image, "image", conformance.DefaultImage, "with --runner cluster: the probe pods' image (netpol's: it runs netpol probe serve and dial)")
	f.DurationVar(&settle, "settle", 10*time.Second, "with --runner cluster: how long a step's cells may take to agree after its objects are written")
	f.BoolVar(&noHostNet, "no-host-network", false, "with --runner cluster: make no host-network pod (it serves ports 80 and 81 on a node's own addresses); the cases involving it are left out")
	return cmd
}

// runStatus is the run's exit status: 1 iff some cell mismatched, 2 when a
// case or the run itself could not be run to the end.
func runStatus(rep *conformance.Report, err error) error {
	errored := 0
	for _, c := range rep.Cases {
		if c.Error != "" {
			errored++
		}
	}
	switch {
	case err != nil:
		return &exitError{code: 2, msg: fmt.Sprintf("conformance: stopped after %d cases: %v", len(rep.Cases), err)}
	case errored > 0:
		return &exitError{code: 2, msg: fmt.Sprintf("conformance: %d of %d cases could not be run to the end, %d mismatching cells", errored, len(rep.Cases), rep.Summary.Mismatches)}
	case rep.Summary.Mismatches > 0:
		return &exitError{code: 1, msg: fmt.Sprintf("conformance: %d of %d cases failed, %d mismatching cells", failedCases(rep), len(rep.Cases), rep.Summary.Mismatches)}
	}
	return nil
}

func failedCases(rep *conformance.Report) int {
	n := 0
	for _, c := range rep.Cases {
		if !c.Passed {
			n++
		}
	}
	return n
}

// isTerminal reports whether w is a terminal (for the live progress line).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// shrinkFailures shrinks every failing random case on a lab of its own to
// a 1-minimal failing case and prints that as YAML (the state after its
// last step, which netpol explain -f and netpol lab probe -f read).
func shrinkFailures(ctx context.Context, stderr, out io.Writer, cases []generator.Case, rep *conformance.Report, prefix string, timeout time.Duration) {
	byName := map[string]generator.Case{}
	for _, c := range cases {
		byName[c.Name] = c
	}
	var failing []generator.Case
	for _, res := range rep.Cases {
		if !res.Passed && res.Error == "" {
			failing = append(failing, byName[res.Name])
		}
	}
	if len(failing) == 0 {
		return
	}
	lr, err := conformance.NewLabRunner(ctx, conformance.LabOptions{Prefix: prefix, Timeout: timeout})
	if err != nil {
		fmt.Fprintf(stderr, "conformance: not shrinking the failing cases: %v\n", err)
		return
	}
	defer func() {
		if err := lr.Close(); err != nil {
			fmt.Fprintf(stderr, "conformance: %v\n", err)
		}
	}()
	for _, c := range failing {
		fmt.Fprintf(stderr, "conformance: shrinking %s (%d steps)\n", c.Name, len(c.Steps))
		runs := 0
		small := generator.Shrink(c, func(try generator.Case) bool {
			runs++
			res := lr.Run(try)
			return !res.Passed && res.Error == "" && ctx.Err() == nil
		})
		fmt.Fprintf(out, "# %s: shrunk in %d runs to %d steps; the state after its last step:\n%s",
			c.Name, runs, len(small.Steps), generator.CaseYAML(small))
	}
}
