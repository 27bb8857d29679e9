package lab

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/ipfamily"
)

// ServiceProbeOptions choose how ProbeServices dials.
type ServiceProbeOptions struct {
	// Family picks the ClusterIP of dual-stack Services (and the node
	// addresses NodePorts are dialed on): IPv4, IPv6, or, by default,
	// each Service's primary family (its first ClusterIP's).
	Family ipfamily.Family
	// Timeout bounds one attempt (default 500ms); failed probes are tried
	// once more with RetryTimeout (default 4 x Timeout) unless NoRetry.
	Timeout      time.Duration
	RetryTimeout time.Duration
	NoRetry      bool
	// Parallel is how many probes run at once (default 128).
	Parallel int
}

// ServiceObservation is what one Service probe saw.
type ServiceObservation struct {
	// From is the source: a pod's namespace/name, or ExternalSource.
	From string
	// To is "service/NAMESPACE/NAME" for the ClusterIP, or
	// "nodeport/NODE/NAMESPACE/NAME" for the NodePort on one of the node's
	// addresses (ToAddr says which).
	To string
	// Service is the Service's namespace/name, PortName its port's name.
	Service  string
	PortName string
	Protocol corev1.Protocol
	// Port is the port dialed: the Service port or the node port.
	Port   int32
	Family corev1.IPFamily
	// FromAddr and FromPort are the source the kernel used, ToAddr the
	// address dialed.
	FromAddr netip.Addr
	FromPort uint16
	ToAddr   netip.Addr
	// Allowed: a connection was made and answered.
	Allowed bool
	// Endpoint is the namespace/name of the pod that answered.
	Endpoint string
	// Result is ResultOK, ResultTimeout, ResultRefused, ... (see
	// Observation.Result).
	Result string
}

// ServiceTo and NodePortTo are how ServiceObservation.To names a Service's
// ClusterIP and its NodePort on a node.
func ServiceTo(namespace, name string) string { return "service/" + namespace + "/" + name }

// NodePortTo: see ServiceTo.
func NodePortTo(node, namespace, name string) string {
	return "nodeport/" + node + "/" + namespace + "/" + name
}

// ProbeServices probes every port of every Service the proxy would serve
// (a ClusterIP that is set and not None; not ExternalName): its ClusterIP
// from every pod of the lab, and, if it has a NodePort, the NodePort on
// every InternalIP/ExternalIP of every node from every pod and from outside
// the cluster (ExternalSource). Only addresses of one family per Service
// are probed (see ServiceProbeOptions.Family); sources without an address
// of that family are left out. The order is the proxy model's Services
// (namespace, name, port name, protocol, family), ClusterIP before
// NodePort, nodes in snapshot order, sources by name, external last.
// SCTP ports are left out, with a note, when the kernel has no SCTP. The
// notes also say what else was left out.
func (l *Lab) ProbeServices(ctx context.Context, opts ServiceProbeOptions) ([]ServiceObservation, []string, error) {
	po := ProbeOptions{Timeout: opts.Timeout, RetryTimeout: opts.RetryTimeout, Parallel: opts.Parallel, NoRetry: opts.NoRetry}
	po.defaults()
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.down {
		return nil, nil, fmt.Errorf("lab %s is down", l.prefix)
	}
	var sources []string
	for _, pp := range l.plan.pods {
		if l.pods[pp.key] != nil {
			sources = append(sources, pp.key)
		}
	}
	withExternal := append(sources[:len(sources):len(sources)], ExternalSource)
	hasAddr := func(from string, f *ipFamily) bool {
		_, _, result := l.source(from, f)
		return result == ""
	}

	var notes []string
	var out []ServiceObservation
	noAddr := map[string]map[string]bool{} // family -> pods without an address of it
	seen, probed := map[string]bool{}, map[string]bool{}
	sctpOK, sctpWhy := SCTPSupported()
	for _, sp := range l.plan.services {
		svc := sp.Namespace + "/" + sp.Name
		seen[svc] = true
		if !wantFamily(sp.Family, opts.Family, l.plan.primary[svc]) {
			continue
		}
		probed[svc] = true
		if sp.Protocol == corev1.ProtocolSCTP && !sctpOK {
			notes = append(notes, fmt.Sprintf("service %s port %s (sctp/%d) not probed: %s", svc, sp.PortName, sp.Port, sctpWhy))
			continue
		}
		f := familyOf(sp.ClusterIP)
		add := func(from, to string, dst netip.Addr, port int32) {
			if !hasAddr(from, f) {
				if noAddr[f.name] == nil {
					noAddr[f.name] = map[string]bool{}
				}
				noAddr[f.name][from] = true
				return
			}
			out = append(out, ServiceObservation{From: from, To: to, Service: svc, PortName: sp.PortName,
				Protocol: sp.Protocol, Port: port, Family: sp.Family, ToAddr: dst})
		}
		for _, from := range sources {
			add(from, ServiceTo(sp.Namespace, sp.Name), sp.ClusterIP, sp.Port)
		}
		if sp.NodePort == 0 {
			continue
		}
		for _, n := range l.plan.nodes {
			for _, a := range n.status {
				if familyOf(a) != f {
					continue
				}
				for _, from := range withExternal {
					add(from, NodePortTo(n.name, sp.Namespace, sp.Name), a, sp.NodePort)
				}
			}
		}
	}
	if opts.Family != ipfamily.Any {
		for svc := range seen {
			if !probed[svc] {
				notes = append(notes, fmt.Sprintf("service %s has no %s ClusterIP: not probed", svc, familyName(opts.Family)))
			}
		}
	}
	for fam, pods := range noAddr {
		var list []string
		for p := range pods {
			list = append(list, p)
		}
		sort.Strings(list)
		notes = append(notes, fmt.Sprintf("without an %s address, these probe no %s Service: %s", fam, fam, strings.Join(list, ", ")))
	}

	obs := observeAll(ctx, len(out), po, func(i int, timeout time.Duration) Observation {
		c := out[i]
		return l.dial(ctx, c.From, netip.AddrPortFrom(c.ToAddr, uint16(c.Port)), c.Protocol, DialOptions{Timeout: timeout})
	})
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("lab %s: probing Services: %w", l.prefix, err)
	}
	if err := probeErrors(obs); err != nil {
		return nil, nil, fmt.Errorf("lab %s: %w", l.prefix, err)
	}
	for i, o := range obs {
		c := &out[i]
		c.FromAddr, c.FromPort = o.FromAddr, o.FromPort
		c.Allowed, c.Result, c.Endpoint = o.Allowed, o.Result, o.Reply
	}
	sort.Strings(notes)
	return out, notes, nil
}

// wantFamily: whether a Service port of family fam is probed when asked
// for `want`, the Service's primary family being primary.
func wantFamily(fam corev1.IPFamily, want ipfamily.Family, primary corev1.IPFamily) bool {
	switch want {
	case ipfamily.IPv4:
		return fam == corev1.IPv4Protocol
	case ipfamily.IPv6:
		return fam == corev1.IPv6Protocol
	}
	return fam == primary
}
