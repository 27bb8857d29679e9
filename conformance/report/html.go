package report

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
	"time"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
)

//go:embed index.html.tmpl
var indexTemplate string

var pageTemplate = template.Must(template.New("index.html").Funcs(template.FuncMap{"dict": dict}).Parse(indexTemplate))

// dict builds a template's argument from name, value pairs.
func dict(kv ...any) (map[string]any, error) {
	if len(kv)%2 != 0 {
		return nil, fmt.Errorf("dict: odd number of arguments")
	}
	m := make(map[string]any, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		k, ok := kv[i].(string)
		if !ok {
			return nil, fmt.Errorf("dict: key %v is not a string", kv[i])
		}
		m[k] = kv[i+1]
	}
	return m, nil
}

// HTML writes index.html: one static page with no external assets (inline
// CSS, no script). At the top the summary, the counts per tag (each a
// filter: pure CSS, radio buttons and :has) and links to the failing
// cases; then every case, passed ones collapsed and failing ones open, with
// per step a matrix per port (expected = observed, or expected next to
// observed when they differ, mismatching cells outlined and linked to
// their explain text and nft trace), the step's YAML, and every mismatch.
func HTML(w io.Writer, r *conformance.Report) error {
	return pageTemplate.Execute(w, buildPage(r))
}

type page struct {
	Summary    conformance.Summary
	Duration   string
	Runner     string
	Notes      []string
	Passed     int
	Failed     int
	Tags       []tagView
	Failing    []caseView
	Cases      []caseView
	FilterCSS  []string // tag IDs, one CSS rule each
	ErrorCases int
}

type tagView struct {
	ID, Name                  string
	Cases, Passed, Mismatches int
	Failed                    int
}

type caseView struct {
	Anchor     string
	Name       string
	Tags       []string
	Classes    string
	Passed     bool
	Error      string
	Duration   string
	Mismatches int
	Probes     int
	Steps      []stepView
}

type stepView struct {
	Anchor     string
	Title      string
	Probes     int
	Apply      string
	Ports      []portView
	Mismatches []mismatchView
}

type portView struct {
	Port     string
	Pods     []string
	Vertical bool // long pod names: column headers turned
	// Same: one matrix (expected = observed); else Expected and Observed.
	Same     bool
	Expected []rowView
	Observed []rowView
}

type rowView struct {
	From  string
	Cells []cellView
}

type cellView struct {
	Class string // a allowed, d denied, n not probed; " x" added on a mismatch
	Href  string // the mismatch's anchor
	Title string
}

type mismatchView struct {
	Anchor   string
	Line     string
	From, To string
	Port     string
	Expected string
	Observed string
	Result   string
	Explain  string
	Trace    string
}

func buildPage(r *conformance.Report) *page {
	p := &page{
		Summary:  r.Summary,
		Duration: duration(r.Summary.DurationSeconds),
		Runner:   r.Runner,
		Notes:    r.Notes,
	}
	tagIndex := map[string]int{}
	for _, c := range r.Cases {
		for _, t := range c.Tags {
			if _, ok := tagIndex[t]; !ok {
				tagIndex[t] = len(p.Tags)
				p.Tags = append(p.Tags, tagView{ID: fmt.Sprintf("t%d", len(p.Tags)), Name: t})
			}
		}
	}
	for i, c := range r.Cases {
		cv := buildCase(i, c)
		classes := []string{"case", "pass"}
		if !c.Passed {
			classes[1] = "fail"
		}
		for _, t := range c.Tags {
			tv := &p.Tags[tagIndex[t]]
			classes = append(classes, tv.ID)
			tv.Cases++
			tv.Mismatches += cv.Mismatches
			if c.Passed {
				tv.Passed++
			} else {
				tv.Failed++
			}
		}
		cv.Classes = strings.Join(classes, " ")
		if c.Passed {
			p.Passed++
		} else {
			p.Failed++
			p.Failing = append(p.Failing, cv)
		}
		if c.Error != "" {
			p.ErrorCases++
		}
		p.Cases = append(p.Cases, cv)
	}
	for _, t := range p.Tags {
		p.FilterCSS = append(p.FilterCSS, t.ID)
	}
	return p
}

