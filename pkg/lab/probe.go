package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/probe"
)

// ProbeOptions choose what Probe dials.
type ProbeOptions struct {
	// Probes are the ports; empty means the union of the declared
	// container ports of the table's pods, as the evaluator does.
	Probes     []l4.Port
	Family     ipfamily.Family
	Namespaces []string
	// Timeout bounds one attempt (default 500ms).
	Timeout time.Duration
	// Failed cells are probed once more with RetryTimeout (default 4 x
	// Timeout) unless NoRetry: a lost first packet must not read as a
	// denial.
	RetryTimeout time.Duration
	NoRetry      bool
	// Parallel is how many probes run at once (default 128).
	Parallel int
	// SkipUnsupported drops SCTP probes, with a note, when the kernel has
	// no SCTP; otherwise they are an error.
	SkipUnsupported bool
}

func (o *ProbeOptions) defaults() {
	if o.Timeout <= 0 {
		o.Timeout = 500 * time.Millisecond
	}
	if o.RetryTimeout <= 0 {
		o.RetryTimeout = 4 * o.Timeout
	}
	if o.Parallel <= 0 {
		o.Parallel = 128
	}
}

// Observation is what one probe saw.
type Observation struct {
	From, To string // namespace/name
	// FromAddr and ToAddr are the addresses used (invalid when the probe
	// could not be sent).
	FromAddr, ToAddr netip.Addr
	// FromPort is the source port (set by Dial and ProbeServices).
	FromPort uint16
	Probe    l4.Port
	// Allowed: a reply came.
	Allowed bool
	// Result is ResultOK, ResultTimeout, ResultRefused, ResultUnreachable,
	// ResultRejected, ResultNoAddress, ResultNotInLab, or "error: ..." when
	// the lab failed to make the probe (Probe then returns an error).
	Result string
	// Reply is what the server answered: its pod's namespace/name.
	Reply string
}

// Probe dials every (from, to, probe) cell of the table the evaluator would
// make for the same options, self pairs included, from the source pod's
// namespace (a host-network pod's node's) bound to the source's address of
// the destination's family, and returns the observed table: same pods,
// ports and cell order as eval's, Allowed meaning a reply came. The notes
// say what was left out or looked wrong (a reply from another pod).
func (l *Lab) Probe(ctx context.Context, opts ProbeOptions) (*eval.TruthTable, []string, error) {
	opts.defaults()
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.down {
		return nil, nil, fmt.Errorf("lab %s is down", l.prefix)
	}
	var notes []string
	tableOpts := eval.TruthTableOptions{Probes: opts.Probes, Namespaces: opts.Namespaces, Family: opts.Family}
	t := l.eval.TruthTable(tableOpts)
	probes := make([]l4.Port, 0, len(t.Ports))
	for _, s := range t.Ports {
		p, err := l4.ParsePort(s)
		if err != nil {
			return nil, nil, fmt.Errorf("lab %s: reading the evaluator's port %q: %w", l.prefix, s, err)
		}
		probes = append(probes, p)
	}
	if ok, why := SCTPSupported(); !ok && slices.ContainsFunc(probes, isSCTP) {
		if !opts.SkipUnsupported {
			return nil, nil, fmt.Errorf("lab %s: cannot probe %s: %s (set SkipUnsupported to drop SCTP probes)",
				l.prefix, probes[slices.IndexFunc(probes, isSCTP)], why)
		}
		probes = slices.DeleteFunc(probes, isSCTP)
		notes = append(notes, "SCTP probes dropped: "+why)
		tableOpts.Probes = probes
		t = l.eval.TruthTable(tableOpts)
		if len(probes) == 0 { // an empty list would mean "declared ports" again
			t.Ports, t.Results = nil, []eval.Result{}
		}
	}
	for _, key := range t.Pods {
		if why, left := l.plan.left[key]; left {
			notes = append(notes, fmt.Sprintf("pod %s is not in the lab (%s): its cells read not allowed", key, why))
		}
	}

	cells := make([]Cell, len(t.Results))
	for i, r := range t.Results {
		cells[i] = Cell{From: r.From, To: r.To, Probe: l4.Port{Protocol: r.Protocol, Port: r.Port}}
	}
	obs := l.observeCells(ctx, cells, opts)
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("lab %s: probing: %w", l.prefix, err)
	}
	if err := probeErrors(obs); err != nil {
		return nil, nil, fmt.Errorf("lab %s: %w", l.prefix, err)
	}
	for i, o := range obs {
		t.Results[i].Allowed = o.Allowed
		if o.Allowed && o.Reply != o.To {
			notes = append(notes, fmt.Sprintf("%s -> %s %s: the reply came from %q", o.From, o.To, o.Probe, o.Reply))
		}
	}
	sort.Strings(notes)
	return t, notes, nil
}

