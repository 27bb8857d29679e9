package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/lab"
)

// `netpol lab probe -o json` prints the kernel's table in exactly the shape
// of `netpol table -o json` (DESIGN.md "CLI contract"), so the two diff
// cleanly; on the demo they are equal.
func TestLabProbeJSONMatchesTable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the lab needs root (network namespaces and nftables)")
	}
	args := []string{"-f", "../../examples/demo", "--ports", "tcp/80,tcp/5432,udp/53", "-o", "json"}
	tableOut, stderr, err := run(t, "", append([]string{"table"}, args...)...)
	if err != nil {
		t.Fatalf("table: %v\n%s", err, stderr)
	}
	labOut, stderr, err := run(t, "", append([]string{"lab", "probe", "--prefix", "netpol-clitest-"}, args...)...)
	if err != nil {
		t.Fatalf("lab probe: %v\n%s", err, stderr)
	}
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

// `netpol compile` prints the demo's ruleset for a node; an unknown node is
// an error that names it.
func TestCompileCommand(t *testing.T) {
	out, stderr, err := run(t, "", "compile", "-f", "../../examples/demo", "--node", "node-2")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	want, err := os.ReadFile("../../testdata/golden/compile/demo-node-2.nft")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("compile output differs from the golden file testdata/golden/compile/demo-node-2.nft")
	}
	out, stderr, err = run(t, "", "compile", "-f", "../../examples/demo", "--node", "node-1", "--services")
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
	if os.Geteuid() != 0 {
		t.Fatal("the lab needs root (network namespaces and nftables)")
	}
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
	if os.Geteuid() != 0 {
		t.Fatal("the lab needs root (network namespaces and nftables)")
	}
	out, stderr, err := run(t, "", "lab", "probe", "--prefix", "netpol-clitest-cmp-", "-f", "../../examples/demo",
		"--ports", "tcp/80", "--services", "--compare")
	if err != nil {
		t.Fatalf("lab probe --compare --services: %v\n%s\n%s", err, out, stderr)
	}
	if !strings.Contains(out, "no differences: the 4 ClusterIP probes from pods are what policy after DNAT says") {
		t.Errorf("no statement that the 4 ClusterIP probes agree:\n%s", out)
	}
}
