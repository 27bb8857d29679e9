package conformance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
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
	Probes []eval.Probe
	// Prefix names the lab's namespaces (default: netpol lab's).
	Prefix string
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
// programmer (Enforcer), conntrack flushed, every pod pair probed on every
// port and compared with the evaluator. A mismatching cell is probed once
// more: only a cell that mismatches twice counts (a cell that does not is
// named in the notes as flaky), and it carries explain's text and the path
// through the compiled tables.
func RunLab(ctx context.Context, cases []generator.Case, opts LabOptions) (_ *Report, err error) {
	start := time.Now()
	if opts.Base == nil {
		opts.Base = generator.Base
	}
	if opts.Probes == nil {
		opts.Probes = generator.Probes()
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
	rep := &Report{Runner: "lab", Cases: []CaseResult{}}
	probes := opts.Probes
	if ok, why := lab.SCTPSupported(); !ok && slices.ContainsFunc(probes, isSCTP) {
		probes = slices.DeleteFunc(slices.Clone(probes), isSCTP)
		rep.Notes = append(rep.Notes, "SCTP probes skipped: "+why)
	}
	skippedPerStep := len(opts.Probes) - len(probes)
	base := opts.Base()
	l, err := lab.Up(ctx, base, lab.Options{Prefix: opts.Prefix, ExtraPorts: probes})
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := l.Down(); derr != nil {
			err = errors.Join(err, fmt.Errorf("lab down: %w", derr))
		}
	}()
	enf := NewEnforcer(l)
	defer enf.Close()
	if _, err := enf.Sync(base); err != nil {
		return nil, fmt.Errorf("programming the base: %w", err)
	}
	if opts.AfterUp != nil {
		if err := opts.AfterUp(l); err != nil {
			return nil, err
		}
	}
	r := &labRun{ctx: ctx, l: l, enf: enf, probes: probes, opts: opts}
	for _, c := range cases {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		res := r.runCase(c)
		rep.Cases = append(rep.Cases, res)
		rep.Summary.Cases++
		for _, st := range res.Steps {
			rep.Summary.Steps++
			rep.Summary.Probes += st.Probes
			rep.Summary.Mismatches += len(st.Mismatches)
			rep.Summary.Skipped += skippedPerStep * len(st.Expected.Pods) * len(st.Expected.Pods)
		}
		if opts.CaseDone != nil {
			opts.CaseDone(res)
		}
	}
	rep.Notes = append(rep.Notes, r.notes...)
	rep.Summary.DurationSeconds = time.Since(start).Seconds()
	return rep, nil
}

func isSCTP(p eval.Probe) bool { return p.Protocol == "SCTP" }

type labRun struct {
	ctx    context.Context
	l      *lab.Lab
	enf    *Enforcer
	probes []eval.Probe
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
	sync, err := r.enf.Sync(snap)
	if err != nil {
		return sr, err
	}
	// The matrix asks what policy allows new connections now.
	if err := r.l.FlushConntrack(); err != nil {
		return sr, err
	}
	ev := eval.New(snap, sync.Model)
	want := ev.Table(eval.TableOptions{Probes: r.probes})
	got, _, err := r.l.Probe(r.ctx, lab.ProbeOptions{Probes: r.probes, Timeout: r.opts.Timeout, RetryTimeout: r.opts.RetryTimeout, Parallel: r.opts.Parallel})
	if err != nil {
		return sr, err
	}
	diffs, err := Compare(want, got)
	if err != nil {
		return sr, err
	}
	sr.Expected, sr.Observed, sr.Probes = want, got, len(want.Results)
	var dp *dataplane.Cluster
	for _, d := range diffs {
		// Probed once more: a cell must mismatch twice to count.
		obs, err := r.l.ProbeOne(r.ctx, d.From, d.To, d.Probe, eval.FamilyPrimary)
		if err != nil {
			return sr, err
		}
		if obs.Allowed == d.Expected {
			r.notes = append(r.notes, fmt.Sprintf("flaky cell in step %d of the case with %s: %s -> %s %s mismatched once, then agreed", i, stepLabel(st), d.From, d.To, d.Probe))
			markCell(got, d, d.Expected)
			continue
		}
		m := Mismatch{From: d.From, To: d.To, Protocol: d.Probe.Protocol, Port: d.Probe.Port, Expected: d.Expected, Observed: !d.Expected, Result: obs.Result}
		m.Explain, m.Trace = explainCell(ev, sync.Model, snap, &dp, d)
		sr.Mismatches = append(sr.Mismatches, m)
	}
	return sr, nil
}

func stepLabel(st generator.Step) string {
	if st.Name != "" {
		return st.Name
	}
	return "an unnamed step"
}

// markCell sets one cell of t.
func markCell(t *eval.Table, d Difference, allowed bool) {
	for k, c := range t.Results {
		if c.From == d.From && c.To == d.To && c.Protocol == d.Probe.Protocol && c.Port == d.Probe.Port {
			t.Results[k].Allowed = allowed
		}
	}
}

// explainCell is explain's text for a mismatching cell and its path
// through the compiled tables.
func explainCell(ev *eval.Evaluator, model *policy.Model, snap *cluster.Snapshot, dp **dataplane.Cluster, d Difference) (string, string) {
	var explain, trace strings.Builder
	v, err := ev.Explain(d.From, d.To, d.Probe, eval.FamilyPrimary)
	if err != nil {
		return "explain: " + err.Error(), ""
	}
	report.ExplainRules(&explain, v, report.Style{}, report.NewRules(model, snap))
	if *dp == nil {
		if *dp, err = dataplane.New(snap, ev, false); err != nil {
			return explain.String(), "trace: " + err.Error()
		}
	}
	dst, err := ev.Endpoint(d.To, eval.FamilyPrimary, netip.Addr{})
	if err == nil {
		var src eval.Endpoint
		if src, err = ev.Endpoint(d.From, eval.FamilyPrimary, dst.Addr); err == nil {
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