// probeErrors reports cells the lab failed to probe: reading them as "not
// allowed" would hide a broken lab behind a plausible table.
func probeErrors(obs []Observation) error {
	var failed []string
	for _, o := range obs {
		if strings.HasPrefix(o.Result, resultErrorPrefix) {
			failed = append(failed, fmt.Sprintf("%s -> %s %s: %s", o.From, o.To, o.Probe, o.Result))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	if len(failed) > 5 {
		failed = append(failed[:5], fmt.Sprintf("and %d more", len(failed)-5))
	}
	return fmt.Errorf("could not probe %d cell(s): %s", len(failed), strings.Join(failed, "; "))
}

// Cell is one cell of a truth table: a probe from one pod to another.
type Cell struct {
	From, To string // namespace/name
	Probe    l4.Port
}

// observeCells probes cells as observeAll does; the caller holds l.mu.
func (l *Lab) observeCells(ctx context.Context, cells []Cell, opts ProbeOptions) []Observation {
	return observeAll(ctx, len(cells), opts, func(i int, timeout time.Duration) Observation {
		c := cells[i]
		return l.observe(ctx, c.From, c.To, c.Probe, opts.Family, timeout)
	})
}

// observeAll runs observe on cells 0..n-1, opts.Parallel at a time, and
// once more with opts.RetryTimeout those whose result a lost packet could
// explain (unless opts.NoRetry), all at once.
func observeAll(ctx context.Context, n int, opts ProbeOptions, observe func(cell int, timeout time.Duration) Observation) []Observation {
	obs := make([]Observation, n)
	run := func(which []int, timeout time.Duration) {
		inParallel(ctx, which, opts.Parallel, func(i int) { obs[i] = observe(i, timeout) })
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	run(all, opts.Timeout)
	if !opts.NoRetry {
		var failed []int
		for i, o := range obs {
			if retryable(o.Result) {
				failed = append(failed, i)
			}
		}
		run(failed, opts.RetryTimeout)
	}
	return obs
}

// inParallel runs do for each of cells, workers at a time, and returns
// when all have run; once ctx is done, no more are started.
func inParallel(ctx context.Context, cells []int, workers int, do func(cell int)) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(cells)) {
		wg.Go(func() {
			for i := range work {
				do(i)
			}
		})
	}
	for _, i := range cells {
		if ctx.Err() != nil {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
}

func isSCTP(p l4.Port) bool { return p.Protocol == corev1.ProtocolSCTP }

// retryable: a result that a lost packet or a slow first contact could
// explain. A missing address or pod will not change.
func retryable(result string) bool {
	return result != ResultOK && result != ResultNoAddress && result != ResultNotInLab
}

// ProbeOne probes one cell, as Probe does (default timeouts, one retry),
// and reports what came back.
func (l *Lab) ProbeOne(ctx context.Context, from, to string, probe l4.Port, family ipfamily.Family) (Observation, error) {
	obs, err := l.ProbeCells(ctx, []Cell{{From: from, To: to, Probe: probe}}, ProbeOptions{Family: family})
	if err != nil {
		return Observation{}, err
	}
	return obs[0], nil
}

// ProbeCells probes the given cells as Probe does (all at once,
// opts.Parallel at a time; a failed cell once more with opts.RetryTimeout
// unless opts.NoRetry) and returns what came back, in order. A cell whose
// pods the lab does not run, or whose destination has no address of
// opts.Family, is an error: these cells were asked for by name.
func (l *Lab) ProbeCells(ctx context.Context, cells []Cell, opts ProbeOptions) ([]Observation, error) {
	opts.defaults()
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.down {
		return nil, fmt.Errorf("lab %s is down", l.prefix)
	}
	for _, c := range cells {
		for _, key := range []string{c.From, c.To} {
			if l.pods[key] != nil {
				continue
			}
			if why, left := l.plan.left[key]; left {
				return nil, fmt.Errorf("pod %s is not in lab %s: %s", key, l.prefix, why)
			}
			return nil, fmt.Errorf("pod %s is not in lab %s's snapshot (or has finished)", key, l.prefix)
		}
		if ok, why := SCTPSupported(); !ok && isSCTP(c.Probe) {
			return nil, fmt.Errorf("cannot probe %s: %s", c.Probe, why)
		}
		if _, ok := pick(l.pods[c.To].plan.addrs, opts.Family); !ok {
			return nil, fmt.Errorf("pod %s has no %s address", c.To, familyName(opts.Family))
		}
	}
	obs := l.observeCells(ctx, cells, opts)
	if err := ctx.Err(); err != nil {
		return obs, err
	}
	return obs, probeErrors(obs)
}

// observe runs one probe; the caller holds l.mu.
func (l *Lab) observe(ctx context.Context, from, to string, pr l4.Port, family ipfamily.Family, timeout time.Duration) Observation {
	o := Observation{From: from, To: to, Probe: pr}
	src, dst := l.pods[from], l.pods[to]
	if src == nil || dst == nil {
		o.Result = ResultNotInLab
		return o
	}
	// As the evaluator: the destination's address of the family, and the
	// source's address of the destination's family.
	dstAddr, ok := pick(dst.plan.addrs, family)
	if !ok {
		o.Result = ResultNoAddress
		return o
	}
	srcAddr, ok := pick(src.plan.addrs, ipfamily.Of(dstAddr))
	if !ok {
		o.Result = ResultNoAddress
		return o
	}
	o.FromAddr, o.ToAddr = srcAddr, dstAddr
	ns := src.node.ns
	if src.ns != nil {
		ns = src.ns
	}
	reply, _, err := probe.Exchange(ctx, ns.handle, netip.AddrPortFrom(srcAddr, 0), netip.AddrPortFrom(dstAddr, uint16(pr.Port)), pr.Protocol, timeout)
	if err != nil {
		o.Result = probe.Classify(err)
		return o
	}
	o.Allowed, o.Result, o.Reply = true, ResultOK, reply
	return o
}

// pick is ipfamily.Family's choice among a pod's addresses: the first of the
// family, or the first (primary) one.
func pick(addrs []netip.Addr, f ipfamily.Family) (netip.Addr, bool) {
	for _, a := range addrs {
		if f == ipfamily.Any || (f == ipfamily.IPv4) == a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func familyName(f ipfamily.Family) string {
	if f == ipfamily.Any {
		return "IP"
	}
	return string(f)
}
