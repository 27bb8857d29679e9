package cluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// referenceLoad is the loader as it was before it streamed: the whole
// input split by utilyaml.YAMLReader, every document through the YAML
// parser, then the same decoding.
func referenceLoad(data []byte, file string, replace bool, s *Snapshot) *Report {
	report := newReport()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			report.Errors = append(report.Errors, fmt.Errorf("%s (document %d): %w", file, doc, err))
			break
		}
		src := Source{File: file, Document: doc}
		j, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			report.Errors = append(report.Errors, fmt.Errorf("%s: invalid YAML: %w", src, err))
			continue
		}
		s.addObject(j, src, replace, report)
	}
	return report
}

// sameLoad compares what two loads found.
func sameLoad(a, b *Snapshot, ra, rb *Report) string {
	errs := func(r *Report) []string {
		var out []string
		for _, e := range r.Errors {
			out = append(out, e.Error())
		}
		return out
	}
	switch {
	case !slices.Equal(errs(ra), errs(rb)):
		return fmt.Sprintf("errors\n%q\n%q", errs(ra), errs(rb))
	case !slices.Equal(ra.Notes, rb.Notes):
		return fmt.Sprintf("notes\n%q\n%q", ra.Notes, rb.Notes)
	case !maps.Equal(ra.Skipped, rb.Skipped) || ra.Objects != rb.Objects:
		return fmt.Sprintf("skipped %v %d, %v %d", ra.Skipped, ra.Objects, rb.Skipped, rb.Objects)
	case !reflect.DeepEqual(a.Origin, b.Origin):
		return fmt.Sprintf("origins\n%v\n%v", a.Origin, b.Origin)
	case !reflect.DeepEqual(a.UnknownFields, b.UnknownFields):
		return fmt.Sprintf("unknown fields\n%v\n%v", a.UnknownFields, b.UnknownFields)
	case !reflect.DeepEqual(a, b):
		return fmt.Sprintf("objects differ: %v, %v", counts(a), counts(b))
	}
	return ""
}

// inParallel runs f with every input decoded on the worker goroutines.
func inParallel(t testing.TB, f func()) {
	old := parallelMin
	parallelMin = 0
	defer func() { parallelMin = old }()
	f()
}

