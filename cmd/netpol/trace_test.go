package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/report"
)

// netpol trace: the JSON shape, the verdict from the traced tables next to
// explain's, and the rules that decided (with their policy comments).
func TestTraceJSON(t *testing.T) {
	tests := []struct {
		name     string
		src, dst string
		port     string
		allowed  bool
		// a matched step that must be on the path: chain prefix, verdict
		// prefix, comment substring
		chain, verdict, comment string
		alternatives            int
		layout                  string // --layout ("": the default, identities)
	}{
		{"NetworkPolicy allows", "web/frontend", "api/orders", "tcp/8080", true, "in.np.", "accept", "NetworkPolicy tier: every rule of NetworkPolicy api/orders-from-web", 0, ""},
		{"Admin deny", "sandbox/toolbox", "db/postgres", "tcp/5432", false, "adm.", "drop", "isolate-dev-from-prod", 0, ""},
		{"NetworkPolicy allows, address layout", "web/frontend", "api/orders", "tcp/8080", true, "in.", "return", "NetworkPolicy tier: every rule of NetworkPolicy api/orders-from-web", 0, "addresses"},
		{"Admin deny, address layout", "sandbox/toolbox", "db/postgres", "tcp/5432", false, "in.", "drop", "isolate-dev-from-prod", 0, "addresses"},
		{"Service through DNAT, denied at the endpoint", "sandbox/toolbox", "svc/api/orders", "tcp/80", false, "services.4", "dnat to 10.244.2.10:8080", "frontends with 1 endpoint", 0, ""},
		{"ClusterIP by address, as the Service", "web/frontend", "10.96.0.20", "tcp/80", true, "services.4", "dnat to", "", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"trace", "-f", "../../examples/demo", tc.src, tc.dst, "--port", tc.port, "-o", "json"}
			if tc.layout != "" {
				args = append(args, "--layout", tc.layout)
			}
			out, stderr, err := run(t, "", args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			var doc struct {
				Allowed bool `json:"allowed"`
				Agree   bool `json:"agree"`
				Explain struct {
					Allowed *bool `json:"allowed"`
				} `json:"explain"`
				Path []struct {
					Node, Hook, Table, Chain, Rule, Comment, Verdict string
					Matched                                          bool
				} `json:"path"`
				Alternatives []json.RawMessage `json:"alternatives"`
			}
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatal(err)
			}
			if doc.Allowed != tc.allowed || !doc.Agree || doc.Explain.Allowed == nil || *doc.Explain.Allowed != tc.allowed {
				t.Fatalf("allowed %v agree %v explain %v, want %v", doc.Allowed, doc.Agree, doc.Explain.Allowed, tc.allowed)
			}
			if len(doc.Alternatives) != tc.alternatives {
				t.Errorf("%d alternatives, want %d", len(doc.Alternatives), tc.alternatives)
			}
			found := false
			for _, s := range doc.Path {
				if s.Node == "" || s.Hook == "" || s.Table == "" || s.Rule == "" {
					t.Fatalf("step without node, hook, table or rule: %+v", s)
				}
				if s.Matched && strings.HasPrefix(s.Chain, tc.chain) && strings.HasPrefix(s.Verdict, tc.verdict) && strings.Contains(s.Comment, tc.comment) {
					found = true
				}
			}
			if !found {
				t.Errorf("no matched step in %s* with verdict %s and comment %q:\n%s", tc.chain, tc.verdict, tc.comment, out)
			}
			last := doc.Path[len(doc.Path)-1]
			if !tc.allowed && last.Verdict != "drop" {
				t.Errorf("denied path ends with %+v, want a drop", last)
			}
		})
	}
}

