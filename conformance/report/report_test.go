package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"

	"github.com/netpol/netpol/conformance"
)

func writeSample(t *testing.T, r *conformance.Report) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "report")
	if err := WriteDir(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{JSONFile, JUnitFile, HTMLFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v (size %v)", f, err, st)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(left) > 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
	return dir
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// field checks that m has key of the JSON type want ("number", "string",
// "bool", "array", "object") and returns its value.
func field(t *testing.T, where string, m map[string]any, key, want string) any {
	t.Helper()
	v, ok := m[key]
	if !ok {
		t.Fatalf("%s: no %q in %v", where, key, m)
	}
	got := "null"
	switch v.(type) {
	case float64:
		got = "number"
	case string:
		got = "string"
	case bool:
		got = "bool"
	case []any:
		got = "array"
	case map[string]any:
		got = "object"
	}
	if got != want {
		t.Fatalf("%s.%s is %s (%v), want %s", where, key, got, v, want)
	}
	return v
}

// TestJSONContract checks every field of the report.json shape,
// with its JSON type and the sample's values.
func TestJSONContract(t *testing.T) {
	r := sampleReport()
	r.Cases[0].Tags = nil // still "tags": []
	dir := writeSample(t, r)
	var doc map[string]any
	if err := json.Unmarshal(read(t, filepath.Join(dir, JSONFile)), &doc); err != nil {
		t.Fatal(err)
	}
	sum := field(t, "report", doc, "summary", "object").(map[string]any)
	want := map[string]float64{"cases": 2, "steps": 3, "probes": 486, "mismatches": 2, "skipped": 162, "durationSeconds": 12.75}
	for k, v := range want {
		if got := field(t, "summary", sum, k, "number"); got != v {
			t.Errorf("summary.%s = %v, want %v", k, got, v)
		}
	}
	cases := field(t, "report", doc, "cases", "array").([]any)
	if len(cases) != 2 {
		t.Fatalf("%d cases, want 2", len(cases))
	}
	var cells []map[string]any
	steps := 0
	for i, c := range cases {
		cm := c.(map[string]any)
		if got := field(t, "case", cm, "name", "string"); got != r.Cases[i].Name {
			t.Errorf("case %d name %v", i, got)
		}
		tags := field(t, "case", cm, "tags", "array").([]any)
		if len(tags) != len(r.Cases[i].Tags) {
			t.Errorf("case %d tags %v", i, tags)
		}
		if got := field(t, "case", cm, "passed", "bool"); got != r.Cases[i].Passed {
			t.Errorf("case %d passed %v", i, got)
		}
		for j, s := range field(t, "case", cm, "steps", "array").([]any) {
			steps++
			sm := s.(map[string]any)
			if got := field(t, "step", sm, "step", "number"); got != float64(j+1) {
				t.Errorf("case %d step %d numbered %v", i, j, got)
			}
			if got := field(t, "step", sm, "probes", "number"); got != float64(162) {
				t.Errorf("case %d step %d probes %v", i, j, got)
			}
			for _, m := range field(t, "step", sm, "mismatches", "array").([]any) {
				cells = append(cells, m.(map[string]any))
			}
			for _, k := range []string{"expected", "observed", "apply", "Expected", "Observed", "Apply"} {
				if _, ok := sm[k]; ok {
					t.Errorf("step has %q: the tables and YAML are for the HTML report only", k)
				}
			}
		}
	}
	if steps != 3 {
		t.Errorf("%d steps, want 3", steps)
	}
	if len(cells) != 2 {
		t.Fatalf("%d mismatches, want 2", len(cells))
	}
	wantCells := []map[string]any{
		{"from": "x/b", "to": "y/a", "protocol": "TCP", "port": 80.0, "expected": false, "observed": true, "result": "ok"},
		{"from": "z/c", "to": "y/a", "protocol": "UDP", "port": 81.0, "expected": true, "observed": false, "result": "timeout"},
	}
	types := map[string]string{"from": "string", "to": "string", "protocol": "string", "port": "number", "expected": "bool", "observed": "bool", "result": "string"}
	for i, c := range cells {
		for k, typ := range types {
			if got := field(t, "mismatch", c, k, typ); got != wantCells[i][k] {
				t.Errorf("mismatch %d %s = %v, want %v", i, k, got, wantCells[i][k])
			}
		}
		for _, k := range []string{"explain", "trace", "Explain", "Trace"} {
			if _, ok := c[k]; ok {
				t.Errorf("mismatch has %q", k)
			}
		}
	}
	// The input is not changed by the normalisation.
	if r.Cases[0].Tags != nil || r.Cases[0].Steps[0].Mismatches != nil {
		t.Error("JSON changed the report it was given")
	}
	// And it reads back into the types.
	var back conformance.Report
	if err := json.Unmarshal(read(t, filepath.Join(dir, JSONFile)), &back); err != nil {
		t.Fatal(err)
	}
	if back.Summary != r.Summary || back.Runner != "lab" || len(back.Cases[1].Steps[1].Mismatches) != 2 {
		t.Errorf("read back: %+v", back.Summary)
	}
}

type junitDoc struct {
	XMLName  xml.Name `xml:"testsuites"`
	Tests    int      `xml:"tests,attr"`
	Failures int      `xml:"failures,attr"`
	Errors   int      `xml:"errors,attr"`
	Suites   []struct {
		Name     string `xml:"name,attr"`
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Errors   int    `xml:"errors,attr"`
		Time     string `xml:"time,attr"`
		Props    []struct {
			Name  string `xml:"name,attr"`
			Value string `xml:"value,attr"`
		} `xml:"properties>property"`
		Cases []struct {
			Name      string `xml:"name,attr"`
			Classname string `xml:"classname,attr"`
			Time      string `xml:"time,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestJUnit(t *testing.T) {
	r := sampleReport()
	r.Cases = append(r.Cases, conformance.CaseResult{Name: "ports: SCTP <not> & \"loaded\"", Tags: []string{"ports"}, Error: "apply: the node programmer failed: <boom>"})
	dir := writeSample(t, r)
	raw := read(t, filepath.Join(dir, JUnitFile))
	if !bytes.HasPrefix(raw, []byte(xml.Header)) {
		t.Error("no XML declaration")
	}
	var doc junitDoc
	if err := xml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("junit.xml does not parse: %v\n%s", err, raw)
	}
	if doc.Tests != 4 || doc.Failures != 1 || doc.Errors != 1 || len(doc.Suites) != 1 {
		t.Fatalf("testsuites tests=%d failures=%d errors=%d suites=%d, want 4 1 1 1", doc.Tests, doc.Failures, doc.Errors, len(doc.Suites))
	}
	s := doc.Suites[0]
	if s.Tests != 4 || s.Failures != 1 || s.Errors != 1 || s.Time != "12.750" {
		t.Errorf("testsuite tests=%d failures=%d errors=%d time=%s", s.Tests, s.Failures, s.Errors, s.Time)
	}
	wantNames := []string{"step 1: apply", "step 1: allow-all baseline", "step 2: deny x to y/a", "run"}
	wantClass := []string{r.Cases[0].Name, r.Cases[1].Name, r.Cases[1].Name, r.Cases[2].Name}
	for i, c := range s.Cases {
		if c.Name != wantNames[i] || c.Classname != wantClass[i] {
			t.Errorf("testcase %d: %q classname %q, want %q %q", i, c.Name, c.Classname, wantNames[i], wantClass[i])
		}
	}
	if s.Cases[3].Classname != r.Cases[2].Name || s.Cases[3].Error == nil || !strings.Contains(s.Cases[3].Error.Message, "<boom>") {
		t.Errorf("the errored case: %+v", s.Cases[3])
	}
	f := s.Cases[2].Failure
	if f == nil || f.Message != "2 of 162 cells mismatch" {
		t.Fatalf("failure of step 2: %+v", f)
	}
	for _, line := range []string{
		"x/b -> y/a tcp/80: expected denied, observed allowed (ok)",
		"z/c -> y/a udp/81: expected allowed, observed denied (timeout)",
	} {
		if !strings.Contains(f.Text, line) {
			t.Errorf("failure text lacks %q:\n%s", line, f.Text)
		}
	}
	if s.Cases[0].Failure != nil || s.Cases[1].Failure != nil {
		t.Error("a clean step failed")
	}
	if s.Cases[1].Time != "4.625" {
		t.Errorf("step time %s, want the case's time split over its steps", s.Cases[1].Time)
	}
}

// voidElements close themselves in HTML.
var voidElements = map[string]bool{"area": true, "base": true, "br": true, "col": true, "embed": true, "hr": true, "img": true, "input": true, "link": true, "meta": true, "source": true, "track": true, "wbr": true}

// checkBalanced fails unless every element the page opens is closed, in
// order: index.html is written to be well-formed, not merely parseable.
func checkBalanced(t *testing.T, page []byte) {
	t.Helper()
	z := html.NewTokenizer(bytes.NewReader(page))
	var stack []string
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			if z.Err() != io.EOF {
				t.Fatal(z.Err())
			}
			if len(stack) > 0 {
				t.Fatalf("unclosed elements at the end: %v", stack)
			}
			return
		case html.StartTagToken:
			name, _ := z.TagName()
			if !voidElements[string(name)] {
				stack = append(stack, string(name))
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			if len(stack) == 0 || stack[len(stack)-1] != string(name) {
				t.Fatalf("</%s> closes %v", name, stack)
			}
			stack = stack[:len(stack)-1]
		}
	}
}

func TestHTML(t *testing.T) {
	r := sampleReport()
	r.Notes = append(r.Notes, `<img src=x onerror="alert(1)"> & more`)
	dir := writeSample(t, r)
	page := read(t, filepath.Join(dir, HTMLFile))
	checkBalanced(t, page)
	s := string(page)
	for _, want := range []string{
		`<div class="cards" id="summary">`,
		"<b>2</b><span>cases</span> &middot; 1 passed, 1 failed",
		"<b>3</b><span>steps</span>",
		"<b>486</b><span>probes</span>",
		"<b>2</b><span>mismatches</span>",
		"<b>162</b><span>skipped probes</span>",
		"<b>12.8s</b><span>duration</span>",
		"<b>lab</b><span>runner</span>",
		"SCTP not probed: the kernel has no sctp module",
		// the failing case is open, the passing one collapsed
		`<details class="case fail t3 t4" id="c2" open>`,
		`<details class="case pass t0 t1 t2" id="c1">`,
		// both cells in the matrices, marked and linked
		`<td class="d x" title="x/b → y/a tcp/80: denied (mismatch)"><a href="#c2-s2-m1"></a></td>`,
		`<td class="a x" title="x/b → y/a tcp/80: allowed (mismatch)"><a href="#c2-s2-m1"></a></td>`,
		`<td class="a x" title="z/c → y/a udp/81: allowed (mismatch)"><a href="#c2-s2-m2"></a></td>`,
		`<td class="d x" title="z/c → y/a udp/81: denied (mismatch)"><a href="#c2-s2-m2"></a></td>`,
		"<b>tcp/80</b> expected</figcaption>",
		"<b>udp/81</b> observed</figcaption>",
		"<b>tcp/80</b> expected = observed</figcaption>",
		// explain and trace, escaped
		`Decision: DENIED by the Admin tier: AdminNetworkPolicy deny-x-to-y-a ingress[0] &#34;deny-x&#34;, action Deny`,
		`netpol/in.5f0c2a91d3e4: ip saddr @peers.9b1e77a0c2d1.4 tcp dport 80 accept   -&gt; accept   [10.244.1.12]`,
		`-&gt; drop   &lt;script&gt;alert(&#34;not run&#34;)&lt;/script&gt;`,
		`<div class="mm" id="c2-s2-m2">`,
		"expected <b>allowed</b>, observed <b>denied</b> (timeout)",
		// the YAML, collapsed
		`<details class="yaml"><summary>YAML applied in this step</summary><pre>apiVersion: policy.networking.k8s.io/v1alpha1`,
		// tag filters
		`body:has(#f-t3:checked) details.case:not(.t3){display:none}`,
		`<label for="f-t3">admin</label>`,
		`&lt;img src=x onerror=&#34;alert(1)&#34;&gt; &amp; more`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("index.html lacks %s", want)
		}
	}
	for _, bad := range []string{"<script", "<img", "http://", "https://", "<link"} {
		if strings.Contains(s, bad) {
			t.Errorf("index.html has %q (no scripts, no external assets)", bad)
		}
	}
	// Mismatching cells: 2 in each of expected and observed.
	if n := strings.Count(s, ` x"`); n != 4 {
		t.Errorf("%d marked cells, want 4", n)
	}
	// Passing steps show one matrix per port, the failing step two.
	if n := strings.Count(s, "<table class=\"m\">"); n != 2+2+4 {
		t.Errorf("%d matrices, want 8", n)
	}
}

func TestHTMLWithoutTables(t *testing.T) {
	r := &conformance.Report{Cases: []conformance.CaseResult{{Name: "x", Passed: false, Error: "lab: no nodes", Steps: []conformance.StepResult{{Step: 1}}}}}
	var b bytes.Buffer
	if err := HTML(&b, r); err != nil {
		t.Fatal(err)
	}
	checkBalanced(t, b.Bytes())
	for _, want := range []string{"no tables recorded for this step", `<div class="error">lab: no nodes</div>`, "<b>&ndash;</b><span>runner</span>"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %s", want)
		}
	}
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestProgressTerminal(t *testing.T) {
	var b bytes.Buffer
	c := &clock{t: time.Unix(0, 0)}
	p := newProgress(&b, 4, true, c.now)
	r := sampleReport()
	c.t = c.t.Add(10 * time.Second)
	p.CaseDone(r.Cases[0])
	c.t = c.t.Add(10 * time.Second)
	p.CaseDone(r.Cases[1])
	p.Done()
	p.Done()
	p.CaseDone(r.Cases[0]) // after Done: nothing
	out := b.String()
	want := "\r\x1b[K[0/4] 0 mismatches · starting" +
		"\r\x1b[K[1/4] 0 mismatches · ETA 30s · target: ingress isolates y/a, allow from namesp…" +
		"\r\x1b[KFAIL admin: ANP Deny at priority 10 beats a NetworkPolicy allow: 2 mismatching cells\n" +
		"\r\x1b[K[2/4] 2 mismatches · ETA 20s · admin: ANP Deny at priority 10 beats a NetworkP…" +
		"\r\x1b[K2 cases done, 1 failed, 2 mismatches, in 20s\n"
	if out != want {
		t.Errorf("got\n%q\nwant\n%q", out, want)
	}
	for _, line := range strings.Split(out, "\r") {
		if n := len([]rune(strings.TrimPrefix(strings.TrimSuffix(line, "\n"), "\x1b[K"))); n > lineWidth && !strings.HasPrefix(line, "\x1b[KFAIL") {
			t.Errorf("live line of %d columns: %q", n, line)
		}
	}
}

func TestProgressPlain(t *testing.T) {
	var b bytes.Buffer
	c := &clock{t: time.Unix(0, 0)}
	p := newProgress(&b, 12, false, c.now)
	r := sampleReport()
	r.Cases = append(r.Cases, conformance.CaseResult{Name: "broken", Error: "apply: boom"})
	for _, cr := range r.Cases {
		c.t = c.t.Add(time.Second)
		p.CaseDone(cr)
	}
	p.Done()
	want := "[ 1/12] PASS target: ingress isolates y/a, allow from namespace x on tcp/80 (3.5s)\n" +
		"[ 2/12] FAIL admin: ANP Deny at priority 10 beats a NetworkPolicy allow (9.3s): 2 mismatching cells\n" +
		"[ 3/12] FAIL broken (0s): error: apply: boom\n" +
		"3 cases done, 2 failed, 2 mismatches, in 3s\n"
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if strings.ContainsAny(b.String(), "\r\x1b") {
		t.Error("control characters in plain output")
	}
}

func TestText(t *testing.T) {
	var b bytes.Buffer
	if err := Text(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	want := `TAG       CASES  PASSED  FAILED  MISMATCHES
target    1      1       0       0
peers     1      1       0       0
ports     1      1       0       0
admin     1      0       1       2
priority  1      0       1       2

Failing cases (1):
  admin: ANP Deny at priority 10 beats a NetworkPolicy allow [admin,priority]
    step 2: deny x to y/a: 2 of 162 cells mismatch
      x/b -> y/a tcp/80: expected denied, observed allowed (ok)
      z/c -> y/a udp/81: expected allowed, observed denied (timeout)

Notes:
  SCTP not probed: the kernel has no sctp module (162 probes skipped)

2 cases (1 passed, 1 failed), 3 steps, 486 probes, 2 mismatches, 162 skipped probes, in 12.8s, runner lab
`
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestLargeReport renders a report the size of a full lab run (400 cases
// of two steps, 12 pods, 5 ports): the page must stay a size a browser
// opens.
func TestLargeReport(t *testing.T) {
	base := sampleReport()
	pods := []string{"x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c", "host/node-1", "host/node-2", "outside/203.0.113.10"}
	ports := []string{"tcp/80", "tcp/81", "udp/80", "udp/81", "sctp/80"}
	tbl := &eval.TruthTable{Pods: pods, Ports: ports}
	for _, ps := range ports {
		p, err := l4.ParsePort(ps)
		if err != nil {
			t.Fatal(err)
		}
		for i, from := range pods {
			for j, to := range pods {
				tbl.Results = append(tbl.Results, eval.Result{From: from, To: to, Protocol: p.Protocol, Port: p.Port, Allowed: (i+j)%3 != 0})
			}
		}
	}
	r := &conformance.Report{Runner: "lab"}
	for i := 0; i < 400; i++ {
		c := conformance.CaseResult{Name: fmt.Sprintf("case-%03d", i), Tags: []string{"peers", "admin"}[i%2:], Passed: true}
		for s := 1; s <= 2; s++ {
			c.Steps = append(c.Steps, conformance.StepResult{Step: s, Probes: len(tbl.Results), Expected: tbl, Observed: tbl, Apply: sampleYAML})
		}
		r.Cases = append(r.Cases, c)
	}
	r.Cases[7] = base.Cases[1]
	start := time.Now()
	var b bytes.Buffer
	if err := HTML(&b, r); err != nil {
		t.Fatal(err)
	}
	t.Logf("400 cases, %d cells: index.html %.1f MB in %v", 400*2*len(tbl.Results), float64(b.Len())/1e6, time.Since(start))
	if b.Len() > 30<<20 {
		t.Errorf("index.html is %d bytes", b.Len())
	}
}

func TestProgressConcurrent(t *testing.T) {
	var b bytes.Buffer
	p := NewProgress(&b, 64, true)
	r := sampleReport()
	done := make(chan bool)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 8; i++ {
				p.CaseDone(r.Cases[i%2])
			}
			done <- true
		}()
	}
	for g := 0; g < 8; g++ {
		<-done
	}
	p.Done()
	if !strings.HasSuffix(b.String(), "64 cases done, 32 failed, 64 mismatches, in 0s\n") {
		t.Errorf("got %q", b.String()[max(0, b.Len()-120):])
	}
}

// TestOutsideRowAndColumn renders a lab step with the outside as a peer:
// one more row and column named by its address, no outside -> outside
// cell (shown not probed), and a mismatching outside cell linked like any
// other, in HTML, text and report.json.
func TestOutsideRowAndColumn(t *testing.T) {
	const outside = "192.0.2.10"
	withOutside := func(t *eval.TruthTable, allowed func(from, to string) bool) *eval.TruthTable {
		out := *t
		out.Pods = append(append([]string(nil), t.Pods...), outside)
		out.Results = append([]eval.Result(nil), t.Results...)
		for _, p := range sampleProbes {
			for _, pod := range samplePods {
				out.Results = append(out.Results,
					eval.Result{From: pod, To: outside, Protocol: p.Protocol, Port: p.Port, Allowed: allowed(pod, outside)},
					eval.Result{From: outside, To: pod, Protocol: p.Protocol, Port: p.Port, Allowed: allowed(outside, pod)})
			}
		}
		return &out
	}
	// x denies egress to the outside; the kernel lets x/a out on tcp/80.
	exp := withOutside(table(func(string, string, l4.Port) bool { return true }),
		func(from, to string) bool { return to != outside || ns(from) != "x" })
	m := conformance.Mismatch{From: "x/a", To: outside, Protocol: corev1.ProtocolTCP, Port: 80, Expected: false, Observed: true, Result: "ok",
		Explain: "x/a (10.244.1.10) -> 192.0.2.10 TCP/80: DENIED", Trace: "traced through the nftables tables: DENIED"}
	probes := len(exp.Results)
	r := &conformance.Report{
		Summary: conformance.Summary{Cases: 1, Steps: 1, Probes: probes, Mismatches: 1},
		Runner:  "lab",
		Cases: []conformance.CaseResult{{Name: "networks: x denies egress to the outside", Tags: []string{"networks"},
			Steps: []conformance.StepResult{{Step: 0, Probes: probes, Mismatches: []conformance.Mismatch{m}, Expected: exp, Observed: flip(exp, m)}}}},
	}
	dir := writeSample(t, r)
	page := read(t, filepath.Join(dir, HTMLFile))
	checkBalanced(t, page)
	s := string(page)
	for _, want := range []string{
		`<th>192.0.2.10</th>`,
		`<td class="d x" title="x/a → 192.0.2.10 tcp/80: denied (mismatch)"><a href="#c1-s1-m1"></a></td>`,
		`<td class="a x" title="x/a → 192.0.2.10 tcp/80: allowed (mismatch)"><a href="#c1-s1-m1"></a></td>`,
		`title="192.0.2.10 → 192.0.2.10 tcp/80: not probed"`,
		`<div class="mm" id="c1-s1-m1">`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("index.html lacks %s", want)
		}
	}
	var b bytes.Buffer
	if err := Text(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("step 0: 1 of %d cells mismatch", probes),
		"x/a -> 192.0.2.10 tcp/80: expected denied, observed allowed (ok)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	var doc struct {
		Cases []struct {
			Steps []struct {
				Probes     int
				Mismatches []conformance.Mismatch
			}
		}
	}
	if err := json.Unmarshal(read(t, filepath.Join(dir, JSONFile)), &doc); err != nil {
		t.Fatal(err)
	}
	if st := doc.Cases[0].Steps[0]; st.Probes != 9*9*2+2*9*2 || len(st.Mismatches) != 1 || st.Mismatches[0].To != outside {
		t.Errorf("report.json step %+v", st)
	}
}