// streamInputs are inputs that the streaming loader reads as the single
// pass did.
func streamInputs(t testing.TB) map[string][]byte {
	in := map[string][]byte{}
	for _, pattern := range []string{"testdata/*.yaml", "testdata/*.json", "../policy/testdata/*.yaml", "../../testdata/base/*.yaml", "../../examples/*.yaml", "../../examples/*/*.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			in[f] = data
		}
	}
	in["kubectlList"] = []byte(kubectlList)
	for name, s := range map[string]string{
		"empty":              "",
		"comments":           "# a\n---\n# b\n---\n",
		"blank documents":    "\n---\n\n---\n" + ns("a") + "---\n   \n---\n" + ns("b"),
		"bad separator":      ns("a") + "---\n" + ns("b") + "--- x\n" + ns("c"),
		"bad separator last": ns("a") + "---x\n",
		"dashes":             ns("a") + "----\n" + ns("b"),
		"separator comment":  ns("a") + "--- # next\n" + ns("b"),
		"document end":       ns("a") + "...\n---\n" + ns("b"),
		"CRLF":               strings.ReplaceAll(ns("a")+"---\n"+ns("b"), "\n", "\r\n"),
		"no final newline":   strings.TrimSuffix(ns("a"), "\n"),
		"JSON then YAML":     `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"j"}}` + "\n---\n" + ns("y"),
		"JSON with comments": "# lead\n\n  {\"apiVersion\": \"v1\", # c\n \"kind\": \"Namespace\", \"metadata\": {\"name\": \"j\"}} # t\n# after\n",
		"flow YAML":          "{apiVersion: v1, kind: Namespace, metadata: {name: f}}\n",
		"flow YAML items":    "{apiVersion: v1, kind: List, items: [{apiVersion: v1, kind: Namespace, metadata: {name: f}}]}\n",
		"JSON List, YAML items": `{"apiVersion": "v1", "kind": "List", "items": [{apiVersion: v1, kind: Namespace, metadata: {name: a}},
 {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b"}},]}`,
		"JSON List, kind first":        `{"kind":"List","apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}],"metadata":{}}`,
		"JSON not a List":              `{"apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}],"kind":"Pod","metadata":{"name":"p","namespace":"x"}}`,
		"JSON unknown kind with items": `{"apiVersion":"v1","items":[{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}}],"kind":"Thing","metadata":{"name":"t"}}`,
		"JSON items null":              `{"apiVersion":"v1","items":null,"kind":"List"}`,
		"JSON items mapping":           `{"apiVersion":"v1","items":{"a":"b"},"kind":"List"}`,
		"JSON List duplicate key":      `{"apiVersion":"v1","items":[],"kind":"List","kind":"List"}`,
		"JSON duplicate key":           `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a","labels":{"x":"1","x":"2"}}}`,
		"JSON escapes":                 `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a","labels":{"x":"a\/b","y":"\u00e9\n"}}}`,
		"JSON float port":              `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s","namespace":"x"},"spec":{"ports":[{"port":80.0}]}}`,
		"JSON unknown fields":          `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"x"},"zz":1,"spec":{"containers":[{"name":"c","b":1,"a":2}]}}`,
		"JSON skipped invalid":         `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"a" 1}}`,
		"JSON truncated":               `{"apiVersion": "v1", "kind": "Pod", "metadata": {"name"`,
		"JSON separator inside":        "{\"apiVersion\": \"v1\",\n---\n" + ns("b"),
		"JSON garbage after":           `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"a"}} x: y`,
		"JSON string newline":          "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"a\nb\"}}\n",
		"YAML List with anchors": `apiVersion: v1
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: a, labels: &l {team: x}}
- apiVersion: v1
  kind: Namespace
  metadata: {name: b, labels: *l}
kind: List
`,
		"YAML List, anchor in head": `apiVersion: &v v1
items:
- apiVersion: *v
  kind: Namespace
  metadata: {name: a}
kind: List
`,
		"YAML List, indented items": "apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: Namespace\n    metadata:\n      name: a\n  # a comment\n\n  - {apiVersion: v1, kind: Namespace, metadata: {name: b}}\nmetadata: {}\n",
		"YAML List, block scalars":  "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: c}\n  data:\n    a: |\n      - not an item\n      items:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: d}\n  data: {b: \"x\n    y\"}\nkind: List\n",
		"YAML List, quoted":         "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: 'a'}\n- 'x\n- y'\nkind: List\n",
		"YAML not a List":           "apiVersion: v1\nkind: Namespace\nmetadata: {name: n}\nitems:\n- a\n- b\n",
		"YAML items null":           "apiVersion: v1\nkind: List\nitems:\nmetadata: {}\n",
		"YAML items twice":          "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n",
		"YAML head error":           "apiVersion: v1\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\nkind: List\nkind: List\n",
		"YAML root sequence":        "- apiVersion: v1\n  kind: Namespace\n",
		"YAML tabs":                 "apiVersion: v1\nkind: Namespace\nmetadata:\n\tname: x\n",
		"duplicate across a List":   ns("a") + "---\napiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n",
		"List of not a List":        "apiVersion: v1\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n- {apiVersion: apps/v1, kind: Deployment, metadata: {name: d}}\nkind: Pod\nmetadata: {name: p, namespace: x}\n",
		"List of Lists":             "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: NamespaceList\n  items:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n  - {apiVersion: v1, kind: Namespace, metadata: {name: b}}\nkind: List\n",
	} {
		in[name] = []byte(s)
	}
	return in
}

