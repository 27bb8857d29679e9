package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/whatif"
)

// diffChangedError is --exit-code's status when a cell flips; the output
// says which.
type diffChangedError struct{ n int }

func (e *diffChangedError) Error() string { return fmt.Sprintf("%d cell(s) flip", e.n) }

func newDiffCommand(in *inputFlags) *cobra.Command {
	var (
		after, apply, deletes []string
		promote               []string
		ports, namespaces     []string
		family, output        string
		allNamespaces         bool
		services, exitCode    bool
	)
	cmd := &cobra.Command{
		Use:   "diff (--after PATH... | --apply PATH... [--delete KIND/NAMESPACE/NAME...])",
		Short: "Show the cells of the truth table whose verdict a change flips",
		Long: "Compare what policy allows before and after a change: every cell of the truth table (source pod,\n" +
			"destination pod, port) whose verdict differs, with the decision explain gives each side that\n" +
			"flipped, before and after, grouped by the policy rules that now decide.\n\n" +
			"Before is the cluster state (-f files, or the live cluster). After is either another whole state\n" +
			"(--after files), or the change on top of before: --apply files, whose objects replace those of the\n" +
			"same kind, namespace and name and add the others (as kubectl apply would), and --delete objects\n" +
			"(KIND/NAMESPACE/NAME, or KIND/NAME for a cluster-scoped kind).\n\n" +
			"When only policies change, only the cells a changed policy can decide are evaluated again.\n" +
			"With --services, also every pod to every Service port (its ClusterIP, after DNAT, as explain does).\n\n" +
			"Exit status: 0 when the comparison was printed (whatever flips), 1 on an error or an invalid input\n" +
			"object (reported on stderr); with --exit-code, also 1 when any cell flips.",
		Example: "  netpol diff -f examples/demo --apply new-policy.yaml\n" +
			"  netpol diff --apply deploy/policies/ --exit-code            # the live cluster; in CI, fail on any flip\n" +
			"  netpol diff -f before/ --after after/ -o json | jq '.changes[] | select(.after == false)'\n" +
			"  netpol diff -f examples/demo --delete NetworkPolicy/api/orders-from-web --ports tcp/8080",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(output, "text", "json", "yaml"); err != nil {
				return err
			}
			if len(after) > 0 == (len(apply) > 0 || len(deletes) > 0 || len(promote) > 0) {
				return fmt.Errorf("give the state after the change: --after PATH, or --apply PATH, --delete KIND/NAMESPACE/NAME and/or --promote KIND/NAMESPACE/NAME")
			}
			probes, err := l4.ParsePorts(ports)
			if err != nil {
				return err
			}
			fam, err := ipfamily.Parse(family)
			if err != nil {
				return err
			}
			if allNamespaces {
				namespaces = nil
			}
			stderr := cmd.ErrOrStderr()
			lb, err := in.load(cmd.Context(), cmd.InOrStdin(), stderr)
			if err != nil {
				return err
			}
			la, err := afterState(lb, after, apply, deletes, promote, cmd.InOrStdin(), stderr)
			if err != nil {
				return err
			}
			opts := eval.TruthTableOptions{Probes: probes, Namespaces: namespaces, Family: fam}
			// JSON and YAML carry explain's whole decisions; text, what decided.
			res := whatif.Compare(whatif.State{Snapshot: lb.snap, Evaluator: lb.evaluator}, whatif.State{Snapshot: la.snap, Evaluator: la.evaluator},
				whatif.Options{TruthTableOptions: opts, Explain: output != "text"})
			if services {
				sc, compared, err := serviceChanges(lb, la, opts)
				if err != nil {
					return err
				}
				res.Changes = append(res.Changes, sc...)
				res.CellsCompared += compared
				res.Unchanged += compared - len(sc)
			}
			if err := writeDiff(cmd.OutOrStdout(), res, output); err != nil {
				return err
			}
			if err := errorsOf(lb, la); err != nil {
				return err
			}
			if exitCode && len(res.Changes) > 0 {
				return &diffChangedError{len(res.Changes)}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&after, "after", nil, "the whole state after the change: files or directories, as -f")
	f.StringSliceVar(&apply, "apply", nil, "objects to apply on top of the state before (files or directories): each replaces the object of the same kind, namespace and name, or is added")
	f.StringSliceVar(&promote, "promote", nil, `staged policies to enforce (their netpol.io/staged annotation removed): KIND/NAMESPACE/NAME or KIND/NAME`)
	f.StringSliceVar(&deletes, "delete", nil, "objects to delete from the state before: KIND/NAMESPACE/NAME, or KIND/NAME for a cluster-scoped kind (e.g. NetworkPolicy/prod/allow-web, ClusterNetworkPolicy/isolate-dev)")
	f.StringSliceVar(&ports, "ports", nil, "probes as protocol/port, comma-separated (default: every port the pods of either state declare)")
	f.StringSliceVarP(&namespaces, "namespace", "n", nil, "only pods of these namespaces (default: all)")
	f.BoolVarP(&allNamespaces, "all-namespaces", "A", false, "pods of every namespace")
	f.StringVar(&family, "family", "", "address family for dual-stack pods: ipv4 or ipv6 (default: each pod's primary address)")
	f.StringVarP(&output, "output", "o", "text", "output format: text, json or yaml")
	f.BoolVar(&services, "services", false, "also compare every pod to every Service port (its ClusterIP, after DNAT: allowed iff every endpoint is)")
	f.BoolVar(&exitCode, "exit-code", false, "exit with status 1 when any cell flips (for CI pipelines that gate policy changes)")
	return cmd
}

// afterState loads the state after the change: the files of --after, or
// before's snapshot with --apply's objects applied and --delete's deleted.
func afterState(before *loaded, after, apply, deletes, promote []string, stdin io.Reader, stderr io.Writer) (*loaded, error) {
	var snap *cluster.Snapshot
	var report *cluster.Report
	since := before // what before printed is not printed again
	if len(after) > 0 {
		since = nil
		snap, report = cluster.LoadPaths(after, stdin)
		if report.Objects == 0 && len(report.Errors) == 0 {
			return nil, fmt.Errorf("--after: no Kubernetes object read from %s", strings.Join(report.Empty, "; "))
		}
	} else {
		snap = before.snap.Copy()
		for _, d := range deletes {
			key, err := parseObjectRef(d)
			if err != nil {
				return nil, fmt.Errorf("--delete %w", err)
			}
			if !snap.Delete(key) {
				return nil, fmt.Errorf("--delete %s: there is no %s in the state before", d, key)
			}
		}
		for _, p := range promote {
			if err := promoteStaged(snap, p); err != nil {
				return nil, err
			}
		}
		report = snap.AddPaths(apply, stdin, true)
		if len(apply) > 0 && report.Objects == 0 && len(report.Errors) == 0 {
			return nil, fmt.Errorf("--apply: no Kubernetes object read from %s", strings.Join(report.Empty, "; "))
		}
	}
	return loadedFrom(snap, report, stderr, since), nil
}

// promoteStaged removes the netpol.io/staged annotation from the staged
// policy ref names (KIND/NAMESPACE/NAME or KIND/NAME), in a copy of it.
func promoteStaged(snap *cluster.Snapshot, ref string) error {
	key, err := parseObjectRef(ref)
	if err != nil {
		return fmt.Errorf("--promote %s: %w", ref, err)
	}
	obj, ok := snap.PolicyObject(key).(runtime.Object)
	if !ok {
		return fmt.Errorf("--promote %s: there is no %s in the state before", ref, key)
	}
	c := obj.DeepCopyObject()
	meta := c.(metav1.Object)
	if meta.GetAnnotations()[policy.StagedAnnotation] != "true" {
		return fmt.Errorf("--promote %s: %s is not staged (annotation %s: \"true\")", ref, key, policy.StagedAnnotation)
	}
	ann := maps.Clone(meta.GetAnnotations())
	delete(ann, policy.StagedAnnotation)
	meta.SetAnnotations(ann)
	snap.ReplacePolicy(c)
	return nil
}

// parseObjectRef reads KIND/NAMESPACE/NAME, or KIND/NAME for a
// cluster-scoped kind.
func parseObjectRef(s string) (cluster.ObjectKey, error) {
	parts := strings.Split(s, "/")
	kinds := []string{cluster.KindNetworkPolicy, cluster.KindAdminPolicy, cluster.KindBaselinePolicy, cluster.KindClusterPolicy,
		cluster.KindPod, cluster.KindNamespace, cluster.KindNode, cluster.KindService, cluster.KindEndpointSlice, cluster.KindConfigMap}
	kind := ""
	for _, k := range kinds {
		if strings.EqualFold(parts[0], k) {
			kind = k
		}
	}
	if kind == "" {
		return cluster.ObjectKey{}, fmt.Errorf("--delete %s: unknown kind %q (one of %s)", s, parts[0], strings.Join(kinds, ", "))
	}
	clusterScoped := kind == cluster.KindAdminPolicy || kind == cluster.KindBaselinePolicy || kind == cluster.KindClusterPolicy ||
		kind == cluster.KindNamespace || kind == cluster.KindNode
	switch {
	case clusterScoped && len(parts) == 2 && parts[1] != "":
		return cluster.ObjectKey{Kind: kind, Name: parts[1]}, nil
	case !clusterScoped && len(parts) == 3 && parts[1] != "" && parts[2] != "":
		return cluster.ObjectKey{Kind: kind, Namespace: parts[1], Name: parts[2]}, nil
	case clusterScoped:
		return cluster.ObjectKey{}, fmt.Errorf("%s: a %s is %s/NAME", s, kind, kind)
	}
	return cluster.ObjectKey{}, fmt.Errorf("%s: a %s is %s/NAMESPACE/NAME", s, kind, kind)
}

// errorsOf is the exit status of input problems in either state.
func errorsOf(states ...*loaded) error {
	n := 0
	for _, l := range states {
		n += l.problems
	}
	if n > 0 {
		return &partialError{n: n}
	}
	return nil
}

// serviceChanges compares every pod of the table with every ClusterIP
// port of every Service of both states, as explain does (after DNAT:
// allowed iff every endpoint is).
func serviceChanges(lb, la *loaded, opts eval.TruthTableOptions) ([]whatif.Change, int, error) {
	pods := la.evaluator.TablePods(opts)
	inBefore := map[string]bool{}
	for _, p := range lb.evaluator.TablePods(opts) {
		inBefore[p] = true
	}
	type port struct {
		target serviceTarget
		probe  l4.Port
	}
	frontends := func(snap *cluster.Snapshot) map[string]port {
		out := map[string]port{}
		for _, s := range snap.Services {
			if s.Spec.ClusterIP == "" || s.Spec.ClusterIP == corev1.ClusterIPNone {
				continue
			}
			for _, sp := range s.Spec.Ports {
				pr := l4.Port{Protocol: policy.DefaultProtocol(sp.Protocol), Port: sp.Port}
				t := serviceTarget{given: "svc/" + s.Namespace + "/" + s.Name, namespace: s.Namespace, name: s.Name, frontend: proxy.FrontendClusterIP}
				out[t.given+" "+pr.String()] = port{t, pr}
			}
		}
		return out
	}
	fb, fa := frontends(lb.snap), frontends(la.snap)
	keys := make([]string, 0, len(fa))
	for k := range fa {
		if _, ok := fb[k]; ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []whatif.Change
	compared := 0
	for _, k := range keys {
		sp := fa[k]
		for _, from := range pods {
			if !inBefore[from] {
				continue
			}
			vb, err := explainService(lb, from, sp.target, sp.probe, opts.Family)
			if err != nil {
				return nil, 0, err
			}
			va, err := explainService(la, from, sp.target, sp.probe, opts.Family)
			if err != nil {
				return nil, 0, err
			}
			compared++
			if vb.Allowed == va.Allowed {
				continue
			}
			c := whatif.Change{From: from, To: sp.target.given, Protocol: sp.probe.Protocol, Port: sp.probe.Port, Before: vb.Allowed, After: va.Allowed}
			c.Direction, c.BeforeDecision, c.AfterDecision = flippedEndpoint(vb, va)
			out = append(out, c)
		}
	}
	return out, compared, nil
}

// flippedEndpoint is the side that flipped for the first endpoint (by
// address) whose verdict differs, and its decisions before and after
// (none when no endpoint of both states flipped: one was added or went).
func flippedEndpoint(vb, va *serviceVerdict) (string, *eval.DirectionVerdict, *eval.DirectionVerdict) {
	byAddr := func(sv *serviceVerdict) map[string]endpointVerdict {
		m := map[string]endpointVerdict{}
		for _, e := range sv.Endpoints {
			m[e.Address] = e
		}
		return m
	}
	b, a := byAddr(vb), byAddr(va)
	for _, addr := range slices.Sorted(maps.Keys(a)) {
		ea, eb := a[addr], b[addr]
		if eb.Verdict == nil || ea.Verdict == nil || ea.Allowed == eb.Allowed {
			continue
		}
		return whatif.Flipped(eb.Verdict, ea.Verdict)
	}
	return "", nil, nil
}

// writeDiff prints the result: JSON or YAML as is; text, a summary, the
// changes grouped by the rules that decide them, then each flipped cell.
func writeDiff(out io.Writer, res *whatif.Result, format string) error {
	if res.Changes == nil {
		res.Changes = []whatif.Change{}
	}
	if format == "json" {
		b, err := res.MarshalIndent()
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	if ok, err := writeStructured(out, format, res); ok {
		return err
	}
	opened := 0
	for _, c := range res.Changes {
		if c.After {
			opened++
		}
	}
	what := "pods, namespaces or nodes changed"
	if !res.PodsChanged {
		what = "no policy changed"
		switch n := len(res.ChangedPolicies); {
		case n == 1:
			what = "1 policy changed (" + res.ChangedPolicies[0] + ")"
		case n > 1:
			what = fmt.Sprintf("%d policies changed (%s)", n, strings.Join(res.ChangedPolicies, ", "))
		}
	}
	fmt.Fprintf(out, "%s; %d cells compared on %s: %d flip (%d open, %d close), %d unchanged\n",
		what, res.CellsCompared, strings.Join(res.Ports, ","), len(res.Changes), opened, len(res.Changes)-opened, res.Unchanged)
	if len(res.OnlyBefore) > 0 {
		fmt.Fprintf(out, "pods only before (not compared): %s\n", strings.Join(res.OnlyBefore, ", "))
	}
	if len(res.OnlyAfter) > 0 {
		fmt.Fprintf(out, "pods only after (not compared): %s\n", strings.Join(res.OnlyAfter, ", "))
	}
	if len(res.Changes) == 0 {
		return nil
	}
	type group struct {
		line  string
		cells int
	}
	// By the side that flipped and what decided it before and now.
	groups := map[string]*group{}
	var order []string
	for _, c := range res.Changes {
		verb := "close"
		if c.After {
			verb = "open"
		}
		line := fmt.Sprintf("%s, %s side: before, %s; now, %s", verb, c.Direction, decisionText(c.BeforeDecision), decisionText(c.AfterDecision))
		g := groups[line]
		if g == nil {
			g = &group{line: line}
			groups[line] = g
			order = append(order, line)
		}
		g.cells++
	}
	fmt.Fprintln(out)
	for _, line := range order {
		fmt.Fprintf(out, "%d cell(s) %s\n", groups[line].cells, groups[line].line)
	}
	fmt.Fprintln(out)
	for _, c := range res.Changes {
		fmt.Fprintf(out, "%s -> %s %s: %s -> %s\n", c.From, c.To, l4.Port{Protocol: c.Protocol, Port: c.Port}, allowedWord(c.Before), allowedWord(c.After))
	}
	return nil
}

func allowedWord(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// decisionText is a decision in a few words: the policy and rule, or why
// none decided.
func decisionText(dv *eval.DirectionVerdict) string {
	switch {
	case dv == nil:
		return "no endpoint"
	case !dv.Applies:
		return "not policed"
	case dv.Tier == "Default":
		return "no policy decides (the default allows)"
	case dv.Policy == "":
		return dv.Reason
	case dv.Rule == "":
		return fmt.Sprintf("%s (%s: isolated, no rule allows)", dv.Policy, dv.Action)
	}
	return fmt.Sprintf("%s %s (%s)", dv.Policy, dv.Rule, dv.Action)
}
