package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft/nftrace"
)

// The kernel's own trace against the Tracer.
//
// For each cell, nftrace is armed on every lab node (nftrace.Arm: a
// netpol-trace table whose prerouting and output chains, at priority
// -350, set `meta nftrace set 1` on the cell's tuple and on every tuple
// the Tracer says the packet takes after NAT), the probe's first packet
// is sent with Lab.Dial, and each node's trace events are read over
// netlink (NFNLGRP_NFTRACE, one listener in each node's namespace).
//
// Alignment. The trace flag lives in the skb and is cleared when the packet
// crosses a veth into another namespace, so each node reports its own
// share: on the source's node prerouting (from a pod) or output (from the
// node), then forward/input and postrouting; on the destination's node
// the same from prerouting. The kernel reports those hooks' chains in
// hook order, which is the order of dataplane.Paths' hops on that node.
// So per node:
//
//   - kernel: the events of the first packet (trace IDs whose headers show
//     the armed tuple and, for TCP, a SYN without ACK: later packets of
//     the connection are established and take another path), minus the
//     netpol-trace table's own events and minus the end-of-chain events
//     (a regular chain running out: the Tracer records no step for it);
//     rule events name the rule by its handle, mapped to netpol's rule ID
//     (the rule comment the Applier writes);
//   - Tracer: the steps of the node's hops whose Matched is true, the
//     base chain policies included (Rule -1), each rule by ID (the hash of
//     its text, as the kernel stores it), NAT statements as the accept
//     they are to the kernel, reject as drop, no verdict as continue.
//
// The two sequences (hook, table, chain, rule ID or policy, verdict; the
// kernel's hook is the base chain's, carried over to the regular chains it
// jumps to) must be
// equal on every node; with several paths (a Service's endpoints), one of
// them must be the kernel's. The probe's outcome must also be the
// Tracer's verdict.
func TestNFTraceMatchesTracer(t *testing.T) {
	requireRoot(t)
	cases, err := corpus.LoadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	// The sample: Admin Pass and Deny with a NetworkPolicy (pass-both-tiers),
	// NetworkPolicy isolation (default-deny-ingress), an ingress allow
	// list (allow-from-pods-within-namespace-podselector), egress
	// (deny-egress-podselector), a Baseline Deny and a Baseline Pass.
	pick := map[string]bool{"pass-both-tiers": true, "default-deny-ingress": true,
		"allow-from-pods-within-namespace-podselector": true, "deny-egress-podselector": true}
	// Cells every run compares, besides the sample: an Admin Pass that
	// NetworkPolicy then allows, an Admin Deny, a Baseline Pass.
	pinned := map[string]bool{
		"pass-both-tiers/0/y/a->x/a/TCP": true, "pass-both-tiers/0/z/a->x/a/TCP": true,
		"pass-both-tiers/1/y/b->x/b/TCP": true, "pass-both-tiers/1/y/a->z/a/TCP": true,
	}
	var chosen []*corpus.Case
	for _, c := range cases {
		if pick[c.Name] {
			chosen = append(chosen, c)
		}
	}
	if len(chosen) != len(pick) {
		t.Fatalf("found %d of the %d sampled cases", len(chosen), len(pick))
	}
	var st traceTally
	t.Run("corpus", func(t *testing.T) {
		full := baseSnapshot(t, "e2e")
		l := labtest.Up(t, full, lab.Options{ExtraPorts: casePorts(t, chosen)})
		enf := conformance.NewEnforcer(l)
		t.Cleanup(enf.Close)
		lt := newLabTracer(t, l)
		for _, c := range chosen {
			snap, err := c.BaseSnapshot(testdata)
			if err != nil {
				t.Fatal(err)
			}
			for i, step := range c.Steps {
				if err := c.ApplyStep(snap, i); err != nil {
					t.Fatal(err)
				}
				if err := l.Update(context.Background(), snap); err != nil {
					t.Fatal(err)
				}
				rep, err := enf.Sync(snap)
				if err != nil {
					t.Fatal(err)
				}
				if len(step.Expect) == 0 {
					continue
				}
				ev := eval.New(snap, rep.Model)
				dp, err := dataplane.New(snap, ev, false)
				if err != nil {
					t.Fatal(err)
				}
				probes := expectedProbes(t, step.Expect)
				table := ev.TruthTable(eval.TruthTableOptions{Probes: probes})
				cells := sampleCells(table.Results, 4)
				for _, r := range table.Results {
					if pinned[fmt.Sprintf("%s/%d/%s->%s/%s", c.Name, i, r.From, r.To, r.Protocol)] && !slices.Contains(cells, r) {
						cells = append(cells, r)
					}
				}
				for _, r := range cells {
					name := fmt.Sprintf("%s/step%d/%s->%s/%s-%d", c.Name, i, r.From, r.To, strings.ToLower(string(r.Protocol)), r.Port)
					probe := l4.Port{Protocol: r.Protocol, Port: r.Port}
					dstEp, err := ev.Endpoint(r.To, ipfamily.Any, netip.Addr{})
					if err != nil {
						t.Fatal(err)
					}
					srcEp, err := ev.Endpoint(r.From, ipfamily.Any, dstEp.Addr)
					if err != nil {
						t.Fatal(err)
					}
					lt.cell(t, name, &st, dp, r.From, srcEp, dstEp, netip.AddrPortFrom(dstEp.Addr, uint16(r.Port)), probe, &r.Allowed)
				}
			}
		}
	})
	t.Run("services", func(t *testing.T) {
		snap, l, _, rep := serviceLab(t)
		ev := eval.New(snap, rep.Model)
		dp, err := dataplane.New(snap, ev, false)
		if err != nil {
			t.Fatal(err)
		}
		lt := newLabTracer(t, l)
		for _, c := range []struct {
			from string
			to   netip.AddrPort
			want bool
		}{
			{"client/c", ap("10.96.0.20:5432"), true},  // policy after DNAT: allowed client
			{"client/a", ap("10.96.0.20:5432"), false}, // policy after DNAT: denied client
			{"client/a", ap("10.96.0.10:80"), true},    // ClusterIP with three endpoints (numgen)
		} {
			probe := l4.Port{Protocol: corev1.ProtocolTCP, Port: int32(c.to.Port())}
			srcEp, err := ev.Endpoint(c.from, ipfamily.Any, c.to.Addr())
			if err != nil {
				t.Fatal(err)
			}
			dstEp := ev.Resolved().EndpointOf(c.to.Addr())
			want := c.want
			lt.cell(t, fmt.Sprintf("%s->%s", c.from, c.to), &st, dp, c.from, srcEp, dstEp, c.to, probe, &want)
		}
	})
	t.Logf("nftrace vs Tracer: %d cells compared (%d allowed, %d denied, %d through a Service), %d agree on every node's path, %d disagree; %d kernel trace events read",
		st.cells, st.allowed, st.denied, st.services, st.agree, st.cells-st.agree, st.events)
	if st.cells == 0 && !t.Skipped() {
		t.Error("no cell was compared")
	}
}

