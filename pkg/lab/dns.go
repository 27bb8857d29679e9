package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/domain"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/probe"
)

// The lab's DNS server. When the snapshot holds ConfigMap
// kube-system/netpol-lab-dns, its data.zone (an RFC 1035 master file of
// A, AAAA and CNAME records, domain.ParseZone) is served as the cluster
// DNS would serve it:
//
//   - by the pods that are ready endpoints of Service kube-system/kube-dns
//     (its EndpointSlices, matched to pods as endpointSlicePorts does), on
//     every address of theirs and every UDP and TCP port of those slices,
//     in place of the probe servers there; so pods reach it through the
//     Service's ClusterIP wherever nodes run netpol's Service NAT, and
//     policy sees the DNS pod as the destination, as in a cluster;
//   - the servers answer netpol's probes too (see probeConn and
//     probeListener), so that tables and Service probes read those ports
//     as any other;
//   - every A and AAAA address of the zone is the outside's (see
//     outside.go), so that a name resolves to a peer that answers.
//
// Servers follow their pods' plans (started, kept, stopped by Up, Update
// and Down as probe servers are), and all read the zone through the
// lab, so that an Update that changes only the zone changes the answers
// at once.

// Where the lab finds its DNS zone and who serves it.
const (
	dnsNamespace = "kube-system"
	dnsConfigMap = "netpol-lab-dns"
	dnsZoneKey   = "zone"
	dnsService   = "kube-dns"
	// dnsPort is where Resolve asks.
	dnsPort = 53
)

// dnsPlan is the zone of a plan and who serves it.
type dnsPlan struct {
	zone *domain.Zone
	// addrs are the zone's A and AAAA addresses (the outside's too).
	addrs []netip.Addr
	// servers are the addresses of the pods that serve the zone, sorted.
	servers []netip.Addr
}

func (p *plan) zone() *domain.Zone {
	if p.dns == nil {
		return nil
	}
	return p.dns.zone
}

// planDNS reads the DNS zone and kube-dns's ClusterIPs: it marks the
// ports of the kube-dns endpoint pods the DNS server answers (pod dns
// lists; after p.pods) and reserves the zone's addresses for the outside
// in owner (after the pinned outside addresses, before synthetic ones).
func (p *plan) planDNS(snap *cluster.Snapshot, owner map[netip.Addr]string) error {
	var svc *corev1.Service
	for _, s := range snap.Services {
		if s != nil && s.Namespace == dnsNamespace && s.Name == dnsService {
			svc = s
		}
	}
	if svc != nil {
		p.clusterDNS = serviceIPs(svc)
	}
	cm := snap.ConfigMap(dnsNamespace, dnsConfigMap)
	if cm == nil {
		return nil
	}
	what := fmt.Sprintf("ConfigMap %s/%s", dnsNamespace, dnsConfigMap)
	zone, err := ZoneOf(snap)
	if err != nil {
		return err
	}
	if svc == nil {
		return fmt.Errorf("%s: the lab serves the zone as the endpoints of Service %s/%s, which the state lacks", what, dnsNamespace, dnsService)
	}

	inLab := map[string]*podPlan{}
	byAddr := map[netip.Addr]string{}
	for _, pp := range p.pods {
		inLab[pp.key] = pp
		if !pp.hostNetwork {
			for _, a := range pp.addrs {
				byAddr[a] = pp.key
			}
		}
	}
	d := &dnsPlan{zone: zone}
	for _, es := range snap.EndpointSlices {
		if es == nil || es.Namespace != dnsNamespace || es.Labels[discoveryv1.LabelServiceName] != dnsService {
			continue
		}
		var ports []l4.Port
		for _, pr := range slicePorts(es) {
			if pr.Protocol == corev1.ProtocolUDP || pr.Protocol == corev1.ProtocolTCP {
				ports = append(ports, pr)
			}
		}
		for _, ep := range es.Endpoints {
			pp := inLab[endpointPod(es, ep, byAddr)]
			if pp == nil || len(ports) == 0 || ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, pr := range ports {
				if !slices.Contains(pp.dns, pr) {
					pp.dns = append(pp.dns, pr)
				}
			}
		}
	}
	for _, pp := range p.pods {
		// In serves' order (which has every port a slice sends the pod).
		dnsPorts := pp.dns
		pp.dns = slices.DeleteFunc(slices.Clone(pp.serves), func(pr l4.Port) bool { return !slices.Contains(dnsPorts, pr) })
		if len(pp.dns) == 0 {
			pp.dns = nil
			continue
		}
		d.servers = append(d.servers, pp.addrs...)
	}
	if len(d.servers) == 0 {
		return fmt.Errorf("%s: Service %s/%s has no ready endpoint on a UDP or TCP port that is a pod of the lab (EndpointSlices labelled %s=%s in %s)",
			what, dnsNamespace, dnsService, discoveryv1.LabelServiceName, dnsService, dnsNamespace)
	}
	slices.SortFunc(d.servers, netip.Addr.Compare)
	d.servers = slices.Compact(d.servers)

	// Every address of the zone is the outside's: no one else may have it.
	serviceOwner := map[netip.Addr]string{}
	for _, s := range snap.Services {
		if s == nil {
			continue
		}
		for _, a := range serviceAddrs(s) {
			serviceOwner[a] = "Service " + s.Namespace + "/" + s.Name
		}
	}
	for _, a := range zone.Addresses() {
		if why := usable(a); why != "" {
			return fmt.Errorf("%s: data.%s: %s's address %s is a %s, which the lab cannot give the outside", what, dnsZoneKey, zoneNameOf(zone, a), a, why)
		}
		prev := owner[a]
		if prev == "" {
			prev = serviceOwner[a]
		}
		if prev != "" && prev != "the outside" {
			return fmt.Errorf("%s: data.%s: %s's address %s belongs to %s too (the lab gives the zone's addresses to the outside)", what, dnsZoneKey, zoneNameOf(zone, a), a, prev)
		}
		owner[a] = "the outside"
		d.addrs = append(d.addrs, a)
	}
	p.dns = d
	return nil
}

