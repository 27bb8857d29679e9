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
	cells := e.TableCells(opts, t)
	t.Results = make([]Result, cells.Len())
	cells.Run(func(c Cell) {
		t.Results[c.Index] = Result{From: t.Pods[c.Row], To: t.Pods[c.Column], Protocol: c.Probe.Protocol, Port: c.Probe.Port,
			Allowed: c.OK && allowed(c.Src, c.Dst, c.Probe)}
	})
	return t
}

// Cell is one cell of a table: its endpoints (the source's of the
// destination's family; OK is false when it has none) and probe, and
// where it is: its row and column (indexes into the table's pods) and
// its index among the table's results.
type Cell struct {
	Src, Dst    Endpoint
	Probe       l4.Port
	OK          bool
	Row, Column int
	Index       int
}

// Cells are a table's cells, to be run through (Run).
type Cells struct {
	e      *Evaluator
	eps    []Endpoint
	probes []l4.Port
}

// Len is the number of cells.
func (c Cells) Len() int { return len(c.probes) * len(c.eps) * len(c.eps) }

// Run calls fn for every cell, from several goroutines, a row at a
// time, as the truth table fills its results.
func (c Cells) Run(fn func(Cell)) {
	n := len(c.eps)
	rows := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Go(func() {
			for r := range rows {
				pi, si := r/n, r%n
				probe, src := c.probes[pi], c.eps[si]
				base := (pi*n + si) * n
				for di, dst := range c.eps {
					from, ok := src, true
					if src.Addr.Is4() != dst.Addr.Is4() {
						// Primary addresses of different families: the
						// source dials from its address of dst's family.
						from, ok = c.e.ix.podEndpoint(src.Pod, ipfamily.Of(dst.Addr))
					}
					fn(Cell{Src: from, Dst: dst, Probe: probe, OK: ok, Row: si, Column: di, Index: base + di})
				}
			}
		})
	}
	for r := 0; r < len(c.probes)*n; r++ {
		rows <- r
	}
	close(rows)
	wg.Wait()
}

// TableCells are the cells of the table of opts, whose pods, skipped pods and
// ports it puts in t (the truth table's, without results).
func (e *Evaluator) TableCells(opts TruthTableOptions, t *TruthTable) Cells {
	eps := e.tablePods(opts, t)
	probes := opts.Probes
	if len(probes) == 0 {
		probes = e.declaredProbes(eps)
	}
	for _, p := range probes {
		t.Ports = append(t.Ports, p.String())
	}
	return Cells{e: e, eps: eps, probes: probes}
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
