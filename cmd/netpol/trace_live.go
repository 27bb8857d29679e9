package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/nft/nftrace"
	"github.com/netpol/netpol/pkg/policy"
)

type liveTraceOptions struct {
	enabled  bool
	duration time.Duration
	netns    string
	// armed, if set, is called once the trace is armed (tests).
	armed func()
}

// liveIdle is how long a packet's trace may go without a new event before
// it is printed: the kernel sends a packet's events as it crosses each
// hook, within microseconds.
const liveIdle = 200 * time.Millisecond

// liveStep is one kernel trace event, in the fields of `netpol trace -o
// json`'s path.
type liveStep struct {
	Node    string `json:"node"`
	Hook    string `json:"hook,omitempty"`
	Table   string `json:"table"`
	Chain   string `json:"chain"`
	Rule    string `json:"rule"`
	RuleID  string `json:"rule_id,omitempty"`
	Handle  uint64 `json:"handle,omitempty"`
	Comment string `json:"comment,omitempty"`
	Verdict string `json:"verdict"`
	// Counters are the per-rule counters the rule counts into, read
	// once the packet's path is complete (this packet counted).
	Counters []liveCounter `json:"counters,omitempty"`
}

// liveCounter is a named counter's value.
type liveCounter struct {
	Name string `json:"name"`
	nft.CounterValue
}

// livePacket is one real packet's path as the kernel reported it.
type livePacket struct {
	ID       string     `json:"id"`
	Src      string     `json:"src"`
	Dst      string     `json:"dst"`
	Protocol string     `json:"protocol"`
	SrcPort  uint16     `json:"src_port,omitempty"`
	DstPort  uint16     `json:"dst_port,omitempty"`
	TCPFlags string     `json:"tcp_flags,omitempty"`
	Verdict  string     `json:"verdict"`
	Path     []liveStep `json:"path"`
}

// liveTrace arms the kernel's nftrace for the tuple in this network
// namespace (or opts.netns), prints each traced packet's path as the
// kernel reports it until opts.duration passes or ctx ends (Ctrl-C), and
// disarms on every way out.
func liveTrace(ctx context.Context, out io.Writer, src, dst string, probe l4.Port, format string, opts liveTraceOptions) error {
	if format != "text" && format != "json" {
		return fmt.Errorf("--live prints text or json, not %s", format)
	}
	m, err := liveMatch(src, dst, probe)
	if err != nil {
		return err
	}
	fd, node, err := openNetNS(opts.netns)
	if err != nil {
		return err
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}

	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if opts.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.duration)
		defer cancel()
	}

	// Listen first: the kernel sends events only while someone listens.
	lst, err := nftrace.Listen(fd)
	if err != nil {
		return fmt.Errorf("trace --live (needs root and nf_tables): %w", err)
	}
	defer lst.Close()
	armed, err := nftrace.Arm(fd, m)
	if err != nil {
		return fmt.Errorf("trace --live: %w", err)
	}
	disarmed := false
	disarm := func() error {
		if disarmed {
			return nil
		}
		disarmed = true
		if err := armed.Disarm(); err != nil {
			return fmt.Errorf("trace --live: removing table inet %s: %w (remove it with `nft delete table inet %s`)", nftrace.TableName, err, nftrace.TableName)
		}
		return nil
	}
	defer disarm()
	if opts.armed != nil {
		opts.armed()
	}

	w := &liveWriter{out: out, format: format, node: node, netns: fd}
	if format == "text" {
		fmt.Fprintf(out, "tracing %s in %s for %v (table inet %s armed); Ctrl-C stops\n", m, node, opts.duration, nftrace.TableName)
	}
	pending := map[uint32]*pendingPacket{}
	var order []uint32
	flush := func(all bool) error {
		now := time.Now()
		kept := order[:0]
		for _, id := range order {
			p := pending[id]
			if !all && now.Sub(p.last) < liveIdle {
				kept = append(kept, id)
				continue
			}
			delete(pending, id)
			for _, pt := range nftrace.Packets(p.events) {
				if err := w.packet(pt); err != nil {
					return err
				}
			}
		}
		order = kept
		return nil
	}
	var recvErr error
	for {
		evs, err := lst.Receive(ctx, time.Now().Add(liveIdle/2))
		if err != nil {
			if ctx.Err() == nil {
				recvErr = err
			}
			break
		}
		now := time.Now()
		for _, e := range evs {
			p := pending[e.ID]
			if p == nil {
				p = &pendingPacket{}
				pending[e.ID] = p
				order = append(order, e.ID)
			}
			p.events = append(p.events, e)
			p.last = now
		}
		if err := flush(false); err != nil {
			recvErr = err
			break
		}
	}
	// Stop tracing, then print what is left.
	derr := disarm()
	if err := flush(true); err != nil && recvErr == nil {
		recvErr = err
	}
	if format == "text" {
		fmt.Fprintf(out, "%d packet(s) traced; table inet %s removed\n", w.packets, nftrace.TableName)
	}
	if lst.Lost > 0 && recvErr == nil {
		recvErr = fmt.Errorf("trace --live: the kernel dropped trace events %d time(s) (socket buffer full); the paths above may be incomplete", lst.Lost)
	}
	return errors.Join(recvErr, derr)
}

type pendingPacket struct {
	events []nftrace.Event
	last   time.Time
}

