package conformance_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/policy"
)

// restartPolicies give the e2e base a mix of allowed and denied cells in
// every tier.
const restartPolicies = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: ingress-from-y, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: z-denies-b}
spec:
  tier: Admin
  priority: 10
  subject:
    namespaces: {matchLabels: {kubernetes.io/metadata.name: "z"}}
  egress:
  - action: Deny
    to:
    - pods:
        namespaceSelector: {}
        podSelector: {matchLabels: {pod: b}}
`

// TestRestartAdoptsWithoutFlip restarts the appliers (new netlink
// connections, no cache: they read the live tables back) again and again
// while the full matrix is probed without retries; every round must equal
// the evaluator's table, and each restart must send nothing to the kernel.
// Then a restarted applier applies a policy change from its read-back.
// In the identity layout a restart numbers the pods as the kernel's table
// does (compiler.Options.Adopt), so it too sends nothing.
func TestRestartAdoptsWithoutFlip(t *testing.T) {
	for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
		t.Run(layout.String(), func(t *testing.T) { restartAdoptsWithoutFlip(t, layout) })
	}
}

func restartAdoptsWithoutFlip(t *testing.T, layout compiler.Layout) {
	ctx := context.Background()
	snap, l, probes := restartLab(t)
	newEnforcer := func() *conformance.Enforcer {
		e := conformance.NewEnforcer(l)
		e.Layout = layout
		return e
	}
	enf := newEnforcer()
	want := syncedTable(t, enf, snap, probes)
	denied := 0
	for _, r := range want.Results {
		if !r.Allowed {
			denied++
		}
	}
	if denied == 0 || denied == len(want.Results) {
		t.Fatalf("the policies should allow some cells and deny others; %d of %d denied", denied, len(want.Results))
	}

	probing := probeContinuously(ctx, l, want, probes)
	const restarts = 20
	for i := 0; i < restarts; i++ {
		enf.Close()
		enf = newEnforcer()
		rep, err := enf.Sync(snap)
		if err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		for node, ns := range rep.Nodes {
			if ns.Stats.Messages != 0 {
				t.Errorf("restart %d: node %s: adopting an up-to-date table sent %d netlink messages, want 0 (%+v)", i, node, ns.Stats.Messages, ns.Stats)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Let the probes run across the last restart for a while.
	time.Sleep(time.Second)
	rounds := probing.stop(t)
	enf.Close()
	t.Logf("%d restarts while %d full-matrix probe rounds ran (%d cells each, %d denied)", restarts, rounds, len(want.Results), denied)

	// A restarted applier diffs a changed state against what it reads back.
	snap.Delete(cluster.ObjectKey{Kind: cluster.KindNetworkPolicy, Namespace: "x", Name: "ingress-from-y"})
	enf = newEnforcer()
	defer enf.Close()
	rep, err := enf.Sync(snap)
	if err != nil {
		t.Fatal(err)
	}
	for node, ns := range rep.Nodes {
		if ns.Stats.ChainsRewritten+ns.Stats.ChainsAdded > 2 || ns.Stats.SetsAdded > 0 {
			t.Errorf("node %s: removing one NetworkPolicy rewrote too much: %+v", node, ns.Stats)
		}
	}
	want = eval.New(snap, rep.Model).TruthTable(eval.TruthTableOptions{Probes: probes})
	got, _, err := l.Probe(ctx, lab.ProbeOptions{Probes: probes})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := conformance.Compare(want, got)
	if err != nil || len(diffs) > 0 {
		t.Errorf("after the change: %s", fmtDiffs(err, diffs))
	}
}

// TestLayoutSwitchWithoutFlip upgrades the nodes in place from one layout
// of the policy table to the other and back (a new agent adopting the
// table the old one wrote), while the full matrix is probed without
// retries: each switch changes the verdicts in one transaction (the new
// layout's sets, maps and chains go in one before it, which nothing reads
// yet, and the old layout's maps and chains in one after it:
// kernel.Plan.inPhases), so no round may disagree with the evaluator, in
// either direction.
func TestLayoutSwitchWithoutFlip(t *testing.T) {
	ctx := context.Background()
	snap, l, probes := restartLab(t)
	enf := conformance.NewEnforcer(l)
	want := syncedTable(t, enf, snap, probes)
	probing := probeContinuously(ctx, l, want, probes)
	const switches = 6
	layout := compiler.LayoutAddresses
	for i := 0; i < switches; i++ {
		if layout == compiler.LayoutAddresses {
			layout = compiler.LayoutIdentities
		} else {
			layout = compiler.LayoutAddresses
		}
		enf.Close()
		enf = conformance.NewEnforcer(l)
		enf.Layout = layout
		rep, err := enf.Sync(snap)
		if err != nil {
			t.Fatalf("switch %d: %v", i, err)
		}
		for node, ns := range rep.Nodes {
			if ns.Stats.Transactions < 2 || ns.Stats.Transactions > 3 || ns.Stats.SetsAdded == 0 {
				t.Errorf("switch %d to layout %d: node %s: %d transactions, want what is new, the change and (when maps or chains went) their deletion (%+v)", i, layout, node, ns.Stats.Transactions, ns.Stats)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(time.Second)
	rounds := probing.stop(t)
	enf.Close()
	t.Logf("%d layout switches while %d full-matrix probe rounds ran (%d cells each)", switches, rounds, len(want.Results))
}

// restartLab is the e2e base with restartPolicies, in a lab, and the
// probes the restart tests make.
func restartLab(t *testing.T) (*cluster.Snapshot, *lab.Lab, []l4.Port) {
	t.Helper()
	requireRoot(t)
	snap := baseSnapshot(t, "e2e")
	if r := snap.AddDocuments([]byte(restartPolicies), "restart policies", false); len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	l := labtest.Up(t, snap, lab.Options{})
	return snap, l, []l4.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 81}}
}

// syncedTable programs the lab through enf and returns the evaluator's
// table for probes: what the kernel must answer from now on.
func syncedTable(t *testing.T, enf *conformance.Enforcer, snap *cluster.Snapshot, probes []l4.Port) *eval.TruthTable {
	t.Helper()
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	return eval.New(snap, policy.Build(snap)).TruthTable(eval.TruthTableOptions{Probes: probes})
}

// probing probes the full matrix round after round, without retries (a
// cell that drops even once shows), until stopped.
type probing struct {
	mu       sync.Mutex
	rounds   int
	problems []string
	halt     chan struct{}
	done     chan struct{}
}

func probeContinuously(ctx context.Context, l *lab.Lab, want *eval.TruthTable, probes []l4.Port) *probing {
	p := &probing{halt: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.halt:
				return
			default:
			}
			// No retry, so a flip cannot hide; a second to answer, so a
			// reply slowed by a loaded machine is not read as a drop (a
			// dropped packet gets no answer however long one waits).
			got, _, err := l.Probe(ctx, lab.ProbeOptions{Probes: probes, Timeout: time.Second, NoRetry: true})
			p.mu.Lock()
			p.rounds++
			if err != nil {
				p.problems = append(p.problems, err.Error())
			} else if diffs, err := conformance.Compare(want, got); err != nil || len(diffs) > 0 {
				p.problems = append(p.problems, fmtDiffs(err, diffs))
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// stop ends the probing once at least 3 rounds ran (30 s at most), fails t
// for every round that disagreed with the evaluator (or when fewer than 3
// ran) and returns how many ran.
func (p *probing) stop(t *testing.T) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		p.mu.Lock()
		enough := p.rounds >= 3
		p.mu.Unlock()
		if enough {
			break
		}
	}
	close(p.halt)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rounds < 3 {
		t.Errorf("only %d probe rounds ran", p.rounds)
	}
	for _, problem := range p.problems {
		t.Errorf("a probe round disagreed with the evaluator: %s", problem)
	}
	return p.rounds
}

func fmtDiffs(err error, diffs []conformance.Difference) string {
	s := ""
	if err != nil {
		s = err.Error() + "; "
	}
	for _, d := range diffs {
		s += d.String() + "; "
	}
	return s
}
