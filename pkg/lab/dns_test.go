package lab

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
)

// dnsConfigMapYAML is ConfigMap kube-system/netpol-lab-dns holding zone.
func dnsConfigMapYAML(zone string) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: netpol-lab-dns, namespace: kube-system}\ndata:\n  zone: |\n")
	for _, line := range strings.Split(strings.TrimSuffix(zone, "\n"), "\n") {
		b.WriteString("    " + line + "\n")
	}
	return b.String()
}

// Planning the DNS server needs no root: planNodes' cluster with
// kube-dns's endpoints kube-system/coredns (ready) and coredns-old (not).
const planDNSService = `
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
`

const planDNSSlice = `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
endpoints:
- addresses: [10.244.0.53]
  conditions: {ready: true}
- addresses: [10.244.0.54]
  conditions: {ready: false}
`

const planDNSZone = `$TTL 60
allowed.example.com. A 203.0.113.10
www.example.com. CNAME cdn.example.net.
cdn.example.net. A 203.0.113.20
v6.example.com. AAAA 2001:db8:113::10
`

func TestPlanDNS(t *testing.T) {
	coredns := podYAML("kube-system", "coredns", "a", false, "8080", "8081", "10.244.0.53")
	old := podYAML("kube-system", "coredns-old", "a", false, "8080", "8081", "10.244.0.54")
	client := podYAML("x", "c", "b", false, "80", "81", "10.244.1.7")
	base := []string{planDNSService, planDNSSlice, coredns, old, client}
	withZone := func(zone string, docs ...string) []string {
		return append(slices.Clone(docs), dnsConfigMapYAML(zone))
	}
	const what = "ConfigMap kube-system/netpol-lab-dns: "
	for _, c := range []struct {
		name    string
		docs    []string
		outside []netip.Addr
		err     string
		// with no error: the DNS pods' dns ports, the servers, br0's
		// addresses
		dns      map[string]string
		servers  string
		external string
	}{
		{name: "no zone", docs: base,
			dns: map[string]string{"kube-system/coredns": "[]"}, external: "10.0.0.254"},
		{name: "served by the ready endpoint", docs: withZone(planDNSZone, base...),
			dns:     map[string]string{"kube-system/coredns": "[tcp/53 udp/53]", "kube-system/coredns-old": "[]", "x/c": "[]"},
			servers: "10.244.0.53", external: "10.0.0.254, 203.0.113.10, 203.0.113.20, 2001:db8:113::10"},
		{name: "a zone address where the outside's would be", docs: withZone("a. 60 A 10.0.0.254\n", base...),
			dns: map[string]string{"kube-system/coredns": "[tcp/53 udp/53]"}, servers: "10.244.0.53", external: "10.0.0.253, 10.0.0.254"},
		{name: "the pinned outside address", docs: withZone("a. 60 A 192.0.2.10\n", base...),
			outside: []netip.Addr{netip.MustParseAddr("192.0.2.10")},
			dns:     map[string]string{"kube-system/coredns": "[tcp/53 udp/53]"}, servers: "10.244.0.53", external: "192.0.2.10"},
		{name: "a host-network endpoint by targetRef",
			docs: withZone(planDNSZone, planDNSService, strings.Replace(planDNSSlice, "- addresses: [10.244.0.53]",
				"- addresses: [10.0.0.1]\n  targetRef: {kind: Pod, namespace: kube-system, name: host}", 1),
				podYAML("kube-system", "host", "a", true, "8080", "8081", "10.0.0.1")),
			dns: map[string]string{"kube-system/host": "[tcp/53 udp/53]"}, servers: "10.0.0.1",
			external: "10.0.0.254, 203.0.113.10, 203.0.113.20, 2001:db8:113::10"},
		{name: "a bad zone", docs: withZone("$TTL 60\nwww.example.com. MX 10 mail.example.com.\n", base...),
			err: what + "data.zone: line 2: www.example.com.: a MX record; the zone serves A, AAAA and CNAME records only"},
		{name: "a zone that does not parse", docs: withZone("$TTL 60\n\nwww.example.com. A 192.0.2\n", base...),
			err: what + `data.zone: line 3: bad A A: "192.0.2"`},
		{name: "no data.zone", docs: append(slices.Clone(base), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: netpol-lab-dns, namespace: kube-system}\ndata: {zones: x}\n"),
			err: what + "data.zone: missing"},
		{name: "no kube-dns Service", docs: withZone(planDNSZone, planDNSSlice, coredns),
			err: what + "the lab serves the zone as the endpoints of Service kube-system/kube-dns, which the state lacks"},
		{name: "no ready endpoint", docs: withZone(planDNSZone, planDNSService, planDNSSlice, old),
			err: what + "Service kube-system/kube-dns has no ready endpoint on a UDP or TCP port that is a pod of the lab"},
		{name: "no EndpointSlice", docs: withZone(planDNSZone, planDNSService, coredns),
			err: what + "Service kube-system/kube-dns has no ready endpoint"},
		{name: "a node's address", docs: withZone("node.example.com. 60 A 203.0.113.2\n", base...),
			err: what + "data.zone: node.example.com's address 203.0.113.2 belongs to node b too"},
		{name: "a pod's address", docs: withZone("pod.example.com. 60 A 10.244.1.7\n", base...),
			err: what + "data.zone: pod.example.com's address 10.244.1.7 belongs to pod x/c too"},
		{name: "a Service's address", docs: withZone("svc.example.com. 60 A 10.96.0.10\n", base...),
			err: what + "data.zone: svc.example.com's address 10.96.0.10 belongs to Service kube-system/kube-dns too"},
		{name: "a link-local address", docs: withZone("ll.example.com. 60 AAAA fe80::1\n", base...),
			err: what + "data.zone: ll.example.com's address fe80::1 is a link-local address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			snap := cluster.New()
			addYAML(t, snap, strings.Join(append([]string{planNodes}, c.docs...), "\n---\n"))
			p, err := makePlan(snap, Options{Outside: c.outside}, nil)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("makePlan: %v; want an error with %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("makePlan: %v", err)
			}
			for _, pp := range p.pods {
				if want, ok := c.dns[pp.key]; ok && fmt.Sprint(pp.dns) != want {
					t.Errorf("%s: dns %v, want %s (serves %v)", pp.key, pp.dns, want, pp.serves)
				}
				if len(pp.dns) > 0 && !slices.Contains(pp.serves, pp.dns[0]) {
					t.Errorf("%s: dns %v not among serves %v", pp.key, pp.dns, pp.serves)
				}
				if got := fmt.Sprint(pp.probeServes()); len(pp.dns) > 0 && strings.Contains(got, "/53") {
					t.Errorf("%s: probe servers on %s, dns %v", pp.key, got, pp.dns)
				}
			}
			servers := ""
			if p.dns != nil {
				servers = addrStrings(p.dns.servers)
			}
			if servers != c.servers {
				t.Errorf("servers %q, want %q", servers, c.servers)
			}
			if got := addrStrings(p.outsideAddrs()); got != c.external {
				t.Errorf("outside addresses %s, want %s", got, c.external)
			}
			if got := addrStrings(p.clusterDNS); got != "10.96.0.10" {
				t.Errorf("clusterDNS %s", got)
			}
			// Every node routes every outside address of its families.
			for _, n := range p.nodes {
				routes := routeStrings(p.outsideRoutes(n))
				for _, a := range p.outsideAddrs() {
					if _, ok := n.addrOf(familyOf(a)); ok && !strings.Contains(routes, hostPrefix(a).String()) {
						t.Errorf("node %s has no route to %s: %s", n.name, a, routes)
					}
				}
			}
		})
	}
}

