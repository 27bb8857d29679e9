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
	for _, table := range []*eval.Table{
		{},
		{Pods: []string{"x/a", `we"ird/na\me`}, Ports: []string{"tcp/80"}, Skipped: []string{"y/b"}, Results: []eval.Result{
			{From: "x/a", To: `we"ird/na\me`, Protocol: "TCP", Port: 80, Allowed: true},
			{From: `we"ird/na\me`, To: "x/a", Protocol: "TCP", Port: 80, Allowed: false},
		}},
	} {
		var buf bytes.Buffer
		if err := TableJSON(&buf, table); err != nil {
			t.Fatal(err)
		}
		var got, want eval.Table
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
