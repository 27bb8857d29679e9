// Command netpol explains, tabulates and (later) enforces Kubernetes
// network policy. This package only wires flags to the pkg/ pipeline and
// prints; the work happens below it.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		var partial *partialError
		if !errors.As(err, &partial) {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	in := &inputFlags{}
	root := &cobra.Command{
		Use:           "netpol",
		Short:         "Kubernetes network policy: explain, truth tables, enforcement",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	in.register(root)
	root.AddCommand(newExplainCommand(in), newTableCommand(in), newCompileCommand(in), newLabCommand(in), newAgentCommand(in), newModelCommand())
	return root
}
