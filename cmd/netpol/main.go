// Command netpol explains, tabulates and enforces Kubernetes network
// policy. This package only wires flags to the pkg/ pipeline and prints;
// the work happens below it.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

func main() {
	if err := commandFor(os.Args[0]).Execute(); err != nil {
		os.Exit(exitStatus(err, os.Stderr))
	}
}

// exitStatus prints err unless its output was already written (input
// problems, a denied --exit-code verdict) and returns the exit status: 1.
func exitStatus(err error, stderr *os.File) int {
	var (
		partial *partialError
		denied  *deniedError
		status  *exitError
	)
	if errors.As(err, &status) {
		fmt.Fprintln(stderr, status.msg)
		return status.code
	}
	var warned *lintWarningsError
	var flipped *diffChangedError
	if !errors.As(err, &partial) && !errors.As(err, &denied) && !errors.As(err, &warned) && !errors.As(err, &flipped) {
		fmt.Fprintln(stderr, "error:", err)
	}
	return 1
}

// exitError ends a command with its own exit status (`netpol trace`: 3
// when the traced tables and explain disagree) after its output.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// commandFor is the root command for the name the binary was run as:
// installed as kubectl-netpol, kubectl runs it as `kubectl netpol`, and
// help says so; it behaves the same.
func commandFor(argv0 string) *cobra.Command {
	root := newRootCommand()
	if name := filepath.Base(argv0); strings.HasPrefix(name, "kubectl-") {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl netpol"}
	}
	return root
}

func newRootCommand() *cobra.Command {
	in := &inputFlags{}
	root := &cobra.Command{
		Use:   "netpol",
		Short: "Kubernetes network policy: explain, truth tables, enforcement",
		Long: "Kubernetes network policy: explain, truth tables, enforcement.\n\n" +
			"Exit status: 0 on success; 1 on an error, when some input object was invalid (the rest\n" +
			"is still evaluated and printed; each problem is on stderr), when `lab probe --compare`\n" +
			"finds a difference, when `explain --exit-code` finds the connection denied, or when\n" +
			"`lint --exit-code` warns;\n" +
			"3 when `trace` finds the traced tables and explain disagree.",
		Version:       versionString(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(newExplainCommand(in), newTableCommand(in), newCompileCommand(in), newLabCommand(in), newAgentCommand(in), newModelCommand(in), newVersionCommand(), newTraceCommand(in), newConformanceCommand(), newProbeCommand(), newLintCommand(in), newDiffCommand(in))
	for _, c := range root.Commands() {
		switch c.Name() {
		case "agent", "model":
			annotate(c, inputKube)
		case "version":
			annotate(c, inputNone)
		case "lab":
			for _, sub := range c.Commands() {
				switch sub.Name() {
				case "up", "probe":
					annotate(sub, inputFiles) // the lab is built from a state file
				default:
					annotate(sub, inputNone)
				}
			}
		}
	}
	in.registerAll(root)
	registerCompletions(root, in)
	return root
}

// annotate sets which input flags cmd and its subcommands take (see
// inputAnnotation), unless they say so themselves.
func annotate(cmd *cobra.Command, mode string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	if _, ok := cmd.Annotations[inputAnnotation]; !ok {
		cmd.Annotations[inputAnnotation] = mode
	}
	for _, c := range cmd.Commands() {
		annotate(c, mode)
	}
}
