package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDiffCLI: the three forms on the demo (--apply, --delete, --after),
// text and JSON, --exit-code, --services, and what is refused.
func TestDiffCLI(t *testing.T) {
	change := "../../examples/diff/change.yaml"
	out, _, err := run(t, "", "diff", "-f", demo, "--apply", change)
	if err != nil {
		t.Fatalf("diff --apply: %v\n%s", err, out)
	}
	wantContains(t, "diff --apply", out,
		"2 policies changed (ClusterNetworkPolicy sandbox-not-from-web, NetworkPolicy api/orders-from-web); 48 cells compared on tcp/80,tcp/5432,tcp/8080: 4 flip (1 open, 3 close), 44 unchanged",
		`3 cell(s) close, ingress side: before, no policy decides (the default allows); now, ClusterNetworkPolicy sandbox-not-from-web ingress[0] "deny-web" (Deny)`,
		"1 cell(s) open, ingress side: before, NetworkPolicy api/orders-from-web (Deny: isolated, no rule allows); now, NetworkPolicy api/orders-from-web ingress[0] (Accept)",
		"db/postgres -> api/orders tcp/8080: denied -> allowed\n",
		"web/frontend -> sandbox/toolbox tcp/80: allowed -> denied\n")

	// JSON, one port: the contract's fields.
	out, _, err = run(t, "", "diff", "-f", demo, "--apply", change, "--ports", "tcp/8080", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Changes []struct {
			From, To, Protocol, Direction string
			Port                          int32
			Before, After                 bool
			BeforeDecision                struct{ Tier, Policy, Rule, Action string } `json:"beforeDecision"`
			AfterDecision                 struct{ Tier, Policy, Rule, Action string } `json:"afterDecision"`
		} `json:"changes"`
		CellsCompared int `json:"cellsCompared"`
		Unchanged     int `json:"unchanged"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(res.Changes) != 2 || res.CellsCompared != 16 || res.Unchanged != 14 {
		t.Fatalf("diff -o json: %+v", res)
	}
	c := res.Changes[0]
	if c.From != "db/postgres" || c.To != "api/orders" || c.Protocol != "TCP" || c.Port != 8080 || c.Before || !c.After || c.Direction != "ingress" ||
		c.BeforeDecision.Policy != "NetworkPolicy api/orders-from-web" || c.BeforeDecision.Action != "Deny" ||
		c.AfterDecision.Rule != "ingress[0]" || c.AfterDecision.Action != "Accept" {
		t.Errorf("the first change: %+v", c)
	}

	// --exit-code: 1 when something flips, 0 when nothing does.
	if _, _, err := run(t, "", "diff", "-f", demo, "--apply", change, "--exit-code"); !errors.As(err, new(*diffChangedError)) {
		t.Errorf("diff --exit-code with flips: %v", err)
	}
	same := filepath.Join(t.TempDir(), "same.yaml")
	data, err := os.ReadFile(demo + "/policies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(same, data, 0o644)
	out, _, err = run(t, "", "diff", "-f", demo, "--apply", same, "--exit-code")
	if err != nil || !strings.HasPrefix(out, "no policy changed; 48 cells compared") {
		t.Errorf("diff --apply of the same policies: %v\n%s", err, out)
	}

	// --delete, and --after (the whole state after).
	out, _, err = run(t, "", "diff", "-f", demo, "--delete", "NetworkPolicy/api/orders-from-web")
	if err != nil || !strings.Contains(out, "5 flip (5 open, 0 close)") {
		t.Errorf("diff --delete: %v\n%s", err, out)
	}
	after := t.TempDir()
	for _, f := range []string{"cluster.yaml", "services.yaml"} {
		data, _ := os.ReadFile(demo + "/" + f)
		os.WriteFile(filepath.Join(after, f), data, 0o644)
	}
	out, _, err = run(t, "", "diff", "-f", demo, "--after", after, "-n", "api,web")
	if err != nil || !strings.Contains(out, "4 policies changed") || !strings.Contains(out, "8 cells compared on tcp/80,tcp/8080: 1 flip (1 open, 0 close)") {
		t.Errorf("diff --after (every policy gone), api and web: %v\n%s", err, out)
	}

	// --services: pod to ClusterIP cells too.
	out, _, err = run(t, "", "diff", "-f", demo, "--apply", change, "--services")
	if err != nil || !strings.Contains(out, "-> svc/api/orders tcp/80: denied -> allowed") {
		t.Errorf("diff --services: %v\n%s", err, out)
	}

	// An invalid object: reported once, by the state that holds it first,
	// and counted in the exit status.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bad-cidr, namespace: web}
spec:
  podSelector: {}
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/33}}]
`), 0o644)
	_, stderr, err := run(t, "", "diff", "-f", demo, "-f", bad, "--apply", change)
	if !errors.As(err, new(*partialError)) || strings.Count(stderr, "bad-cidr") != 1 {
		t.Errorf("an invalid policy before the change: %v\n%s", err, stderr)
	}
	_, stderr, err = run(t, "", "diff", "-f", demo, "--apply", bad)
	if !errors.As(err, new(*partialError)) || strings.Count(stderr, "bad-cidr") != 1 || !strings.Contains(stderr, bad) {
		t.Errorf("an invalid policy applied: %v\n%s", err, stderr)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"diff", "-f", demo}, "give the state after the change"},
		{[]string{"diff", "-f", demo, "--after", after, "--apply", change}, "give the state after the change"},
		{[]string{"diff", "-f", demo, "--delete", "NetworkPolicy/nosuch/x"}, "there is no NetworkPolicy nosuch/x in the state before"},
		{[]string{"diff", "-f", demo, "--delete", "ClusterNetworkPolicy/a/b"}, "a ClusterNetworkPolicy is ClusterNetworkPolicy/NAME"},
		{[]string{"diff", "-f", demo, "--delete", "Secret/a/b"}, `unknown kind "Secret"`},
	} {
		if _, _, err := run(t, "", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// TestStagedCLI: a staged policy is not enforced; explain --staged shows
// the verdict with it enforced and says it differs; diff --promote shows
// the cells enforcing it flips; promoting a policy that is not staged is
// refused.
func TestStagedCLI(t *testing.T) {
	staged := "../../examples/diff/staged.yaml"
	out, _, err := run(t, "", "explain", "-f", demo, "-f", staged, "web/frontend", "sandbox/toolbox", "--staged")
	if err != nil {
		t.Fatal(err)
	}
	wantContains(t, "explain --staged", out,
		"web/frontend (10.244.1.10) -> sandbox/toolbox (10.244.1.30) TCP/80: ALLOWED",
		"With the staged policies enforced (ClusterNetworkPolicy sandbox-not-from-web), the verdict DIFFERS: denied instead of allowed.",
		`Decision: DENIED by the Admin tier: ClusterNetworkPolicy sandbox-not-from-web ingress[0] "deny-web", action Deny`)
	out, _, err = run(t, "", "explain", "-f", demo, "-f", staged, "web/frontend", "sandbox/toolbox", "--staged", "-o", "json")
	var sv struct {
		Staged     []string `json:"stagedPolicies"`
		Differs    bool     `json:"differs"`
		Enforced   struct{ Allowed bool }
		WithStaged struct{ Allowed bool } `json:"withStaged"`
	}
	if err != nil || json.Unmarshal([]byte(out), &sv) != nil || !sv.Differs || !sv.Enforced.Allowed || sv.WithStaged.Allowed ||
		len(sv.Staged) != 1 || sv.Staged[0] != "ClusterNetworkPolicy sandbox-not-from-web" {
		t.Errorf("explain --staged -o json: %v %+v\n%s", err, sv, out)
	}
	// Not enforced: the table allows it; --exit-code follows the enforced verdict.
	if _, _, err := run(t, "", "explain", "-f", demo, "-f", staged, "web/frontend", "sandbox/toolbox", "--staged", "--exit-code"); err != nil {
		t.Errorf("explain --staged --exit-code of an allowed connection: %v", err)
	}
	out, _, err = run(t, "", "diff", "-f", demo, "-f", staged, "--promote", "ClusterNetworkPolicy/sandbox-not-from-web")
	if err != nil || !strings.Contains(out, "3 flip (0 open, 3 close)") || !strings.Contains(out, "web/frontend -> sandbox/toolbox tcp/80: allowed -> denied") {
		t.Errorf("diff --promote: %v\n%s", err, out)
	}
	if _, _, err := run(t, "", "diff", "-f", demo, "--promote", "NetworkPolicy/api/orders-from-web"); err == nil ||
		!strings.Contains(err.Error(), `NetworkPolicy api/orders-from-web is not staged (annotation netpol.io/staged: "true")`) {
		t.Errorf("diff --promote of a policy not staged: %v", err)
	}
}
