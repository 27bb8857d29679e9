package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// checkYAMLToJSON: whatever yamlToJSON converts, yaml.YAMLToJSONStrict
// converts to the same value (keys aside from their order).
func checkYAMLToJSON(t *testing.T, doc []byte) (converted bool) {
	t.Helper()
	got, ok := yamlToJSON(doc, nil)
	if !ok {
		return false
	}
	want, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		t.Fatalf("yamlToJSON converted what YAML refuses (%v):\n%s\n=> %s", err, doc, got)
	}
	g, w := decodeAny(t, got), decodeAny(t, want)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("yamlToJSON:\n%s\n=> %s\nwant %s", doc, got, want)
	}
	return true
}

func decodeAny(t *testing.T, j []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(j))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("invalid JSON %s: %v", j, err)
	}
	return v
}

// splitDocs cuts a stream as the loader does.
func splitDocs(t testing.TB, data []byte) [][]byte {
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) || err != nil {
			return docs
		}
		docs = append(docs, doc)
	}
}

func yamlCorpus(t testing.TB) [][]byte {
	var docs [][]byte
	for _, pattern := range []string{"testdata/*.yaml", "../policy/testdata/*.yaml", "../../testdata/base/*.yaml", "../../examples/*.yaml", "../../examples/*/*.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, splitDocs(t, data)...)
		}
	}
	return append(docs, yamlCases...)
}

// yamlCases are what the converter must convert as YAML does, or leave.
var yamlCases = [][]byte{
	[]byte("a: 1\nb: -2\nc: 007\nd: 0x1f\ne: 1_000\nf: +5\ng: 0o17\nh: 0b101\ni: 9223372036854775808\nj: -0\n"),
	[]byte("a: 1\nb: -2\nc: 007\nd: 0x1f\ne: 1_000\nf: +5\ng: 0o17\nh: 0b101\nj: -0\nk: 08\nl: 0_1\n"),
	[]byte("labels: {app: web, tier: 'db', x: 1, e: , f: \"x y\"}\nports: [80, \"81\", x, {a: b}, [c]]\n"),
	[]byte("a: 1.5\nb: 1e3\nc: .5\nd: .inf\ne: -.inf\nf: .nan\ng: 1.\n"),
	[]byte("a: yes\nb: No\nc: on\nd: OFF\ne: y\nf: n\ng: ~\nh: null\ni:\nj: True\nk: tRue\nl: Yes!\n"),
	[]byte("a: 2024-05-01\nb: 2024-05-01T10:00:00Z\nc: 2024-5-1\nd: 1234-5678\ne: 12345-67\n"),
	[]byte("ip: 10.244.1.5\nv6: fd00::1\ncidr: 10.0.0.0/8\nport: 80\nq: 100m\nm: 128Mi\nuid: 9f1c2d3e-1111-2222-3333-444455556666\n"),
	[]byte("a: \"x\\ty\\n\\\"z\\\\ \\u00e9 \\x41 \\U0001F600 \\/\"\nb: 'it''s'\nc: \"\"\nd: ''\n"),
	[]byte("a: \"\\ud83d\"\n"),
	[]byte("a: \"\\q\"\n"),
	[]byte("labels: {app: web, tier: 'db', n: 1, e: , f: \"x y\"}\nports: [80, \"81\", x, {a: b}, [c]]\nempty: {}\nnone: []\n"),
	[]byte("a: {b: c,}\nd: [1, 2,]\n"),
	[]byte("a: {\"b\":c}\n"),
	[]byte("a: [b: c]\n"),
	[]byte("a: {b: c\n  , d: e}\n"),
	[]byte("k:{\"type\":\"Ready\"}:\n  .: {}\n  f:status: {}\n"),
	[]byte("- a\n- b: c\n  d: e\n-\n  f: g\n- - h\n"),
	[]byte("items:\n- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p\n- apiVersion: v1\n  kind: Pod\nkind: List\n"),
	[]byte("a:\n  - b\n  - c\nd:\n- e\n"),
	[]byte("a: |\n  line 1\n   line 2\n\n  line 3\nb: |-\n  x\n\n\nc: |+\n  y\n\n\nd: x\n"),
	[]byte("a: |\n\n  x\n"),
	[]byte("a: >\n  x\n  y\n"),
	[]byte("a: |2\n   x\n"),
	[]byte("- |\n  text\n- x\n"),
	[]byte("a: &x 1\nb: *x\n"),
	[]byte("a: !!str 1\n"),
	[]byte("a: 1\na: 2\n"),
	[]byte("a: {b: 1, b: 2}\n"),
	[]byte("a:\n  b: 1\n  c: 2\n  b: 3\n"),
	[]byte("? a\n: b\n"),
	[]byte("a: b: c\n"),
	[]byte("a: b\n c\n"),
	[]byte("a:\n\tb: c\n"),
	[]byte("a: b\t# c\n"),
	[]byte("a: b # comment\n# comment\nc: 'd' # e\nf: g#h\n"),
	[]byte("80: a\n"),
	[]byte("true: a\n"),
	[]byte("<<: {a: b}\n"),
	[]byte("a: <<\n"),
	[]byte("\"q\": 1\n'r': 2\n\"s t\": 3\n"),
	[]byte("a: -1\nb: -x\nc: -\n"),
	[]byte("a: ?x\nb: :x\n"),
	[]byte("a: [?x]\n"),
	[]byte("a: x # c\n  # c\nb: y\n"),
	[]byte("  a: 1\n  b: 2\n"),
	[]byte("a:\n    b: 1\n  c: 2\n"),
	[]byte("a: 1\n...\n"),
	[]byte("%YAML 1.1\na: 1\n"),
	[]byte("# only a comment\n"),
	[]byte("just a string\n"),
	[]byte("- [a, b]\n- {c: d}\n"),
	[]byte("a: [\"x\", 'y', \"z\"]\n"),
	[]byte("a: 'multi\n  line'\n"),
	[]byte("a: x\u0085y\n"),
	[]byte("a: \u00e9t\u00e9\n"),
	[]byte("a: x\n\n\n"),
	[]byte("a: |\n  x\n  # not a comment\nb: 1\n"),
	[]byte("a: |\n    x\n  y\n"),
	[]byte("metadata:\n  annotations:\n    kubectl.kubernetes.io/last-applied-configuration: |\n      {\"apiVersion\":\"v1\"}\n  name: x\n"),
}

