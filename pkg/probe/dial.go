package probe

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/l4"
)

// Target is one probe to make: a server's owner (namespace/name), its
// address, protocol and port.
type Target struct {
	Name     string
	Addr     netip.Addr
	Protocol corev1.Protocol
	Port     int32
}

// String is the target as ParseTarget reads it: NAME=ADDR:PROTO/PORT
// (IPv6 addresses in brackets), e.g. x/a=10.244.1.10:tcp/80.
func (t Target) String() string {
	return fmt.Sprintf("%s=%s:%s/%d", t.Name, hostText(t.Addr), strings.ToLower(string(t.Protocol)), t.Port)
}

func hostText(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

// ParseTarget reads NAME=ADDR:PROTO/PORT.
func ParseTarget(s string) (Target, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return Target{}, fmt.Errorf("target %q: want NAME=ADDR:PROTO/PORT, e.g. x/a=10.244.1.10:tcp/80", s)
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 {
		return Target{}, fmt.Errorf("target %q: want NAME=ADDR:PROTO/PORT", s)
	}
	addr, err := netip.ParseAddr(strings.Trim(rest[:i], "[]"))
	if err != nil {
		return Target{}, fmt.Errorf("target %q: %v", s, err)
	}
	if !strings.Contains(rest[i+1:], "/") {
		return Target{}, fmt.Errorf("target %q: want PROTO/PORT after the address", s)
	}
	p, err := l4.ParsePort(rest[i+1:])
	if err != nil {
		return Target{}, fmt.Errorf("target %q: %v", s, err)
	}
	return Target{Name: name, Addr: addr.Unmap(), Protocol: p.Protocol, Port: p.Port}, nil
}

// Outcome is what one probe to a target saw; its JSON is what `netpol
// probe dial` prints (one array per call).
type Outcome struct {
	To       string          `json:"to"`
	Address  string          `json:"address"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	// Allowed: the target's own server answered.
	Allowed bool `json:"allowed"`
	// Result is ResultOK, ResultTimeout, ResultRefused, ResultUnreachable,
	// ResultRejected, ResultWrongReply, or ErrorPrefix + why the probe
	// could not be made (e.g. no SCTP sockets).
	Result string `json:"result"`
	Reply  string `json:"reply,omitempty"`
}

// ResultWrongReply: a server answered, but not the target's (its address
// belongs to someone else): not the connection that was asked about.
const ResultWrongReply = "wrong-reply"

// DialOptions bound DialAll.
type DialOptions struct {
	// Timeout bounds one attempt; a target that fails is tried once more
	// with RetryTimeout (0: no retry), so that a lost first packet does
	// not read as a denial.
	Timeout, RetryTimeout time.Duration
	// Parallel is how many probes run at once (0: all).
	Parallel int
}

// DialAll probes every target from this process's network namespace, in
// parallel, and returns the outcomes in the targets' order.
func DialAll(ctx context.Context, targets []Target, opts DialOptions) []Outcome {
	out := make([]Outcome, len(targets))
	parallel := opts.Parallel
	if parallel <= 0 {
		parallel = len(targets)
	}
	run := func(idx []int, timeout time.Duration) {
		sem := make(chan struct{}, parallel)
		var wg sync.WaitGroup
		for _, i := range idx {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				out[i] = dialOne(ctx, targets[i], timeout)
			})
		}
		wg.Wait()
	}
	all := make([]int, len(targets))
	for i := range all {
		all[i] = i
	}
	run(all, opts.Timeout)
	if opts.RetryTimeout > 0 {
		var again []int
		for i, o := range out {
			if !o.Allowed && !strings.HasPrefix(o.Result, ErrorPrefix) && o.Result != ResultWrongReply {
				again = append(again, i)
			}
		}
		run(again, opts.RetryTimeout)
	}
	return out
}

func dialOne(ctx context.Context, t Target, timeout time.Duration) Outcome {
	o := Outcome{To: t.Name, Address: t.Addr.String(), Protocol: t.Protocol, Port: t.Port}
	if t.Protocol == corev1.ProtocolSCTP {
		if ok, why := SCTPSupported(); !ok {
			o.Result = ErrorPrefix + why
			return o
		}
	}
	reply, _, err := Exchange(ctx, netns.None(), netip.AddrPortFrom(unspecified(t.Addr), 0), netip.AddrPortFrom(t.Addr, uint16(t.Port)), t.Protocol, timeout)
	switch {
	case err != nil:
		o.Result = Classify(err)
	case reply != t.Name:
		o.Result, o.Reply = ResultWrongReply, reply
	default:
		o.Allowed, o.Result, o.Reply = true, ResultOK, reply
	}
	return o
}

func unspecified(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}