// zoneNameOf is the first name (sorted) that resolves to a, for messages.
func zoneNameOf(z *domain.Zone, a netip.Addr) string {
	for _, name := range z.Names() {
		if addrs, _, _ := z.Lookup(name); slices.Contains(addrs, a) {
			return name
		}
	}
	return a.String()
}

// serviceIPs are a Service's ClusterIPs (spec.clusterIPs, else
// spec.clusterIP), in order.
func serviceIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, a.Unmap()) {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// serviceAddrs are every address of a Service: ClusterIPs, external IPs
// and load-balancer ingress IPs.
func serviceAddrs(svc *corev1.Service) []netip.Addr {
	out := serviceIPs(svc)
	more := slices.Clone(svc.Spec.ExternalIPs)
	for _, in := range svc.Status.LoadBalancer.Ingress {
		more = append(more, in.IP)
	}
	for _, s := range more {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// Zone is the DNS zone the lab serves, or nil when the snapshot has no
// ConfigMap kube-system/netpol-lab-dns.
func (l *Lab) Zone() *domain.Zone { return l.zone.Load() }

// DNSServers are the addresses of the pods that serve the zone (the
// ready endpoints of Service kube-system/kube-dns in the lab), sorted; nil
// without a zone.
func (l *Lab) DNSServers() []netip.Addr {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.plan == nil || l.plan.dns == nil {
		return nil
	}
	return slices.Clone(l.plan.dns.servers)
}

// DNSQueries counts the DNS queries the lab's DNS servers have answered
// (an answer made and sent) since Up.
func (l *Lab) DNSQueries() uint64 { return l.dnsQueries.Load() }

// ClusterDNS is the ClusterIP of Service kube-system/kube-dns of the
// family of `of` (a pod's first address, say), whether or not the lab
// serves a zone.
func (l *Lab) ClusterDNS(of netip.Addr) (netip.Addr, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.plan == nil {
		return netip.Addr{}, false
	}
	return pick(l.plan.clusterDNS, ipfamily.Of(of.Unmap()))
}

// resolveTimeout bounds Resolve: a lab answers at once or not at all.
const resolveTimeout = 2 * time.Second

// Resolve asks server, port 53 (normally the kube-dns ClusterIP, see
// ClusterDNS), from inside pod's network namespace (a host-network pod's
// node's), bound to the pod's address of server's family, for name's
// records of the pod's primary family (A or AAAA, as its first address):
// over UDP with an EDNS0 buffer of 4096 bytes, or over TCP, within 2
// seconds. It returns the addresses the answer's CNAME chain leads to,
// sorted; an answer that is not NOERROR, or is truncated, is an error.
func (l *Lab) Resolve(ctx context.Context, pod, name string, tcp bool, server netip.Addr) ([]netip.Addr, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.down {
		return nil, fmt.Errorf("lab %s is down", l.prefix)
	}
	p := l.pods[pod]
	if p == nil {
		return nil, fmt.Errorf("resolving %s: pod %s is not in lab %s", name, pod, l.prefix)
	}
	ns := p.node.ns
	if p.ns != nil {
		ns = p.ns
	}
	qtype := dns.TypeA
	if !p.plan.addrs[0].Is4() {
		qtype = dns.TypeAAAA
	}
	server = server.Unmap()
	src, ok := pick(p.plan.addrs, ipfamily.Of(server))
	if !ok {
		return nil, fmt.Errorf("resolving %s: pod %s has no %s address to ask %s from", name, pod, familyOf(server).name, server)
	}
	network := "udp"
	if tcp {
		network = "tcp"
	}
	dst := netip.AddrPortFrom(server, dnsPort)
	fail := func(err error) error {
		return fmt.Errorf("resolving %s from pod %s: %s %s: %w", name, pod, network, dst, err)
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	conn, err := dialIn(ctx, ns.handle, network, netip.AddrPortFrom(src, 0), dst)
	if err != nil {
		return nil, fail(err)
	}
	defer conn.Close()

	req := new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype)
	if !tcp {
		req.SetEdns0(4096, false)
	}
	client := &dns.Client{Net: network, Timeout: resolveTimeout}
	resp, _, err := client.ExchangeWithConnContext(ctx, req, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, fail(err)
	}
	if resp.Truncated {
		return nil, fail(errors.New("the answer is truncated (TC)"))
	}
	if resp.Rcode != dns.RcodeSuccess {
		return nil, fail(fmt.Errorf("the answer is %s", dns.RcodeToString[resp.Rcode]))
	}
	packed, err := resp.Pack()
	if err != nil {
		return nil, fail(err)
	}
	learned, err := domain.Learn(packed)
	if err != nil {
		return nil, fail(err)
	}
	var out []netip.Addr
	for _, lr := range learned {
		if lr.Addr.Is4() == (qtype == dns.TypeA) {
			out = append(out, lr.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}

// dialIn connects from src inside namespace h to dst: the socket is made
// on a thread in h, and stays there.
func dialIn(ctx context.Context, h netns.NsHandle, network string, src, dst netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{}
	if network == "tcp" {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	} else {
		d.LocalAddr = net.UDPAddrFromAddrPort(src)
	}
	var conn net.Conn
	err := inNetNS(h, func() error {
		var err error
		conn, err = d.DialContext(ctx, network, dst.String())
		return err
	})
	return conn, err
}

// dnsServer answers DNS queries on one address and port of a pod from the
// lab's zone, and netpol's probes there as a probe server would.
type dnsServer struct {
	addr   netip.Addr
	probe  l4.Port
	srv    *dns.Server
	served chan error     // ActivateAndServe's return
	ln     *probeListener // TCP only
}

// serveDNS starts a DNS server inside namespace h for owner (the pod's
// namespace/name, the probes' answer).
func (l *Lab) serveDNS(h netns.NsHandle, owner string, addr netip.Addr, pr l4.Port) (*dnsServer, error) {
	udp := pr.Protocol == corev1.ProtocolUDP
	s := &dnsServer{addr: addr, probe: pr, served: make(chan error, 1)}
	s.srv = &dns.Server{
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
			var resp *dns.Msg
			if z := l.zone.Load(); z != nil {
				resp = z.Answer(req, udp)
			} else { // between a zone's removal and its servers' stop
				resp = new(dns.Msg).SetRcode(req, dns.RcodeServerFailure)
			}
			// Counted before the answer leaves: a client that has it
			// sees it counted.
			l.dnsQueries.Add(1)
			w.WriteMsg(resp)
		}),
		UDPSize: dns.DefaultMsgSize, // requests with EDNS options can exceed 512 bytes
	}
	reply := []byte(owner)
	if udp {
		pc, err := probe.ListenPacket(h, addr, int(pr.Port))
		if err != nil {
			return nil, fmt.Errorf("serving DNS (%s) on %s: %w", pr, addr, err)
		}
		s.srv.PacketConn = &probeConn{PacketConn: pc, reply: reply}
	} else {
		ln, err := probe.Listen(h, addr, int(pr.Port), pr.Protocol)
		if err != nil {
			return nil, fmt.Errorf("serving DNS (%s) on %s: %w", pr, addr, err)
		}
		s.ln = newProbeListener(ln, reply)
		s.srv.Listener = s.ln
	}
	started := make(chan struct{})
	s.srv.NotifyStartedFunc = func() { close(started) }
	go func() { s.served <- s.srv.ActivateAndServe() }()
	select {
	case <-started:
		return s, nil
	case err := <-s.served:
		if s.ln != nil {
			s.ln.Close()
			s.ln.wait()
		} else {
			s.srv.PacketConn.Close()
		}
		return nil, fmt.Errorf("serving DNS (%s) on %s: %w", pr, addr, err)
	}
}

// Stop closes the server's socket and waits for it to finish.
func (s *dnsServer) Stop() error {
	err := s.srv.Shutdown()
	if serveErr := <-s.served; err == nil {
		err = serveErr
	}
	if s.ln != nil {
		s.ln.wait()
	}
	if err != nil {
		return fmt.Errorf("stopping the DNS server (%s) on %s: %w", s.probe, s.addr, err)
	}
	return nil
}

// stopDNS stops every server, returning every error.
func stopDNS(servers []*dnsServer) error {
	var errs []error
	for _, s := range servers {
		errs = append(errs, s.Stop())
	}
	return errors.Join(errs...)
}

// dnsHeaderLen is the size of a DNS header: no query is shorter, and
// netpol's probe datagram ("probe") is.
const dnsHeaderLen = 12

// probeConn hands the DNS server the datagrams that can be queries, and
// answers the others (netpol's probes) with the owner's name, as a probe
// server would.
type probeConn struct {
	net.PacketConn
	reply []byte
}

func (c *probeConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		n, from, err := c.PacketConn.ReadFrom(p)
		if err != nil || n >= dnsHeaderLen {
			return n, from, err
		}
		c.PacketConn.WriteTo(c.reply, from)
	}
}

// probeWait is how long a TCP connection may stay silent before it is
// taken for a probe: a DNS client writes its query as soon as it has
// connected, a probe only reads (and gives up after 300 ms or more).
const probeWait = 100 * time.Millisecond

// probeListener hands the DNS server the TCP connections that send
// something, and answers those that stay silent for probeWait (netpol's
// probes) with the owner's name, as a probe server would.
type probeListener struct {
	inner     net.Listener
	reply     []byte
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // the accept loop and the connections it sorts
}

func newProbeListener(inner net.Listener, reply []byte) *probeListener {
	pl := &probeListener{inner: inner, reply: reply, conns: make(chan net.Conn), closed: make(chan struct{})}
	pl.wg.Go(pl.acceptLoop)
	return pl
}

func (pl *probeListener) acceptLoop() {
	for {
		c, err := pl.inner.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond) // out of descriptors: let clients finish
			continue
		}
		pl.wg.Go(func() { pl.sort(c) })
	}
}

// sort reads the connection's first byte: a DNS client's goes to the
// server with the rest of its stream; silence is a probe's.
func (pl *probeListener) sort(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(probeWait))
	first := make([]byte, 1)
	n, err := c.Read(first)
	if n == 0 {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write(pl.reply)
		}
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	select {
	case pl.conns <- &prefixedConn{Conn: c, prefix: first[:n]}:
	case <-pl.closed:
		c.Close()
	}
}