func TestYAMLToJSONMatchesYAML(t *testing.T) {
	converted, total := 0, 0
	for _, doc := range yamlCorpus(t) {
		total++
		if checkYAMLToJSON(t, doc) {
			converted++
		}
	}
	t.Logf("converted %d of %d documents", converted, total)
	// The repository's own files are plain YAML: nearly all convert.
	if converted < total/2 {
		t.Errorf("converted only %d of %d documents", converted, total)
	}
	for _, doc := range []string{
		"a: 1\nb: [x, {c: d}]\n",
		"- a: 1\n  b: |\n    x\n- c\n",
		"metadata:\n  managedFields:\n  - f:metadata:\n      k:{\"a\":\"b\"}:\n        .: {}\n",
	} {
		if !checkYAMLToJSON(t, []byte(doc)) {
			t.Errorf("not converted:\n%s", doc)
		}
	}
}

// FuzzYAMLToJSON: yamlToJSON converts as yaml.YAMLToJSONStrict does, or
// not at all.
func FuzzYAMLToJSON(f *testing.F) {
	for _, doc := range yamlCorpus(f) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		if !bytes.HasSuffix(doc, []byte("\n")) {
			doc = append(doc, '\n')
		}
		if strings.Contains(string(doc), "\n---") || bytes.HasPrefix(doc, []byte("---")) {
			return // the splitter's
		}
		checkYAMLToJSON(t, doc)
	})
}

// Plain scalars resolve as yaml.v2 resolves them.
func TestYAMLToJSONScalars(t *testing.T) {
	for _, s := range []string{
		"0", "00", "-0", "+0", "007", "08", "1_0", "_1", "0x", "0x1g", "0x1F", "0X1F", "0o7", "0O7", "0o8", "0b", "0b2", "0b101", "-0b1", "0B1",
		"1.2.3", "1.", ".5", "1e5", "1E+5", "-1.5e-3", "+1", "1-2", "10.0.0.1", "10.0.0.0/8", "fd00::1", "1:2", "12:30", "1_000.5",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "18446744073709551615", "18446744073709551616",
		"123456789012345678", "1234567890123456789", "2024-05-01", "2024-5-1", "20240501", "1e", "e1", "abc", "dead", "beef", "cafe", "0xdead_beef",
		"1_", "1__0", "+.inf", "-.5", "+.5", ".", "-.", "100m", "128Mi", "1.5Gi", "3.14", "v1", "1a", "a1", "-a", "~x", "yes", "Off", "nil",
	} {
		doc := []byte("a: " + s + "\n")
		converted := checkYAMLToJSON(t, doc)
		t.Logf("%-24s converted=%v", s, converted)
	}
}
