package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/report"
)

// LabOptions configure a conformance run on the lab.
type LabOptions struct {
	// Base is the cluster every case starts from (default generator.Base()).
	// It must return a fresh snapshot on each call.
	Base func() *cluster.Snapshot
	// Probes are the ports of every step (default generator.Probes();
	// SCTP is dropped, with a note, on a kernel without it).
	Probes []l4.Port
	// Prefix names the lab's namespaces (default: netpol lab's).
	Prefix string
	// Outside are the addresses of the host outside the cluster (the lab's
	// outside), at most one per family (default generator.OutsideAddr). It
	// serves the probe ports, and every step probes every pod to it and
	// back besides the pod pairs.
	Outside []netip.Addr
	// Timeout bounds one probe attempt (default 300ms: the lab's veths
	// answer in microseconds); a failed cell is retried once with
	// RetryTimeout (default 4 x Timeout).
	Timeout, RetryTimeout time.Duration
	// Parallel is how many probes run at once (default 1024: a whole step,
	// so a step costs about one timeout and one retry).
	Parallel int
	// CaseDone is called after each case (progress).
	CaseDone func(CaseResult)
	// AfterUp, when set, is called once the lab is up and programmed with
	// the base, before the first case (tests inject faults here).
	AfterUp func(*lab.Lab) error
}

// RunLab runs the cases on one lab for the whole run: the base is brought
// up once, and every step is applied incrementally through the agent's node
// programmer (Enforcer), conntrack flushed, every pod pair and every pod to
// and from the outside (outside.go) probed on every port and compared with
// the evaluator. A mismatching cell is probed once
// more: only a cell that mismatches twice counts (a cell that does not is
// named in the notes as flaky), and it carries explain's text and the path
// through the compiled tables. A cancelled ctx (Ctrl-C) returns the report
// of the cases finished so far with ctx's error.
func RunLab(ctx context.Context, cases []generator.Case, opts LabOptions) (_ *Report, err error) {
	start := time.Now()
	lr, err := NewLabRunner(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := lr.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	rep := &Report{Runner: "lab", Cases: []CaseResult{}}
	runCases(ctx, rep, cases, lr.skippedPerStep, opts.CaseDone, func(c generator.Case) (CaseResult, int, bool) {
		return lr.Run(c), len(c.Steps), true
	})
	rep.Notes = append(rep.Notes, lr.Notes()...)
	return finish(ctx, rep, start)
}

// runCases runs the cases one at a time and adds each result to rep: run
// returns the result, the number of steps the case has and whether it ran
// at all (false: left out). A case that ctx cut short is not a result.
func runCases(ctx context.Context, rep *Report, cases []generator.Case, skippedPerStep int, done func(CaseResult),
	run func(generator.Case) (CaseResult, int, bool)) {
	for _, c := range cases {
		if ctx.Err() != nil {
			return
		}
		res, steps, ran := run(c)
		if !ran {
			continue
		}
		if ctx.Err() != nil && len(res.Steps) < steps {
			return // interrupted: not a result
		}
		rep.Cases = append(rep.Cases, res)
		rep.Summary.Cases++
		for _, st := range res.Steps {
			rep.Summary.Steps++
			rep.Summary.Probes += st.Probes
			rep.Summary.Mismatches += len(st.Mismatches)
			rep.Summary.Skipped += skippedPerStep * cellsPerProbe(st.Expected)
		}
		if done != nil {
			done(res)
		}
	}
}

// finish stamps the run's duration; an interrupted run keeps its report,
// with a note, and returns ctx's error.
func finish(ctx context.Context, rep *Report, start time.Time) (*Report, error) {
	rep.Summary.DurationSeconds = time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		rep.Notes = append(rep.Notes, fmt.Sprintf("interrupted after %d cases", len(rep.Cases)))
		return rep, err
	}
	return rep, nil
}

// LabRunner is one lab, up and programmed with the base, that runs cases
// one at a time (RunLab; shrinking a failing case runs many).
type LabRunner struct {
	labRun
	skippedPerStep int
	setupNotes     []string
}

