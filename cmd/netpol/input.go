package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
)

// inputFlags say where the cluster state comes from: files (-f) or the live
// cluster (kubeconfig rules).
type inputFlags struct {
	files      []string
	kubeconfig string
	context    string
}

// inputAnnotation on a command says which input flags it takes: inputFiles
// (-f only), inputKube (--kubeconfig only) or inputNone. Commands without
// it take all three.
const (
	inputAnnotation = "netpol/input"
	inputFiles      = "files"
	inputKube       = "kubeconfig"
	inputNone       = "none"
)

// registerInputFlags gives every runnable command below root the input
// flags its annotation says it uses, so help shows flags only where they
// act.
func (in *inputFlags) registerAll(root *cobra.Command) {
	for _, c := range root.Commands() {
		in.registerAll(c)
	}
	if root.Runnable() && root.HasParent() {
		in.register(root, root.Annotations[inputAnnotation])
	}
}

func (in *inputFlags) register(cmd *cobra.Command, mode string) {
	f := cmd.Flags()
	if mode == "" || mode == inputFiles {
		help := "file, directory or - (stdin) with the cluster state as YAML or JSON (repeatable); without it, read the live cluster"
		if mode == inputFiles {
			help = "file, directory or - (stdin) with the cluster state as YAML or JSON (repeatable; required)"
		}
		f.StringArrayVarP(&in.files, "filename", "f", nil, help)
		cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	}
	if mode == "" || mode == inputKube {
		f.StringVar(&in.kubeconfig, "kubeconfig", "", "path to the kubeconfig (default: KUBECONFIG, then ~/.kube/config, then in-cluster)")
	}
	if mode == "" {
		f.StringVar(&in.context, "context", "", "kubeconfig context to use")
	}
}

// partialError means output was produced but some input was invalid; the
// problems were already printed.
type partialError struct{ n int }

func (e *partialError) Error() string { return fmt.Sprintf("%d problem(s) in the input", e.n) }

// deniedError is --exit-code's status for a denied connection; the
// verdict was already printed.
type deniedError struct{}

func (e *deniedError) Error() string { return "the connection is denied" }

// loaded is the pipeline up to the evaluator: snapshot -> model -> evaluator.
type loaded struct {
	snap      *cluster.Snapshot
	model     *policy.Model
	evaluator *eval.Evaluator
	problems  int
}

// load reads the cluster state and prints every problem found to stderr.
// Reading no object at all is an error that names the paths.
func (in *inputFlags) load(ctx context.Context, stdin io.Reader, stderr io.Writer) (*loaded, error) {
	var (
		snap   *cluster.Snapshot
		report *cluster.Report
	)
	if len(in.files) > 0 {
		snap, report = cluster.LoadPaths(in.files, stdin)
		if report.Objects == 0 && len(report.Errors) == 0 {
			return nil, fmt.Errorf("no Kubernetes object read from %s", strings.Join(report.Empty, "; "))
		}
	} else {
		var err error
		snap, report, err = cluster.LoadFromAPI(ctx, cluster.APIOptions{Kubeconfig: in.kubeconfig, Context: in.context})
		if err != nil {
			if emptyConfig(err) {
				return nil, errors.New("no kubeconfig found (looked at --kubeconfig, KUBECONFIG, ~/.kube/config and the in-cluster service account): " +
					"give one with --kubeconfig PATH or KUBECONFIG, or read files with -f PATH")
			}
			return nil, fmt.Errorf("reading the cluster (use -f to read files instead): %w", err)
		}
	}
	return loadedFrom(snap, report, stderr, nil), nil
}

// loadedFrom builds the model and evaluator of snap, read with report,
// and prints every problem found to stderr; with since (a state snap was
// made from), only those it did not have: the model's warnings it did not
// print, and the errors of objects that are not its own.
func loadedFrom(snap *cluster.Snapshot, report *cluster.Report, stderr io.Writer, since *loaded) *loaded {
	model := policy.Build(snap)
	if since != nil {
		model = newProblemsOnly(model, snap, since)
	}
	for _, e := range report.Empty {
		fmt.Fprintln(stderr, "note: nothing read from", e)
	}
	for _, n := range report.Notes {
		fmt.Fprintln(stderr, "note:", n)
	}
	if note := report.SkippedNote(); note != "" {
		fmt.Fprintln(stderr, "note:", note)
	}
	for _, w := range model.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	for _, e := range report.Errors {
		fmt.Fprintln(stderr, "error:", e)
	}
	l := &loaded{snap: snap, model: model, evaluator: eval.New(snap, model), problems: len(report.Errors)}
	l.reportErrors(stderr, model.Errors)
	return l
}

// newProblemsOnly is model with the warnings and errors of since's model
// left out: those of objects since holds unchanged (the same origin), and
// those it printed word for word.
func newProblemsOnly(model *policy.Model, snap *cluster.Snapshot, since *loaded) *policy.Model {
	m := *model
	printed := map[string]bool{}
	for _, w := range since.model.Warnings {
		printed[w] = true
	}
	for _, e := range since.model.Errors {
		printed[e.Error()] = true
	}
	m.Warnings = slices.DeleteFunc(slices.Clone(m.Warnings), func(w string) bool { return printed[w] })
	m.Errors = slices.DeleteFunc(slices.Clone(m.Errors), func(e error) bool {
		if key, ok := objectOf(e); ok {
			if src, ok := snap.Origin[key]; ok {
				if old, had := since.snap.Origin[key]; had && old == src {
					return true
				}
			}
		}
		return printed[e.Error()]
	})
	return &m
}

// reportErrors prints errors about input objects found after loading (the
// policy model's, proxy.Build's) as the loader's are, and counts them
// toward the exit status.
func (l *loaded) reportErrors(stderr io.Writer, errs []error) {
	for _, e := range errs {
		fmt.Fprintln(stderr, "error:", withOrigin(l.snap, e))
	}
	l.problems += len(errs)
}

// withOrigin prefixes an object's error with the file and document it was
// read from.
func withOrigin(snap *cluster.Snapshot, err error) string {
	if key, ok := objectOf(err); ok {
		if src, ok := snap.Origin[key]; ok && src.File != "" {
			return fmt.Sprintf("%s: %s", src, err)
		}
	}
	return err.Error()
}

// objectOf is the object an error names: policy and proxy each have
// their own error type for an object's field.
func objectOf(err error) (cluster.ObjectKey, bool) {
	var oe *policy.ObjectError
	if errors.As(err, &oe) {
		return oe.Object, true
	}
	var fe *proxy.FieldError
	if errors.As(err, &fe) {
		return fe.Object, true
	}
	return cluster.ObjectKey{}, false
}

func emptyConfig(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if clientcmd.IsEmptyConfig(err) {
			return true
		}
	}
	return false
}

// done turns input problems into the exit status once output is written.
func (l *loaded) done() error {
	if l.problems > 0 {
		return &partialError{n: l.problems}
	}
	return nil
}
