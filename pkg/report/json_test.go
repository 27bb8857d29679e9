package report

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/netpol/netpol/pkg/eval"
)

// The streamed JSON must decode to exactly what encoding/json would give.
func TestTableJSONMatchesEncodingJSON(t *testing.T) {
	for _, table := range []*eval.TruthTable{
		{},
		{Pods: []string{"x/a", `we"ird/na\me`}, Ports: []string{"tcp/80"}, Skipped: []string{"y/b"}, Results: []eval.Result{
			{From: "x/a", To: `we"ird/na\me`, Protocol: "TCP", Port: 80, Allowed: true},
			{From: `we"ird/na\me`, To: "x/a", Protocol: "TCP", Port: 80, Allowed: false},
		}},
	} {
		var buf bytes.Buffer
		if err := TruthTableJSON(&buf, table); err != nil {
			t.Fatal(err)
		}
		var got, want eval.TruthTable
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
			t.Fatalf("invalid JSON %q: %v", buf.String(), err)
		}
		ref, _ := json.Marshal(table)
		if err := json.Unmarshal(ref, &want); err != nil {
			t.Fatal(err)
		}
		if want.Pods == nil {
			want.Pods, want.Ports = []string{}, []string{}
		}
		if want.Results == nil {
			want.Results = []eval.Result{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("got %+v, want %+v", got, want)
		}
	}
}

// Service probes follow the cells in the same results array, with the
// cell fields plus endpoint, result and address; TableDocument is the same
// value for other encoders.
func TestTableJSONWithServices(t *testing.T) {
	services := []ServiceResult{
		{From: "x/a", To: "service/y/web", Protocol: "TCP", Port: 80, Allowed: true, Endpoint: "y/b", Result: "ok", Address: "10.96.0.10"},
		{From: "external", To: "nodeport/node-1/y/web", Protocol: "UDP", Port: 30053, Result: "timeout", Address: "172.18.0.2"},
	}
	for _, table := range []*eval.TruthTable{
		{},
		{Pods: []string{"x/a"}, Ports: []string{"tcp/80"}, Results: []eval.Result{
			{From: "x/a", To: "x/a", Protocol: "TCP", Port: 80, Allowed: true},
		}},
	} {
		var buf bytes.Buffer
		if err := TruthTableJSON(&buf, table, services...); err != nil {
			t.Fatal(err)
		}
		var got map[string]any
		if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
			t.Fatalf("invalid JSON %q: %v", buf.String(), err)
		}
		results, _ := got["results"].([]any)
		if len(results) != len(table.Results)+len(services) {
			t.Fatalf("%d results, want %d: %s", len(results), len(table.Results)+len(services), buf.String())
		}
		last := results[len(results)-1].(map[string]any)
		want := map[string]any{"from": "external", "to": "nodeport/node-1/y/web", "protocol": "UDP", "port": 30053.0,
			"allowed": false, "endpoint": "", "result": "timeout", "address": "172.18.0.2"}
		if !reflect.DeepEqual(last, want) {
			t.Errorf("last row %v, want %v", last, want)
		}
		doc, err := json.Marshal(TruthTableDocument(table, services))
		if err != nil {
			t.Fatal(err)
		}
		var fromDoc map[string]any
		json.Unmarshal(doc, &fromDoc)
		if !reflect.DeepEqual(fromDoc, got) {
			t.Errorf("TableDocument:\n %s\nTableJSON:\n %s", doc, buf.String())
		}
	}
}