// TestStreamMatchesReference: on inputs whose every List is valid YAML
// (and which hold no JSON objects one after the other), the streaming
// loader reads exactly what the single pass read: objects, origins,
// unknown fields, errors, notes, counts. Sequentially, in parallel, with
// and without replace, and read a byte at a time.
func TestStreamMatchesReference(t *testing.T) {
	for name, data := range streamInputs(t) {
		for _, replace := range []bool{false, true} {
			want := New()
			wantReport := referenceLoad(data, "f", replace, want)
			check := func(how string, got *Snapshot, gotReport *Report) {
				if diff := sameLoad(want, got, wantReport, gotReport); diff != "" {
					t.Errorf("%s (%s, replace %v): %s", name, how, replace, diff)
				}
			}
			got := New()
			check("sequential", got, got.AddDocuments(data, "f", replace))
			inParallel(t, func() {
				got := New()
				check("parallel", got, got.AddDocuments(data, "f", replace))
			})
			got = New()
			check("byte at a time", got, got.AddReader(iotest.OneByteReader(bytes.NewReader(data)), "f", replace))
		}
	}
}

// Where the streaming loader reads otherwise, by design: an error in one
// item of a List is that item's (the others load); JSON objects one after
// the other are documents each (the YAML parser read the first only).
func TestStreamedDocuments(t *testing.T) {
	item := func(name string) string {
		return fmt.Sprintf("{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": %q}}", name)
	}
	cases := []struct {
		name   string
		input  string
		want   []string // namespaces
		errs   []string // each error, whole
		origin map[string]int
	}{
		{
			name: "YAML List: a YAML error in item 2",
			input: `apiVersion: v1
items:
- apiVersion: v1
  kind: Namespace
  metadata: {name: a}
- apiVersion: v1
  kind: Namespace
  metadata: {name: b, name: c}
- apiVersion: v1
  kind: Namespace
  metadata: {name: d}
kind: List
`,
			want: []string{"a", "d"},
			errs: []string{"in.yaml (document 1, item 2): invalid YAML: yaml: unmarshal errors:\n  line 8: key \"name\" already set in map"},
		},
		{
			name:  "YAML List: a decoding error in item 3",
			input: "apiVersion: v1\nkind: List\nitems:\n- " + item("a") + "\n- " + item("b") + "\n- {apiVersion: v1, kind: Namespace, metadata: {name: c, labels: {x: 1}}}\n",
			want:  []string{"a", "b"},
			errs:  []string{"in.yaml (document 1, item 3): Namespace c: metadata.labels is a number, not a string"},
		},
		{
			name:  "JSON List: errors in items 2 and 3",
			input: `{"apiVersion": "v1", "items": [` + item("a") + `, ` + item("b/c") + `, {"kind": "Namespace"}, ` + item("d") + `], "kind": "List"}`,
			want:  []string{"a", "d"},
			errs: []string{
				`in.yaml (document 1, item 2): Namespace: metadata.name "b/c": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`,
				`in.yaml (document 1, item 3): object "" has no apiVersion or kind`,
			},
		},
		{
			name:  "JSON List: a YAML-only error in item 2, on its line",
			input: "{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [\n" + item("a") + ",\n{\"apiVersion\": \"v1\", \"kind\": \"Namespace\",\n \"metadata\": {\"name\": \"b\", \"name\": \"c\"}},\n" + item("d") + "]}",
			want:  []string{"a", "d"},
			errs:  []string{"in.yaml (document 1, item 2): invalid YAML: yaml: unmarshal errors:\n  line 4: key \"name\" already set in map"},
		},
		{
			name:  "JSON List cut short: nothing of it",
			input: `{"apiVersion": "v1", "kind": "List", "items": [` + item("a") + `, {"apiVersion": "v1"`,
			errs:  []string{"in.yaml (document 1, item 2): invalid JSON at line 1: unexpected end of input"},
		},
		{
			name:  "JSON List with a separator inside: nothing of it, the next document read",
			input: `{"apiVersion": "v1", "kind": "List", "items": [` + item("a") + ",\n---\n" + ns("b"),
			want:  []string{"b"},
			errs:  []string{"in.yaml (document 1, item 2): invalid JSON at line 2: a document separator (---) inside the object"},
		},
		{
			name:   "JSON objects one after the other",
			input:  item("a") + "\n" + item("b") + item("c") + "\n\n# c\n" + item("d") + "\n---\n" + ns("e"),
			want:   []string{"a", "b", "c", "d", "e"},
			origin: map[string]int{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5},
		},
		{
			name:   "JSON Lists one after the other",
			input:  `{"apiVersion":"v1","kind":"List","items":[` + item("a") + `]}{"apiVersion":"v1","kind":"List","items":[` + item("b") + `]}`,
			want:   []string{"a", "b"},
			origin: map[string]int{"a": 1, "b": 2},
		},
		{
			name:   "YAML with JSON documents inside",
			input:  ns("a") + "---\n" + item("b") + "\n---\n# c\n" + item("c") + "\n---\n" + ns("d"),
			want:   []string{"a", "b", "c", "d"},
			origin: map[string]int{"a": 1, "b": 2, "c": 3, "d": 4},
		},
		{
			name:  "something after a JSON List",
			input: `{"apiVersion":"v1","kind":"List","items":[` + item("a") + `]} x` + "\n---\n" + ns("b"),
			want:  []string{"b"},
			errs:  []string{"in.yaml (document 1): invalid JSON at line 1: more than one object"},
		},
	}
	for _, tc := range cases {
		for _, parallel := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/parallel=%v", tc.name, parallel), func(t *testing.T) {
				s := New()
				var r *Report
				if parallel {
					inParallel(t, func() { r = s.AddDocuments([]byte(tc.input), "in.yaml", false) })
				} else {
					r = s.AddDocuments([]byte(tc.input), "in.yaml", false)
				}
				var got []string
				for _, n := range s.Namespaces {
					got = append(got, n.Name)
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("namespaces %v, want %v", got, tc.want)
				}
				var errs []string
				for _, e := range r.Errors {
					errs = append(errs, e.Error())
				}
				if !slices.Equal(errs, tc.errs) {
					t.Errorf("errors\n%q\nwant\n%q", errs, tc.errs)
				}
				for name, doc := range tc.origin {
					if got := s.Origin[ObjectKey{Kind: KindNamespace, Name: name}]; got != (Source{APIVersion: "v1", File: "in.yaml", Document: doc}) {
						t.Errorf("origin of %s: %+v, want document %d", name, got, doc)
					}
				}
				if len(s.Origin) != len(got) {
					t.Errorf("%d origins for %d namespaces", len(s.Origin), len(got))
				}
			})
		}
	}
}

