// Command conformance-summary reads the results of the upstream suites
// (hack/conformance-upstream.sh) and writes their summary as JSON:
// [{"suite", "version", "passed", "failed", "skipped", "skippedWhy":
// {reason: count}, "nodes"}].
//
// Kubernetes' e2e suites (-suite): their JUnit reports; a spec counts when
// its name matches its suite's focus (the report lists the specs the focus
// left out too). network-policy-api's conformance suites (-gosuite): the
// go test events of TestConformanceProfiles, one test per conformance test,
// and the tests the run left out (-test.skip), which the suite's own report
// counts as passed: conformance-summary writes the report again with those
// tests skipped (see gosuite.go).
package main

import (
	"encoding/json"
	"encoding/xml"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

type suiteFlag []string

func (s *suiteFlag) String() string     { return strings.Join(*s, ",") }
func (s *suiteFlag) Set(v string) error { *s = append(*s, v); return nil }

// Summary is one suite's line of summary.json.
type Summary struct {
	Suite      string         `json:"suite"`
	Version    string         `json:"version"`
	Passed     int            `json:"passed"`
	Failed     int            `json:"failed"`
	Skipped    int            `json:"skipped"`
	SkippedWhy map[string]int `json:"skippedWhy"`
	Nodes      int            `json:"nodes"`
	// FailedSpecs names the failed specs.
	FailedSpecs []string `json:"failedSpecs,omitempty"`
}

type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Status  string `xml:"status,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct{} `xml:"failure"`
			Error   *struct{} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func main() {
	dir := flag.String("dir", "", "the directory with a SUITE/junit_01.xml per suite")
	version := flag.String("version", "", "the suites' version")
	nodes := flag.Int("nodes", 0, "the cluster's nodes")
	var suites, skips suiteFlag
	flag.Var(&suites, "suite", "NAME=FOCUS, repeatable")
	flag.Var(&skips, "skip", "NAME=REGEXP=REASON, repeatable: why suite NAME's skip filter left out the specs it matches (each suite has its own filter: a Netpol spec matches sig-network's)")
	var gosuites suiteFlag
	flag.Var(&gosuites, "gosuite", "NAME=VERSION=SKIPPED_RESULT, repeatable: a network-policy-api conformance run in DIR/NAME (gosuite.go)")
	flag.Parse()
	why, err := parseSkips(skips)
	if err != nil {
		fail(err)
	}
	var out []Summary
	for _, s := range suites {
		name, focus, ok := strings.Cut(s, "=")
		if !ok {
			fail(fmt.Errorf("-suite %q: want NAME=FOCUS", s))
		}
		sum, err := summarize(filepath.Join(*dir, name, "junit_01.xml"), regexp.MustCompile(focus), why[name])
		if err != nil {
			fail(err)
		}
		sum.Suite, sum.Version, sum.Nodes = name, *version, *nodes
		out = append(out, sum)
	}
	for _, g := range gosuites {
		parts := strings.Split(g, "=")
		if len(parts) != 3 {
			fail(fmt.Errorf("-gosuite %q: want NAME=VERSION=SKIPPED_RESULT", g))
		}
		sum, err := summarizeGoSuite(filepath.Join(*dir, parts[0]), parts[2])
		if err != nil {
			fail(err)
		}
		sum.Suite, sum.Version, sum.Nodes = parts[0], parts[1], *nodes
		out = append(out, sum)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fail(err)
	}
}

// parseSkips reads the -skip flags: each suite's reasons, in order.
func parseSkips(skips []string) (map[string][]skipReason, error) {
	why := map[string][]skipReason{}
	for _, s := range skips {
		parts := strings.SplitN(s, "=", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("-skip %q: want NAME=REGEXP=REASON", s)
		}
		re, err := regexp.Compile(parts[1])
		if err != nil {
			return nil, fmt.Errorf("-skip %q: %w", s, err)
		}
		why[parts[0]] = append(why[parts[0]], skipReason{re, parts[2]})
	}
	return why, nil
}

// skipReason says why the specs a skip filter matches were left out.
type skipReason struct {
	match  *regexp.Regexp
	reason string
}

func summarize(path string, focus *regexp.Regexp, why []skipReason) (Summary, error) {
	sum := Summary{SkippedWhy: map[string]int{}}
	data, err := os.ReadFile(path)
	if err != nil {
		return sum, err
	}
	var r junit
	if err := xml.Unmarshal(data, &r); err != nil {
		return sum, fmt.Errorf("%s: %w", path, err)
	}
	for _, s := range r.Suites {
		for _, c := range s.Cases {
			if !focus.MatchString(c.Name) {
				continue
			}
			switch {
			case c.Failure != nil || c.Error != nil:
				sum.Failed++
				sum.FailedSpecs = append(sum.FailedSpecs, c.Name)
			case c.Skipped != nil:
				sum.Skipped++
				sum.SkippedWhy[reason(c.Name, c.Skipped.Message, why)]++
			default:
				sum.Passed++
			}
		}
	}
	return sum, nil
}

// reason is why spec name was skipped: the run's skip filter, or the
// spec's own message without its details.
func reason(name, msg string, why []skipReason) string {
	msg = strings.TrimSpace(strings.TrimPrefix(msg, "skipped - "))
	if msg == "" || msg == "skipped" {
		for _, w := range why {
			if w.match.MatchString(name) {
				return w.reason
			}
		}
		return "skipped by the focus or skip filters"
	}
	if i := strings.IndexByte(msg, '\n'); i > 0 {
		msg = msg[:i]
	}
	return msg
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "conformance-summary:", err)
	os.Exit(1)
}