// NewLabRunner brings up the lab for opts and programs the base.
func NewLabRunner(ctx context.Context, opts LabOptions) (_ *LabRunner, err error) {
	if opts.Base == nil {
		opts.Base = generator.Base
	}
	if opts.Probes == nil {
		opts.Probes = generator.Probes()
	}
	if opts.Outside == nil {
		opts.Outside = []netip.Addr{netip.MustParseAddr(generator.OutsideAddr)}
	}
	if opts.Timeout == 0 {
		opts.Timeout = 300 * time.Millisecond
	}
	if opts.RetryTimeout == 0 {
		opts.RetryTimeout = 4 * opts.Timeout
	}
	if opts.Parallel == 0 {
		opts.Parallel = 1024
	}
	lr := &LabRunner{}
	probes := opts.Probes
	if ok, why := lab.SCTPSupported(); !ok && slices.ContainsFunc(probes, isSCTP) {
		probes = slices.DeleteFunc(slices.Clone(probes), isSCTP)
		lr.setupNotes = append(lr.setupNotes, "SCTP probes skipped: "+why)
	}
	lr.skippedPerStep = len(opts.Probes) - len(probes)
	base := opts.Base()
	l, err := lab.Up(ctx, base, lab.Options{Prefix: opts.Prefix, ExtraPorts: probes, Outside: opts.Outside, OutsidePorts: probes})
	if err != nil {
		return nil, err
	}
	enf := NewEnforcer(l)
	defer func() {
		if err != nil {
			enf.Close()
			err = errors.Join(err, l.Down())
		}
	}()
	if _, err := enf.Sync(base); err != nil {
		return nil, fmt.Errorf("programming the base: %w", err)
	}
	if opts.AfterUp != nil {
		if err := opts.AfterUp(l); err != nil {
			return nil, err
		}
	}
	lr.labRun = labRun{ctx: ctx, l: l, enf: enf, probes: probes, opts: opts}
	return lr, nil
}

// Run runs one case from the base.
func (lr *LabRunner) Run(c generator.Case) CaseResult { return lr.runCase(c) }

// Notes are what the runs so far left out or found flaky.
func (lr *LabRunner) Notes() []string { return append(slices.Clone(lr.setupNotes), lr.notes...) }

// Close takes the lab down.
func (lr *LabRunner) Close() error {
	lr.enf.Close()
	if err := lr.l.Down(); err != nil {
		return fmt.Errorf("lab down: %w", err)
	}
	return nil
}

func isSCTP(p l4.Port) bool { return p.Protocol == "SCTP" }

// cellsPerProbe is how many cells a table has per port: pod pairs, and
// pods to and from the outside.
func cellsPerProbe(t *eval.TruthTable) int {
	if t == nil || len(t.Ports) == 0 {
		return 0
	}
	return len(t.Results) / len(t.Ports)
}

type labRun struct {
	ctx    context.Context
	l      *lab.Lab
	enf    *Enforcer
	probes []l4.Port
	opts   LabOptions
	notes  []string
}

func (r *labRun) runCase(c generator.Case) CaseResult {
	start := time.Now()
	res := CaseResult{Name: c.Name, Tags: c.Tags, Passed: true, Steps: []StepResult{}}
	fail := func(err error) CaseResult {
		res.Passed, res.Error = false, err.Error()
		res.DurationSeconds = time.Since(start).Seconds()
		return res
	}
	snap := r.opts.Base()
	for i, st := range c.Steps {
		if err := generator.ApplyStep(snap, st, fmt.Sprintf("%s step %d", c.Name, i)); err != nil {
			return fail(err)
		}
		sr, err := r.step(snap, i, st)
		if err != nil {
			return fail(fmt.Errorf("step %d: %w", i, err))
		}
		if len(sr.Mismatches) > 0 {
			res.Passed = false
		}
		res.Steps = append(res.Steps, sr)
	}
	res.DurationSeconds = time.Since(start).Seconds()
	return res
}

// step programs snap, probes everything and compares.
func (r *labRun) step(snap *cluster.Snapshot, i int, st generator.Step) (StepResult, error) {
	sr := StepResult{Step: i, Name: st.Name, Apply: st.Apply, Mismatches: []Mismatch{}}
	if err := r.l.Update(r.ctx, snap); err != nil {
		return sr, fmt.Errorf("lab update: %w", err)
	}
	synced, err := r.enf.Sync(snap)
	if err != nil {
		return sr, err
	}
	// The matrix asks what policy allows new connections now.
	if err := r.l.FlushConntrack(); err != nil {
		return sr, err
	}
	ev := eval.New(snap, synced.Model)
	want := ev.TruthTable(eval.TruthTableOptions{Probes: r.probes})
	// The pod pairs and the outside cells are probed at once: each costs
	// about one timeout and one retry.
	var (
		got   *eval.TruthTable
		notes []string
		perr  error
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		got, notes, perr = r.l.Probe(r.ctx, lab.ProbeOptions{Probes: r.probes, Timeout: r.opts.Timeout, RetryTimeout: r.opts.RetryTimeout, Parallel: r.opts.Parallel})
	})
	op, oerr := r.probeOutside(ev, slices.Clone(want.Pods))
	wg.Wait()
	if err := errors.Join(perr, oerr); err != nil {
		return sr, err
	}
	op.addTo(want, got, r.opts.Outside)
	outside := op.byCell
	for _, n := range append(notes, op.notes...) {
		// Once per run: the same note comes back every step.
		if !slices.Contains(r.notes, n) {
			r.notes = append(r.notes, n)
		}
	}
	diffs, err := Compare(want, got)
	if err != nil {
		return sr, err
	}
	sr.Expected, sr.Observed, sr.Probes = want, got, len(want.Results)
	var dp *dataplane.Cluster
	again, err := r.reprobe(outside, diffs)
	if err != nil {
		return sr, err
	}
	for _, d := range diffs {
		obs := again[cellID{d.From, d.To, d.Probe}]
		if obs.Allowed == d.Expected {
			r.notes = append(r.notes, fmt.Sprintf("flaky cell in step %d of the case with %s: %s -> %s %s mismatched once, then agreed", i, stepLabel(st), d.From, d.To, d.Probe))
			markCell(got, d, d.Expected)
			continue
		}
		m := Mismatch{From: d.From, To: d.To, Protocol: d.Probe.Protocol, Port: d.Probe.Port, Expected: d.Expected, Observed: !d.Expected, Result: obs.Result}
		m.Explain, m.Trace = explainCell(ev, synced.Model, snap, &dp, d)
		sr.Mismatches = append(sr.Mismatches, m)
	}
	return sr, nil
}

