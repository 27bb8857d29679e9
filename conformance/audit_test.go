package conformance_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// lineBuffer is a verdict log the test reads while nodes write it.
type lineBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lineBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lineBuffer) lines(t *testing.T) []audit.Line {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []audit.Line
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if s == "" {
			continue
		}
		var line audit.Line
		if err := json.Unmarshal([]byte(s), &line); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
		out = append(out, line)
	}
	return out
}

// The policies of the verdict log's lab test: x/b admits ingress from x/c
// only (a NetworkPolicy), and an Admin policy denies y/a to x/b, logged
// whatever the default says (netpol.io/audit: deny).
const auditPolicies = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: deny-ya-to-xb
  annotations: {netpol.io/audit: deny}
spec:
  tier: Admin
  priority: 10
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      podSelector: {matchLabels: {pod: b}}
  ingress:
  - name: from-y-a
    action: Deny
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}
        podSelector: {matchLabels: {pod: a}}
`

// TestVerdictLogInKernel: with the verdict log at `all`, an allowed and
// two denied connections to x/b (a NetworkPolicy's allow and isolation, an
// Admin Deny), IPv4 and IPv6, TCP and UDP, each give exactly one line, the
// one explain gives the deciding side: its verdict, tier, policy, rule and
// action, the pods' names and addresses, the node that decided. At
// `off`, only the Admin policy that asks (netpol.io/audit: deny) logs.
func TestVerdictLogInKernel(t *testing.T) {
	requireRoot(t)
	for _, mode := range []string{policy.AuditAll, policy.AuditOff} {
		t.Run(mode, func(t *testing.T) { verdictLogInKernel(t, mode) })
	}
}

func verdictLogInKernel(t *testing.T, mode string) {
	snap := strictSnapshot(t, auditPolicies, nil)
	l := labtest.Up(t, snap, lab.Options{})
	out := &lineBuffer{}
	logger := audit.NewLogger(out, audit.LoggerOptions{})
	enf := conformance.NewEnforcer(l)
	enf.Layout = compiler.LayoutIdentities
	enf.Audit = &node.AuditOptions{Audit: compiler.Audit{Mode: mode, Group: compiler.DefaultAuditGroup}, Logger: logger}
	defer enf.Close()
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	ev := eval.New(snap, policy.Build(snap))
	ctx := context.Background()
	type conn struct {
		from     string
		protocol corev1.Protocol
		port     int32
		ipv6     bool
	}
	conns := []conn{
		{"x/c", corev1.ProtocolTCP, 80, false},
		{"x/a", corev1.ProtocolUDP, 81, false},
		{"y/a", corev1.ProtocolTCP, 80, true},
	}
	var want []audit.Line
	for i, c := range conns {
		family := ipfamily.IPv4
		if c.ipv6 {
			family = ipfamily.IPv6
		}
		to := podAddr(t, labPod(t, l, "x/b"), c.ipv6)
		obs := l.Dial(ctx, c.from, netip.AddrPortFrom(to, uint16(c.port)), c.protocol, lab.DialOptions{SourcePort: uint16(43000 + i), Timeout: 700 * time.Millisecond})
		v, err := ev.Explain(c.from, "x/b", l4.Port{Protocol: c.protocol, Port: c.port}, family)
		if err != nil {
			t.Fatal(err)
		}
		if obs.Allowed != v.Allowed {
			t.Fatalf("%s -> x/b %s/%d: the kernel says allowed=%v, explain %v", c.from, c.protocol, c.port, obs.Allowed, v.Allowed)
		}
		dv := v.Ingress // x/b's ingress decides; no policy selects the sources' egress
		verdict := "deny"
		if dv.Allowed {
			verdict = "allow"
		}
		if mode == policy.AuditOff && dv.Tier != "Admin" {
			continue
		}
		want = append(want, audit.Line{Node: "node-1", Verdict: verdict, Direction: "ingress", Src: c.from, Dst: "x/b",
			SrcIP: v.FromIP, DstIP: v.ToIP, Protocol: string(c.protocol), Port: uint16(c.port),
			Tier: dv.Tier, Policy: dv.Policy, Rule: dv.Rule, Action: dv.Action})
	}
	// The kernel sends its copies within a tenth of a second; a denied TCP
	// connection's SYN is sent again after a second, a line of the same
	// decision that folds (repeats), so Close writes what came.
	deadline := time.Now().Add(3 * time.Second)
	for len(out.lines(t)) < len(want) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	enf.Close()
	logger.Close()
	var got []audit.Line
	for _, line := range out.lines(t) {
		if line.Time.IsZero() || time.Since(line.Time) > time.Minute {
			t.Errorf("line time %v", line.Time)
		}
		line.Time, line.Repeats = time.Time{}, 0
		got = append(got, line)
	}
	key := func(l audit.Line) string { b, _ := json.Marshal(l); return string(b) }
	slices.SortFunc(got, func(a, b audit.Line) int { return strings.Compare(key(a), key(b)) })
	slices.SortFunc(want, func(a, b audit.Line) int { return strings.Compare(key(a), key(b)) })
	if !slices.EqualFunc(got, want, func(a, b audit.Line) bool { return key(a) == key(b) }) {
		t.Errorf("the verdict log:\n%s\nwant:\n%s", lineText(got), lineText(want))
	}
	if n := logger.Stats.Dropped.Load(); n > 0 {
		t.Errorf("%d lines dropped", n)
	}
}

func lineText(ls []audit.Line) string {
	var b strings.Builder
	for _, l := range ls {
		data, _ := json.Marshal(l)
		b.Write(data)
		b.WriteByte('\n')
	}
	return b.String()
}