// dnsState is dualstack.yaml's cluster with a dual-stack CoreDNS on
// node-1 behind Service kube-system/kube-dns.
const dnsState = `
apiVersion: v1
kind: Namespace
metadata: {name: kube-system}
---
apiVersion: v1
kind: Pod
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  nodeName: node-1
  containers:
  - name: coredns
    ports:
    - {name: dns, containerPort: 53, protocol: UDP}
    - {name: dns-tcp, containerPort: 53, protocol: TCP}
status:
  phase: Running
  podIP: 10.244.1.53
  podIPs: [{ip: 10.244.1.53}, {ip: "fd00:10:244:1::53"}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: PreferDualStack
  ports:
  - {name: dns, port: 53, targetPort: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 53, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-v4, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
endpoints:
- addresses: [10.244.1.53]
  conditions: {ready: true}
  nodeName: node-1
  targetRef: {kind: Pod, namespace: kube-system, name: coredns}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-v6, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv6
ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53, protocol: TCP}]
endpoints:
- addresses: ["fd00:10:244:1::53"]
  conditions: {ready: true}
  nodeName: node-1
  targetRef: {kind: Pod, namespace: kube-system, name: coredns}
`

// dnsZone has an A name, an AAAA name, a CNAME chain, a CNAME to a name
// the zone lacks, and a name whose 100 A records make an answer of over
// 1,232 bytes.
const dnsZone = `$TTL 300
$ORIGIN example.com.
allowed          A      203.0.113.10
v6               AAAA   2001:db8:113::10
www         60   CNAME  cdn.example.net.
cdn.example.net. 30 A   203.0.113.20
away             CNAME  elsewhere.example.org.
short       2    A      203.0.113.30
$GENERATE 1-100 big 60 A 198.51.100.$
`

