// Package report renders a conformance run: report.json (the stable
// contract), junit.xml for CI systems, index.html for people, the live
// progress line and the final text summary. It writes only to the files and
// io.Writers it is given.
package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/netpol/netpol/conformance"
)

// Files WriteDir writes, in order.
const (
	JSONFile  = "report.json"
	JUnitFile = "junit.xml"
	HTMLFile  = "index.html"
)

// WriteDir writes report.json, junit.xml and index.html into dir, creating
// it if needed. Each file is written to a temporary name and renamed, so a
// reader never sees half a report.
func WriteDir(dir string, r *conformance.Report) error {
	if r == nil {
		return errors.New("report: no report")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer, *conformance.Report) error
	}{
		{JSONFile, JSON},
		{JUnitFile, JUnit},
		{HTMLFile, HTML},
	} {
		if err := writeFile(filepath.Join(dir, f.name), func(w io.Writer) error { return f.write(w, r) }); err != nil {
			return fmt.Errorf("report: %s: %w", f.name, err)
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// JSON writes report.json: the stable contract of the issue,
//
//	{"summary": {"cases", "steps", "probes", "mismatches", "skipped", "durationSeconds"},
//	 "cases": [{"name", "tags": [...], "passed",
//	            "steps": [{"step", "probes", "mismatches": [{"from", "to", "protocol", "port",
//	                                                        "expected", "observed", "result"}]}]}]}
//
// plus "runner", "notes" and per case "error" and "durationSeconds". Lists
// are never null: a case without tags has "tags": [], a clean step
// "mismatches": [].
func JSON(w io.Writer, r *conformance.Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(normalized(r))
}

// normalized is a shallow copy of r whose nil lists are empty, so that
// they encode as [] and not null.
func normalized(r *conformance.Report) *conformance.Report {
	out := *r
	out.Cases = make([]conformance.CaseResult, len(r.Cases))
	for i, c := range r.Cases {
		if c.Tags == nil {
			c.Tags = []string{}
		}
		steps := make([]conformance.StepResult, len(c.Steps))
		for j, s := range c.Steps {
			if s.Mismatches == nil {
				s.Mismatches = []conformance.Mismatch{}
			}
			steps[j] = s
		}
		c.Steps = steps
		out.Cases[i] = c
	}
	return &out
}
