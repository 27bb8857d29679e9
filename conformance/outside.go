package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/probe"
)

// The outside as a peer. Besides the pod pairs, every step probes every
// pod to each outside address of the run (LabOptions.Outside) and back, on
// every probe port. The cells join the step's tables with the address as
// the pod name ("192.0.2.10"), which is how the evaluator names an
// address endpoint, so that Compare, the second probe of a mismatch,
// explain, the trace and the report treat them as any other cell.

// outsideCell is how one outside cell is probed.
type outsideCell struct {
	// from dials: a pod, or lab.ExternalSource.
	from string
	// dst is the outside's address, or the pod's address of the outside's
	// family; invalid when the pod has none (the evaluator says not
	// allowed, and there is nothing to dial).
	dst      netip.AddrPort
	protocol corev1.Protocol
	// reply is who must answer: the pod, or the outside's address.
	reply string
}

// pod is the cell's pod, whichever way it goes.
func (c outsideCell) pod() string {
	if c.from == lab.ExternalSource {
		return c.reply
	}
	return c.from
}

// outsideCells are the evaluator's cells between the pods and the outside
// addresses, per probe: every pod to each address, then each address to
// every pod, with how to probe each. As eval.TableWith pairs families, a
// pod uses its address of the outside's family; without one its cells are
// not allowed.
func outsideCells(ev *eval.Evaluator, pods []string, outside []netip.Addr, probes []l4.Port) ([]eval.Result, []outsideCell, error) {
	var results []eval.Result
	var cells []outsideCell
	for _, pr := range probes {
		port := uint16(pr.Port)
		for _, a := range outside {
			out, err := ev.Endpoint(a.String(), ipfamily.Any, netip.Addr{})
			if err != nil {
				return nil, nil, err
			}
			name := ev.Name(out)
			eps := make([]eval.Endpoint, len(pods))
			has := make([]bool, len(pods))
			for i, pod := range pods {
				eps[i], err = ev.Endpoint(pod, ipfamily.Any, a)
				has[i] = err == nil
			}
			for i, pod := range pods {
				results = append(results, eval.Result{From: pod, To: name, Protocol: pr.Protocol, Port: pr.Port,
					Allowed: has[i] && ev.Allowed(eps[i], out, pr)})
				cells = append(cells, outsideCell{from: pod, dst: netip.AddrPortFrom(a, port), protocol: pr.Protocol, reply: name})
			}
			for i, pod := range pods {
				results = append(results, eval.Result{From: name, To: pod, Protocol: pr.Protocol, Port: pr.Port,
					Allowed: has[i] && ev.Allowed(out, eps[i], pr)})
				c := outsideCell{from: lab.ExternalSource, protocol: pr.Protocol, reply: pod}
				if has[i] {
					c.dst = netip.AddrPortFrom(eps[i].Addr, port)
				}
				cells = append(cells, c)
			}
		}
	}
	return results, cells, nil
}

// observeOutside probes the cells, Parallel at a time, and once more with
// RetryTimeout those that failed for a reason a lost packet could explain,
// as lab.Probe does; again (a mismatching cell's second probe) makes it
// one attempt of RetryTimeout, as the pod pairs' second probe. Cells of
// pods the lab does not run read lab.ResultNotInLab. A probe the lab
// failed to make is an error.
func (r *labRun) observeOutside(cells []outsideCell, inLab map[string]bool, again bool) ([]lab.Observation, error) {
	obs := make([]lab.Observation, len(cells))
	var all []int
	for i, c := range cells {
		switch {
		case !inLab[c.pod()]:
			obs[i] = lab.Observation{From: c.from, Result: lab.ResultNotInLab}
		case !c.dst.IsValid():
			obs[i] = lab.Observation{From: c.from, Result: lab.ResultNoAddress}
		default:
			all = append(all, i)
		}
	}
	if again {
		r.dialCells(cells, all, obs, r.opts.RetryTimeout)
	} else {
		r.dialCells(cells, all, obs, r.opts.Timeout)
		var failed []int
		for _, i := range all {
			if outsideRetryable(obs[i].Result) {
				failed = append(failed, i)
			}
		}
		r.dialCells(cells, failed, obs, r.opts.RetryTimeout)
	}
	if err := r.ctx.Err(); err != nil {
		return nil, err
	}
	var errs []string
	for i, o := range obs {
		if strings.HasPrefix(o.Result, probe.ErrorPrefix) {
			errs = append(errs, fmt.Sprintf("%s -> %s %s: %s", cells[i].from, cells[i].dst, cells[i].protocol, o.Result))
		}
	}
	if len(errs) > 0 {
		if len(errs) > 5 {
			errs = append(errs[:5], fmt.Sprintf("and %d more", len(errs)-5))
		}
		return nil, fmt.Errorf("could not probe %d outside cell(s): %s", len(errs), strings.Join(errs, "; "))
	}
	return obs, nil
}

