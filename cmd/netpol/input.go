package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
)

// inputFlags say where the cluster state comes from: files (-f) or the live
// cluster (kubeconfig rules).
type inputFlags struct {
	files      []string
	kubeconfig string
	context    string
}

func (in *inputFlags) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringArrayVarP(&in.files, "filename", "f", nil, "file, directory or - (stdin) with the cluster state as YAML or JSON (repeatable); without it, read the live cluster")
	f.StringVar(&in.kubeconfig, "kubeconfig", "", "path to the kubeconfig (default: KUBECONFIG, then ~/.kube/config, then in-cluster)")
	f.StringVar(&in.context, "context", "", "kubeconfig context to use")
}

// partialError means output was produced but some input was invalid; the
// problems were already printed.
type partialError struct{ n int }

func (e *partialError) Error() string { return fmt.Sprintf("%d problem(s) in the input", e.n) }

// loaded is the pipeline up to the evaluator: snapshot -> model -> evaluator.
type loaded struct {
	snap      *cluster.Snapshot
	model     *policy.Model
	evaluator *eval.Evaluator
	problems  int
}

// load reads the cluster state and prints every problem found to stderr.
func (in *inputFlags) load(ctx context.Context, stdin io.Reader, stderr io.Writer) (*loaded, error) {
	var (
		snap   *cluster.Snapshot
		report *cluster.Report
	)
	if len(in.files) > 0 {
		snap, report = cluster.LoadPaths(in.files, stdin)
	} else {
		var err error
		snap, report, err = cluster.LoadLive(ctx, cluster.LiveOptions{Kubeconfig: in.kubeconfig, Context: in.context})
		if err != nil {
			return nil, fmt.Errorf("reading the cluster (use -f to read files instead): %w", err)
		}
	}
	model := policy.Build(snap)
	for _, n := range report.Notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	if note := report.SkippedNote(); note != "" {
		fmt.Fprintln(stderr, "note:", note)
	}
	for _, w := range model.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	errs := append(report.Errors, model.Errors...)
	for _, e := range errs {
		fmt.Fprintln(stderr, "error:", e)
	}
	return &loaded{snap: snap, model: model, evaluator: eval.New(snap, model), problems: len(errs)}, nil
}

// done turns input problems into the exit status once output is written.
func (l *loaded) done() error {
	if l.problems > 0 {
		return &partialError{n: l.problems}
	}
	return nil
}
