package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/syncbuf"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/nft/nftrace"
)

// Arguments --live refuses before touching the kernel.
func TestLiveTraceArguments(t *testing.T) {
	tcp80 := l4.Port{Protocol: corev1.ProtocolTCP, Port: 80}
	for _, c := range []struct {
		src, dst, format, netns, want string
	}{
		{"web/frontend", "10.0.0.1", "text", "", "SRC must be an IP address"},
		{"10.0.0.1", "svc/api/orders", "text", "", "DST must be an IP address"},
		{"10.0.0.1", "fd00::1", "text", "", "different address families"},
		{"10.0.0.1", "10.0.0.2", "yaml", "", "text or json"},
		{"10.0.0.1", "10.0.0.2", "text", "netpol-no-such-namespace-xyz", "--netns netpol-no-such-namespace-xyz"},
	} {
		err := liveTrace(context.Background(), &bytes.Buffer{}, c.src, c.dst, tcp80, c.format, liveTraceOptions{enabled: true, duration: time.Second, netns: c.netns})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s -> %s (%s, netns %q): error %v, want %q", c.src, c.dst, c.format, c.netns, err, c.want)
		}
	}
	// Through the command: --live goes here, no snapshot is loaded.
	if _, _, err := run(t, "", "trace", "--live", "web/frontend", "10.0.0.1", "--port", "tcp/80"); err == nil || !strings.Contains(err.Error(), "SRC must be an IP address") {
		t.Errorf("netpol trace --live web/frontend 10.0.0.1: %v", err)
	}
}

// TestLiveTraceInLab runs `trace --live` in a lab node's namespace while
// real connections are made: each packet's path is printed as the kernel
// reports it (netpol's rules, by text and ID, with their verdicts), the
// Admin Deny shows as a drop, and the trace table is gone afterwards, also
// when the trace is stopped early.
func TestLiveTraceInLab(t *testing.T) {
	kerneltest.Require(t, "the lab creates network namespaces and programs nftables")
	snap, report := cluster.LoadPaths([]string{"../../examples/demo"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	l := labtest.Up(t, snap, lab.Options{Prefix: "netpol-livetrace-"})
	enf := conformance.NewEnforcer(l)
	enf.Layout = compiler.DefaultLayout // the agent's, with its per-rule counters
	t.Cleanup(enf.Close)
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	// Ingress is judged on the destination's node: trace there.
	node := l.Node("node-2")
	if node == nil {
		t.Fatal("no node-2 in the lab")
	}
	orders := netip.MustParseAddrPort("10.244.2.10:8080")

	live := func(t *testing.T, src, format string, stopEarly bool, dial func()) string {
		t.Helper()
		out := &syncbuf.Buffer{} // written by liveTrace, read by the test
		armed := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- liveTrace(ctx, out, src, orders.Addr().String(), l4.Port{Protocol: corev1.ProtocolTCP, Port: int32(orders.Port())}, format,
				liveTraceOptions{enabled: true, duration: 4 * time.Second, netns: node.NetNS, armed: func() { close(armed) }})
		}()
		select {
		case <-armed:
		case err := <-done:
			t.Fatalf("live trace ended before arming: %v", err)
		}
		if tb, err := kernel.Read(int(node.Handle), nftrace.TableName); err != nil || tb == nil {
			t.Fatalf("while tracing, table inet %s is %v (%v)", nftrace.TableName, tb, err)
		}
		dial()
		if stopEarly {
			time.Sleep(500 * time.Millisecond)
			cancel() // as Ctrl-C does
		}
		if err := <-done; err != nil {
			t.Fatalf("live trace: %v\n%s", err, out)
		}
		if tb, err := kernel.Read(int(node.Handle), nftrace.TableName); err != nil || tb != nil {
			t.Errorf("after the trace, table inet %s is still there (%v)", nftrace.TableName, err)
		}
		return out.String()
	}

	t.Run("allowed/text", func(t *testing.T) {
		start := time.Now()
		out := live(t, "10.244.1.10", "text", false, func() {
			if o := l.Dial(context.Background(), "web/frontend", orders, corev1.ProtocolTCP, lab.DialOptions{Timeout: 2 * time.Second}); o.Result != lab.ResultOK {
				t.Errorf("web/frontend -> api/orders: %s", o.Result)
			}
		})
		t.Logf("trace --live output:\n%s", out)
		if d := time.Since(start); d < 3*time.Second {
			t.Errorf("the trace ran %v, not its --duration of 4s", d)
		}
		wantContains(t, "output", out,
			"tracing saddr 10.244.1.10 daddr 10.244.2.10 tcp dport 8080 in "+node.NetNS,
			"10.244.1.10:", "-> 10.244.2.10:8080 [SYN]: ACCEPT",
			"  "+node.NetNS+" forward\n",
			"netpol/forward ", "-> jump ",
			"[ACK]: ACCEPT", // the connection's later packets: established
			"table inet netpol-trace removed",
			// The NetworkPolicy rule that admits it, beside its counter.
			`counter name "rule.`, " packets, ",
		)
		if strings.Contains(out, nftrace.TableName+"/") {
			t.Error("the trace table's own rule is printed")
		}
	})
	t.Run("denied/json", func(t *testing.T) {
		out := live(t, "10.244.1.30", "json", true, func() {
			if o := l.Dial(context.Background(), "sandbox/toolbox", orders, corev1.ProtocolTCP, lab.DialOptions{Timeout: 300 * time.Millisecond}); o.Result != lab.ResultTimeout {
				t.Errorf("sandbox/toolbox -> api/orders: %s, want a timeout", o.Result)
			}
		})
		t.Logf("trace --live -o json output:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) == 0 || lines[0] == "" {
			t.Fatal("no packet traced")
		}
		var p livePacket
		if err := json.Unmarshal([]byte(lines[0]), &p); err != nil {
			t.Fatalf("not one JSON object per line: %v\n%s", err, lines[0])
		}
		if p.Src != "10.244.1.30" || p.Dst != "10.244.2.10" || p.DstPort != 8080 || p.Protocol != "tcp" || p.TCPFlags != "SYN" || p.Verdict != "drop" {
			t.Errorf("packet %+v", p)
		}
		last := p.Path[len(p.Path)-1]
		if last.Node != node.NetNS || last.Table != "netpol" || last.Verdict != "drop" || last.RuleID == "" || last.Rule == "" || last.Handle == 0 {
			t.Errorf("the last step is %+v, want netpol's rule that drops", last)
		}
		// It counts into the isolating policy's counter, which holds this
		// SYN (and any sent again while the trace ran).
		if len(last.Counters) != 1 || last.Counters[0].Packets == 0 || !strings.Contains(last.Rule, `counter name "`+last.Counters[0].Name+`"`) {
			t.Errorf("the last step's counters are %+v, want the one its rule names, with this packet", last.Counters)
		}
		if p.Path[0].Hook != "prerouting" {
			t.Errorf("the first step is at hook %q, want prerouting", p.Path[0].Hook)
		}
	})
}
