package eval

import (
	"runtime"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

// TruthTableOptions choose the rows, columns and ports of a truth table.
type TruthTableOptions struct {
	// Probes are the ports; empty means the union of the declared
	// container ports of the table's pods.
	Probes []l4.Port
	// Namespaces restricts the table to pods of these namespaces; empty
	// means all.
	Namespaces []string
	Family     ipfamily.Family
}

// TruthTable is the truth table: every pod to every other pod on every probe.
type TruthTable struct {
	Pods    []string `json:"pods"`
	Ports   []string `json:"ports"`
	Results []Result `json:"results"`
	// Skipped lists pods left out (no address in the family, not running).
	Skipped []string `json:"skipped,omitempty"`
}

// Result is one cell; the field names are a stable contract for scripts.
type Result struct {
	From     string          `json:"from"`
	To       string          `json:"to"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	Allowed  bool            `json:"allowed"`
}

// TruthTable computes the truth table. Rows are filled in parallel; each cell is
// the same decision Explain traces.
func (e *Evaluator) TruthTable(opts TruthTableOptions) *TruthTable {
	return e.TruthTableWith(opts, e.Allowed)
}

// Decider decides one cell of a truth table.
type Decider func(src, dst Endpoint, probe l4.Port) bool

// TruthTableWith computes the truth table with another decider for the cells
// (the data plane's, for `netpol table --engine nft`): same rows, columns,
// ports and address choice as Table. allowed is called from several
// goroutines.
func (e *Evaluator) TruthTableWith(opts TruthTableOptions, allowed Decider) *TruthTable {
	t := &TruthTable{}
	eps := e.tablePods(opts, t)
	probes := opts.Probes
	if len(probes) == 0 {
		probes = e.declaredProbes(eps)
	}
	for _, p := range probes {
		t.Ports = append(t.Ports, p.String())
	}
	n := len(eps)
	t.Results = make([]Result, len(probes)*n*n)
	rows := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rows {
				pi, si := r/n, r%n
				probe, src := probes[pi], eps[si]
				base := (pi*n + si) * n
				for di, dst := range eps {
					from, ok := src, true
					if src.Addr.Is4() != dst.Addr.Is4() {
						// Primary addresses of different families: the
						// source dials from its address of dst's family.
						from, ok = e.ix.podEndpoint(src.Pod, ipfamily.Of(dst.Addr))
					}
					allowed := ok && allowed(from, dst, probe)
					t.Results[base+di] = Result{From: t.Pods[si], To: t.Pods[di], Protocol: probe.Protocol, Port: probe.Port, Allowed: allowed}
				}
			}
		}()
	}
	for r := 0; r < len(probes)*n; r++ {
		rows <- r
	}
	close(rows)
	wg.Wait()
	return t
}

// tablePods are the endpoints of the table's rows and columns (their
// names in t.Pods; the pods without an address of the family in
// t.Skipped).
func (e *Evaluator) tablePods(opts TruthTableOptions, t *TruthTable) []Endpoint {
	inNS := map[string]bool{}
	for _, ns := range opts.Namespaces {
		inNS[ns] = true
	}
	var eps []Endpoint
	for i, p := range e.ix.pods {
		if len(inNS) > 0 && !inNS[p.namespace] {
			continue
		}
		ep, ok := e.ix.podEndpoint(i, opts.Family)
		if !ok {
			t.Skipped = append(t.Skipped, p.key)
			continue
		}
		eps = append(eps, ep)
		t.Pods = append(t.Pods, p.key)
	}
	return eps
}

// TablePods are the rows (and columns) of a table of opts.
func (e *Evaluator) TablePods(opts TruthTableOptions) []string {
	t := &TruthTable{}
	e.tablePods(opts, t)
	return t.Pods
}

// DeclaredProbes are the ports a table of opts without Probes has: the
// union of the container ports its pods declare, in the table's order.
func (e *Evaluator) DeclaredProbes(opts TruthTableOptions) []l4.Port {
	return e.declaredProbes(e.tablePods(opts, &TruthTable{}))
}

// declaredProbes is the union of the container ports the pods declare.
func (e *Evaluator) declaredProbes(eps []Endpoint) []l4.Port {
	seen := map[l4.Port]bool{}
	var out []l4.Port
	for _, ep := range eps {
		for _, cp := range e.ix.pods[ep.Pod].ports {
			p := l4.Port{Protocol: policy.ContainerPortProtocol(cp), Port: cp.ContainerPort}
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return protocolOrder[out[i].Protocol] < protocolOrder[out[j].Protocol]
	})
	return out
}

var protocolOrder = map[corev1.Protocol]int{corev1.ProtocolTCP: 0, corev1.ProtocolUDP: 1, corev1.ProtocolSCTP: 2}