func buildCase(i int, c conformance.CaseResult) caseView {
	cv := caseView{
		Anchor:   fmt.Sprintf("c%d", i+1),
		Name:     c.Name,
		Tags:     c.Tags,
		Passed:   c.Passed,
		Error:    c.Error,
		Duration: duration(c.DurationSeconds),
	}
	for j, s := range c.Steps {
		sv := stepView{
			Anchor: fmt.Sprintf("%s-s%d", cv.Anchor, j+1),
			Title:  stepTitle(s),
			Probes: s.Probes,
			Apply:  s.Apply,
		}
		type key struct{ from, to, port string }
		anchors := map[key]string{}
		for k, m := range s.Mismatches {
			mv := mismatchView{
				Anchor:   fmt.Sprintf("%s-m%d", sv.Anchor, k+1),
				Line:     cellLine(m),
				From:     m.From,
				To:       m.To,
				Port:     portName(m),
				Expected: verdict(m.Expected),
				Observed: verdict(m.Observed),
				Result:   m.Result,
				Explain:  m.Explain,
				Trace:    m.Trace,
			}
			anchors[key{m.From, m.To, mv.Port}] = mv.Anchor
			sv.Mismatches = append(sv.Mismatches, mv)
		}
		sv.Ports = buildPorts(s.Expected, s.Observed, func(from, to, port string) string { return anchors[key{from, to, port}] })
		cv.Mismatches += len(s.Mismatches)
		cv.Probes += s.Probes
		cv.Steps = append(cv.Steps, sv)
	}
	return cv
}

// buildPorts lays out one matrix per port: rows the source pods, columns
// the destinations. mismatch gives a cell's mismatch anchor, if any.
func buildPorts(expected, observed *eval.TruthTable, mismatch func(from, to, port string) string) []portView {
	base := expected
	if base == nil {
		base = observed
	}
	if base == nil {
		return nil
	}
	type key struct{ from, to, port string }
	cells := func(t *eval.TruthTable) map[key]bool {
		if t == nil {
			return nil
		}
		m := make(map[key]bool, len(t.Results))
		for _, r := range t.Results {
			m[key{r.From, r.To, l4.Port{Protocol: r.Protocol, Port: r.Port}.String()}] = r.Allowed
		}
		return m
	}
	exp, obs := cells(expected), cells(observed)
	pods := base.Pods
	ports := base.Ports
	if observed != nil && base != observed {
		pods = union(pods, observed.Pods)
		ports = union(ports, observed.Ports)
	}
	vertical := false
	for _, p := range pods {
		if len(p) > 6 {
			vertical = true
		}
	}
	cell := func(m map[key]bool, k key, href string) cellView {
		allowed, ok := m[k]
		// Titles only where they say more than the colour: a page of
		// 400 cases has half a million cells.
		c := cellView{Class: "n", Title: fmt.Sprintf("%s → %s %s: not probed", k.from, k.to, k.port)}
		if ok {
			c.Class, c.Title = "d", ""
			if allowed {
				c.Class = "a"
			}
		}
		if href != "" {
			c.Class += " x"
			c.Href = "#" + href
			c.Title = fmt.Sprintf("%s → %s %s: %s (mismatch)", k.from, k.to, k.port, verdict(allowed))
		}
		return c
	}
	var out []portView
	for _, port := range ports {
		pv := portView{Port: port, Pods: pods, Vertical: vertical, Same: true}
		for _, from := range pods {
			er, or := rowView{From: from}, rowView{From: from}
			for _, to := range pods {
				k := key{from, to, port}
				href := mismatch(from, to, port)
				e := cell(exp, k, href)
				o := e
				if observed != nil {
					o = cell(obs, k, href)
				}
				if expected == nil {
					e = o
				}
				if e.Class != o.Class || href != "" {
					pv.Same = false
				}
				er.Cells = append(er.Cells, e)
				or.Cells = append(or.Cells, o)
			}
			pv.Expected = append(pv.Expected, er)
			pv.Observed = append(pv.Observed, or)
		}
		if pv.Same {
			pv.Observed = nil
		}
		out = append(out, pv)
	}
	return out
}

func union(a, b []string) []string {
	seen := make(map[string]bool, len(a))
	out := append([]string(nil), a...)
	for _, s := range a {
		seen[s] = true
	}
	for _, s := range b {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func portName(m conformance.Mismatch) string {
	return l4.Port{Protocol: m.Protocol, Port: m.Port}.String()
}

// duration is a run's or case's wall time, rounded for people.
func duration(s float64) string {
	if s <= 0 || math.IsNaN(s) || math.IsInf(s, 0) {
		return "0s"
	}
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
