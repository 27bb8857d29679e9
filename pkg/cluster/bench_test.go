package cluster_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
)

// benchSpec is a 10,000-pod cluster (the easy shape) with Services and
// policies: 6.5 MB of YAML.
var benchSpec = synth.Spec{Namespaces: 100, Pods: 10000, Nodes: 100, NetworkPolicies: 1000, AdminPolicies: 100, Services: 2000, Seed: 1}

var benchInputs = sync.OnceValues(func() (yamlDoc, jsonList []byte) {
	yamlDoc = []byte(synth.YAML(benchSpec))
	var items []json.RawMessage
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(yamlDoc)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			panic(err)
		}
		if j = bytes.TrimSpace(j); len(j) > 0 && string(j) != "null" {
			items = append(items, j)
		}
	}
	jsonList, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		panic(err)
	}
	return yamlDoc, jsonList
})

// BenchmarkLoad loads the 10,000-pod synthetic cluster as the CLI reads a
// file: a multi-document YAML stream, and the same objects as one JSON
// `kind: List` (as `kubectl get -o json` prints it, but not indented).
// B/op is the memory decoding takes (the snapshot included).
func BenchmarkLoad(b *testing.B) {
	yamlDoc, jsonList := benchInputs()
	for _, in := range []struct {
		name string
		data []byte
	}{{"yaml", yamlDoc}, {"json-list", jsonList}} {
		b.Run(in.name, func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			for b.Loop() {
				s := cluster.New()
				if r := s.AddDocuments(in.data, "bench", false); len(r.Errors) > 0 || len(s.Pods) != benchSpec.Pods {
					b.Fatalf("%d pods, errors %v", len(s.Pods), r.Errors)
				}
			}
		})
	}
}
