package generator

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// SplitDocs parses a YAML stream into its (non-empty) documents.
func SplitDocs(stream string) ([]M, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader([]byte(stream))))
	var out []M
	for {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		var m M
		if err := yaml.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		if len(m) > 0 {
			out = append(out, m)
		}
	}
}

func joinDocs(docs []M) string {
	parts := make([]string, len(docs))
	for i, d := range docs {
		parts[i] = marshal(d)
	}
	return strings.Join(parts, "---\n")
}

// docKey names a document's object: kind, namespace, name.
func docKey(d M) string {
	kind, _ := d["kind"].(string)
	meta, _ := d["metadata"].(M)
	name, _ := meta["name"].(string)
	ns, _ := meta["namespace"].(string)
	if ns == "" && (kind == "Pod" || kind == "NetworkPolicy" || kind == "Service" || kind == "EndpointSlice") {
		ns = "default"
	}
	return kind + "/" + ns + "/" + name
}

func isPolicyDoc(d M) bool {
	switch d["kind"] {
	case "NetworkPolicy", "AdminNetworkPolicy", "BaselineAdminNetworkPolicy", "ClusterNetworkPolicy":
		return true
	}
	return false
}

// shrinkState is a case with its steps' documents parsed.
type shrinkState struct {
	c    Case
	docs [][]M
}

func parseCase(c Case) (shrinkState, error) {
	s := shrinkState{c: c, docs: make([][]M, len(c.Steps))}
	for i, st := range c.Steps {
		d, err := SplitDocs(st.Apply)
		if err != nil {
			return s, fmt.Errorf("step %d: %w", i, err)
		}
		s.docs[i] = d
	}
	return s, nil
}

// build renders the state back into a case.
func (s shrinkState) build() Case {
	c := s.c
	c.Steps = make([]Step, len(s.docs))
	for i := range s.docs {
		st := s.c.Steps[i]
		st.Apply = ""
		if len(s.docs[i]) > 0 {
			st.Apply = joinDocs(s.docs[i])
		}
		c.Steps[i] = st
	}
	return c
}