// liveMatch is the tuple: SRC and DST must be IP addresses here (the
// kernel traces packets, not pods).
func liveMatch(src, dst string, probe l4.Port) (nftrace.Match, error) {
	s, err := netip.ParseAddr(src)
	if err != nil {
		return nftrace.Match{}, fmt.Errorf("with --live, SRC must be an IP address (the kernel traces packets): %q", src)
	}
	d, err := netip.ParseAddr(dst)
	if err != nil {
		return nftrace.Match{}, fmt.Errorf("with --live, DST must be an IP address (for a Service, its ClusterIP): %q", dst)
	}
	s, d = s.Unmap(), d.Unmap()
	if s.Is4() != d.Is4() {
		return nftrace.Match{}, fmt.Errorf("%s and %s are of different address families", s, d)
	}
	proto, ok := policy.IPProtocol(probe.Protocol)
	if !ok {
		return nftrace.Match{}, fmt.Errorf("protocol %q", probe.Protocol)
	}
	return nftrace.Match{Src: s, Dst: d, L4Proto: proto, DstPort: uint16(probe.Port)}, nil
}

// openNetNS opens the namespace to trace in: a name under /run/netns or a
// path; "" is this process's own (fd -1). node names it in the output.
func openNetNS(ns string) (fd int, node string, err error) {
	if ns == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "this host"
		}
		return -1, host, nil
	}
	path := ns
	if !strings.Contains(ns, "/") {
		path = filepath.Join("/run/netns", ns)
	}
	fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("--netns %s: %w", ns, err)
	}
	return fd, ns, nil
}

type liveWriter struct {
	out     io.Writer
	format  string
	node    string
	netns   int // the namespace's descriptor (-1: this one)
	packets int
}

// counters reads the values of the named counters of table (nil when it
// cannot: the path is printed without them).
func (w *liveWriter) counters(table string, names []string) []liveCounter {
	values, err := kernel.Counters(w.netns, table)
	if err != nil {
		return nil
	}
	out := make([]liveCounter, 0, len(names))
	for _, n := range names {
		if v, ok := values[n]; ok {
			out = append(out, liveCounter{n, v})
		}
	}
	return out
}

// packet prints one packet: its tuple, then one line per event. The
// trace table's own rule and the ends of regular chains (no decision) are
// left out.
func (w *liveWriter) packet(p *nftrace.Packet) error {
	lp := livePacket{ID: fmt.Sprintf("%08x", p.ID), Protocol: protocolName(p.L4Proto), SrcPort: p.SrcPort, DstPort: p.DstPort, Path: []liveStep{}}
	if p.Src.IsValid() {
		lp.Src, lp.Dst = p.Src.String(), p.Dst.String()
	}
	if p.L4Proto == unix.IPPROTO_TCP {
		lp.TCPFlags = tcpFlags(p.TCPFlags)
	}
	for _, e := range p.Events {
		if e.Table == nftrace.TableName || e.Type == nftrace.EventReturn {
			continue
		}
		st := liveStep{Node: w.node, Hook: e.Hook, Table: e.Table, Chain: e.Chain, RuleID: e.RuleID, Handle: e.Handle, Verdict: e.Verdict}
		switch {
		case e.Type == nftrace.EventPolicy:
			st.Rule = "policy " + e.Verdict
		case e.RuleText != "":
			st.Rule = e.RuleText
		default:
			st.Rule = fmt.Sprintf("handle %d", e.Handle)
		}
		if len(e.Counters) > 0 {
			st.Counters = w.counters(e.Table, e.Counters)
		}
		lp.Path = append(lp.Path, st)
	}
	if len(lp.Path) == 0 {
		return nil // only the trace table saw it
	}
	lp.Verdict = p.Verdict()
	w.packets++
	if w.format == "json" {
		b, err := json.Marshal(lp)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w.out, "%s\n", b)
		return err
	}
	head := fmt.Sprintf("packet %s: %s", lp.ID, lp.Protocol)
	if lp.Src != "" {
		head += fmt.Sprintf(" %s -> %s", netip.AddrPortFrom(p.Src, p.SrcPort), netip.AddrPortFrom(p.Dst, p.DstPort))
	}
	if lp.TCPFlags != "" {
		head += " [" + lp.TCPFlags + "]"
	}
	fmt.Fprintf(w.out, "%s: %s\n", head, strings.ToUpper(orUnknown(lp.Verdict)))
	hook := ""
	for _, st := range lp.Path {
		if st.Hook != "" && st.Hook != hook {
			hook = st.Hook
			fmt.Fprintf(w.out, "  %s %s\n", st.Node, hook)
		}
		line := fmt.Sprintf("    %s/%s %s -> %s", st.Table, st.Chain, st.Rule, st.Verdict)
		if st.RuleID != "" {
			line += "   # " + st.RuleID
		}
		for _, c := range st.Counters {
			line += fmt.Sprintf("   [%s: %d packets, %d bytes]", c.Name, c.Packets, c.Bytes)
		}
		fmt.Fprintln(w.out, line)
	}
	return nil
}

func orUnknown(v string) string {
	if v == "" {
		return "no verdict seen"
	}
	return v
}

func protocolName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "icmpv6"
	}
	return fmt.Sprint(p)
}

func tcpFlags(f byte) string {
	var w []string
	for _, x := range []struct {
		bit  byte
		name string
	}{{0x02, "SYN"}, {0x10, "ACK"}, {0x01, "FIN"}, {0x04, "RST"}, {0x08, "PSH"}} {
		if f&x.bit != 0 {
			w = append(w, x.name)
		}
	}
	return strings.Join(w, ",")
}