// dialCells dials the given cells, Parallel at a time, into obs.
func (r *labRun) dialCells(cells []outsideCell, which []int, obs []lab.Observation, timeout time.Duration) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(r.opts.Parallel, len(which)) {
		wg.Go(func() {
			for i := range work {
				c := cells[i]
				obs[i] = r.l.Dial(r.ctx, c.from, c.dst, c.protocol, lab.DialOptions{Timeout: timeout})
			}
		})
	}
	for _, i := range which {
		if r.ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
}

// outsideRetryable is lab.Probe's rule: a missing address or pod will not
// change, anything else but an answer might.
func outsideRetryable(result string) bool {
	return result != lab.ResultOK && result != lab.ResultNoAddress && result != lab.ResultNotInLab
}

// outsideProbe is a step's outside cells: the evaluator's verdicts and
// what the lab saw.
type outsideProbe struct {
	expected, observed []eval.Result
	byCell             map[cellID]outsideCell
	notes              []string
}

// probeOutside probes the outside cells of a step whose pods are pods (the
// evaluator's table's) and returns how to probe each cell again (by cell)
// and notes on replies from the wrong server. It only reads the lab, so it
// runs beside the lab's probe of the pod pairs.
func (r *labRun) probeOutside(ev *eval.Evaluator, pods []string) (*outsideProbe, error) {
	if len(r.opts.Outside) == 0 {
		return &outsideProbe{}, nil
	}
	results, cells, err := outsideCells(ev, pods, r.opts.Outside, r.probes)
	if err != nil {
		return nil, err
	}
	obs, err := r.observeOutside(cells, r.podsInLab(), false)
	if err != nil {
		return nil, err
	}
	op := &outsideProbe{expected: results, observed: slices.Clone(results), byCell: make(map[cellID]outsideCell, len(cells))}
	for i, o := range obs {
		res := results[i]
		op.byCell[keyOf(res)] = cells[i]
		op.observed[i].Allowed = o.Allowed
		if o.Allowed && o.Reply != cells[i].reply {
			op.notes = append(op.notes, fmt.Sprintf("%s -> %s %s/%d: the reply came from %q", res.From, res.To, res.Protocol, res.Port, o.Reply))
		}
	}
	return op, nil
}

// addTo adds the outside cells to the step's tables: the evaluator's to
// want, the lab's to got, under the outside addresses as pods.
func (op *outsideProbe) addTo(want, got *eval.TruthTable, outside []netip.Addr) {
	if len(op.expected) == 0 {
		return
	}
	for _, a := range outside {
		want.Pods = append(want.Pods, a.String())
		got.Pods = append(got.Pods, a.String())
	}
	want.Results = append(want.Results, op.expected...)
	got.Results = append(got.Results, op.observed...)
}

// reprobeOutside probes the outside cells among diffs once more (one
// attempt of RetryTimeout each), all at once.
func (r *labRun) reprobeOutside(outside map[cellID]outsideCell, diffs []Difference) (map[cellID]lab.Observation, error) {
	var ids []cellID
	var cells []outsideCell
	for _, d := range diffs {
		id := cellID{d.From, d.To, d.Probe}
		if c, ok := outside[id]; ok {
			ids, cells = append(ids, id), append(cells, c)
		}
	}
	if len(cells) == 0 {
		return nil, nil
	}
	obs, err := r.observeOutside(cells, r.podsInLab(), true)
	if err != nil {
		return nil, err
	}
	out := make(map[cellID]lab.Observation, len(ids))
	for i, id := range ids {
		out[id] = obs[i]
	}
	return out, nil
}

// cellID names one cell of a table.
type cellID struct {
	from, to string
	probe    l4.Port
}

func keyOf(r eval.Result) cellID {
	return cellID{r.From, r.To, l4.Port{Protocol: r.Protocol, Port: r.Port}}
}

// podsInLab are the pods the lab runs (not those it left out).
func (r *labRun) podsInLab() map[string]bool {
	in := map[string]bool{}
	for _, p := range r.l.Pods() {
		in[p.Name] = true
	}
	return in
}