// The cases of TestAddDocuments and the testdata directory, decoded on
// the worker goroutines.
func TestAddDocumentsInParallel(t *testing.T) {
	inParallel(t, func() {
		t.Run("AddDocuments", TestAddDocuments)
		t.Run("LoadTestdataDir", TestLoadTestdataDir)
		t.Run("LoadPaths", TestLoadPaths)
	})
}

// A read error ends the input, reported, and drops the document it cut.
func TestAddReaderReadError(t *testing.T) {
	data := ns("a") + "---\n" + ns("b")
	r := io.MultiReader(strings.NewReader(data[:len(data)-5]), iotest.ErrReader(errors.New("disk on fire")))
	s := New()
	rep := s.AddReader(r, "f.yaml", false)
	if len(rep.Errors) != 1 || rep.Errors[0].Error() != "reading f.yaml: disk on fire" {
		t.Errorf("errors %v", rep.Errors)
	}
	if len(s.Namespaces) != 1 || s.Namespaces[0].Name != "a" {
		t.Errorf("namespaces %v", counts(s))
	}
}

// FuzzStream: the streaming loader reads what the single pass read
// wherever that found nothing wrong (and there are no JSON objects one
// after the other, which it did not read).
func FuzzStream(f *testing.F) {
	for _, data := range streamInputs(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		want := New()
		wantReport := referenceLoad(data, "f", false, want)
		got := New()
		gotReport := got.AddDocuments(data, "f", false)
		if len(wantReport.Errors) > 0 || len(gotReport.Errors) > 0 && bytes.Contains(data, []byte("}")) {
			return
		}
		if diff := sameLoad(want, got, wantReport, gotReport); diff != "" {
			t.Errorf("%s", diff)
		}
	})
}
