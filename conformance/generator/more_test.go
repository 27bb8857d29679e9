package generator

import (
	"reflect"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

func TestSelect(t *testing.T) {
	cases := []Case{
		{Name: "a", Tags: []string{"np", "peers"}},
		{Name: "b", Tags: []string{"admin", "pass"}},
		{Name: "c", Tags: []string{"baseline", "pass", "churn"}},
		{Name: "d", Tags: []string{"np", "churn"}},
	}
	for _, tc := range []struct {
		name             string
		include, exclude []string
		want             []string
	}{
		{"everything", nil, nil, []string{"a", "b", "c", "d"}},
		{"include one tag", []string{"pass"}, nil, []string{"b", "c"}},
		{"include any of", []string{"peers", "admin"}, nil, []string{"a", "b"}},
		{"exclude", nil, []string{"churn"}, []string{"a", "b"}},
		{"exclude any of", nil, []string{"churn", "peers"}, []string{"b"}},
		{"include and exclude", []string{"pass", "np"}, []string{"churn"}, []string{"a", "b"}},
		{"unknown tag", []string{"nope"}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range Select(cases, tc.include, tc.exclude) {
				got = append(got, c.Name)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
	all := All()
	if got := len(Select(all, []string{"churn"}, nil)); got == 0 || got >= len(all) {
		t.Errorf("churn selects %d of %d", got, len(all))
	}
	for _, c := range Select(all, []string{"admin"}, []string{"baseline"}) {
		if !c.HasTag("admin") || c.HasTag("baseline") {
			t.Errorf("%s: tags %v", c.Name, c.Tags)
		}
	}
}

func casesYAML(cases []Case) string {
	var b strings.Builder
	for _, c := range cases {
		b.WriteString(c.Name + "\n" + strings.Join(c.Tags, ",") + "\n")
		for _, st := range c.Steps {
			b.WriteString(st.Apply)
			for _, d := range st.Delete {
				b.WriteString("delete " + d.Kind + " " + d.Namespace + "/" + d.Name + "\n")
			}
		}
	}
	return b.String()
}

func TestRandom(t *testing.T) {
	a, b := casesYAML(Random(50, 7)), casesYAML(Random(50, 7))
	if a != b {
		t.Error("the same seed gives different cases")
	}
	if casesYAML(Random(50, 8)) == a {
		t.Error("seeds 7 and 8 give the same cases")
	}
	kinds := map[string]int{}
	names := map[string]bool{}
	for _, seed := range []uint64{1, 2, 3, 42} {
		for _, c := range Random(100, seed) {
			if names[c.Name] {
				t.Errorf("duplicate random case name %s", c.Name)
			}
			names[c.Name] = true
			if err := Check(c); err != nil {
				t.Errorf("seed %d: %v\n%s", seed, err, c.Steps[0].Apply)
				continue
			}
			for _, tag := range c.Tags {
				kinds[tag]++
			}
		}
	}
	t.Logf("random tags over 400 cases: %v", kinds)
	for _, tag := range []string{"np", "admin", "baseline", "pass", "networks", "nodes", "churn", "anp", "banp", "cnp-v1alpha2", "cnp-v1beta1"} {
		if kinds[tag] == 0 {
			t.Errorf("no random case tagged %s", tag)
		}
	}
}

func TestRandomTracedEqualsEvaluator(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	for _, c := range Random(200, 1) {
		diffs, _, err := tracedDiffs(c)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
		for i, d := range diffs {
			if i == 3 {
				break
			}
			t.Errorf("%s: %s\n%s", c.Name, d, CaseYAML(c))
		}
	}
}

// finalTable is the evaluator's table after every step of c.
func finalTable(t *testing.T, c Case) []eval.Result {
	t.Helper()
	snap := Base()
	for i, st := range c.Steps {
		if err := ApplyStep(snap, st, c.Name+" step "+itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	return eval.New(snap, policy.Build(snap)).TruthTable(eval.TruthTableOptions{Probes: Probes(), Family: ipfamily.IPv4}).Results
}

func TestCaseYAMLLoads(t *testing.T) {
	var cases []Case
	for _, c := range All() {
		if len(c.Steps) > 1 || strings.HasPrefix(c.Name, "upstream-e2e/") {
			cases = append(cases, c)
		}
	}
	cases = append(cases, Random(30, 3)...)
	for _, c := range cases {
		path := t.TempDir() + "/case.yaml"
		writeFile(t, path, CaseYAML(c))
		snap, report := cluster.LoadPaths([]string{path}, nil)
		if len(report.Errors) > 0 || len(report.Skipped) > 0 {
			t.Errorf("%s: %v %v", c.Name, report.Errors, report.Skipped)
			continue
		}
		m := policy.Build(snap)
		if len(m.Errors) > 0 {
			t.Errorf("%s: %v", c.Name, m.Errors)
			continue
		}
		got := eval.New(snap, m).TruthTable(eval.TruthTableOptions{Probes: Probes(), Family: ipfamily.IPv4}).Results
		if want := finalTable(t, c); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the table of CaseYAML differs from the table after the last step", c.Name)
		}
	}
}

// deniesTCP81 is the synthetic failure: some step's table denies a TCP 81
// cell.
func deniesTCP81(c Case) bool {
	snap := Base()
	for i, st := range c.Steps {
		if ApplyStep(snap, st, "step "+itoa(i)) != nil {
			return false
		}
		tbl := eval.New(snap, policy.Build(snap)).TruthTable(eval.TruthTableOptions{Probes: []l4.Port{{Protocol: "TCP", Port: 81}}, Family: ipfamily.IPv4})
		for _, r := range tbl.Results {
			if !r.Allowed {
				return true
			}
		}
	}
	return false
}

func policyDocs(t *testing.T, c Case) []M {
	var out []M
	for _, st := range c.Steps {
		docs, err := SplitDocs(st.Apply)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, docs...)
	}
	return out
}

func TestShrink(t *testing.T) {
	big := newCase("shrink/example", "three steps, several policies, one TCP 81 deny deep inside", tags("test"),
		step("policies",
			NP{NS: "x", Name: "allow-all", Types: []string{"Ingress"}, Ingress: []NPRule{{}}},
			adminPol(apiANP, "mixed", 10, subjX, "ingress",
				rule(actAllw, peerNS(nsSel("z"))).on(aport("UDP", 80)),
				rule(actDeny, peerNS(nsSel("y")), peerPods(nsSel("z"), podSel("b"))).on(aport("UDP", 80), aport("TCP", 81), aport("SCTP", 80)),
			),
			adminPol(apiCNP1, "pass", 5, subjNS(nsSel("y")), "egress", rule(actPass, peerNets(podsCIDR))),
		),
		step("relabel x/c", basePodYAML("x", "c", map[string]string{"pod": "b"})),
		step("one more policy", baselinePol(apiBANP, "", 0, subjAll, "egress", rule(actAllw, peerNodes(sel())))),
	)
	if err := Check(big); err != nil {
		t.Fatal(err)
	}
	if !deniesTCP81(big) {
		t.Fatal("the example does not fail")
	}
	got := Shrink(big, deniesTCP81)
	if !deniesTCP81(got) || Check(got) != nil {
		t.Fatalf("the shrunk case no longer fails or is invalid:\n%s", CaseYAML(got))
	}
	docs := policyDocs(t, got)
	if len(got.Steps) != 1 || len(docs) != 1 {
		t.Fatalf("%d steps, %d documents, want 1 and 1:\n%s", len(got.Steps), len(docs), CaseYAML(got))
	}
	// Exactly the deny rule with one peer and the TCP 81 port is left.
	spec := docs[0]["spec"].(M)
	ingress := spec["ingress"].([]any)
	if docs[0]["kind"] != kindANP || len(ingress) != 1 {
		t.Fatalf("want the ANP with one rule:\n%s", got.Steps[0].Apply)
	}
	r := ingress[0].(M)
	ports := r["ports"].([]any)
	if r["action"] != "Deny" || len(r["from"].([]any)) != 1 || len(ports) != 1 ||
		ports[0].(M)["portNumber"].(M)["port"] != float64(81) {
		t.Errorf("want one Deny rule, one peer, port TCP 81:\n%s", got.Steps[0].Apply)
	}
	// 1-minimal: no single further reduction still fails.
	s, err := parseCase(got)
	if err != nil {
		t.Fatal(err)
	}
	for _, cand := range s.candidates() {
		if cc := cand.build(); Check(cc) == nil && deniesTCP81(cc) {
			t.Errorf("not minimal: this smaller case still fails:\n%s", cc.Steps[0].Apply)
		}
	}
	// Its YAML loads and is what a user would feed to netpol explain -f.
	path := t.TempDir() + "/shrunk.yaml"
	writeFile(t, path, CaseYAML(got))
	if _, report := cluster.LoadPaths([]string{path}, nil); len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	t.Logf("shrunk:\n%s", got.Steps[0].Apply)

	// A case that does not fail comes back unchanged.
	pass := one("shrink/passes", "allow all", nil, NP{NS: "x", Name: "allow", Types: []string{"Ingress"}, Ingress: []NPRule{{}}})
	if got := Shrink(pass, deniesTCP81); !reflect.DeepEqual(got, pass) {
		t.Error("a passing case was changed")
	}
}

// TestShrinkRandom shrinks random failing cases: each result still fails,
// is valid, and is no bigger than the original.
func TestShrinkRandom(t *testing.T) {
	shrunk := 0
	for _, c := range Random(40, 11) {
		if !deniesTCP81(c) {
			continue
		}
		got := Shrink(c, deniesTCP81)
		if !deniesTCP81(got) || Check(got) != nil {
			t.Errorf("%s: shrunk case invalid or passing", c.Name)
		}
		if len(got.Steps) > len(c.Steps) || len(policyDocs(t, got)) > 1 {
			t.Errorf("%s: shrunk to %d steps, %d documents:\n%s", c.Name, len(got.Steps), len(policyDocs(t, got)), CaseYAML(got))
		}
		shrunk++
		if shrunk == 8 {
			break
		}
	}
	if shrunk == 0 {
		t.Error("no random case failed")
	}
}
