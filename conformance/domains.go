package conformance

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/domain"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
)

// Domain probes: from each pod, resolve each name of the lab's zone
// through the cluster DNS, then connect to the first address of the pod's
// family. The evaluator's rows (ExpectedDomains) and the kernel's
// (ProbeDomains) have one shape, so that they can be compared.

// DomainRow is one (pod, name, port) probe.
type DomainRow struct {
	From     string `json:"from"`
	To       string `json:"to"` // DomainTo(name)
	Protocol string `json:"protocol"`
	Port     int    `json:"port"`
	Allowed  bool   `json:"allowed"`
	// Address is the address connected to ("" when the name did not
	// resolve to one of the pod's family).
	Address string `json:"address,omitempty"`
	// Result says what happened: ok, or why not (the resolution failed,
	// no address, a policy denied, the connection timed out).
	Result string `json:"result"`
}

// DomainTo is a row's destination: dns/NAME.
func DomainTo(name string) string { return "dns/" + name }

// Results of a domain probe besides the lab's dial results.
const (
	ResultResolveDenied = "resolution denied"
	ResultNoAnswer      = "no address"
)

// DomainProbeOptions say what to probe.
type DomainProbeOptions struct {
	Probes []l4.Port // ports (each connects to the address on it)
	TCP    bool      // resolve over TCP (default UDP)
	// Timeout of each connection (default 1 s) and Parallel probes at once
	// (default 16).
	Timeout  time.Duration
	Parallel int
}

// ClusterDNSPod is the first ready endpoint of the cluster DNS that is a
// pod of the snapshot: the evaluator judges a resolution by whether the
// pod may reach it on port 53.
func ClusterDNSPod(snap *cluster.Snapshot) (string, bool) {
	servers := node.ClusterDNS(snap.EndpointSlices)
	for _, p := range snap.Pods {
		for _, ip := range p.Status.PodIPs {
			for _, s := range servers {
				if a, err := netip.ParseAddr(ip.IP); err == nil && a.Unmap() == s.Addr() {
					return p.Namespace + "/" + p.Name, true
				}
			}
		}
	}
	return "", false
}

// zoneOracle is what the lab's agents learn: every name of the zone is
// resolved by the time a probe connects (ProbeDomains resolves them all
// first), so a pattern has learned the addresses of every name it
// matches.
type zoneOracle struct{ zone *domain.Zone }

func (o zoneOracle) Learned(pattern string, addr netip.Addr) (bool, string) {
	p, err := domain.ParsePattern(pattern)
	if err != nil {
		return false, ""
	}
	for _, name := range o.zone.Names() {
		if !p.Matches(name) {
			continue
		}
		addrs, ttl, _ := o.zone.Lookup(name)
		if slices.Contains(addrs, addr) {
			return true, fmt.Sprintf("%s resolves to %s in the lab's zone (TTL %s)", name, addr, ttl)
		}
	}
	return false, ""
}

// ZoneOracle makes the evaluator's domainNames match what the lab's zone
// teaches (eval.Evaluator.LearnDomains).
func ZoneOracle(z *domain.Zone) eval.DomainOracle { return zoneOracle{z} }

// ExpectedDomains are the evaluator's rows: a pod resolves a name when it
// may reach the cluster DNS's pod on 53 (UDP, or TCP with tcp), and then
// connects to the name's first address of its family, as ev (which must
// have the zone's oracle) decides.
func ExpectedDomains(ev *eval.Evaluator, snap *cluster.Snapshot, zone *domain.Zone, opts DomainProbeOptions) ([]DomainRow, error) {
	dnsPod, ok := ClusterDNSPod(snap)
	if !ok {
		return nil, fmt.Errorf("the state has no pod serving Service %s (its EndpointSlices' ready endpoints)", node.ClusterDNSService)
	}
	dnsProbe := l4.Port{Protocol: corev1.ProtocolUDP, Port: 53}
	if opts.TCP {
		dnsProbe.Protocol = corev1.ProtocolTCP
	}
	var rows []DomainRow
	for _, from := range domainSources(snap) {
		src, err := ev.Endpoint(from, ipfamily.Any, netip.Addr{})
		if err != nil {
			return nil, err
		}
		dnsEp, err := ev.Endpoint(dnsPod, ipfamily.Of(src.Addr), src.Addr)
		if err != nil {
			return nil, err
		}
		resolves := ev.Allowed(src, dnsEp, dnsProbe)
		for _, name := range zone.Names() {
			addrs, _, _ := zone.Lookup(name)
			addr, found := firstOfFamily(addrs, src.Addr)
			for _, pr := range opts.Probes {
				row := DomainRow{From: from, To: DomainTo(name), Protocol: string(pr.Protocol), Port: int(pr.Port)}
				switch {
				case !resolves:
					row.Result = ResultResolveDenied
				case !found:
					row.Result = ResultNoAnswer
				default:
					row.Address = addr.String()
					row.Allowed = ev.Allowed(src, eval.Endpoint{Pod: -1, Node: -1, Addr: addr}, pr)
					row.Result = lab.ResultOK
					if !row.Allowed {
						row.Result = "denied"
					}
				}
				rows = append(rows, row)
			}
		}
	}
	return rows, nil
}

