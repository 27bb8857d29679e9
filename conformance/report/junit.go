package report

import (
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/netpol/netpol/conformance"
)

// The JUnit XML schema CI systems read (Jenkins, GitLab, GitHub actions'
// test reporters): testsuites > testsuite > testcase with failure, error or
// skipped children.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Skipped  int          `xml:"skipped,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Tests      int             `xml:"tests,attr"`
	Failures   int             `xml:"failures,attr"`
	Errors     int             `xml:"errors,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Time       string          `xml:"time,attr"`
	Properties []junitProperty `xml:"properties>property,omitempty"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

// JUnit writes junit.xml: one testsuite for the run, one testcase per case
// step (classname the case's name, name "step N" and the step's name). A
// step with mismatches fails, listing its mismatching cells; a case that
// could not be run to the end gets one more testcase, "run", with an error.
func JUnit(w io.Writer, r *conformance.Report) error {
	suite := junitSuite{
		Name: "netpol conformance",
		Time: seconds(r.Summary.DurationSeconds),
		Properties: []junitProperty{
			{Name: "runner", Value: r.Runner},
			{Name: "cases", Value: strconv.Itoa(r.Summary.Cases)},
			{Name: "probes", Value: strconv.Itoa(r.Summary.Probes)},
			{Name: "mismatches", Value: strconv.Itoa(r.Summary.Mismatches)},
			{Name: "skippedProbes", Value: strconv.Itoa(r.Summary.Skipped)},
		},
	}
	for i, n := range r.Notes {
		suite.Properties = append(suite.Properties, junitProperty{Name: fmt.Sprintf("note.%d", i+1), Value: n})
	}
	for _, c := range r.Cases {
		per := 0.0
		if len(c.Steps) > 0 {
			per = c.DurationSeconds / float64(len(c.Steps))
		}
		for _, s := range c.Steps {
			tc := junitCase{Name: stepTitle(s), Classname: c.Name, Time: seconds(per)}
			if len(s.Mismatches) > 0 {
				var b strings.Builder
				for _, m := range s.Mismatches {
					b.WriteString(cellLine(m))
					b.WriteByte('\n')
				}
				tc.Failure = &junitMessage{
					Message: fmt.Sprintf("%d of %d cells mismatch", len(s.Mismatches), s.Probes),
					Type:    "mismatch",
					Text:    b.String(),
				}
			}
			suite.Cases = append(suite.Cases, tc)
		}
		switch {
		case c.Error != "":
			suite.Cases = append(suite.Cases, junitCase{
				Name: "run", Classname: c.Name, Time: seconds(0),
				Error: &junitMessage{Message: c.Error, Type: "error", Text: c.Error},
			})
		case len(c.Steps) == 0:
			// A case with nothing probed still shows up in CI.
			suite.Cases = append(suite.Cases, junitCase{
				Name: "run", Classname: c.Name, Time: seconds(c.DurationSeconds),
				Skipped: &junitMessage{Message: "no step was probed"},
			})
		}
	}
	for _, tc := range suite.Cases {
		suite.Tests++
		switch {
		case tc.Failure != nil:
			suite.Failures++
		case tc.Error != nil:
			suite.Errors++
		case tc.Skipped != nil:
			suite.Skipped++
		}
	}
	all := junitSuites{
		Name: suite.Name, Tests: suite.Tests, Failures: suite.Failures, Errors: suite.Errors,
		Skipped: suite.Skipped, Time: suite.Time, Suites: []junitSuite{suite},
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(all); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func seconds(s float64) string { return strconv.FormatFloat(s, 'f', 3, 64) }

// stepTitle is "step 2" or "step 2: label change".
func stepTitle(s conformance.StepResult) string {
	if s.Name == "" {
		return fmt.Sprintf("step %d", s.Step)
	}
	return fmt.Sprintf("step %d: %s", s.Step, s.Name)
}

// cellLine is one mismatching cell: "x/a -> y/b tcp/80: expected allowed,
// observed denied (timeout)".
func cellLine(m conformance.Mismatch) string {
	line := fmt.Sprintf("%s -> %s %s: expected %s, observed %s", m.From, m.To, portName(m), verdict(m.Expected), verdict(m.Observed))
	if m.Result != "" {
		line += " (" + m.Result + ")"
	}
	return line
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}