type traceTally struct {
	cells, agree, allowed, denied, services, events int
}

// sampleCells picks up to n allowed and n denied cells, spread over the
// table, pods' traffic to themselves left out.
func sampleCells(rs []eval.Result, n int) []eval.Result {
	var allowed, denied []eval.Result
	for _, r := range rs {
		if r.From == r.To {
			continue
		}
		if r.Allowed {
			allowed = append(allowed, r)
		} else {
			denied = append(denied, r)
		}
	}
	spread := func(xs []eval.Result) []eval.Result {
		if len(xs) <= n {
			return xs
		}
		var out []eval.Result
		for i := 0; i < n; i++ {
			out = append(out, xs[i*len(xs)/n+(len(xs)/n)/2])
		}
		return out
	}
	return append(spread(allowed), spread(denied)...)
}

// labTracer holds a trace listener in every node's namespace.
type labTracer struct {
	l         *lab.Lab
	listeners map[string]*nftrace.Listener
}

func newLabTracer(t *testing.T, l *lab.Lab) *labTracer {
	lt := &labTracer{l: l, listeners: map[string]*nftrace.Listener{}}
	for _, n := range l.Nodes() {
		lst, err := nftrace.Listen(int(n.Handle))
		if errors.Is(err, nftrace.ErrUnsupported) {
			t.Skipf("the kernel cannot trace nf_tables (nftrace): %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lst.Close() })
		lt.listeners[n.Name] = lst
	}
	return lt
}

// cell traces one connection in the kernel and through the Tracer and
// compares them node by node.
func (lt *labTracer) cell(t *testing.T, name string, st *traceTally, dp *dataplane.Cluster, from string, srcEp, dstEp eval.Endpoint, dst netip.AddrPort, probe l4.Port, wantAllowed *bool) {
	t.Helper()
	paths, err := dp.Paths(srcEp, dstEp, probe)
	if err != nil {
		t.Fatalf("%s: tracer: %v", name, err)
	}
	if len(paths) == 0 {
		t.Fatalf("%s: the Tracer found no path", name)
	}
	proto := map[corev1.Protocol]uint8{corev1.ProtocolTCP: 6, corev1.ProtocolUDP: 17, corev1.ProtocolSCTP: 132}[probe.Protocol]
	// Arm the tuple as sent and as NAT leaves it at each hop.
	matches := []nftrace.Match{{Src: srcEp.Addr, Dst: dst.Addr(), L4Proto: proto, DstPort: dst.Port()}}
	for _, p := range paths {
		for _, h := range p.Hops {
			m := nftrace.Match{Src: h.Result.Packet.Src, Dst: h.Result.Packet.Dst, L4Proto: proto, DstPort: h.Result.Packet.DstPort}
			if !slices.Contains(matches, m) {
				matches = append(matches, m)
			}
		}
	}
	var armed []*nftrace.Armed
	disarm := func() {
		for _, a := range armed {
			if err := a.Disarm(); err != nil {
				t.Errorf("%s: disarm: %v", name, err)
			}
		}
		armed = nil
	}
	defer disarm()
	for _, n := range lt.l.Nodes() {
		a, err := nftrace.Arm(int(n.Handle), matches...)
		if err != nil {
			t.Fatalf("%s: arm on %s: %v", name, n.Name, err)
		}
		armed = append(armed, a)
	}
	lt.drain()
	timeout := 400 * time.Millisecond
	if wantAllowed != nil && *wantAllowed {
		timeout = 2 * time.Second
	}
	o := lt.l.Dial(context.Background(), from, dst, probe.Protocol, lab.DialOptions{Timeout: timeout})
	if strings.HasPrefix(o.Result, "error") {
		t.Fatalf("%s: dial: %s", name, o.Result)
	}
	kernel := map[string][]nftrace.PathStep{}
	var packets []string // what the kernel traced, for failure messages
	for node, lst := range lt.listeners {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		evs, err := lst.Collect(ctx, 300*time.Millisecond, nil)
		cancel()
		if err != nil {
			t.Fatalf("%s: reading %s's trace: %v", name, node, err)
		}
		if lst.Lost > 0 {
			t.Fatalf("%s: %s's trace lost events (socket buffer full)", name, node)
		}
		st.events += len(evs)
		for _, p := range nftrace.Packets(evs) {
			packets = append(packets, fmt.Sprintf("%s id %08x %s:%d -> %s:%d proto %d flags %#x, %d events, opens %v",
				node, p.ID, p.Src, p.SrcPort, p.Dst, p.DstPort, p.L4Proto, p.TCPFlags, len(p.Events), p.Opens()))
			if !p.Opens() || !armedTuple(matches, p) {
				continue
			}
			kernel[node] = append(kernel[node], p.Path(nftrace.TableName)...)
		}
	}
	disarm()

	st.cells++
	if dstEp.Pod < 0 || dstEp.Addr != dst.Addr() {
		st.services++ // to a Service address: through DNAT
	}
	var match *dataplane.Path
	var tracerText []string
	for i := range paths {
		want := tracerByNode(paths[i])
		if sameByNode(kernel, want) {
			match = &paths[i]
			break
		}
		tracerText = append(tracerText, byNodeText(want))
	}
	if match == nil {
		t.Errorf("%s: the kernel's trace differs from the Tracer's\nkernel:\n%s\ntracer (%d paths):\n%s\npackets traced (probe from %s:%d, %s):\n  %s", name, byNodeText(kernel), len(paths),
			strings.Join(tracerText, "\n  or\n"), o.FromAddr, o.FromPort, o.Result, strings.Join(packets, "\n  "))
		return
	}
	gotAllowed := o.Result == lab.ResultOK
	if match.Allowed {
		st.allowed++
	} else {
		st.denied++
	}
	if gotAllowed != match.Allowed || (wantAllowed != nil && *wantAllowed != match.Allowed) {
		t.Errorf("%s: probe %s, Tracer path allowed=%v, evaluator allowed=%v", name, o.Result, match.Allowed, *wantAllowed)
		return
	}
	st.agree++
	t.Logf("%s: %s, kernel == tracer:\n%s", name, verdict(match.Allowed), byNodeText(kernel))
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// drain drops events left from earlier cells (later packets of their
// connections, before their disarm).
func (lt *labTracer) drain() {
	for _, lst := range lt.listeners {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		lst.Collect(ctx, 20*time.Millisecond, nil)
		cancel()
	}
}

func armedTuple(ms []nftrace.Match, p *nftrace.Packet) bool {
	for _, m := range ms {
		if m.Src == p.Src && m.Dst == p.Dst && m.L4Proto == p.L4Proto && m.DstPort == p.DstPort {
			return true
		}
	}
	return false
}

func tracerByNode(p dataplane.Path) map[string][]nftrace.PathStep {
	out := map[string][]nftrace.PathStep{}
	for _, h := range p.Hops {
		out[h.Node] = append(out[h.Node], nftrace.TracerPath(h.Hook, h.Result)...)
	}
	return out
}

func sameByNode(a, b map[string][]nftrace.PathStep) bool {
	for n, s := range a {
		if !slices.Equal(s, b[n]) {
			return false
		}
	}
	for n, s := range b {
		if !slices.Equal(s, a[n]) {
			return false
		}
	}
	return true
}

func byNodeText(m map[string][]nftrace.PathStep) string {
	var nodes []string
	for n := range m {
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	var w []string
	for _, n := range nodes {
		for _, s := range m[n] {
			w = append(w, "  "+n+" "+s.String())
		}
	}
	return strings.Join(w, "\n")
}