// deepCopy copies a parsed document.
func deepCopy(v any) any {
	switch t := v.(type) {
	case M:
		out := make(M, len(t))
		for k, e := range t {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// listPaths finds every list element inside v: each is a way to drop one
// rule, peer, port, except entry, network, selector term...
type listElem struct {
	path []any // keys (string) and indexes (int) to the list
	idx  int
}

func listElems(v any, path []any, out *[]listElem) {
	switch t := v.(type) {
	case M:
		for _, k := range sortedKeys(t) {
			listElems(t[k], append(append([]any{}, path...), k), out)
		}
	case []any:
		for i, e := range t {
			*out = append(*out, listElem{path: path, idx: i})
			listElems(e, append(append([]any{}, path...), i), out)
		}
	}
}

// dropElem returns a copy of doc without the element e.
func dropElem(doc M, e listElem) M {
	cp := deepCopy(doc).(M)
	var parent any = cp
	for _, p := range e.path[:len(e.path)-1] {
		switch k := p.(type) {
		case string:
			parent = parent.(M)[k]
		case int:
			parent = parent.([]any)[k]
		}
	}
	last := e.path[len(e.path)-1]
	var list []any
	switch k := last.(type) {
	case string:
		list = parent.(M)[k].([]any)
	case int:
		list = parent.([]any)[k].([]any)
	}
	shorter := append(append([]any{}, list[:e.idx]...), list[e.idx+1:]...)
	switch k := last.(type) {
	case string:
		parent.(M)[k] = shorter
	case int:
		parent.([]any)[k] = shorter
	}
	return cp
}

// candidates are the cases one reduction smaller than s: a step dropped, a
// delete dropped, a document dropped, or one list element inside a
// policy's spec dropped. Larger reductions come first.
func (s shrinkState) candidates() []shrinkState {
	var out []shrinkState
	clone := func() shrinkState {
		n := shrinkState{c: s.c, docs: make([][]M, len(s.docs))}
		n.c.Steps = append([]Step{}, s.c.Steps...)
		for i := range s.docs {
			n.docs[i] = append([]M{}, s.docs[i]...)
		}
		return n
	}
	for i := range s.docs {
		if len(s.docs) > 1 {
			n := clone()
			n.c.Steps = append(n.c.Steps[:i:i], n.c.Steps[i+1:]...)
			n.docs = append(n.docs[:i:i], n.docs[i+1:]...)
			out = append(out, n)
		}
	}
	for i := range s.docs {
		for j := range s.c.Steps[i].Delete {
			n := clone()
			st := n.c.Steps[i]
			st.Delete = append(st.Delete[:j:j], st.Delete[j+1:]...)
			n.c.Steps[i] = st
			out = append(out, n)
		}
		for j := range s.docs[i] {
			n := clone()
			n.docs[i] = append(n.docs[i][:j:j], n.docs[i][j+1:]...)
			out = append(out, n)
		}
	}
	for i := range s.docs {
		for j, d := range s.docs[i] {
			if !isPolicyDoc(d) {
				continue
			}
			var elems []listElem
			listElems(d["spec"], []any{"spec"}, &elems)
			for _, e := range elems {
				n := clone()
				n.docs[i][j] = dropElem(d, e)
				out = append(out, n)
			}
		}
	}
	return out
}

// Shrink reduces a failing case, delta-debugging style: it drops steps,
// deletes, documents, and rules, peers and ports inside policies, one at a
// time, keeping each reduction that still loads and builds cleanly (Check)
// and still fails, until no single reduction does. The result is
// 1-minimal: removing any one more piece makes it pass or invalid. A case
// that does not fail, or does not parse, is returned unchanged.
func Shrink(c Case, fails func(Case) bool) Case {
	s, err := parseCase(c)
	if err != nil || !fails(c) {
		return c
	}
	for {
		progress := false
		for _, cand := range s.candidates() {
			cc := cand.build()
			if Check(cc) == nil && fails(cc) {
				s, progress = cand, true
				break
			}
		}
		if !progress {
			break
		}
	}
	out := s.build()
	if !strings.HasSuffix(out.Name, "/shrunk") {
		out.Name += "/shrunk"
	}
	return out
}

// CaseYAML is the cluster state after the case's last step, as one
// multi-document YAML stream that loads on its own (`netpol explain -f`,
// `netpol table -f`, `netpol lab probe -f`): the base objects, with those
// the case replaced or deleted changed accordingly, then the case's policies
// and new objects.
func CaseYAML(c Case) string {
	type entry struct {
		key  string
		text string
	}
	var state []entry
	index := map[string]int{}
	put := func(key, text string) {
		if i, ok := index[key]; ok {
			state[i].text = text
			return
		}
		index[key] = len(state)
		state = append(state, entry{key, text})
	}
	for _, d := range baseDocs() {
		docs, err := SplitDocs(d)
		if err != nil || len(docs) != 1 {
			panic("generator: base document does not parse")
		}
		put(docKey(docs[0]), d)
	}
	for _, st := range c.Steps {
		for _, ref := range st.Delete {
			ns := ref.Namespace
			if ns == "" && (ref.Kind == "Pod" || ref.Kind == "NetworkPolicy") {
				ns = "default"
			}
			if i, ok := index[ref.Kind+"/"+ns+"/"+ref.Name]; ok {
				state[i].text = ""
			}
		}
		docs, err := SplitDocs(st.Apply)
		if err != nil {
			continue
		}
		for _, d := range docs {
			put(docKey(d), marshal(d))
		}
	}
	var parts []string
	for _, e := range state {
		if e.text != "" {
			parts = append(parts, strings.TrimRight(e.text, "\n")+"\n")
		}
	}
	head := "# netpol conformance case " + c.Name + ": the cluster state after its last step\n"
	if c.Description != "" {
		head += "# " + strings.ReplaceAll(c.Description, "\n", " ") + "\n"
	}
	return head + strings.Join(parts, "---\n")
}