// domainSources are the pods probed from: pod-network pods with an
// address, as namespace/name, sorted.
func domainSources(snap *cluster.Snapshot) []string {
	var out []string
	for _, p := range snap.Pods {
		if p.Spec.HostNetwork || p.Status.PodIP == "" || p.Spec.NodeName == "" {
			continue
		}
		out = append(out, p.Namespace+"/"+p.Name)
	}
	slices.Sort(out)
	return out
}

// firstOfFamily is the first address of like's family in addrs, which
// Zone.Lookup and Lab.Resolve both give sorted and unmapped.
func firstOfFamily(addrs []netip.Addr, like netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Is4() == like.Unmap().Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// ProbeDomains probes the kernel: every pod first resolves every name
// (the nodes' agents learn from the answers), then each (pod, name, port)
// resolves again and connects. The lab must serve a zone and its nodes be
// programmed with DNS (Enforcer.DNS).
func ProbeDomains(ctx context.Context, lb *lab.Lab, opts DomainProbeOptions) ([]DomainRow, error) {
	zone := lb.Zone()
	if zone == nil {
		return nil, fmt.Errorf("the lab serves no zone: the state needs ConfigMap kube-system/netpol-lab-dns (data.zone)")
	}
	if opts.Timeout == 0 {
		opts.Timeout = time.Second
	}
	if opts.Parallel == 0 {
		opts.Parallel = 16
	}
	var sources []*lab.Pod
	for _, p := range lb.Pods() {
		if !p.HostNetwork && len(p.Addrs) > 0 {
			sources = append(sources, p)
		}
	}
	slices.SortFunc(sources, func(a, b *lab.Pod) int { return strings.Compare(a.Name, b.Name) })
	resolve := func(p *lab.Pod, name string) ([]netip.Addr, error) {
		server, ok := lb.ClusterDNS(p.Addrs[0])
		if !ok {
			return nil, fmt.Errorf("no cluster DNS address of the pod's family")
		}
		return lb.Resolve(ctx, p.Name, name, opts.TCP, server)
	}
	names := zone.Names()
	// Learning pass: what the evaluator's zone oracle assumes.
	each(len(sources)*len(names), opts.Parallel, func(i int) {
		resolve(sources[i/len(names)], names[i%len(names)])
	})
	rows := make([]DomainRow, len(sources)*len(names)*len(opts.Probes))
	each(len(rows), opts.Parallel, func(i int) {
		p := sources[i/(len(names)*len(opts.Probes))]
		name := names[i/len(opts.Probes)%len(names)]
		pr := opts.Probes[i%len(opts.Probes)]
		row := DomainRow{From: p.Name, To: DomainTo(name), Protocol: string(pr.Protocol), Port: int(pr.Port)}
		defer func() { rows[i] = row }()
		addrs, err := resolve(p, name)
		if err != nil {
			row.Result = ResultResolveDenied + ": " + err.Error()
			return
		}
		addr, ok := firstOfFamily(addrs, p.Addrs[0])
		if !ok {
			row.Result = ResultNoAnswer
			return
		}
		row.Address = addr.String()
		obs := lb.Dial(ctx, p.Name, netip.AddrPortFrom(addr, uint16(pr.Port)), pr.Protocol, lab.DialOptions{Timeout: opts.Timeout})
		row.Allowed, row.Result = obs.Allowed, obs.Result
	})
	return rows, nil
}

// each runs f(0..n-1), parallel at a time.
func each(n, parallel int, f func(int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// CompareDomains lists the rows where the kernel and the evaluator
// disagree on allowed (rows in the same order: both come from sorted
// pods, the zone's names and the probes).
func CompareDomains(expected, observed []DomainRow) []string {
	want := map[string]DomainRow{}
	key := func(r DomainRow) string { return fmt.Sprintf("%s %s %s/%d", r.From, r.To, r.Protocol, r.Port) }
	for _, r := range expected {
		want[key(r)] = r
	}
	var diffs []string
	for _, r := range observed {
		w, ok := want[key(r)]
		switch {
		case !ok:
			diffs = append(diffs, key(r)+": probed, but the evaluator has no row")
		case w.Allowed != r.Allowed:
			diffs = append(diffs, fmt.Sprintf("%s: evaluator %v (%s), kernel %v (%s, address %s)", key(r), w.Allowed, w.Result, r.Allowed, r.Result, r.Address))
		}
		delete(want, key(r))
	}
	for k := range want {
		diffs = append(diffs, k+": the evaluator has a row the lab did not probe")
	}
	slices.Sort(diffs)
	return diffs
}
