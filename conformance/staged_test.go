package conformance_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// staged is a policy's YAML with the netpol.io/staged annotation.
func staged(yaml, name string) string {
	return strings.Replace(yaml, "metadata: {name: "+name+"}", "metadata: {name: "+name+`, annotations: {netpol.io/staged: "true"}}`, 1)
}

// TestStagedPolicyInKernel: an Admin Deny of x/a to x/b, staged over open
// flows (TCP and UDP, IPv4 and IPv6), cuts nothing and denies nothing:
// the flows still answer, strict mode ends none, new connections from x/a
// succeed, and the verdict log has one staged line for each (would deny,
// enforced allow, the policy and rule explain names with it enforced),
// none for x/c's; the staged policy's counter counts them. Removing the
// annotation enforces it: strict mode ends x/a's flows, x/c's go on. A
// staged Accept over a Baseline Deny logs the other way (would allow,
// enforced deny) while the connection stays denied.
func TestStagedPolicyInKernel(t *testing.T) {
	requireRoot(t)
	l := labtest.Up(t, baseSnapshot(t, "e2e"), lab.Options{})
	out := &syncbuf.Buffer{}
	logger := audit.NewLogger(out, audit.LoggerOptions{})
	enf := conformance.NewEnforcer(l)
	enf.Layout = compiler.LayoutIdentities
	enf.Audit = &node.AuditOptions{Audit: compiler.Audit{Mode: policy.AuditOff, Group: compiler.DefaultAuditGroup}, Logger: logger}
	defer enf.Close()
	startEchoServers(t, l)
	sport := uint16(45000)
	if _, err := enf.Sync(strictSnapshot(t, "", nil)); err != nil {
		t.Fatal(err)
	}
	denied := []strictFlow{
		{from: "x/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort},
		{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 80, ipv6: true},
	}
	kept := []strictFlow{{from: "x/c", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort, ipv6: true}}
	open := map[strictFlow]*openFlow{}
	for _, f := range slices.Concat(denied, kept) {
		sport++
		o := openStrictFlow(t, l, f, sport)
		t.Cleanup(o.close)
		if !o.answers() {
			t.Fatalf("%s: not answered before the change", f)
		}
		open[f] = o
	}

	// Staged: nothing changes but the log.
	snap := strictSnapshot(t, staged(adminDenyAToB, "deny-a-to-b"), nil)
	rep, err := enf.Sync(snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Nodes {
		if len(n.Ended) > 0 {
			t.Errorf("staging a Deny ended %v", n.Ended)
		}
	}
	for f, o := range open {
		if !o.answers() {
			t.Errorf("%s: cut by a staged policy", f)
		}
	}
	conns := []connToXB{
		{"x/a", corev1.ProtocolTCP, 80, false},
		{"x/a", corev1.ProtocolUDP, 81, true},
		{"x/c", corev1.ProtocolTCP, 80, false},
	}
	want := stagedConnections(t, l, snap, conns, &sport, true)
	got := stagedLines(t, out, len(want))
	if lineText(got) != lineText(want) {
		t.Errorf("the verdict log with a staged Deny:\n%s\nwant:\n%s", lineText(got), lineText(want))
	}
	counts, err := enf.StagedCounts()
	if err != nil {
		t.Fatal(err)
	}
	var counted uint64
	for _, c := range counts["node-1"] {
		if c.Name == "deny-a-to-b" && c.Verdict == "deny" {
			counted += c.Packets
		}
	}
	if counted != 2 {
		t.Errorf("the staged Deny's counter on node-1: %d, want 2 (x/a's two new connections): %+v", counted, counts)
	}

	// Enforced: strict mode ends x/a's flows.
	rep, err = enf.Sync(strictSnapshot(t, adminDenyAToB, nil))
	if err != nil {
		t.Fatal(err)
	}
	var ended []conntrack.Flow
	xa, xb := labPod(t, l, "x/a"), labPod(t, l, "x/b")
	for _, n := range rep.Nodes {
		ended = append(ended, n.Ended...)
		for _, fl := range n.Ended {
			// The held flows, and the new connections of x/a above.
			if !slices.Contains(xa.Addrs, fl.Src.Addr()) || !slices.Contains(xb.Addrs, fl.Dst.Addr()) {
				t.Errorf("ended %s, which the policy allows", fl)
			}
		}
	}
	for _, f := range denied {
		if !slices.ContainsFunc(ended, open[f].is) {
			t.Errorf("%s: not ended (ended: %v)", f, ended)
		}
		if open[f].answers() {
			t.Errorf("%s: still answered with the Deny enforced", f)
		}
	}
	for _, f := range kept {
		if !open[f].answers() {
			t.Errorf("%s: no longer answered", f)
		}
	}

	// A staged Accept over an enforced Baseline Deny: denied, and logged
	// as what it would open. (The TCP flow denied above retransmits
	// meanwhile, each retransmit a new connection to the policy: its lines
	// to the echo port are left out.)
	out.Reset()
	snap = strictSnapshot(t, baselineDenyToB+"---"+staged(adminAcceptAToB, "accept-a-to-b"), nil)
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	conns = []connToXB{{"x/a", corev1.ProtocolTCP, 80, true}, {"x/c", corev1.ProtocolUDP, 80, false}}
	want = stagedConnections(t, l, snap, conns, &sport, false)
	got = slices.DeleteFunc(stagedLines(t, out, len(want)), func(l audit.Line) bool { return l.Port == echoPort })
	if lineText(got) != lineText(want) {
		t.Errorf("the verdict log with a staged Accept:\n%s\nwant:\n%s", lineText(got), lineText(want))
	}
	enf.Close()
	logger.Close()
	if n := logger.Stats.Dropped.Load(); n > 0 {
		t.Errorf("%d lines dropped", n)
	}
}

// stagedConnections makes each new connection to x/b, checks that the
// kernel decides as explain does with the policies enforced (allowed), and
// returns the staged lines expected: one where explain with the staged
// policies enforced decides otherwise, naming its deciding side.
func stagedConnections(t *testing.T, l *lab.Lab, snap *cluster.Snapshot, conns []connToXB, sport *uint16, wantAllowed bool) []audit.Line {
	t.Helper()
	m := policy.Build(snap)
	enforced, promoted := eval.New(snap, m), eval.New(snap, policy.Promoted(m))
	var want []audit.Line
	for _, c := range conns {
		*sport++
		obs, probe, family := c.dial(t, l, *sport)
		v, err := enforced.Explain(c.from, "x/b", probe, family)
		if err != nil {
			t.Fatal(err)
		}
		w, err := promoted.Explain(c.from, "x/b", probe, family)
		if err != nil {
			t.Fatal(err)
		}
		if obs.Allowed != v.Allowed {
			t.Errorf("%s -> x/b %s/%d: the kernel says allowed=%v, explain of the enforced policies %v", c.from, c.protocol, c.port, obs.Allowed, v.Allowed)
		}
		if c.from == "x/a" && v.Allowed != wantAllowed {
			t.Fatalf("%s -> x/b: enforced allowed=%v: the test expects %v", c.from, v.Allowed, wantAllowed)
		}
		if w.Allowed == v.Allowed {
			continue
		}
		word := map[bool]string{true: "allow", false: "deny"}
		dv := w.Ingress // x/b's ingress decides (on node-1); no policy selects the sources' egress
		want = append(want, audit.Line{Node: "node-1", Verdict: word[w.Allowed], Direction: "ingress", Src: c.from, Dst: "x/b",
			SrcIP: v.FromIP, DstIP: v.ToIP, Protocol: string(c.protocol), Port: uint16(c.port),
			Tier: dv.Tier, Policy: dv.Policy, Rule: dv.Rule, Action: dv.Action, Staged: true, Enforced: word[v.Allowed]})
	}
	if len(want) == 0 {
		t.Fatal("no connection the staged policy would decide otherwise")
	}
	return want
}

// stagedLines waits for n lines (a tenth of a second for the kernel's
// copies; a folded line is written when its second ends) and returns them
// sorted, without times and repeats.
func stagedLines(t *testing.T, out *syncbuf.Buffer, n int) []audit.Line {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for len(logLines(t, out)) < n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond) // any line more (repeats fold into the first)
	var got []audit.Line
	for _, line := range logLines(t, out) {
		line.Time, line.Repeats = time.Time{}, 0
		got = append(got, line)
	}
	key := func(l audit.Line) string { b, _ := json.Marshal(l); return string(b) }
	slices.SortFunc(got, func(a, b audit.Line) int { return strings.Compare(key(a), key(b)) })
	return got
}
