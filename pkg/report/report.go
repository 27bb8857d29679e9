// Package report renders evaluator results for people: the explain trace as
// sentences, the truth table as a matrix per port. It writes to an
// io.Writer; cmd/netpol decides where that goes.
package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// Style picks how cells are drawn.
type Style struct {
	Color bool // ANSI colours (a terminal that supports them)
}

const (
	green = "\x1b[32m"
	red   = "\x1b[31m"
	bold  = "\x1b[1m"
	reset = "\x1b[0m"
)

func (s Style) paint(code, text string) string {
	if !s.Color {
		return text
	}
	return code + text + reset
}

// Verdict is "ALLOWED" or "DENIED", coloured for a terminal.
func (s Style) Verdict(allowed bool) string { return s.verdict(allowed) }

func (s Style) verdict(allowed bool) string {
	if allowed {
		return s.paint(green, "ALLOWED")
	}
	return s.paint(red, "DENIED")
}

// Explain writes the verdict as a person would explain it: per direction,
// each tier with every rule that did not decide on its own line, then the
// decision quoting the deciding rule.
func Explain(w io.Writer, v *eval.Verdict, s Style) { ExplainRules(w, v, s, nil) }

// ExplainRules is Explain that also says, with rules, what each rule that
// did not match wanted (its peers or ports, named ports resolved).
func ExplainRules(w io.Writer, v *eval.Verdict, s Style, rules *Rules) {
	fmt.Fprintf(w, "%s -> %s %s/%d: %s\n", endpoint(v.From, v.FromIP), endpoint(v.To, v.ToIP), v.Protocol, v.Port, s.verdict(v.Allowed))
	if v.Reason != "" {
		fmt.Fprintf(w, "  %s\n", v.Reason)
		return
	}
	for _, d := range []struct {
		name string
		dv   *eval.DirectionVerdict
	}{{"Egress", v.Egress}, {"Ingress", v.Ingress}} {
		fmt.Fprintf(w, "\n%s of %s: %s\n", d.name, d.dv.Subject, s.verdict(d.dv.Allowed))
		if d.dv.Applies {
			for _, tier := range []policy.Tier{policy.TierAdmin, policy.TierNetworkPolicy, policy.TierBaseline} {
				summary, steps := tierLines(d.dv, tier, rules, v.To)
				switch {
				case summary == "" && len(steps) == 0:
				case len(steps) == 0:
					fmt.Fprintf(w, "  %s tier: %s\n", tier, summary)
				default:
					fmt.Fprintf(w, "  %s tier:\n", tier)
					for _, st := range steps {
						fmt.Fprintf(w, "    - %s\n", st)
					}
				}
			}
		}
		fmt.Fprintf(w, "  Decision: %s\n", decision(d.dv, s))
		if strings.Contains(d.dv.Reason, "fails closed") && d.dv.Rule != "" {
			fmt.Fprintf(w, "  Why: %s\n", d.dv.Reason)
		}
		if d.dv.Domain != "" {
			fmt.Fprintf(w, "  Learned: %s\n", d.dv.Domain)
		}
		for _, a := range d.dv.Ambiguous {
			fmt.Fprintf(w, "  Ambiguous: %s\n", a)
		}
	}
}

func endpoint(name, ip string) string {
	if ip == "" || ip == name {
		return name
	}
	return fmt.Sprintf("%s (%s)", name, ip)
}

// tierLines summarizes what one tier did before (or at) the decision: a
// one-line summary when no rule was skipped, else one line per skipped
// rule (with what it wanted, when rules can say).
func tierLines(dv *eval.DirectionVerdict, tier policy.Tier, rules *Rules, dst string) (string, []string) {
	t := tier.String()
	selected := dv.SelectedBy[t]
	var parts []string
	rulesSkipped := 0
	for _, st := range dv.Skipped {
		if st.Tier != t {
			continue
		}
		if st.Rule != "" {
			rulesSkipped++
		}
		if st.Policy == "" {
			parts = append(parts, st.Why)
			continue
		}
		if st.Rule == "" {
			parts = append(parts, fmt.Sprintf("%s: %s", st.Policy, st.Why))
			continue
		}
		line := fmt.Sprintf("%s %s (%s): %s", st.Policy, st.Rule, st.Action, st.Why)
		if wanted := rules.Wanted(st.Policy, st.Rule, st.Why, dst); wanted != "" {
			line += "; " + wanted
		}
		parts = append(parts, line)
	}
	reached := dv.Tier == t || len(parts) > 0 || tierBefore(tier, dv.Tier)
	switch {
	case !reached:
		return "", nil
	case len(selected) == 0 && tier != policy.TierNetworkPolicy:
		return "no policy selects " + dv.Subject, nil
	case len(parts) == 0 && dv.Tier == t:
		return "selected by " + strings.Join(selected, ", "), nil
	case len(parts) == 0:
		return "selected by " + strings.Join(selected, ", ") + "; no rule matched", nil
	case len(parts) == 1 && rulesSkipped == 0:
		return parts[0], nil // one summary, not a rule: on the tier's line
	}
	return "", parts
}

