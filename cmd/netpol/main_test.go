package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

func run(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newRootCommand()
	var out, errOut bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// wantContains fails t for each of wants that text, called what in the
// message, lacks.
func wantContains(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// The JSON shape of `netpol table` is a contract (DESIGN.md "CLI contract").
func TestTableJSONContract(t *testing.T) {
	out, stderr, err := run(t, "", "table", "-f", "../../examples/demo", "--ports", "tcp/80,udp/53", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var doc struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if want := 2 * 4 * 4; len(doc.Results) != want {
		t.Fatalf("got %d results, want %d", len(doc.Results), want)
	}
	seen := map[string]bool{}
	for _, r := range doc.Results {
		from, _ := r["from"].(string)
		to, _ := r["to"].(string)
		proto, _ := r["protocol"].(string)
		port, _ := r["port"].(float64)
		allowed, ok := r["allowed"].(bool)
		if !strings.Contains(from, "/") || !strings.Contains(to, "/") || !ok ||
			(proto != "TCP" && proto != "UDP") || (port != 80 && port != 53) {
			t.Fatalf("result breaks the contract: %v", r)
		}
		if from == "sandbox/toolbox" && to == "db/postgres" && allowed {
			t.Errorf("sandbox/toolbox -> db/postgres must be denied (Admin deny-from-dev): %v", r)
		}
		seen[from+" "+to] = true
	}
	if len(seen) != 16 {
		t.Errorf("got %d pod pairs, want 16", len(seen))
	}
}

func TestExplainJSONContract(t *testing.T) {
	out, stderr, err := run(t, "", "explain", "-f", "../../examples/demo", "sandbox/toolbox", "db/postgres", "--port", "tcp/5432", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var v struct {
		Allowed *bool `json:"allowed"`
		Egress  map[string]any
		Ingress map[string]any
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Allowed == nil || *v.Allowed {
		t.Fatalf("allowed = %v, want false", v.Allowed)
	}
	want := map[string]any{"tier": "Admin", "policy": "ClusterNetworkPolicy isolate-dev-from-prod", "rule": `ingress[0] "deny-from-dev"`, "action": "Deny"}
	for k, w := range want {
		if v.Ingress[k] != w {
			t.Errorf("ingress.%s = %v, want %v", k, v.Ingress[k], w)
		}
	}
	for _, k := range []string{"tier", "action"} {
		if _, ok := v.Egress[k]; !ok {
			t.Errorf("egress has no %q", k)
		}
	}
}

func TestExplainTextQuotesTheDecidingRule(t *testing.T) {
	out, _, err := run(t, "", "explain", "-f", "../../examples/demo", "web/frontend", "api/orders", "--port", "tcp/8080")
	if err != nil {
		t.Fatal(err)
	}
	wantContains(t, "output", out,
		"web/frontend (10.244.1.10) -> api/orders (10.244.2.10) TCP/8080: ALLOWED",
		"Egress of web/frontend: ALLOWED",
		"Ingress of api/orders: ALLOWED",
		`ClusterNetworkPolicy isolate-dev-from-prod ingress[0] "deny-from-dev" (Deny): peer did not match`,
		"ALLOWED by the NetworkPolicy tier: NetworkPolicy api/orders-from-web ingress[0], action Accept",
	)
}

// Bad input: errors name the object and field, the rest is still
// evaluated, and the exit status says something was wrong.
func TestBadInputStillEvaluatesTheRest(t *testing.T) {
	demo, err := os.ReadFile("../../examples/demo/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := string(demo) + `
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: broken, namespace: web}
spec:
  podSelector: {}
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/33}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ignored}
---
apiVersion: v1
kind: Pod
metadata: {name: truncated
`
	out, stderr, err := run(t, bad, "table", "-f", "-", "--ports", "tcp/80", "-o", "json")
	var partial *partialError
	if !errors.As(err, &partial) {
		t.Fatalf("err = %v, want a partialError", err)
	}
	wantContains(t, "stderr", stderr,
		"NetworkPolicy web/broken: spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR",
		"skipped 1 object(s) of kinds netpol does not use: apps/v1 Deployment (1)",
		"document",
	)
	// web/broken's only rule fails closed: web/frontend is isolated and
	// nothing reaches it.
	if !strings.Contains(out, `{"from":"api/orders","to":"web/frontend","protocol":"TCP","port":80,"allowed":false}`) {
		t.Errorf("web/frontend should be isolated with nothing allowed:\n%s", out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"explain", "-f", "../../examples/demo", "web/frontend", "api/orders", "--port", "icmp/1"},
		{"explain", "-f", "../../examples/demo", "web/frontend", "nope/nope"},
		{"table", "-f", "../../examples/demo", "-o", "xml"},
		{"table", "-f", "../../examples/demo", "--family", "ipv5"},
		{"table", "-f", "/does/not/exist"},
	} {
		if _, _, err := run(t, "", args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// A Service destination is explained per endpoint, at its target port,
// as the source's node chooses endpoints (examples/demo/services.yaml).
func TestExplainService(t *testing.T) {
	tests := []struct {
		src     string
		allowed bool
	}{
		{"web/frontend", true},     // orders-from-web admits the frontend on the named port http
		{"sandbox/toolbox", false}, // isolated api: nothing else
	}
	for _, tt := range tests {
		out, stderr, err := run(t, "", "explain", "-f", "../../examples/demo", tt.src, "svc/api/orders", "--port", "tcp/80", "-o", "json")
		if err != nil {
			t.Fatalf("%s: %v\n%s", tt.src, err, stderr)
		}
		var sv struct {
			ClusterIP string `json:"clusterIP"`
			Endpoints []struct {
				Endpoint string `json:"endpoint"`
				Port     int    `json:"port"`
				Verdict  struct {
					Allowed bool `json:"allowed"`
				} `json:"verdict"`
			} `json:"endpoints"`
		}
		if err := json.Unmarshal([]byte(out), &sv); err != nil {
			t.Fatal(err)
		}
		if sv.ClusterIP != "10.96.0.20" || len(sv.Endpoints) != 1 || sv.Endpoints[0].Endpoint != "api/orders" || sv.Endpoints[0].Port != 8080 {
			t.Fatalf("%s: got %+v, want the one endpoint api/orders on target port 8080", tt.src, sv)
		}
		if sv.Endpoints[0].Verdict.Allowed != tt.allowed {
			t.Errorf("%s -> svc/api/orders: allowed %v, want %v", tt.src, sv.Endpoints[0].Verdict.Allowed, tt.allowed)
		}
	}
	if _, _, err := run(t, "", "explain", "-f", "../../examples/demo", "web/frontend", "svc/api/orders", "--port", "tcp/81"); err == nil || !strings.Contains(err.Error(), "no IPv4 port tcp/81") {
		t.Errorf("a port the service lacks: got %v", err)
	}
}
