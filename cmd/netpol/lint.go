package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/lint"
)

// lintWarningsError is --exit-code's status when lint warned; the
// warnings were already printed.
type lintWarningsError struct{ n int }

func (e *lintWarningsError) Error() string { return fmt.Sprintf("%d lint warning(s)", e.n) }

func newLintCommand(in *inputFlags) *cobra.Command {
	var (
		output   string
		exitCode bool
	)
	cmd := &cobra.Command{
		Use:   "lint",
		Short: "Find what in the policies does not do what it seems to: shadowed rules, undefined order, selectors matching nothing",
		Long: `Lint the cluster's policies (files with -f, or the live cluster) and print one warning per
finding, naming the object, the field and why:

  shadowed-rule          a rule that never decides: an earlier rule of its policy, or of a policy
                         evaluated before it (a lower Admin or Baseline priority; any Admin Accept or
                         Deny before Baseline) whose subject holds its own, matches every connection
                         it matches (the rule that shadows it is named)
  ambiguous-priority     two Admin or Baseline policies of one priority with rules that match the
                         same connections with different actions: the API leaves their order
                         undefined (netpol applies them by kind, then name)
  selects-nothing        a policy (a NetworkPolicy's podSelector, an Admin or Baseline subject) that
                         selects no pod in the snapshot
  peer-matches-nothing   a pods, namespaces or nodes peer that matches nothing in the snapshot
  named-port-unresolved  a named port no destination of the rule declares
  domain-names           domainNames outside the Admin tier, or in a rule that does not Accept
                         (network-policy-api rejects both)

Containment is decided from the policies alone and errs towards silence: a rule is called
shadowed only when one earlier rule covers it. The snapshot's problems (invalid objects, rules
that fail closed) are printed on stderr as every command prints them.
-o json prints {"warnings": [{"kind", "object": {"kind", "namespace", "name"}, "field",
"message"}]}. Exit status: 1 on input problems; with --exit-code, also when anything warned.`,
		Example: "  netpol lint -f examples/demo\n" +
			"  netpol lint -o json | jq -r '.warnings[] | select(.kind == \"shadowed-rule\") | .object.name'\n" +
			"  netpol lint -f policies/ --exit-code   # in CI: fail on any warning",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "text", "json", "yaml"); err != nil {
				return err
			}
			l, err := in.load(cmd.Context(), cmd.InOrStdin(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			warnings := lint.Run(l.snap, l.model)
			out := cmd.OutOrStdout()
			if ok, err := writeStructured(out, output, struct {
				Warnings []lint.Warning `json:"warnings"`
			}{append([]lint.Warning{}, warnings...)}); ok {
				if err != nil {
					return err
				}
			} else {
				for _, w := range warnings {
					fmt.Fprintf(out, "warning: %s\n", w)
				}
				fmt.Fprintf(out, "%d warning(s) in %d policies\n", len(warnings), len(l.model.Policies))
			}
			if err := l.done(); err != nil {
				return err
			}
			if exitCode && len(warnings) > 0 {
				return &lintWarningsError{n: len(warnings)}
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	cmd.Flags().BoolVar(&exitCode, "exit-code", false, "exit with status 1 when anything warned (for CI)")
	return cmd
}
