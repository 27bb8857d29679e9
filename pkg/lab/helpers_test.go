package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
)

func requireRoot(t *testing.T) {
	t.Helper()
	kerneltest.Require(t, "the lab tests create network namespaces, veths and bridges")
}

// testPrefix is a fresh lab prefix; t.Cleanup removes every namespace
// starting with it, whatever happens to the test.
func testPrefix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 3)
	rand.Read(b)
	prefix := "netpol-t" + hex.EncodeToString(b)
	t.Cleanup(func() {
		removed, err := DownAll(prefix + "-")
		if err != nil {
			t.Errorf("cleaning up lab %s: %v", prefix, err)
		}
		if len(removed) > 0 {
			t.Errorf("lab %s left namespaces behind (removed now): %v", prefix, removed)
		}
	})
	return prefix
}

func loadBase(t *testing.T, name string) *cluster.Snapshot {
	t.Helper()
	snap, report := cluster.LoadPaths([]string{filepath.Join("..", "..", "testdata", "base", name)}, nil)
	if len(report.Errors) > 0 {
		t.Fatalf("loading %s: %v", name, report.Errors)
	}
	return snap
}

// addYAML adds (or replaces) objects in the snapshot.
func addYAML(t *testing.T, snap *cluster.Snapshot, doc string) {
	t.Helper()
	if r := snap.AddDocuments([]byte(doc), "test", true); len(r.Errors) > 0 {
		t.Fatalf("adding objects: %v", r.Errors)
	}
}

// upLab brings a lab up and registers its Down; it logs how long Up took.
func upLab(t *testing.T, snap *cluster.Snapshot, opts Options) *Lab {
	t.Helper()
	requireRoot(t)
	if opts.Prefix == "" {
		opts.Prefix = testPrefix(t)
	}
	start := time.Now()
	l, err := Up(context.Background(), snap, opts)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Logf("Up: %d nodes, %d pods in %v", len(l.Nodes()), len(l.Pods()), time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Errorf("Down: %v", err)
		}
	})
	return l
}

// evalTable is what the evaluator says for the snapshot and its policies.
func evalTable(snap *cluster.Snapshot, opts eval.TruthTableOptions) *eval.TruthTable {
	return eval.New(snap, policy.Build(snap)).TruthTable(opts)
}

func probeLab(t *testing.T, l *Lab, opts ProbeOptions) (*eval.TruthTable, []string) {
	t.Helper()
	start := time.Now()
	got, notes, err := l.Probe(context.Background(), opts)
	if err != nil {
		t.Fatalf("Probe: %v", err)
	}
	t.Logf("Probe %s %v: %d pods x %d ports = %d cells in %v", opts.Family, got.Ports, len(got.Pods), len(got.Ports),
		len(got.Results), time.Since(start).Round(time.Millisecond))
	return got, notes
}

// sameTable compares two tables cell by cell.
func sameTable(t *testing.T, want, got *eval.TruthTable) {
	t.Helper()
	if fmt.Sprint(want.Pods) != fmt.Sprint(got.Pods) {
		t.Fatalf("pods differ:\n want %v\n got  %v", want.Pods, got.Pods)
	}
	if fmt.Sprint(want.Ports) != fmt.Sprint(got.Ports) {
		t.Fatalf("ports differ:\n want %v\n got  %v", want.Ports, got.Ports)
	}
	if fmt.Sprint(want.Skipped) != fmt.Sprint(got.Skipped) {
		t.Errorf("skipped pods differ:\n want %v\n got  %v", want.Skipped, got.Skipped)
	}
	if len(want.Results) != len(got.Results) {
		t.Fatalf("%d results, want %d", len(got.Results), len(want.Results))
	}
	var diffs []string
	for i, w := range want.Results {
		g := got.Results[i]
		if w.From != g.From || w.To != g.To || w.Protocol != g.Protocol || w.Port != g.Port {
			t.Fatalf("cell %d is %+v, want %+v", i, g, w)
		}
		if w.Allowed != g.Allowed {
			diffs = append(diffs, fmt.Sprintf("%s -> %s %s/%d: observed allowed=%v, evaluator says %v",
				w.From, w.To, w.Protocol, w.Port, g.Allowed, w.Allowed))
		}
	}
	if len(diffs) > 0 {
		if len(diffs) > 20 {
			diffs = append(diffs[:20], fmt.Sprintf("... and %d more", len(diffs)-20))
		}
		t.Errorf("%d of %d cells differ:\n%s", len(diffs), len(want.Results), strings.Join(diffs, "\n"))
	}
}

func mustProbes(t *testing.T, s ...string) []l4.Port {
	t.Helper()
	ps, err := l4.ParsePorts(s)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}
