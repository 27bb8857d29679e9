package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/netpol/netpol/conformance"
)

// Text writes the final summary for people: the counts per tag (cases,
// passed, failed, mismatches), every failing case with its mismatching
// cells, the notes, and one closing line with the totals.
func Text(w io.Writer, r *conformance.Report) error {
	ew := &errWriter{w: w}
	type counts struct{ cases, passed, mismatches int }
	var order []string
	per := map[string]*counts{}
	passed := 0
	var failing []conformance.CaseResult
	for _, c := range r.Cases {
		n := caseMismatches(c)
		if c.Passed {
			passed++
		} else {
			failing = append(failing, c)
		}
		for _, t := range c.Tags {
			k := per[t]
			if k == nil {
				k = &counts{}
				per[t] = k
				order = append(order, t)
			}
			k.cases++
			k.mismatches += n
			if c.Passed {
				k.passed++
			}
		}
	}
	if len(order) > 0 {
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TAG\tCASES\tPASSED\tFAILED\tMISMATCHES")
		for _, t := range order {
			k := per[t]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", t, k.cases, k.passed, k.cases-k.passed, k.mismatches)
		}
		tw.Flush()
	}
	if len(failing) > 0 {
		fmt.Fprintf(ew, "\nFailing cases (%d):\n", len(failing))
		for _, c := range failing {
			tags := ""
			if len(c.Tags) > 0 {
				tags = " [" + strings.Join(c.Tags, ",") + "]"
			}
			fmt.Fprintf(ew, "  %s%s\n", c.Name, tags)
			if c.Error != "" {
				fmt.Fprintf(ew, "    error: %s\n", indent(c.Error, "           "))
			}
			for _, s := range c.Steps {
				if len(s.Mismatches) == 0 {
					continue
				}
				fmt.Fprintf(ew, "    %s: %d of %d cells mismatch\n", stepTitle(s), len(s.Mismatches), s.Probes)
				for _, m := range s.Mismatches {
					fmt.Fprintf(ew, "      %s\n", cellLine(m))
				}
			}
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(ew, "\nNotes:")
		for _, n := range r.Notes {
			fmt.Fprintf(ew, "  %s\n", indent(n, "  "))
		}
	}
	s := r.Summary
	runner := ""
	if r.Runner != "" {
		runner = ", runner " + r.Runner
	}
	fmt.Fprintf(ew, "\n%d cases (%d passed, %d failed), %d steps, %d probes, %d mismatches, %d skipped probes, in %s%s\n",
		s.Cases, passed, len(failing), s.Steps, s.Probes, s.Mismatches, s.Skipped, duration(s.DurationSeconds), runner)
	return ew.err
}

func indent(s, prefix string) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}

// errWriter keeps the first write error, so Text can write freely.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}
