package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// A network-policy-api conformance run's directory holds:
//
//	events.json        go test -json events of TestConformanceProfiles
//	not-run            the conformance tests the run left out with
//	                   -test.skip, one per line: TEST PROFILE LEVEL REASON
//	                   (PROFILE the one the suite counts the test in, "-"
//	                   for none; LEVEL standard or experimental)
//	report.suite.yaml  the suite's report (--report-output)
//
// and gets report.yaml: the suite's report with the left-out tests counted
// as skipped. Go's testing reports a subtest that -test.skip left out as
// passed, so the suite's report counts it among the passed ones; its
// result is then computed again by the suite version's own rule for
// skipped tests (skippedResult: "partial" in v0.1.x, "failure" in v0.3.x,
// where every skipped test of a profile is a required one).

// testEvent is one line of go test -json.
type testEvent struct {
	Action string
	Test   string
	Output string
}

// notRun is a conformance test that the run left out.
type notRun struct {
	test, profile, level, reason string
}

func summarizeGoSuite(dir, skippedResult string) (Summary, error) {
	sum := Summary{SkippedWhy: map[string]int{}}
	f, err := os.Open(filepath.Join(dir, "events.json"))
	if err != nil {
		return sum, err
	}
	defer f.Close()
	suiteFailed := false           // TestConformanceProfiles itself failed
	final := map[string]string{}   // conformance test -> pass, fail or skip
	skipWhy := map[string]string{} // conformance test -> its Skipf message
	dec := json.NewDecoder(bufio.NewReader(f))
	for {
		var e testEvent
		if err := dec.Decode(&e); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return sum, fmt.Errorf("%s: %w", f.Name(), err)
		}
		// TestConformanceProfiles/NAME: one conformance test; deeper
		// names are its cases.
		parts := strings.Split(e.Test, "/")
		if len(parts) == 1 && parts[0] == "TestConformanceProfiles" && e.Action == "fail" {
			suiteFailed = true
		}
		if len(parts) != 2 || parts[0] != "TestConformanceProfiles" {
			continue
		}
		switch e.Action {
		case "pass", "fail", "skip":
			final[parts[1]] = e.Action
		case "output":
			if _, msg, ok := strings.Cut(e.Output, "Skipping "+parts[1]+": "); ok {
				skipWhy[parts[1]] = strings.TrimSpace(msg)
			}
		}
	}
	names := make([]string, 0, len(final))
	for n := range final {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		switch final[n] {
		case "pass":
			sum.Passed++
		case "fail":
			sum.Failed++
			sum.FailedSpecs = append(sum.FailedSpecs, n)
		case "skip":
			sum.Skipped++
			why := skipWhy[n]
			if why == "" {
				why = "skipped by the suite"
			}
			sum.SkippedWhy[why]++
		}
	}
	if suiteFailed && sum.Failed == 0 {
		// Failed outside every conformance test: its setup (the base
		// manifests, the pods' readiness) or its report.
		sum.Failed++
		sum.FailedSpecs = append(sum.FailedSpecs, "TestConformanceProfiles (setup or report; see the log)")
	}
	left, err := readNotRun(filepath.Join(dir, "not-run"))
	if err != nil {
		return sum, err
	}
	for _, l := range left {
		if _, ran := final[l.test]; ran {
			return sum, fmt.Errorf("%s: %s is listed as left out but ran", dir, l.test)
		}
		sum.Skipped++
		sum.SkippedWhy[l.reason]++
	}
	if _, err := os.Stat(filepath.Join(dir, "report.suite.yaml")); errors.Is(err, os.ErrNotExist) && sum.Failed > 0 {
		return sum, nil // the suite stopped before its report
	}
	if err := rewriteReport(dir, left, skippedResult); err != nil {
		return sum, err
	}
	return sum, nil
}

func readNotRun(path string) ([]notRun, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var out []notRun
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		f := strings.SplitN(line, " ", 4)
		if len(f) != 4 || (f[2] != "standard" && f[2] != "experimental") {
			return nil, fmt.Errorf("%s:%d: want TEST PROFILE standard|experimental REASON, got %q", path, i+1, line)
		}
		out = append(out, notRun{test: f[0], profile: f[1], level: f[2], reason: f[3]})
	}
	return out, nil
}

// rewriteReport writes report.yaml from report.suite.yaml with the tests
// in left counted as skipped, not passed. The report is read as a document
// of any version (v0.1.x and v0.3.x name one field differently); only its
// profiles' statistics, skipped tests and results change.
func rewriteReport(dir string, left []notRun, skippedResult string) error {
	data, err := os.ReadFile(filepath.Join(dir, "report.suite.yaml"))
	if err != nil {
		return err
	}
	var r map[string]any
	if err := yaml.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s/report.suite.yaml: %w", dir, err)
	}
	profiles, _ := r["profiles"].([]any)
	level := func(profile, lvl string) (map[string]any, error) {
		for _, p := range profiles {
			if p, ok := p.(map[string]any); ok && p["name"] == profile {
				if st, ok := p[lvl].(map[string]any); ok {
					return st, nil
				}
				return nil, fmt.Errorf("profile %s has no %s results", profile, lvl)
			}
		}
		return nil, fmt.Errorf("no profile %s", profile)
	}
	for _, l := range left {
		if l.profile == "-" {
			continue // the suite counts it in no profile
		}
		st, err := level(l.profile, l.level)
		if err != nil {
			return fmt.Errorf("%s/report.suite.yaml: %s: %w", dir, l.test, err)
		}
		stats, _ := st["statistics"].(map[string]any)
		passed, _ := stats["Passed"].(float64)
		if passed < 1 {
			return fmt.Errorf("%s/report.suite.yaml: %s: profile %s counts no %s test as passed", dir, l.test, l.profile, l.level)
		}
		skipped, _ := stats["Skipped"].(float64)
		stats["Passed"], stats["Skipped"] = passed-1, skipped+1
		names, _ := st["skippedTests"].([]any)
		st["skippedTests"] = append(names, l.test)
	}
	for _, p := range profiles {
		p, _ := p.(map[string]any)
		for _, lvl := range []string{"standard", "experimental"} {
			if st, ok := p[lvl].(map[string]any); ok {
				result(st, skippedResult)
			}
		}
	}
	out, err := yaml.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.yaml"), out, 0o644)
}

// result sets a level's result from its counts: failure when a test
// failed, else skippedResult when one was skipped.
func result(st map[string]any, skippedResult string) {
	stats, _ := st["statistics"].(map[string]any)
	failed, _ := stats["Failed"].(float64)
	skipped, _ := stats["Skipped"].(float64)
	switch {
	case failed > 0:
		st["result"] = "failure"
	case skipped > 0:
		st["result"] = skippedResult
		if s, _ := st["summary"].(string); s == "" {
			var names []string
			for _, n := range st["skippedTests"].([]any) {
				names = append(names, fmt.Sprint(n))
			}
			st["summary"] = "skipped: " + strings.Join(names, ", ")
		}
	}
}
