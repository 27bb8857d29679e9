package main

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/netpol/netpol/pkg/cluster"
)

// completionSnapshot reads the cluster state the command line names, for
// shell completion: quietly, and briefly for a live cluster.
func (in *inputFlags) completionSnapshot(ctx context.Context) *cluster.Snapshot {
	if len(in.files) > 0 {
		var files []string
		for _, f := range in.files {
			if f != "-" { // stdin is the shell's, not a state file
				files = append(files, f)
			}
		}
		snap, _ := cluster.LoadPaths(files, strings.NewReader(""))
		return snap
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	snap, _, err := cluster.LoadFromAPI(ctx, cluster.APIOptions{Kubeconfig: in.kubeconfig, Context: in.context})
	if err != nil {
		return nil
	}
	return snap
}

// completeFrom completes from what names lists of the cluster the command
// line names (args: the arguments before the one completed).
func completeFrom(in *inputFlags, names func(snap *cluster.Snapshot, args []string) []string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		snap := in.completionSnapshot(cmd.Context())
		if snap == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return matching(names(snap, args), toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeEndpoints completes explain's SRC (pods as namespace/name) and
// DST (pods, svc/NAMESPACE/NAME, nodeport/NODE/NAMESPACE/NAME).
func completeEndpoints(in *inputFlags) cobra.CompletionFunc {
	endpoints := completeFrom(in, func(snap *cluster.Snapshot, args []string) []string {
		var out []string
		for _, p := range snap.Pods {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		if len(args) == 1 {
			for _, s := range snap.Services {
				out = append(out, "svc/"+s.Namespace+"/"+s.Name)
				for _, port := range s.Spec.Ports {
					if port.NodePort != 0 {
						for _, n := range snap.Nodes {
							out = append(out, "nodeport/"+n.Name+"/"+s.Namespace+"/"+s.Name)
						}
						break
					}
				}
			}
		}
		return out
	})
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) >= 2 {
			return nil, cobra.ShellCompDirectiveNoFileComp // before reading the cluster
		}
		return endpoints(cmd, args, toComplete)
	}
}

// completeNodes completes a Node name.
func completeNodes(in *inputFlags) cobra.CompletionFunc {
	return completeFrom(in, func(snap *cluster.Snapshot, _ []string) []string {
		var out []string
		for _, n := range snap.Nodes {
			out = append(out, n.Name)
		}
		return out
	})
}

// completeNamespaces completes a Namespace name (of a namespace or a pod;
// matching drops the repeats).
func completeNamespaces(in *inputFlags) cobra.CompletionFunc {
	return completeFrom(in, func(snap *cluster.Snapshot, _ []string) []string {
		var out []string
		for _, n := range snap.Namespaces {
			out = append(out, n.Name)
		}
		for _, p := range snap.Pods {
			out = append(out, p.Namespace)
		}
		return out
	})
}

func matching(all []string, prefix string) []cobra.Completion {
	sort.Strings(all)
	var out []cobra.Completion
	for i, s := range all {
		if strings.HasPrefix(s, prefix) && (i == 0 || all[i-1] != s) {
			out = append(out, s)
		}
	}
	return out
}

func fixed(values ...string) cobra.CompletionFunc {
	return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
}

// registerCompletions adds flag completion to every command: -o values (from
// the flag's help text, "one of: a, b or c"), --family, --node and -n.
func registerCompletions(root *cobra.Command, in *inputFlags) {
	for _, c := range root.Commands() {
		registerCompletions(c, in)
	}
	complete := func(flag string, f cobra.CompletionFunc) {
		if root.Flags().Lookup(flag) != nil {
			if _, ok := root.GetFlagCompletionFunc(flag); !ok {
				_ = root.RegisterFlagCompletionFunc(flag, f)
			}
		}
	}
	if o := root.Flags().Lookup("output"); o != nil {
		complete("output", fixed(formatsOf(o.Usage)...))
	}
	complete("family", fixed("ipv4", "ipv6"))
	complete("log-format", fixed("text", "json"))
	complete("log-level", fixed("debug", "info", "warn", "error"))
	complete("node", completeNodes(in))
	complete("node-name", completeNodes(in))
	complete("namespace", completeNamespaces(in))
}

// formatsOf reads "output format: table, json or yaml" as its values. A
// value may carry a remark, "json (report.json's shape)": the value is
// the item's first word, and remarks in brackets (commas and all) are
// dropped first.
func formatsOf(usage string) []string {
	_, list, ok := strings.Cut(usage, ":")
	if !ok {
		return nil
	}
	var plain strings.Builder
	depth := 0
	for _, r := range list {
		switch {
		case r == '(':
			depth++
		case r == ')' && depth > 0:
			depth--
		case depth == 0:
			plain.WriteRune(r)
		}
	}
	list = strings.ReplaceAll(plain.String(), " or ", ", ")
	var out []string
	for _, f := range strings.Split(list, ",") {
		if words := strings.Fields(f); len(words) > 0 {
			out = append(out, words[0])
		}
	}
	return out
}
