package conformance_test

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/audit"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

// logLines are the lines of a verdict log the nodes write to out.
func logLines(t *testing.T, out *syncbuf.Buffer) []audit.Line {
	t.Helper()
	ls, err := audit.ParseLines(out.String())
	if err != nil {
		t.Fatal(err)
	}
	return ls
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
	out := &syncbuf.Buffer{}
	logger := audit.NewLogger(out, audit.LoggerOptions{})
	enf := conformance.NewEnforcer(l)
	enf.Layout = compiler.LayoutIdentities
	enf.Audit = &node.AuditOptions{Audit: compiler.Audit{Mode: mode, Group: compiler.DefaultAuditGroup}, Logger: logger}
	defer enf.Close()
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	ev := eval.New(snap, policy.Build(snap))
	conns := []connToXB{
		{"x/c", corev1.ProtocolTCP, 80, false},
		{"x/a", corev1.ProtocolUDP, 81, false},
		{"y/a", corev1.ProtocolTCP, 80, true},
	}
	var want []audit.Line
	for i, c := range conns {
		obs, probe, family := c.dial(t, l, uint16(43000+i))
		v, err := ev.Explain(c.from, "x/b", probe, family)
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
	for len(logLines(t, out)) < len(want) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	enf.Close()
	logger.Close()
	var got []audit.Line
	for _, line := range logLines(t, out) {
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

// connToXB is a new connection to x/b of the verdict log's lab tests.
type connToXB struct {
	from     string
	protocol corev1.Protocol
	port     int32
	ipv6     bool
}

// dial makes the connection from source port sport (700 ms at most) and
// returns what the kernel did, with the connection's probe and family.
func (c connToXB) dial(t *testing.T, l *lab.Lab, sport uint16) (lab.Observation, l4.Port, ipfamily.Family) {
	t.Helper()
	family := ipfamily.IPv4
	if c.ipv6 {
		family = ipfamily.IPv6
	}
	to := podAddr(t, labPod(t, l, "x/b"), c.ipv6)
	obs := l.Dial(context.Background(), c.from, netip.AddrPortFrom(to, uint16(c.port)), c.protocol,
		lab.DialOptions{SourcePort: sport, Timeout: 700 * time.Millisecond})
	return obs, l4.Port{Protocol: c.protocol, Port: c.port}, family
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

// TestVerdictLogOverload: a pod sends denied SYNs to x/b as fast as it
// can (about 10,000 a second here, each to another port: no two fold)
// while x/c's connections to x/b, which policy allows, go on. The log
// writes at most its rate (500 a second, 1,000 at once) and counts the
// rest; x/c's connections all succeed meanwhile (the copies the kernel
// makes are dropped, never the packets).
func TestVerdictLogOverload(t *testing.T) {
	requireRoot(t)
	snap := strictSnapshot(t, npOnlyFromC, nil)
	l := labtest.Up(t, snap, lab.Options{})
	out := &syncbuf.Buffer{}
	const lineRate, burst = 500, 1000
	logger := audit.NewLogger(out, audit.LoggerOptions{Rate: lineRate, Burst: burst})
	enf := conformance.NewEnforcer(l)
	enf.Layout = compiler.LayoutIdentities
	enf.Audit = &node.AuditOptions{Audit: compiler.Audit{Mode: policy.AuditAll, Group: compiler.DefaultAuditGroup}, Logger: logger}
	defer enf.Close()
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	dst := podAddr(t, labPod(t, l, "x/b"), false)
	from := labPod(t, l, "x/a")
	const flood = 2 * time.Second
	start := time.Now()
	var sent int
	var floodErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		floodErr = nsexec.In(from.Handle, func() error {
			sa := &unix.SockaddrInet4{Addr: dst.As4()}
			for i := 0; time.Since(start) < flood; i++ {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
				if err != nil {
					return err
				}
				sa.Port = 1024 + i%60000
				if err := unix.Connect(fd, sa); err != nil && err != unix.EINPROGRESS {
					unix.Close(fd)
					return err
				}
				unix.Close(fd) // the SYN is out; no retransmission
				sent++
			}
			return nil
		})
	})
	var allowed, failed int
	ctx := context.Background()
	for time.Since(start) < flood {
		o := l.Dial(ctx, "x/c", netip.AddrPortFrom(dst, 80), corev1.ProtocolTCP, lab.DialOptions{Timeout: time.Second})
		if o.Allowed {
			allowed++
		} else {
			failed++
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	if floodErr != nil {
		t.Fatal(floodErr)
	}
	time.Sleep(300 * time.Millisecond) // the last copies reach the reader
	decisions, err := enf.AuditDecisions()
	if err != nil {
		t.Fatal(err)
	}
	enf.Close()
	logger.Close()
	written, dropped, folded := logger.Stats.Written.Load(), logger.Stats.Dropped.Load(), logger.Stats.Folded.Load()
	t.Logf("%d denied SYNs in %v (%.0f/s); %d decisions counted by the kernel, %d lines written, %d dropped, %d folded; x/c's connections meanwhile: %d allowed, %d failed",
		sent, elapsed.Round(time.Millisecond), float64(sent)/elapsed.Seconds(), decisions, written, dropped, folded, allowed, failed)
	if float64(sent)/elapsed.Seconds() < 2000 {
		t.Fatalf("only %d SYNs in %v: the test did not flood", sent, elapsed)
	}
	if limit := uint64(burst + lineRate*(elapsed.Seconds()+1)); written > limit {
		t.Errorf("%d lines written, more than the rate allows (%d)", written, limit)
	}
	if lines := len(logLines(t, out)); uint64(lines) != written {
		t.Errorf("%d lines in the log, %d counted written", lines, written)
	}
	// Every SYN is an x/b ingress decision (x/a's egress is not policed),
	// as each of x/c's connections is: the kernel counts each, copied or
	// not, so that every line not written is counted (the agent's
	// netpol_audit_lines_dropped_total is decisions less lines written or
	// folded).
	if want := uint64(sent + allowed); decisions < want {
		t.Errorf("%d decisions counted, want %d or more (%d SYNs, %d allowed connections)", decisions, want, sent, allowed)
	}
	if failed > 0 || allowed == 0 {
		t.Errorf("x/c's allowed connections during the flood: %d allowed, %d failed", allowed, failed)
	}
}
