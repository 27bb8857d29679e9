package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/probe"
)

// ExternalSource is the source Dial and ProbeServices name the lab's
// outside by: the underlay namespace, a client outside the cluster.
const ExternalSource = "external"

// nodeSourcePrefix starts a node source; see NodeSource.
const nodeSourcePrefix = "node/"

// NodeSource names node name's own network namespace as a Dial source.
func NodeSource(name string) string { return nodeSourcePrefix + name }

// DialOptions tune Dial.
type DialOptions struct {
	// Timeout bounds the attempt (default 500ms). Dial does not retry.
	Timeout time.Duration
	// SourcePort is the source port to bind (with SO_REUSEADDR, so that
	// it can be used again at once); 0 means an ephemeral one.
	SourcePort uint16
}

// Dial makes one connection (TCP, SCTP) or exchange (UDP) to dst, which
// may be any address: a pod's, a node's, a Service's. from is
//
//   - "namespace/pod": from the pod's namespace (a host-network pod's
//     node's), bound to the pod's address of dst's family;
//   - ExternalSource ("external"): from the underlay, bound to its address
//     of dst's family (see External);
//   - NodeSource(name) ("node/NAME"): from the node's namespace, not bound
//     to an address (the kernel picks the source, as for a node process).
//
// A pod the lab runs wins over a node of the same "node/NAME" spelling.
// Observation.From is from, To is dst as a string, FromAddr and FromPort
// the source the kernel used, Reply the answering pod's namespace/name.
// Result is one of the Result constants; a source the lab does not have,
// or a probe it failed to make, reads "error: ...".
func (l *Lab) Dial(ctx context.Context, from string, dst netip.AddrPort, protocol corev1.Protocol, opts DialOptions) Observation {
	if opts.Timeout <= 0 {
		opts.Timeout = 500 * time.Millisecond
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.down {
		return Observation{From: from, To: dst.String(), ToAddr: dst.Addr(),
			Probe:  l4.Port{Protocol: protocol, Port: int32(dst.Port())},
			Result: resultErrorPrefix + "lab " + l.prefix + " is down"}
	}
	return l.dial(ctx, from, dst, protocol, opts)
}

// dial is Dial; the caller holds l.mu.
func (l *Lab) dial(ctx context.Context, from string, dst netip.AddrPort, protocol corev1.Protocol, opts DialOptions) Observation {
	o := Observation{From: from, To: dst.String(), ToAddr: dst.Addr(), Probe: l4.Port{Protocol: protocol, Port: int32(dst.Port())}}
	if ok, why := SCTPSupported(); !ok && protocol == corev1.ProtocolSCTP {
		o.Result = resultErrorPrefix + why
		return o
	}
	h, src, result := l.source(from, familyOf(dst.Addr()))
	if result != "" {
		o.Result = result
		return o
	}
	reply, local, err := probe.Exchange(ctx, h, netip.AddrPortFrom(src, opts.SourcePort), dst, protocol, opts.Timeout)
	o.FromAddr, o.FromPort = local.Addr(), local.Port()
	if !local.IsValid() && src.IsValid() && !src.IsUnspecified() {
		o.FromAddr = src
	}
	if err != nil {
		o.Result = probe.Classify(err)
		return o
	}
	o.Allowed, o.Result, o.Reply = true, ResultOK, reply
	return o
}

// source finds where a probe from `from` starts: the namespace and the
// address to bind (unspecified: any), or the Result saying why it cannot.
func (l *Lab) source(from string, f *ipFamily) (netns.NsHandle, netip.Addr, string) {
	switch {
	case l.pods[from] != nil:
		p := l.pods[from]
		ns := p.node.ns
		if p.ns != nil {
			ns = p.ns
		}
		for _, a := range p.plan.addrs {
			if familyOf(a) == f {
				return ns.handle, a, ""
			}
		}
		return netns.None(), netip.Addr{}, ResultNoAddress
	case from == ExternalSource:
		for _, a := range l.plan.external {
			if familyOf(a) == f {
				return l.underlay.handle, a, ""
			}
		}
		return netns.None(), netip.Addr{}, ResultNoAddress
	case strings.HasPrefix(from, nodeSourcePrefix) && l.nodes[strings.TrimPrefix(from, nodeSourcePrefix)] != nil:
		n := l.nodes[strings.TrimPrefix(from, nodeSourcePrefix)]
		unspecified := netip.IPv4Unspecified()
		if f == ipv6 {
			unspecified = netip.IPv6Unspecified()
		}
		return n.ns.handle, unspecified, ""
	case l.plan != nil && l.plan.left[from] != "":
		return netns.None(), netip.Addr{}, ResultNotInLab
	}
	return netns.None(), netip.Addr{}, fmt.Sprintf("%sno source %q in lab %s (want namespace/pod, %q or %q)",
		resultErrorPrefix, from, l.prefix, ExternalSource, NodeSource("NAME"))
}