func dnsSnapshot(t *testing.T, zone string) *cluster.Snapshot {
	snap := loadBase(t, "dualstack.yaml")
	addYAML(t, snap, dnsState+"\n---\n"+dnsConfigMapYAML(zone))
	return snap
}

func bigAddrs() string {
	var out []string
	for i := 1; i <= 100; i++ {
		out = append(out, fmt.Sprintf("198.51.100.%d", i))
	}
	slices.SortFunc(out, func(a, b string) int { return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b)) })
	return strings.Join(out, ", ")
}

type resolveCase struct {
	pod, name string
	tcp       bool
	server    string
	want      string // addresses, or "error: " and part of the error
}

func checkResolve(t *testing.T, l *Lab, cases []resolveCase) {
	t.Helper()
	for _, c := range cases {
		proto := "udp"
		if c.tcp {
			proto = "tcp"
		}
		t.Run(fmt.Sprintf("%s %s %s@%s", c.pod, c.name, proto, c.server), func(t *testing.T) {
			addrs, err := l.Resolve(t.Context(), c.pod, c.name, c.tcp, netip.MustParseAddr(c.server))
			if want, isErr := strings.CutPrefix(c.want, "error: "); isErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("Resolve = %v, %v; want an error with %q", addrs, err, want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if got := addrStrings(addrs); got != c.want {
				t.Errorf("Resolve = %s, want %s", got, c.want)
			}
		})
	}
}

// The lab serves the zone from the kube-dns endpoint pod, over UDP and
// TCP, on both families, and the zone's addresses are peers outside the
// cluster. No node runs Service NAT here: pods ask the pod directly.
func TestDNSServer(t *testing.T) {
	const v4, v6 = "10.244.1.53", "fd00:10:244:1::53"
	snap := dnsSnapshot(t, dnsZone)
	l := upLab(t, snap, Options{OutsidePorts: mustProbes(t, "tcp/80", "udp/81")})

	if l.Zone() == nil || !slices.Contains(l.Zone().Names(), "www.example.com") {
		t.Fatalf("Zone() = %v", l.Zone())
	}
	if got := addrStrings(l.DNSServers()); got != v4+", "+v6 {
		t.Errorf("DNSServers() = %s", got)
	}
	for of, want := range map[string]string{"10.244.2.50": "10.96.0.10", "fd00:10:244:2::50": "fd00:96::10", "::ffff:10.0.0.1": "10.96.0.10"} {
		if a, ok := l.ClusterDNS(netip.MustParseAddr(of)); !ok || a.String() != want {
			t.Errorf("ClusterDNS(%s) = %s, %v; want %s", of, a, ok, want)
		}
	}
	for _, p := range l.Pods() {
		want := "[]"
		if p.Name == "kube-system/coredns" {
			want = "[tcp/53 udp/53]"
		}
		if got := fmt.Sprint(p.DNS); got != want {
			t.Errorf("pod %s: DNS %s, want %s", p.Name, got, want)
		}
	}
	ext := l.External()
	if len(ext.Zone) != 104 || !slices.Contains(ext.Zone, netip.MustParseAddr("2001:db8:113::10")) ||
		slices.ContainsFunc(ext.Zone, func(a netip.Addr) bool { return slices.Contains(ext.Addrs, a) }) {
		t.Errorf("External().Zone = %v (Addrs %v)", ext.Zone, ext.Addrs)
	}

	before := l.DNSQueries()
	checkResolve(t, l, []resolveCase{
		{"x/dual", "allowed.example.com", false, v4, "203.0.113.10"},
		{"x/dual", "ALLOWED.example.com.", true, v4, "203.0.113.10"},
		{"x/four", "www.example.com", false, v4, "203.0.113.20"},
		{"y/dual", "www.example.com", true, v4, "203.0.113.20"}, // on the DNS pod's node
		{"x/dual", "away.example.com", false, v4, ""},
		{"x/dual", "v6.example.com", false, v4, ""}, // an IPv4 pod asks for A
		{"x/dual6", "v6.example.com", false, v6, "2001:db8:113::10"},
		{"x/dual6", "v6.example.com", true, v4, "2001:db8:113::10"}, // AAAA over IPv4
		{"x/six", "v6.example.com", true, v6, "2001:db8:113::10"},
		{"x/six", "allowed.example.com", false, v6, ""},
		{"x/dual", "big.example.com", false, v4, bigAddrs()}, // over 1,232 bytes, EDNS 4096
		{"x/dual", "big.example.com", true, v4, bigAddrs()},
		{"x/dual", "nope.example.com", false, v4, "error: the answer is NXDOMAIN"},
		{"x/four", "allowed.example.com", false, v6, "error: pod x/four has no IPv6 address"},
		{"x/nobody", "allowed.example.com", false, v4, "error: pod x/nobody is not in lab"},
	})
	if n := l.DNSQueries() - before; n != 13 {
		t.Errorf("%d queries answered, want 13", n)
	}

	// Without EDNS the big answer over UDP is cut, TC set; over TCP whole.
	for _, c := range []struct {
		network string
		tc      bool
		records int
	}{{"udp", true, -1}, {"tcp", false, 100}} {
		conn, err := dialIn(t.Context(), l.pods["x/dual"].ns.handle, c.network,
			netip.MustParseAddrPort("10.244.2.50:0"), netip.MustParseAddrPort(v4+":53"))
		if err != nil {
			t.Fatal(err)
		}
		client := &dns.Client{Net: c.network, Timeout: 2 * time.Second}
		resp, _, err := client.ExchangeWithConnContext(t.Context(), new(dns.Msg).SetQuestion("big.example.com.", dns.TypeA), &dns.Conn{Conn: conn})
		conn.Close()
		if err != nil {
			t.Fatalf("%s: %v", c.network, err)
		}
		if resp.Truncated != c.tc || c.records >= 0 && len(resp.Answer) != c.records || c.records < 0 && len(resp.Answer) >= 100 {
			t.Errorf("%s without EDNS: truncated %v, %d records", c.network, resp.Truncated, len(resp.Answer))
		}
	}

	// The zone's addresses are the outside's: its servers answer there
	// with the address dialed.
	for _, c := range []struct {
		from, dst string
		proto     corev1.Protocol
	}{
		{"x/dual", "203.0.113.10:80", corev1.ProtocolTCP},
		{"x/four", "203.0.113.20:81", corev1.ProtocolUDP},
		{"y/dual", "198.51.100.77:80", corev1.ProtocolTCP},
		{"x/six", "[2001:db8:113::10]:80", corev1.ProtocolTCP},
		{NodeSource("node-2"), "203.0.113.30:80", corev1.ProtocolTCP},
	} {
		dst := netip.MustParseAddrPort(c.dst)
		o := dialRetry(t, l, c.from, dst, c.proto)
		if o.Result != ResultOK || o.Reply != dst.Addr().String() {
			t.Errorf("%s -> %s %s: %+v; want the outside answering %s", c.from, c.dst, c.proto, o, dst.Addr())
		}
	}
	// The DNS server answers probes as the probe server it replaces would.
	for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
		for _, dst := range []string{v4 + ":53", "[" + v6 + "]:53"} {
			o := dialRetry(t, l, "x/dual", netip.MustParseAddrPort(dst), proto)
			if o.Result != ResultOK || o.Reply != "kube-system/coredns" {
				t.Errorf("probe %s %s: %+v", proto, dst, o)
			}
		}
	}
	// So a table reads the DNS pod's ports as the evaluator does (and
	// nobody else serves 53; IPv6-only pods cannot reach its primary).
	probes := mustProbes(t, "udp/53", "tcp/53")
	want := evalTable(snap, eval.TruthTableOptions{Probes: probes})
	got, notes := probeLab(t, l, ProbeOptions{Probes: probes})
	reached := 0
	for i, r := range got.Results {
		w := want.Results[i].Allowed && r.To == "kube-system/coredns"
		if r.Allowed != w {
			t.Errorf("%s -> %s %s/%d: allowed %v, want %v (notes %q)", r.From, r.To, r.Protocol, r.Port, r.Allowed, w, notes)
		}
		if r.Allowed {
			reached++
		}
	}
	if reached != 10 {
		t.Errorf("%d cells reached the DNS pod, want 10 (5 pods with IPv4, 2 ports)", reached)
	}
}

