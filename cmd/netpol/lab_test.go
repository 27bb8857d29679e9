package main

import (
	"encoding/json"
	"os"
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
	_, _, err = run(t, "", "compile", "-f", "../../examples/demo", "--node", "node-9")
	if err == nil || !strings.Contains(err.Error(), "node-9") {
		t.Errorf("unknown node: got %v, want an error naming node-9", err)
	}
	_, _, err = run(t, "", "compile", "-f", "../../examples/demo")
	if err == nil || !strings.Contains(err.Error(), "--node") {
		t.Errorf("missing --node: got %v, want an error naming --node", err)
	}
}
