package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/pkg/lab"
)

// `netpol lab probe -o json` prints the kernel's table in exactly the shape
// of `netpol table -o json` (DESIGN.md "CLI contract"), so the two diff
// cleanly; on the demo they are equal.
func TestLabProbeJSONMatchesTable(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	args := []string{"-f", "../../examples/demo", "--ports", "tcp/80,tcp/5432,udp/53", "-o", "json"}
	tableOut, stderr, err := run(t, "", append([]string{"table"}, args...)...)
	if err != nil {
		t.Fatalf("table: %v\n%s", err, stderr)
	}
	labOut, stderr, err := run(t, "", append([]string{"lab", "probe", "--prefix", "netpol-clitest-"}, args...)...)
	if err != nil {
		t.Fatalf("lab probe: %v\n%s", err, stderr)
	}
	// Progress on stderr (make demo is silent otherwise); the prefix's
	// trailing dash is not doubled.
	wantContains(t, "lab probe stderr", stderr, "lab: bringing up 2 node(s) and 4 pod(s)", "lab netpol-clitest is up: 7 network namespaces (underlay, 2 node(s), 4 pod(s))",
		"lab netpol-clitest: probing 4 pod(s) x 4 pod(s) x 3 port(s)", "lab netpol-clitest removed: 7 network namespaces")
	var want, got map[string]json.RawMessage
	if err := json.Unmarshal([]byte(tableOut), &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(labOut), &got); err != nil {
		t.Fatalf("lab probe output is not JSON: %v\n%s", err, labOut)
	}
	for key, w := range want {
		if string(got[key]) != string(w) {
			t.Errorf("%q differs:\n table: %s\n lab:   %s", key, w, got[key])
		}
	}
	for key := range got {
		if _, ok := want[key]; !ok {
			t.Errorf("lab probe has a key table lacks: %q", key)
		}
	}
	if left, err := lab.List("netpol-clitest-"); err != nil || len(left) > 0 {
		t.Errorf("lab namespaces left behind: %v %v", left, err)
	}
}