// dialRetry dials once more, with a longer timeout, when the first try
// fails: a lost first packet is not a verdict.
func dialRetry(t *testing.T, l *Lab, from string, dst netip.AddrPort, proto corev1.Protocol) Observation {
	t.Helper()
	o := l.Dial(t.Context(), from, dst, proto, DialOptions{Timeout: 500 * time.Millisecond})
	if o.Result != ResultOK {
		o = l.Dial(t.Context(), from, dst, proto, DialOptions{Timeout: 2 * time.Second})
	}
	return o
}

// Update changes the zone the servers answer from and the outside's
// addresses; without the ConfigMap the pod's probe servers come back;
// Down stops the DNS servers.
func TestDNSUpdate(t *testing.T) {
	const v4 = "10.244.1.53"
	l := upLab(t, dnsSnapshot(t, dnsZone), Options{OutsidePorts: mustProbes(t, "tcp/80")})
	checkResolve(t, l, []resolveCase{{"x/dual", "allowed.example.com", false, v4, "203.0.113.10"}})

	const changed = `$TTL 60
allowed.example.com. A 203.0.113.11
allowed.example.com. A 203.0.113.12
new.example.com.     CNAME allowed.example.com.
`
	if err := l.Update(t.Context(), dnsSnapshot(t, changed)); err != nil {
		t.Fatalf("Update: %v", err)
	}
	checkResolve(t, l, []resolveCase{
		{"x/dual", "allowed.example.com", false, v4, "203.0.113.11, 203.0.113.12"},
		{"x/four", "new.example.com", true, v4, "203.0.113.11, 203.0.113.12"},
		{"x/dual", "big.example.com", false, v4, "error: NXDOMAIN"},
	})
	if got := addrStrings(l.External().Zone); got != "203.0.113.11, 203.0.113.12" {
		t.Errorf("External().Zone = %s after the update", got)
	}
	if o := dialRetry(t, l, "x/dual", netip.MustParseAddrPort("203.0.113.12:80"), corev1.ProtocolTCP); o.Result != ResultOK || o.Reply != "203.0.113.12" {
		t.Errorf("the new zone address: %+v", o)
	}

	// A ConfigMap the lab cannot serve: Update says why.
	bad := dnsSnapshot(t, changed)
	bad.Delete(cluster.ObjectKey{Kind: cluster.KindService, Namespace: "kube-system", Name: "kube-dns"})
	if err := l.Update(t.Context(), bad); err == nil || !strings.Contains(err.Error(), "Service kube-system/kube-dns, which the state lacks") {
		t.Errorf("Update without kube-dns: %v", err)
	}

	// No ConfigMap: no zone, and probe servers on port 53 again.
	plain := dnsSnapshot(t, changed)
	plain.Delete(cluster.ObjectKey{Kind: cluster.KindConfigMap, Namespace: "kube-system", Name: "netpol-lab-dns"})
	if err := l.Update(t.Context(), plain); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if l.Zone() != nil || l.DNSServers() != nil || l.External().Zone != nil {
		t.Errorf("zone %v, servers %v, outside's zone addresses %v; want none", l.Zone(), l.DNSServers(), l.External().Zone)
	}
	if lp := l.pods["kube-system/coredns"]; len(lp.dns) != 0 || len(lp.servers) != 4 {
		t.Errorf("coredns runs %d DNS and %d probe servers; want 0 and 4", len(lp.dns), len(lp.servers))
	}
	for _, proto := range []corev1.Protocol{corev1.ProtocolUDP, corev1.ProtocolTCP} {
		if o := dialRetry(t, l, "x/dual", netip.MustParseAddrPort(v4+":53"), proto); o.Result != ResultOK || o.Reply != "kube-system/coredns" {
			t.Errorf("probe %s: %+v", proto, o)
		}
	}

	// And back: DNS servers replace the probe servers.
	if err := l.Update(t.Context(), dnsSnapshot(t, dnsZone)); err != nil {
		t.Fatalf("Update: %v", err)
	}
	checkResolve(t, l, []resolveCase{{"x/six", "v6.example.com", true, "fd00:10:244:1::53", "2001:db8:113::10"}})
	if err := l.Down(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := l.Resolve(ctx, "x/dual", "allowed.example.com", false, netip.MustParseAddr(v4)); err == nil || !strings.Contains(err.Error(), "down") {
		t.Errorf("Resolve after Down: %v", err)
	}
}

// examples/lab-dns.yaml loads without a note and plans a DNS server on
// its CoreDNS pod.
func TestPlanDNSExample(t *testing.T) {
	snap, report := cluster.LoadPaths([]string{"../../examples/lab-dns.yaml"}, nil)
	if len(report.Errors) > 0 || len(report.Notes) > 0 || len(report.Skipped) > 0 {
		t.Fatalf("errors %v, notes %q, skipped %v", report.Errors, report.Notes, report.Skipped)
	}
	p, err := makePlan(snap, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.dns == nil || addrStrings(p.dns.servers) != "10.244.1.53" || len(p.dns.addrs) != 106 {
		t.Fatalf("dns plan %+v", p.dns)
	}
	for name, want := range map[string]string{
		"allowed.example.com": "203.0.113.10 5m0s", "www.example.com": "203.0.113.20 5m0s",
		"short.example.com": "203.0.113.30 2s", "api.example.org": "203.0.113.40 5m0s",
	} {
		addrs, ttl, _ := p.dns.zone.Lookup(name)
		if got := addrStrings(addrs) + " " + ttl.String(); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	if addrs, ttl, _ := p.dns.zone.Lookup("big.example.com"); len(addrs) != 100 || ttl != time.Minute {
		t.Errorf("big.example.com: %d addresses, TTL %v", len(addrs), ttl)
	}
}
