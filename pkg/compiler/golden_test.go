package compiler_test

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/nftcheck"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files")

const testdata = "../../testdata"

// goldenCases are representative snapshots: a corpus case's state after
// all its steps (or the demo), compiled for one node.
var goldenCases = []struct {
	name, suite, kase, node string
	dns                     *compiler.DNS
}{
	{"demo-node-1", "", "", "node-1", nil},
	{"demo-node-2", "", "", "node-2", nil},
	{"e2e-ingress-named-port", "e2e", "ingress-named-port", "node-1", nil},
	{"e2e-egress-named-port", "e2e", "egress-named-port", "node-2", nil},
	{"e2e-cidr-and-except-overlap", "e2e", "cidr-and-except-overlap", "node-2", nil},
	{"e2e-ingress-and-egress-together", "e2e", "ingress-and-egress-together", "node-2", nil},
	{"conformance-admin-node-peers", "conformance", "cnp-admin-tier-egress-node-peers", "node-1", nil},
	{"netpol-pass-both-tiers", "netpol", "pass-both-tiers", "node-1", nil},
	{"netpol-ipv6-ipblock-except", "netpol", "ipv6-ipblock-except", "node-1", nil},
	{"netpol-unknown-peer-fails-closed", "netpol", "unknown-peer-fails-closed", "node-1", nil},
	{"netpol-domain-names", "netpol", "domain-names-nothing-learned", "node-2", nil},
	// The agent's DNS snooping: the native queue statement (the xtables
	// target's text is not nft syntax).
	{"netpol-domain-names-dns", "netpol", "domain-names-nothing-learned", "node-2", &compiler.DNS{Queue: nft.QueueNative, QueueNum: 53,
		Servers: []netip.AddrPort{netip.MustParseAddrPort("10.244.1.53:53"), netip.MustParseAddrPort("[fd00:10:244:1::53]:53")}}},
}

// demoStaged is the demo with examples/diff/staged.yaml's staged policy.
const demoStaged = "demo+staged"

func goldenSnapshot(t *testing.T, suite, name string) *cluster.Snapshot {
	t.Helper()
	if suite == "" || suite == demoStaged {
		paths := []string{"../../examples/demo"}
		if suite == demoStaged {
			paths = append(paths, "../../examples/diff/staged.yaml")
		}
		snap, report := cluster.LoadPaths(paths, nil)
		if len(report.Errors) > 0 {
			t.Fatal(report.Errors)
		}
		return snap
	}
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if c.Suite != suite || c.Name != name {
			continue
		}
		snap, err := c.BaseSnapshot(testdata)
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.Steps {
			if err := c.ApplyStep(snap, i); err != nil {
				t.Fatal(err)
			}
		}
		return snap
	}
	t.Fatalf("no case %s/%s", suite, name)
	return nil
}

func compileText(t *testing.T, snap *cluster.Snapshot, node string, dns *compiler.DNS, layout compiler.Layout, counters bool) []byte {
	t.Helper()
	m := policy.Build(snap)
	table, err := compiler.Compile(eval.New(snap, m).Resolved(), compiler.Options{Node: node, DNS: dns, Layout: layout, RuleCounters: counters, Staged: m.Staged})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := table.Render(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestGolden compares `netpol compile` output with testdata/golden/compile
// (go test ./pkg/compiler -run TestGolden -update rewrites them), in both
// layouts (the identity layout's files end in -identities; it does not
// program the DNS queue yet), and has nft itself check that each file is
// a valid ruleset. Cases with Admin and Baseline Pass rules and
// NetworkPolicy rules are also compiled with the agent's per-rule counters
// (files ending in -counters), and the demo with a staged policy beside
// (-staged).
func TestGolden(t *testing.T) {
	_, nftErr := exec.LookPath("nft")
	type golden struct {
		name, suite, kase, node string
		dns                     *compiler.DNS
		layout                  compiler.Layout
		counters                bool
	}
	var all []golden
	for _, gc := range goldenCases {
		all = append(all, golden{gc.name, gc.suite, gc.kase, gc.node, gc.dns, compiler.LayoutAddresses, false})
		if gc.dns == nil {
			all = append(all, golden{gc.name + "-identities", gc.suite, gc.kase, gc.node, nil, compiler.LayoutIdentities, false})
		}
		if gc.kase == "pass-both-tiers" || gc.kase == "" && gc.node == "node-1" {
			all = append(all, golden{gc.name + "-identities-counters", gc.suite, gc.kase, gc.node, nil, compiler.LayoutIdentities, true})
		}
		if gc.kase == "" && gc.node == "node-1" {
			// A staged policy's shadow evaluation beside the enforced one.
			all = append(all, golden{gc.name + "-identities-staged", demoStaged, "", gc.node, nil, compiler.LayoutIdentities, true})
		}
	}
	for _, gc := range all {
		t.Run(gc.name, func(t *testing.T) {
			got := compileText(t, goldenSnapshot(t, gc.suite, gc.kase), gc.node, gc.dns, gc.layout, gc.counters)
			path := filepath.Join(testdata, "golden", "compile", gc.name+".nft")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("compile output differs from %s (run with -update after checking the change):\n%s", path, lineDiff(string(want), string(got)))
			}
			if nftErr != nil {
				t.Fatalf("the nft binary is needed to check the golden file (Debian package nftables): %v", nftErr)
			}
			if !kerneltest.Can(t, "nft -c checks "+path+" against the kernel") {
				return
			}
			if gc.dns != nil && !nativeQueue(t) {
				t.Logf("SKIP nft -c of %s: this kernel has no nft_queue, so nft rejects its queue statement (the agent uses the xtables NFQUEUE target here)", path)
				return
			}
			// -c only checks: nothing is committed to the kernel.
			if out, err := nftcheck.Check(path); err != nil {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
}

// nativeQueue reports whether nft -c takes the native queue statement
// on this kernel.
func nativeQueue(t *testing.T) bool {
	path := filepath.Join(t.TempDir(), "queue.nft")
	if err := os.WriteFile(path, []byte("table inet netpol-queue-check {\n\tchain c {\n\t\tqueue flags bypass to 53\n\t}\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := nftcheck.Check(path)
	return err == nil
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	in := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if g[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if w[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