func TestTraceText(t *testing.T) {
	out, stderr, err := run(t, "", "trace", "-f", "../../examples/demo", "sandbox/toolbox", "db/postgres", "--port", "tcp/5432")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	wantContains(t, "text", out,
		"Ingress of db/postgres: DENIED", // explain's part
		"traced through the nftables tables: DENIED",
		"  node-2 forward\n",
		"ip daddr vmap @ingress-pods4   -> jump in.",
		"explain and the traced tables agree: denied",
	)
	if strings.Contains(out, "(no match)") {
		t.Errorf("rules that did not match are shown without --all-rules:\n%s", out)
	}
	all, _, err := run(t, "", "trace", "-f", "../../examples/demo", "sandbox/toolbox", "db/postgres", "--port", "tcp/5432", "--all-rules")
	if err != nil || !strings.Contains(all, "ct state established,related accept   (no match)") {
		t.Errorf("--all-rules: %v\n%s", err, all)
	}
}

// A disagreement is printed and ends with status 3.
func TestTraceDisagreement(t *testing.T) {
	var b bytes.Buffer
	res := &traceResult{Allowed: true, explainAllowed: false}
	res.explainText = func(io.Writer, report.Style, *report.Rules) {}
	writeTrace(&b, res, false, report.Style{}, nil)
	if !strings.Contains(b.String(), "DISAGREEMENT: the traced tables say allowed, explain says denied") {
		t.Errorf("got %q", b.String())
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if got := exitStatus(&exitError{code: traceDisagrees, msg: "x"}, null); got != 3 {
		t.Errorf("exit status %d, want 3", got)
	}
}

// `table --engine nft` prints the same table as the evaluator, traced
// through the nodes' compiled tables; an unknown engine is refused.
func TestTableEngineNft(t *testing.T) {
	byEval, _, err := run(t, "", "table", "-f", "../../examples/demo", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	byNft, stderr, err := run(t, "", "table", "-f", "../../examples/demo", "-o", "json", "--engine", "nft")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if byEval != byNft || !strings.Contains(byNft, `"allowed":false`) {
		t.Errorf("engines differ or nothing is denied:\neval %s\nnft  %s", byEval, byNft)
	}
	if _, _, err := run(t, "", "table", "-f", "../../examples/demo", "--engine", "kernel"); err == nil || !strings.Contains(err.Error(), "want eval or nft") {
		t.Errorf("unknown engine: %v", err)
	}
}

// Explain's model of a Service connection (which node DNATs, which
// endpoints it may choose, who is masqueraded, where policy runs) agrees
// with the compiled tables traced packet by packet, for every pod to every
// Service frontend of the test states.
func TestServiceExplainAgreesWithTracedTables(t *testing.T) {
	states := [][]string{
		{"../../examples/demo"},
		{"../../conformance/testdata/services.yaml"},
		{"../../examples/demo", "testdata/nodeports.yaml"},
	}
	for _, paths := range states {
		t.Run(strings.Join(paths, "+"), func(t *testing.T) {
			snap, rep := cluster.LoadPaths(paths, nil)
			if len(rep.Errors) > 0 {
				t.Fatal(rep.Errors)
			}
			model := policy.Build(snap)
			l := &loaded{snap: snap, model: model, evaluator: eval.New(snap, model)}
			checked := 0
			for _, src := range snap.Pods {
				for _, svc := range snap.Services {
					for _, sp := range svc.Spec.Ports {
						probe := l4.Port{Protocol: policy.DefaultProtocol(sp.Protocol), Port: sp.Port}
						targets := []string{"svc/" + svc.Namespace + "/" + svc.Name}
						if sp.NodePort != 0 {
							for _, n := range snap.Nodes {
								targets = append(targets, "nodeport/"+n.Name+"/"+svc.Namespace+"/"+svc.Name)
							}
						}
						for _, dst := range targets {
							p := probe
							if strings.HasPrefix(dst, "nodeport/") {
								p.Port = sp.NodePort
							}
							tr, err := traceConnection(l, src.Namespace+"/"+src.Name, dst, p, "", dataplane.Options{})
							if err != nil {
								continue // e.g. a Service without a ClusterIP of the pod's family
							}
							checked++
							if !tr.Agree {
								t.Errorf("%s/%s -> %s %s: traced %v, explain %v", src.Namespace, src.Name, dst, p, tr.Allowed, tr.explainAllowed)
							}
						}
					}
				}
			}
			if checked == 0 {
				t.Fatal("no Service connection traced")
			}
			t.Logf("%d Service connections: explain == traced tables", checked)
		})
	}
}