// tierBefore reports whether tier a was evaluated before the deciding tier.
func tierBefore(a policy.Tier, decidingTier string) bool {
	for _, t := range []policy.Tier{policy.TierAdmin, policy.TierNetworkPolicy, policy.TierBaseline, policy.TierDefault} {
		if t.String() == decidingTier {
			return false
		}
		if t == a {
			return true
		}
	}
	return false
}

func decision(dv *eval.DirectionVerdict, s Style) string {
	verb := s.verdict(dv.Allowed)
	if dv.Policy == "" {
		return fmt.Sprintf("%s by the %s tier: %s", verb, dv.Tier, dv.Reason)
	}
	if dv.Rule == "" {
		return fmt.Sprintf("%s by the %s tier (%s): %s", verb, dv.Tier, dv.Policy, dv.Reason)
	}
	return fmt.Sprintf("%s by the %s tier: %s %s, action %s", verb, dv.Tier, dv.Policy, dv.Rule, dv.Action)
}

// TruthTable writes one matrix per port: rows are sources, columns destinations.
func TruthTable(w io.Writer, t *eval.TruthTable, s Style) {
	if len(t.Pods) == 0 {
		fmt.Fprintln(w, "no pods with an address to show")
		return
	}
	if len(t.Results) != len(t.Pods)*len(t.Pods)*len(t.Ports) {
		cellList(w, t, s) // a filtered table (only denied cells): no matrix
		return
	}
	cells := map[[3]string]bool{}
	for _, r := range t.Results {
		cells[[3]string{l4.Port{Protocol: r.Protocol, Port: r.Port}.String(), r.From, r.To}] = r.Allowed
	}
	rowWidth := 0
	for _, p := range t.Pods {
		rowWidth = max(rowWidth, len(p))
	}
	for i, port := range t.Ports {
		if i > 0 {
			fmt.Fprintln(w)
		}
		// Pad by visible width: colour codes must not count.
		fmt.Fprint(w, s.paint(bold, port)+strings.Repeat(" ", max(rowWidth, len(port))-len(port)+1))
		for _, to := range t.Pods {
			fmt.Fprint(w, to+" ")
		}
		fmt.Fprintln(w)
		for _, from := range t.Pods {
			fmt.Fprintf(w, "%-*s ", max(rowWidth, len(port)), from)
			for _, to := range t.Pods {
				fmt.Fprint(w, cell(cells[[3]string{port, from, to}], s)+strings.Repeat(" ", len(to)))
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintf(w, "\n%s allowed, %s denied (rows: source, columns: destination)\n", cell(true, s), cell(false, s))
}

// cellList writes a table's cells one per line: "x/a -> y/b TCP/80: DENIED".
func cellList(w io.Writer, t *eval.TruthTable, s Style) {
	denied := 0
	for _, r := range t.Results {
		if !r.Allowed {
			denied++
		}
		fmt.Fprintf(w, "%s -> %s %s/%d: %s\n", r.From, r.To, r.Protocol, r.Port, s.verdict(r.Allowed))
	}
	fmt.Fprintf(w, "\n%d cell(s) shown, %d denied, of %d pods x %d pods x %d ports\n", len(t.Results), denied, len(t.Pods), len(t.Pods), len(t.Ports))
}

func cell(allowed bool, s Style) string {
	switch {
	case allowed && s.Color:
		return green + "✓" + reset
	case s.Color:
		return red + "✗" + reset
	case allowed:
		return "."
	}
	return "X"
}

// ServiceProbes writes Service probes one per line:
// "x/a -> service/y/web tcp/80 at 10.96.0.10: ok (endpoint y/b)".
func ServiceProbes(w io.Writer, rows []ServiceResult, s Style) {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no Service ports to probe")
		return
	}
	ok := 0
	for _, r := range rows {
		probe := l4.Port{Protocol: r.Protocol, Port: r.Port}
		result := s.paint(red, r.Result)
		if r.Allowed {
			ok++
			result = s.paint(green, r.Result)
		}
		line := fmt.Sprintf("%s -> %s %s", r.From, r.To, probe)
		if r.Address != "" {
			line += " at " + r.Address
		}
		line += ": " + result
		if r.Endpoint != "" {
			line += " (endpoint " + r.Endpoint + ")"
		}
		if r.Why != "" {
			line += ": " + r.Why
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "\n%d of %d Service probes answered\n", ok, len(rows))
}
