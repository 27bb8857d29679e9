package report

import (
	"bufio"
	"encoding/json"
	"io"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
)

// ServiceResult is one Service probe as a row of a table's results: the
// fields of a cell (To names "service/NAMESPACE/NAME" for a ClusterIP or
// "nodeport/NODE/NAMESPACE/NAME" for a NodePort; From may be "external";
// Port is the port dialed), plus the pod that answered, how the probe
// ended (ok, timeout, refused, ...) and the address dialed.
type ServiceResult struct {
	From     string          `json:"from"`
	To       string          `json:"to"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	Allowed  bool            `json:"allowed"`
	Endpoint string          `json:"endpoint"`
	Result   string          `json:"result"`
	Address  string          `json:"address"`
	// Why says why a NodePort probe timed out: policy after DNAT or the
	// Service's traffic policy.
	Why string `json:"why,omitempty"`
}

// TruthTableJSON streams the table as JSON, one result per line, in the shape
// encoding/json gives eval.TruthTable. A 1,000-pod table has millions of cells:
// streaming keeps memory at the size of the table itself. Service probes,
// if any, follow the cells in the same results array.
func TruthTableJSON(w io.Writer, t *eval.TruthTable, services ...ServiceResult) error {
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
	for i, r := range services {
		if i > 0 || len(t.Results) > 0 {
			bw.WriteByte(',')
		}
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		bw.WriteByte('\n')
		bw.Write(data)
	}
	bw.WriteString("\n]}\n")
	return bw.Flush()
}

// TruthTableDocument is the table with its Service probes as one value, in
// TableJSON's shape, for other encoders (YAML).
func TruthTableDocument(t *eval.TruthTable, services []ServiceResult) any {
	results := make([]any, 0, len(t.Results)+len(services))
	for _, r := range t.Results {
		results = append(results, r)
	}
	for _, r := range services {
		results = append(results, r)
	}
	pods, ports := t.Pods, t.Ports
	if pods == nil {
		pods = []string{}
	}
	if ports == nil {
		ports = []string{}
	}
	return struct {
		Pods    []string `json:"pods"`
		Ports   []string `json:"ports"`
		Skipped []string `json:"skipped,omitempty"`
		Results []any    `json:"results"`
	}{pods, ports, t.Skipped, results}
}