// `netpol compile` prints the demo's ruleset for a node, in the agent's
// layout unless --layout says otherwise; an unknown node is an error that
// names it.
func TestCompileCommand(t *testing.T) {
	for _, tc := range []struct{ args, golden string }{
		{"", "demo-node-2-identities.nft"},
		{"--layout identities", "demo-node-2-identities.nft"},
		{"--layout addresses", "demo-node-2.nft"},
	} {
		out, stderr, err := run(t, "", append([]string{"compile", "-f", "../../examples/demo", "--node", "node-2"}, strings.Fields(tc.args)...)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		want, err := os.ReadFile("../../testdata/golden/compile/" + tc.golden)
		if err != nil {
			t.Fatal(err)
		}
		if out != string(want) {
			t.Errorf("compile %s: the output differs from the golden file testdata/golden/compile/%s", tc.args, tc.golden)
		}
	}
	out, stderr, err := run(t, "", "compile", "-f", "../../examples/demo", "--node", "node-1", "--services")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if want, err := os.ReadFile("../../pkg/proxy/testdata/golden/demo-node-1.nft"); err != nil || out != string(want) {
		t.Errorf("compile --services output differs from pkg/proxy/testdata/golden/demo-node-1.nft (%v)", err)
	}
	_, _, err = run(t, "", "compile", "-f", "../../examples/demo", "--node", "node-9")
	if err == nil || !strings.Contains(err.Error(), "node-9") {
		t.Errorf("unknown node: got %v, want an error naming node-9", err)
	}
	_, _, err = run(t, "", "compile", "-f", "../../examples/demo")
	if err == nil || !strings.Contains(err.Error(), "--node") {
		t.Errorf("missing --node: got %v, want an error naming --node", err)
	}
}

// `netpol lab probe --services -o json` appends one object per Service
// probe to the table's results: the cell fields plus endpoint, result and
// address. The demo's api/orders (ClusterIP 10.96.0.20:80, no NodePort)
// is probed from each of its 4 pods; a probe that is answered is answered
// by the Service's only endpoint.
func TestLabProbeServicesJSON(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	out, stderr, err := run(t, "", "lab", "probe", "--prefix", "netpol-clitest-svc-", "-f", "../../examples/demo",
		"--ports", "tcp/80", "--services", "-o", "json")
	if err != nil {
		t.Fatalf("lab probe --services: %v\n%s", err, stderr)
	}
	var got struct {
		Pods    []string                     `json:"pods"`
		Results []map[string]json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	cells, services := 0, map[string]bool{}
	for _, r := range got.Results {
		var to string
		json.Unmarshal(r["to"], &to)
		if !strings.HasPrefix(to, "service/") && !strings.HasPrefix(to, "nodeport/") {
			cells++
			if _, ok := r["endpoint"]; ok {
				t.Errorf("a pod-table cell has an endpoint: %v", r)
			}
			continue
		}
		var row struct {
			From     *string `json:"from"`
			To       *string `json:"to"`
			Protocol *string `json:"protocol"`
			Port     *int    `json:"port"`
			Allowed  *bool   `json:"allowed"`
			Endpoint *string `json:"endpoint"`
			Result   *string `json:"result"`
		}
		data, _ := json.Marshal(r)
		if err := json.Unmarshal(data, &row); err != nil || row.From == nil || row.Protocol == nil || row.Port == nil ||
			row.Allowed == nil || row.Endpoint == nil || row.Result == nil {
			t.Errorf("service row %s lacks a field or has one of the wrong type (%v)", data, err)
			continue
		}
		if *row.To != "service/api/orders" || *row.Protocol != "TCP" || *row.Port != 80 {
			t.Errorf("service row %s: want to service/api/orders, TCP, port 80", data)
		}
		known := []string{lab.ResultOK, lab.ResultTimeout, lab.ResultRefused, lab.ResultUnreachable, lab.ResultRejected}
		if !slices.Contains(known, *row.Result) || *row.Allowed != (*row.Result == lab.ResultOK) {
			t.Errorf("service row %s: result and allowed disagree, or an unknown result", data)
		}
		if *row.Allowed && *row.Endpoint != "api/orders" {
			t.Errorf("service row %s: answered by %q, want api/orders (the only endpoint)", data, *row.Endpoint)
		}
		// Policy judges the endpoint after DNAT (examples/demo): the
		// frontend may reach orders; orders reaches itself (hairpin, never
		// policed); the others are denied, silently.
		wantResult := map[string]string{"web/frontend": lab.ResultOK, "api/orders": lab.ResultOK,
			"db/postgres": lab.ResultTimeout, "sandbox/toolbox": lab.ResultTimeout}[*row.From]
		if *row.Result != wantResult {
			t.Errorf("service row %s: result %s, want %s", data, *row.Result, wantResult)
		}
		services[*row.From] = true
	}
	if cells != len(got.Pods)*len(got.Pods) || len(services) != len(got.Pods) {
		t.Errorf("%d cells and service rows from %v; want %d cells and a row from each of %v",
			cells, services, len(got.Pods)*len(got.Pods), got.Pods)
	}
	if left, err := lab.List("netpol-clitest-svc-"); err != nil || len(left) > 0 {
		t.Errorf("lab namespaces left behind: %v %v", left, err)
	}
}

// `netpol lab probe --compare --services` also checks the ClusterIP probes
// against policy after DNAT; on the demo there is no difference.
func TestLabProbeCompareServices(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	out, stderr, err := run(t, "", "lab", "probe", "--prefix", "netpol-clitest-cmp-", "-f", "../../examples/demo",
		"--ports", "tcp/80", "--services", "--compare")
	if err != nil {
		t.Fatalf("lab probe --compare --services: %v\n%s\n%s", err, out, stderr)
	}
	if !strings.Contains(out, "no differences: the 4 ClusterIP probes from pods are what policy after DNAT says") {
		t.Errorf("no statement that the 4 ClusterIP probes agree:\n%s", out)
	}
}

// Issue 12 defect 6: `lab up` notices that `netpol lab down` removed its
// namespaces from elsewhere, tears down the rest and exits; on Ctrl-C
// (its context) it says what it removed. Its namespace names have one
// dash after the prefix, however the prefix was written.
func TestLabUpStopsWhenItsNamespacesGo(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	const prefix = "netpol-cliup"
	start := func(ctx context.Context) (*bytes.Buffer, chan error) {
		cmd := newRootCommand()
		out := &bytes.Buffer{}
		cmd.SetOut(out)
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs([]string{"lab", "up", "-f", "../../examples/demo", "--prefix", prefix + "-"})
		done := make(chan error, 1)
		go func() { done <- cmd.ExecuteContext(ctx) }()
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			if labs, _ := lab.List(prefix + "-"); len(labs[prefix]) == 7 {
				return out, done
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatal("lab up did not make its 7 namespaces in 60s")
		return nil, nil
	}
	wait := func(done chan error) error {
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatal("lab up is still running")
			return nil
		}
	}
	t.Cleanup(func() { lab.DownAll(prefix + "-") })

	out, done := start(context.Background())
	labs, _ := lab.List(prefix + "-")
	for _, ns := range labs[prefix] {
		if strings.Contains(ns, "--") {
			t.Errorf("namespace %s has a doubled dash", ns)
		}
	}
	if _, stderr, err := run(t, "", "lab", "down", "--prefix", prefix); err != nil {
		t.Fatalf("lab down: %v\n%s", err, stderr)
	}
	if err := wait(done); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	wantContains(t, "lab up output", out.String(), "cat </dev/tcp/", "were removed from elsewhere", "removed the rest of lab "+prefix)

	ctx, cancel := context.WithCancel(context.Background())
	out, done = start(ctx)
	cancel() // as Ctrl-C does
	if err := wait(done); err != nil {
		t.Fatalf("lab up: %v", err)
	}
	if w := "removed lab " + prefix + ": 7 network namespaces (underlay, 2 node(s), 4 pod(s))"; !strings.Contains(out.String(), w) {
		t.Errorf("lab up output lacks %q:\n%s", w, out)
	}
	if left, err := lab.List(prefix + "-"); err != nil || len(left) > 0 {
		t.Errorf("lab namespaces left behind: %v %v", left, err)
	}
}

// Every NodePort probe the kernel made (from pods and from outside, both
// traffic policies) is what explain says for it, and each one that timed
// out says why.
func TestLabNodePortProbesAgreeWithExplain(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	out, stderr, err := run(t, "", "lab", "probe", "--prefix", "netpol-clinp", "-f", "../../examples/demo", "-f", "testdata/nodeports.yaml",
		"--ports", "tcp/8080", "--services", "-o", "json")
	if err != nil {
		t.Fatalf("lab probe: %v\n%s", err, stderr)
	}
	var doc struct {
		Results []struct {
			From, To, Result, Address, Why string
			Port                           int
			Allowed                        bool
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range doc.Results {
		if !strings.HasPrefix(r.To, "nodeport/") {
			continue
		}
		n++
		from := r.From
		if from == lab.ExternalSource {
			// The lab's outside: the last free address of the first
			// node's /24 (README), 172.18.0.254 for the demo.
			from = outside
		}
		eout, estderr, err := run(t, "", "explain", "-f", "../../examples/demo", "-f", "testdata/nodeports.yaml", from, r.To, "--port", "tcp/"+strconv.Itoa(r.Port), "-o", "json")
		if err != nil {
			t.Fatalf("explain %s %s: %v\n%s", from, r.To, err, estderr)
		}
		var sv struct{ Allowed bool }
		if err := json.Unmarshal([]byte(eout), &sv); err != nil {
			t.Fatal(err)
		}
		if sv.Allowed != r.Allowed {
			t.Errorf("%s -> %s: kernel %s, explain allowed=%v", r.From, r.To, r.Result, sv.Allowed)
		}
		if r.Result == lab.ResultTimeout && (r.Why == "" || strings.Contains(r.Why, "not explained")) {
			t.Errorf("%s -> %s timed out without a reason: %q", r.From, r.To, r.Why)
		}
	}
	if n != 20 { // 2 Services x 2 nodes x (4 pods + outside)
		t.Errorf("%d NodePort probes, want 20", n)
	}
}

// `netpol lab probe --domains --compare`, over UDP and TCP DNS: the
// kernel's rows equal `table --domains`' (exit 0), and the JSON rows have
// the shape.
func TestLabProbeDomainsCompare(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	for _, extra := range [][]string{nil, {"--dns-tcp"}} {
		args := append([]string{"lab", "probe", "--prefix", "netpol-clitest-dns-", "-f", "../../examples/lab-dns.yaml",
			"--ports", "tcp/80", "--domains", "--compare", "-o", "json"}, extra...)
		out, stderr, err := run(t, "", args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr)
		}
		if !strings.Contains(stderr, "the kernel agrees with the evaluator on all 24 domain probe(s)") {
			t.Errorf("%v: no agreement stated:\n%s", extra, stderr)
		}
		var got struct {
			Results []map[string]any `json:"results"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatal(err)
		}
		var allowed, denied int
		for _, r := range got.Results {
			for _, k := range []string{"from", "to", "protocol", "port", "allowed", "address", "result"} {
				if _, ok := r[k]; !ok {
					t.Fatalf("row %v lacks %q", r, k)
				}
			}
			if r["allowed"] == true {
				allowed++
			} else {
				denied++
			}
		}
		if allowed == 0 || denied == 0 {
			t.Errorf("%v: %d allowed and %d denied rows: want both", extra, allowed, denied)
		}
	}
}