// reprobe probes the mismatching cells once more, so that a cell must
// mismatch twice to count: all at once, the pod pairs beside the outside
// cells, as the step's first probe, each pod pair in one attempt of
// RetryTimeout (a cell read as denied has had the short attempt and a
// long one already). A broken data plane then costs a step one more long
// attempt, not a round per cell.
func (r *labRun) reprobe(outside map[cellID]outsideCell, diffs []Difference) (map[cellID]lab.Observation, error) {
	var ids []cellID
	var cells []lab.Cell
	for _, d := range diffs {
		id := cellID{d.From, d.To, d.Probe}
		if _, ok := outside[id]; !ok {
			ids, cells = append(ids, id), append(cells, lab.Cell{From: d.From, To: d.To, Probe: d.Probe})
		}
	}
	var (
		pods    []lab.Observation
		podsErr error
		wg      sync.WaitGroup
	)
	if len(cells) > 0 {
		wg.Go(func() {
			pods, podsErr = r.l.ProbeCells(r.ctx, cells, lab.ProbeOptions{Family: ipfamily.Any, Timeout: r.opts.RetryTimeout,
				NoRetry: true, Parallel: r.opts.Parallel})
		})
	}
	again, err := r.reprobeOutside(outside, diffs)
	wg.Wait()
	if err := errors.Join(podsErr, err); err != nil {
		return nil, err
	}
	if again == nil {
		again = make(map[cellID]lab.Observation, len(ids))
	}
	for i, id := range ids {
		again[id] = pods[i]
	}
	return again, nil
}

func stepLabel(st generator.Step) string {
	if st.Name != "" {
		return st.Name
	}
	return "an unnamed step"
}

// markCell sets one cell of t.
func markCell(t *eval.TruthTable, d Difference, allowed bool) {
	for k, c := range t.Results {
		if c.From == d.From && c.To == d.To && c.Protocol == d.Probe.Protocol && c.Port == d.Probe.Port {
			t.Results[k].Allowed = allowed
		}
	}
}

// explainCell is explain's text for a mismatching cell and its path
// through the compiled tables. Either end may be an address (the
// outside): a pod then uses its address of that address's family, as the
// cell was made.
func explainCell(ev *eval.Evaluator, model *policy.Model, snap *cluster.Snapshot, dp **dataplane.Cluster, d Difference) (string, string) {
	var explain, trace strings.Builder
	family := ipfamily.Any
	if a, err := netip.ParseAddr(d.From); err == nil {
		family = ipfamily.Of(a)
	}
	v, err := ev.Explain(d.From, d.To, d.Probe, family)
	if err != nil {
		return "explain: " + err.Error(), ""
	}
	report.ExplainRules(&explain, v, report.Style{}, report.NewRules(model, snap))
	if *dp == nil {
		if *dp, err = dataplane.New(snap, ev, false); err != nil {
			return explain.String(), "trace: " + err.Error()
		}
	}
	dst, err := ev.Endpoint(d.To, family, netip.Addr{})
	if err == nil {
		var src eval.Endpoint
		if src, err = ev.Endpoint(d.From, ipfamily.Any, dst.Addr); err == nil {
			var paths []dataplane.Path
			if paths, err = (*dp).Paths(src, dst, d.Probe); err == nil {
				var tps []report.TracedPath
				for _, p := range paths {
					tps = append(tps, report.Traced(p))
				}
				trace.WriteString(report.PathsText(tps))
			}
		}
	}
	if err != nil {
		trace.WriteString("trace: " + err.Error())
	}
	return explain.String(), trace.String()
}
