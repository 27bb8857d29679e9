package main

import (
	"encoding/json"
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
		sel       selection
		runner    string
		reportDir string
		output    string
		prefix    string
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the cases and compare every probed cell with the evaluator (exit status 1 iff any mismatch)",
		Long: `Run the selected cases. The lab runner (the default; root) brings up one lab
of network namespaces for the whole run (namespaces x, y, z with pods a, b, c
on two nodes and a host-network pod), programs every step through the agent's
node programmer and probes it in the real kernel.

--report-dir DIR writes report.json, junit.xml and index.html (a static page:
the summary, every case's matrices of expected vs observed, and for every
mismatching cell explain's reason and the nftables trace).

Exit status: 0 when every cell agreed, 1 when some cell mismatched or a case
could not be run, and on errors.`,
		Example: "  sudo netpol conformance run --include admin,pass --report-dir /tmp/report\n" +
			"  sudo netpol conformance run --random 50 --seed 7 -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "text", "json"); err != nil {
				return err
			}
			if runner != "lab" {
				return fmt.Errorf("--runner %q: only the lab runner is available here (the cluster runner needs a cluster: --runner cluster is not built yet)", runner)
			}
			if os.Geteuid() != 0 {
				return fmt.Errorf("the lab runner needs root (network namespaces and nftables)")
			}
			cases := sel.cases()
			if len(cases) == 0 {
				return fmt.Errorf("no case matches --include %v --exclude %v", sel.include, sel.exclude)
			}
			ctx, cancel := signalContext(cmd.Context())
			defer cancel()
			stderr := cmd.ErrOrStderr()
			progress := creport.NewProgress(stderr, len(cases), isTerminal(stderr))
			fmt.Fprintf(stderr, "conformance: %d cases on the lab\n", len(cases))
			rep, err := conformance.RunLab(ctx, cases, conformance.LabOptions{Prefix: prefix, Timeout: timeout, CaseDone: progress.CaseDone})
			progress.Done()
			if err != nil {
				return err
			}
			if reportDir != "" {
				if err := creport.WriteDir(reportDir, rep); err != nil {
					return err
				}
				fmt.Fprintf(stderr, "report written to %s (index.html, report.json, junit.xml)\n", reportDir)
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				creport.Text(out, rep)
			}
			if failed := failedCases(rep); failed > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("conformance: %d of %d cases failed, %d mismatching cells", failed, len(rep.Cases), rep.Summary.Mismatches)}
			}
			return nil
		},
	}
	sel.register(cmd)
	f := cmd.Flags()
	f.StringVar(&runner, "runner", "lab", "where to run: lab (network namespaces on this machine, root)")
	f.StringVar(&reportDir, "report-dir", "", "write report.json, junit.xml and index.html there")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json (report.json's shape)")
	f.StringVar(&prefix, "prefix", "", "lab namespace prefix (default netpol-<random>)")
	f.DurationVar(&timeout, "timeout", 0, "one probe attempt's timeout (default 300ms; a failed cell is retried with 4x)")
	return cmd
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
