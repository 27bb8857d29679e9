package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/netpol/netpol/pkg/dataplane"
)

// TracedPath is one path of a connection's first packet through the
// compiled tables (`netpol trace -o json`).
type TracedPath struct {
	Allowed   bool        `json:"allowed"`
	Delivered string      `json:"delivered,omitempty"`
	Path      []TraceStep `json:"path"`
}

// TraceStep is one rule the packet met, on one node and hook.
type TraceStep struct {
	Node    string `json:"node"`
	Hook    string `json:"hook"`
	Table   string `json:"table"`
	Chain   string `json:"chain"`
	Rule    string `json:"rule"`
	Comment string `json:"comment,omitempty"`
	Matched bool   `json:"matched"`
	Verdict string `json:"verdict,omitempty"`
	Element string `json:"element,omitempty"`
}

// Traced flattens a data-plane path into steps.
func Traced(p dataplane.Path) TracedPath {
	out := TracedPath{Allowed: p.Allowed, Delivered: p.Delivered, Path: []TraceStep{}}
	for _, h := range p.Hops {
		for _, s := range h.Result.Steps {
			out.Path = append(out.Path, TraceStep{Node: h.Node, Hook: h.Hook, Table: s.Table, Chain: s.Chain, Rule: s.Text,
				Comment: s.Comment, Matched: s.Matched, Verdict: s.Verdict, Element: s.Element})
		}
	}
	return out
}

// Paths writes each path hook by hook: the rules that matched, with their
// policy comments, verdicts and elements (with all, also those that did
// not match).
func Paths(w io.Writer, paths []TracedPath, all bool, s Style) {
	for i, p := range paths {
		head := "traced through the nftables tables"
		if len(paths) > 1 {
			head = fmt.Sprintf("path %d of %d", i+1, len(paths))
		}
		fmt.Fprintf(w, "%s: %s", head, s.verdict(p.Allowed))
		if p.Delivered != "" {
			fmt.Fprintf(w, " (delivered to %s)", p.Delivered)
		}
		fmt.Fprintln(w)
		hop := ""
		for _, st := range p.Path {
			if h := st.Node + " " + st.Hook; h != hop {
				hop = h
				fmt.Fprintf(w, "  %s %s\n", st.Node, st.Hook)
			}
			if !st.Matched && !all {
				continue
			}
			if st.Comment != "" && st.Matched {
				fmt.Fprintf(w, "    # %s\n", st.Comment)
			}
			line := fmt.Sprintf("    %s/%s: %s", st.Table, st.Chain, st.Rule)
			switch {
			case !st.Matched:
				fmt.Fprintln(w, line+"   (no match)")
				continue
			case st.Verdict != "":
				line += "   -> " + st.Verdict
			}
			if st.Element != "" {
				line += "   [" + st.Element + "]"
			}
			fmt.Fprintln(w, line)
		}
	}
}

// PathsText is Paths as a string, without colour.
func PathsText(paths []TracedPath) string {
	var b strings.Builder
	Paths(&b, paths, false, Style{})
	return b.String()
}
