package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/cluster"
)

// gitCommit is set by `make build` (-ldflags -X) for builds without a VCS
// stamp in their build info.
var gitCommit string

// versionString is what --version and `netpol version` print: the module
// version, the git commit it was built from, the Go version and the API
// versions netpol reads.
func versionString() string {
	version, commit := "(devel)", "unknown"
	if gitCommit != "" {
		commit = gitCommit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && commit != "unknown" {
			commit += " (modified)"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "netpol %s\n", version)
	fmt.Fprintf(&b, "  git commit: %s\n", commit)
	fmt.Fprintf(&b, "  go:         %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&b, "  reads:\n")
	for _, k := range cluster.SupportedKinds() {
		fmt.Fprintf(&b, "    %s\n", k)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, git commit, Go version and the API versions netpol reads",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionString())
			return nil
		},
	}
}
