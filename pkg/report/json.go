package report

import (
	"bufio"
	"encoding/json"
	"io"
	"strconv"

	"github.com/netpol/netpol/pkg/eval"
)

// TableJSON streams the table as JSON, one result per line, in the shape
// encoding/json gives eval.Table. A 1,000-pod table has millions of cells:
// streaming keeps memory at the size of the table itself.
func TableJSON(w io.Writer, t *eval.Table) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	head := struct {
		Pods    []string `json:"pods"`
		Ports   []string `json:"ports"`
		Skipped []string `json:"skipped,omitempty"`
	}{t.Pods, t.Ports, t.Skipped}
	if head.Pods == nil {
		head.Pods = []string{}
	}
	if head.Ports == nil {
		head.Ports = []string{}
	}
	data, err := json.Marshal(head)
	if err != nil {
		return err
	}
	bw.Write(data[:len(data)-1]) // reopen the object for "results"
	bw.WriteString(`,"results":[`)
	quoted := map[string][]byte{}
	quote := func(s string) []byte {
		q, ok := quoted[s]
		if !ok {
			q, _ = json.Marshal(s)
			quoted[s] = q
		}
		return q
	}
	var num []byte
	for i, r := range t.Results {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.WriteString("\n{\"from\":")
		bw.Write(quote(r.From))
		bw.WriteString(`,"to":`)
		bw.Write(quote(r.To))
		bw.WriteString(`,"protocol":`)
		bw.Write(quote(string(r.Protocol)))
		bw.WriteString(`,"port":`)
		num = strconv.AppendInt(num[:0], int64(r.Port), 10)
		bw.Write(num)
		bw.WriteString(`,"allowed":`)
		bw.WriteString(strconv.FormatBool(r.Allowed))
		bw.WriteByte('}')
	}
	bw.WriteString("\n]}\n")
	return bw.Flush()
}