func (pl *probeListener) Accept() (net.Conn, error) {
	select {
	case c := <-pl.conns:
		return c, nil
	case <-pl.closed:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; wait waits for the connections being sorted.
func (pl *probeListener) Close() error {
	pl.closeOnce.Do(func() {
		close(pl.closed)
		pl.closeErr = pl.inner.Close()
	})
	return pl.closeErr
}

func (pl *probeListener) wait() { pl.wg.Wait() }

func (pl *probeListener) Addr() net.Addr { return pl.inner.Addr() }

// prefixedConn is a connection whose first bytes were read already.
type prefixedConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixedConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// ZoneOf is the zone the lab would serve for snap: ConfigMap
// kube-system/netpol-lab-dns's data.zone, parsed; nil when the state has
// no such ConfigMap.
func ZoneOf(snap *cluster.Snapshot) (*domain.Zone, error) {
	cm := snap.ConfigMap(dnsNamespace, dnsConfigMap)
	if cm == nil {
		return nil, nil
	}
	text, ok := cm.Data[dnsZoneKey]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s/%s: data.%s: missing (the RFC 1035 master file of the lab's DNS)", dnsNamespace, dnsConfigMap, dnsZoneKey)
	}
	zone, err := domain.ParseZone(text)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: data.%s: %w", dnsNamespace, dnsConfigMap, dnsZoneKey, err)
	}
	return zone, nil
}
