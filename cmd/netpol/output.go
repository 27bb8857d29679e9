package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/report"
)

// writeStructured prints v as json or yaml; it reports false for other
// formats.
func writeStructured(w io.Writer, format string, v any) (bool, error) {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case "yaml":
		data, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(data)
		return true, err
	}
	return false, nil
}

func checkFormat(format string, allowed ...string) error {
	for _, a := range allowed {
		if format == a {
			return nil
		}
	}
	return fmt.Errorf("unknown output format %q (one of %v)", format, allowed)
}

// terminalStyle colours output only for a terminal that wants it.
func terminalStyle(w io.Writer) report.Style {
	if os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return report.Style{}
	}
	return report.Style{Color: isTerminal(w)}
}

// deniedOnly is t with only its denied cells.
func deniedOnly(t *eval.TruthTable) *eval.TruthTable {
	out := *t
	out.Results = make([]eval.Result, 0, len(t.Results)/2)
	for _, r := range t.Results {
		if !r.Allowed {
			out.Results = append(out.Results, r)
		}
	}
	return &out
}

// noPodsNotes says on stderr which namespaces asked for have no pods.
func noPodsNotes(stderr io.Writer, l *loaded, namespaces []string) {
	for _, ns := range namespaces {
		found := false
		for _, p := range l.snap.Pods {
			if p.Namespace == ns {
				found = true
				break
			}
		}
		if found {
			continue
		}
		if l.snap.Namespace(ns) == nil {
			fmt.Fprintf(stderr, "note: namespace %s has no pods (there is no such namespace)\n", ns)
		} else {
			fmt.Fprintf(stderr, "note: namespace %s has no pods\n", ns)
		}
	}
}
