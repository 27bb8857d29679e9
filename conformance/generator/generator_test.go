package generator

import (
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
)

func TestBaseLoads(t *testing.T) {
	snap := Base()
	if got := len(snap.Pods); got != 10 {
		t.Errorf("%d pods, want 10", got)
	}
	if got := len(snap.Nodes); got != 2 {
		t.Errorf("%d nodes, want 2", got)
	}
	if got := len(snap.Namespaces); got != 4 {
		t.Errorf("%d namespaces, want 4", got)
	}
	onNode := map[string]int{}
	for _, p := range snap.Pods {
		onNode[p.Spec.NodeName]++
		if p.Status.PodIP == "" || len(p.Status.PodIPs) != 1 || p.Status.Phase != "Running" {
			t.Errorf("%s/%s: status %+v", p.Namespace, p.Name, p.Status)
		}
		if !p.Spec.HostNetwork && len(p.Spec.Containers[0].Ports) != 6 {
			t.Errorf("%s/%s: %d ports", p.Namespace, p.Name, len(p.Spec.Containers[0].Ports))
		}
	}
	if onNode["node-1"] == 0 || onNode["node-2"] == 0 {
		t.Errorf("pods per node: %v", onNode)
	}
	h := snap.Pod("h", "h")
	if h == nil || !h.Spec.HostNetwork || h.Status.PodIP != node1IP {
		t.Errorf("host-network pod: %+v", h)
	}
	for _, ns := range snap.Namespaces {
		if ns.Labels["ns"] != ns.Name || ns.Labels["kubernetes.io/metadata.name"] != ns.Name {
			t.Errorf("namespace %s labels %v", ns.Name, ns.Labels)
		}
	}
	// The same YAML through the file loader.
	path := t.TempDir() + "/base.yaml"
	writeFile(t, path, BaseYAML())
	_, report := cluster.LoadPaths([]string{path}, nil)
	if len(report.Errors) > 0 || len(report.Notes) > 0 || len(report.Skipped) > 0 {
		t.Fatalf("LoadPaths: errors %v notes %v skipped %v", report.Errors, report.Notes, report.Skipped)
	}
	if BaseYAML() != BaseYAML() {
		t.Error("BaseYAML is not deterministic")
	}
}

// OutsideAddr is in outsideCIDR and in no other CIDR of the base, and no
// node or pod has it: it is outside the cluster for every policy.
func TestOutsideAddr(t *testing.T) {
	a := netip.MustParseAddr(OutsideAddr)
	for _, c := range []struct {
		cidr string
		in   bool
	}{{outsideCIDR, true}, {podsCIDR, false}, {node1CIDR, false}, {node2CIDR, false}, {nodesCIDR, false}} {
		if netip.MustParsePrefix(c.cidr).Contains(a) != c.in {
			t.Errorf("%s in %s: %v, want %v", a, c.cidr, !c.in, c.in)
		}
	}
	snap := Base()
	for _, p := range snap.Pods {
		for _, pa := range cluster.PodAddresses(p) {
			if pa == a {
				t.Errorf("pod %s/%s has the outside's address", p.Namespace, p.Name)
			}
		}
	}
	for _, n := range snap.Nodes {
		for _, na := range n.Status.Addresses {
			if na.Address == OutsideAddr {
				t.Errorf("node %s has the outside's address", n.Name)
			}
		}
	}
}

func TestEveryCaseLoadsAndBuilds(t *testing.T) {
	for _, c := range All() {
		if err := Check(c); err != nil {
			t.Error(err)
		}
	}
}

func TestNamesUniqueAndTagged(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range All() {
		if seen[c.Name] {
			t.Errorf("duplicate case name %s", c.Name)
		}
		seen[c.Name] = true
		if len(c.Tags) == 0 {
			t.Errorf("%s: no tags", c.Name)
		}
		tagSeen := map[string]bool{}
		for _, tag := range c.Tags {
			if tagSeen[tag] {
				t.Errorf("%s: tag %s twice", c.Name, tag)
			}
			tagSeen[tag] = true
		}
		for _, st := range c.Steps {
			if len(st.Expect) > 0 {
				t.Errorf("%s: a step with expectations (the evaluator is the oracle)", c.Name)
			}
		}
	}
}

func TestDeterministic(t *testing.T) {
	a, b := All(), All()
	if len(a) != len(b) {
		t.Fatal("different lengths")
	}
	for i := range a {
		if a[i].Name != b[i].Name || CaseYAML(a[i]) != CaseYAML(b[i]) {
			t.Fatalf("case %d differs between calls", i)
		}
		for j := range a[i].Steps {
			if a[i].Steps[j].Apply != b[i].Steps[j].Apply {
				t.Fatalf("%s step %d differs between calls", a[i].Name, j)
			}
		}
	}
}

// TestCounts logs the cases per tag and checks the suite's totals.
func TestCounts(t *testing.T) {
	cases := All()
	perTag := map[string]int{}
	npOnly, admin := 0, 0
	for _, c := range cases {
		for _, tag := range c.Tags {
			perTag[tag]++
		}
		if c.AdminTier() {
			admin++
		} else {
			npOnly++
		}
	}
	tagNames := make([]string, 0, len(perTag))
	for tag := range perTag {
		tagNames = append(tagNames, tag)
	}
	sort.Strings(tagNames)
	var b strings.Builder
	for _, tag := range tagNames {
		b.WriteString(tag + "=" + itoa(perTag[tag]) + " ")
	}
	steps := 0
	for _, c := range cases {
		steps += len(c.Steps)
	}
	t.Logf("%d cases (%d steps): %d NetworkPolicy-only, %d admin-tier", len(cases), steps, npOnly, admin)
	t.Logf("per tag: %s", b.String())
	if len(cases) < 400 || npOnly < 230 || admin < 150 {
		t.Errorf("%d cases, %d NetworkPolicy-only, %d admin-tier: want >= 400, >= 230, >= 150", len(cases), npOnly, admin)
	}
	for _, tag := range []string{"target", "peers", "ports", "action", "rules", "conflict", "namespaces", "upstream-e2e",
		"admin", "baseline", "pass", "priority", "networks", "nodes", "churn"} {
		if perTag[tag] == 0 {
			t.Errorf("no case tagged %s", tag)
		}
	}
	if perTag["upstream-e2e"] != 49 {
		t.Errorf("%d upstream-e2e cases, want the 49 upstream ones", perTag["upstream-e2e"])
	}
}
