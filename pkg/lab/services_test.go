package lab

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
)

// webService is y/web in hostnet.yaml's cluster: port 80 to target port
// 8080 of y/b (by targetRef) and x/b (by address alone), NodePort 30080,
// a load-balancer IP and an external IP.
const webService = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: "y"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ipFamilies: [IPv4]
  externalIPs: [192.0.2.60]
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}]
status:
  loadBalancer: {ingress: [{ip: 192.0.2.50}]}
`

const webSlice = `
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: "y", labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.2.21]
  nodeName: node-2
  targetRef: {kind: Pod, namespace: "y", name: b}
- addresses: [10.244.2.11]
  nodeName: node-2
`

func hostnetWithWeb(t *testing.T) *cluster.Snapshot {
	snap := loadBase(t, "hostnet.yaml")
	addYAML(t, snap, webService+"\n---\n"+webSlice)
	return snap
}

// Without any NAT rule: pods serve their slice ports, the outside reaches
// node addresses (host-network servers) and pods, nothing else; Service
// addresses lead nowhere but do not fail fast, and Dial reports sources
// it does not know.
func TestDialWithoutNAT(t *testing.T) {
	l := upLab(t, hostnetWithWeb(t), Options{})
	ext := l.External()
	if got := addrStrings(ext.Addrs); got != "172.18.0.254" {
		t.Errorf("external addresses %s, want 172.18.0.254", got)
	}
	if got := fmt.Sprint(ext.Routes); got != "[{192.0.2.50 node-1 172.18.0.2} {192.0.2.60 node-1 172.18.0.2}]" {
		t.Errorf("external routes %s", got)
	}
	for _, dst := range []string{"192.0.2.50", "192.0.2.60"} {
		routes, err := l.underlay.nl.RouteGet(net.ParseIP(dst))
		if err != nil || len(routes) != 1 || routes[0].Gw.String() != "172.18.0.2" {
			t.Errorf("the underlay's route to %s: %+v, %v; want one via node-1 (172.18.0.2)", dst, routes, err)
		}
	}

	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		from     string
		dst      netip.AddrPort
		protocol corev1.Protocol
		result   []string // any of
		reply    string
		fromAddr string
	}{
		{"x/a", ap("10.244.2.21:8080"), corev1.ProtocolTCP, []string{ResultOK}, "y/b", "10.244.1.10"},
		{"y/a", ap("10.244.2.11:8080"), corev1.ProtocolTCP, []string{ResultOK}, "x/b", "10.244.1.20"},
		{"x/h1", ap("10.244.2.21:8080"), corev1.ProtocolTCP, []string{ResultOK}, "y/b", "172.18.0.2"},
		{NodeSource("node-1"), ap("10.244.2.21:80"), corev1.ProtocolTCP, []string{ResultOK}, "y/b", "172.18.0.2"},
		{ExternalSource, ap("172.18.0.2:80"), corev1.ProtocolTCP, []string{ResultOK}, "x/h1", "172.18.0.254"},
		{ExternalSource, ap("172.18.0.3:81"), corev1.ProtocolUDP, []string{ResultOK}, "y/h2", "172.18.0.254"},
		// The underlay routes pods through their nodes.
		{ExternalSource, ap("10.244.1.10:80"), corev1.ProtocolTCP, []string{ResultOK}, "x/a", "172.18.0.254"},
		{"x/a", ap("10.244.2.21:9999"), corev1.ProtocolTCP, []string{ResultRefused}, "", "10.244.1.10"},
		// No DNAT: Service addresses lead onto the bridge and time out.
		{"x/a", ap("10.96.0.10:80"), corev1.ProtocolTCP, []string{ResultTimeout}, "", "10.244.1.10"},
		{NodeSource("node-1"), ap("10.96.0.10:80"), corev1.ProtocolTCP, []string{ResultTimeout}, "", "172.18.0.2"},
		{ExternalSource, ap("192.0.2.50:80"), corev1.ProtocolTCP, []string{ResultTimeout}, "", "172.18.0.254"},
		// No IPv6 anywhere.
		{ExternalSource, ap("[fd00::1]:80"), corev1.ProtocolTCP, []string{ResultNoAddress}, "", ""},
	} {
		t.Run(fmt.Sprintf("%s->%s/%s", c.from, c.dst, c.protocol), func(t *testing.T) {
			o := l.Dial(t.Context(), c.from, c.dst, c.protocol, DialOptions{Timeout: 300 * time.Millisecond})
			if !slices.Contains(c.result, o.Result) || o.Reply != c.reply || o.Allowed != (o.Result == ResultOK) {
				t.Errorf("%+v; want result %v, reply %q", o, c.result, c.reply)
			}
			if c.fromAddr != "" && o.FromAddr.String() != c.fromAddr {
				t.Errorf("source %s, want %s", o.FromAddr, c.fromAddr)
			}
		})
	}
	o := l.Dial(t.Context(), "nobody/here", ap("10.244.2.21:80"), corev1.ProtocolTCP, DialOptions{})
	if !strings.HasPrefix(o.Result, resultErrorPrefix) || !strings.Contains(o.Result, "nobody/here") {
		t.Errorf("unknown source: %+v, want an error naming it", o)
	}
	for range 2 {
		o := l.Dial(t.Context(), "x/a", ap("10.244.2.21:81"), corev1.ProtocolUDP, DialOptions{SourcePort: 40081})
		if o.Result != ResultOK || o.FromPort != 40081 {
			t.Errorf("from source port 40081: %+v", o)
		}
	}
}

// ProbeServices without NAT: every row is there, in order, and none is
// answered.
func TestProbeServicesWithoutNAT(t *testing.T) {
	l := upLab(t, hostnetWithWeb(t), Options{})
	obs, notes, err := l.ProbeServices(t.Context(), ServiceProbeOptions{Timeout: 200 * time.Millisecond, NoRetry: true})
	if err != nil {
		t.Fatal(err)
	}
	pods := []string{"x/a", "x/b", "x/h1", "y/a", "y/b", "y/h2"}
	var want []string
	for _, p := range pods {
		want = append(want, p+" service/y/web TCP 80 10.96.0.10")
	}
	for _, n := range []string{"node-1 172.18.0.2", "node-2 172.18.0.3"} {
		node, addr, _ := strings.Cut(n, " ")
		for _, p := range append(pods, ExternalSource) {
			want = append(want, fmt.Sprintf("%s nodeport/%s/y/web TCP 30080 %s", p, node, addr))
		}
	}
	var got []string
	for _, o := range obs {
		got = append(got, fmt.Sprintf("%s %s %s %d %s", o.From, o.To, o.Protocol, o.Port, o.ToAddr))
		// Nothing listens on the node port; the ClusterIP leads nowhere.
		want := ResultTimeout
		if strings.HasPrefix(o.To, "nodeport/") {
			want = ResultRefused
		}
		if o.Allowed || o.Result != want || o.Service != "y/web" || o.PortName != "http" {
			t.Errorf("%+v: want %s for y/web's port http", o, want)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(notes) > 0 {
		t.Errorf("notes: %v", notes)
	}
	// IPv6: the Service has no IPv6 ClusterIP.
	obs, notes, err = l.ProbeServices(t.Context(), ServiceProbeOptions{Family: ipfamily.IPv6})
	if err != nil || len(obs) != 0 || !strings.Contains(strings.Join(notes, "\n"), "y/web has no ipv6 ClusterIP") {
		t.Errorf("IPv6: %v, %v, %v; want no rows and a note", obs, notes, err)
	}
}

// Update starts and stops the servers an EndpointSlice asks for without
// recreating the pod, and moves the outside's routes with the Services.
func TestUpdateServicesAndSlices(t *testing.T) {
	base := loadBase(t, "hostnet.yaml")
	l := upLab(t, base, Options{})
	yb := func() string {
		for _, p := range l.Pods() {
			if p.Name == "y/b" {
				return p.NetNS
			}
		}
		return ""
	}
	ns := yb()
	dial := func(want string) {
		t.Helper()
		o := l.Dial(t.Context(), "x/a", netip.MustParseAddrPort("10.244.2.21:8080"), corev1.ProtocolTCP, DialOptions{})
		if o.Result != want {
			t.Errorf("x/a -> y/b tcp/8080: %+v, want %s", o, want)
		}
	}
	dial(ResultRefused)

	if err := l.Update(t.Context(), hostnetWithWeb(t)); err != nil {
		t.Fatalf("Update: %v", err)
	}
	dial(ResultOK)
	if yb() != ns {
		t.Errorf("y/b was recreated (%s -> %s) for a new served port", ns, yb())
	}
	ext := l.External()
	if len(ext.Routes) != 2 || addrStrings(ext.Addrs) != "172.18.0.254" {
		t.Errorf("outside %+v; want 172.18.0.254 and two routes", ext)
	}

	// The load-balancer IP changes; the slice goes.
	next := loadBase(t, "hostnet.yaml")
	addYAML(t, next, strings.ReplaceAll(webService, "192.0.2.50", "192.0.2.51"))
	if err := l.Update(t.Context(), next); err != nil {
		t.Fatalf("Update: %v", err)
	}
	dial(ResultRefused)
	if got := fmt.Sprint(l.External().Routes); !strings.Contains(got, "192.0.2.51") || strings.Contains(got, "192.0.2.50") {
		t.Errorf("routes after the LB IP moved: %s", got)
	}
	if _, err := l.underlay.nl.RouteGet(net.ParseIP("192.0.2.50")); err == nil {
		t.Errorf("the underlay still routes 192.0.2.50")
	}
	if yb() != ns {
		t.Errorf("y/b was recreated for a port it no longer serves")
	}
}

// dualWeb is y/web in dualstack.yaml's cluster, dual-stack, TCP and UDP,
// with x/dual as its only endpoint (IPv4 by targetRef, IPv6 by address);
// and a host-network pod on node-1.
const dualWeb = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: "y"}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00:96::10"]
  ipFamilies: [IPv4, IPv6]
  externalIPs: [192.0.2.60, "2001:db8::60"]
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}
  - {name: dns, port: 53, targetPort: 5353, protocol: UDP, nodePort: 30053}
status:
  loadBalancer: {ingress: [{ip: 192.0.2.50}, {ip: "2001:db8::50"}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-4, namespace: "y", labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- addresses: [10.244.2.50]
  nodeName: node-2
  targetRef: {kind: Pod, namespace: "x", name: dual}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-6, namespace: "y", labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 5353, protocol: UDP}]
endpoints:
- addresses: ["fd00:10:244:2::50"]
  nodeName: node-2
`

// With a stand-in for the proxy's NAT (DNAT to x/dual, SNAT of what was
// DNATed), every Service probe is answered by x/dual, in both families:
// the lab's routes carry ClusterIP, NodePort, load-balancer and external
// IP traffic from pods, host-network pods, nodes and the outside.
func TestServicesThroughNAT(t *testing.T) {
	snap := loadBase(t, "dualstack.yaml")
	addYAML(t, snap, dualWeb+"\n---\n"+
		podYAML("x", "host", "node-1", true, "9080", "9081", "172.18.0.2", "fc00:f853:ccd:e793::2"))
	l := upLab(t, snap, Options{})
	ext := l.External()
	if got := addrStrings(ext.Addrs); got != "172.18.0.254, fc00:f853:ccd:e793:ffff:ffff:ffff:fffe" {
		t.Errorf("external addresses %s", got)
	}
	endpoint := map[bool]netip.Addr{
		true:  netip.MustParseAddr("10.244.2.50"),
		false: netip.MustParseAddr("fd00:10:244:2::50"),
	}
	ports := []struct {
		proto          corev1.Protocol
		port, nodePort uint16
		target         uint16
	}{{corev1.ProtocolTCP, 80, 30080, 8080}, {corev1.ProtocolUDP, 53, 30053, 5353}}
	vips := []string{"10.96.0.10", "fd00:96::10", "192.0.2.50", "2001:db8::50", "192.0.2.60", "2001:db8::60"}
	for _, n := range l.Nodes() {
		var rules []natRule
		for _, p := range ports {
			for _, s := range vips {
				a := netip.MustParseAddr(s)
				rules = append(rules, natRule{a, p.proto, p.port, netip.AddrPortFrom(endpoint[a.Is4()], p.target)})
			}
			for _, a := range n.Addrs {
				rules = append(rules, natRule{a, p.proto, p.nodePort, netip.AddrPortFrom(endpoint[a.Is4()], p.target)})
			}
		}
		installNAT(t, n, rules)
	}

	for _, family := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
		obs, notes, err := l.ProbeServices(t.Context(), ServiceProbeOptions{Family: family})
		if err != nil {
			t.Fatal(err)
		}
		// Sources with an address of the family: 4 (IPv6: 5) pods and
		// x/host; per port a ClusterIP row each, and a NodePort row each
		// and one from outside per node.
		sources := map[ipfamily.Family]int{ipfamily.IPv4: 5, ipfamily.IPv6: 6}[family]
		if want := 2 * (sources + 2*(sources+1)); len(obs) != want {
			t.Errorf("%s: %d rows, want %d", family, len(obs), want)
		}
		for _, o := range obs {
			if !o.Allowed || o.Endpoint != "x/dual" || o.Result != ResultOK {
				t.Errorf("%s: %+v; want an answer from x/dual", family, o)
			}
		}
		if len(obs) > 0 && (obs[0].To != "service/y/web" || obs[0].Protocol != corev1.ProtocolUDP || obs[0].Port != 53) {
			t.Errorf("first row %+v; want the dns port's ClusterIP", obs[0])
		}
		if !strings.Contains(strings.Join(notes, "\n"), "x/six, y/six") && family == ipfamily.IPv4 {
			t.Errorf("notes %v do not name the IPv6-only pods", notes)
		}
	}

	for _, c := range []struct {
		from string
		dst  string
	}{
		{ExternalSource, "192.0.2.50:80"},
		{ExternalSource, "[2001:db8::50]:80"},
		{ExternalSource, "192.0.2.60:53"},
		{ExternalSource, "[2001:db8::60]:53"},
		{NodeSource("node-1"), "10.96.0.10:80"},
		{NodeSource("node-1"), "[fd00:96::10]:53"},
		{NodeSource("node-2"), "[fd00:96::10]:80"},
	} {
		dst := netip.MustParseAddrPort(c.dst)
		proto := corev1.ProtocolTCP
		if dst.Port() == 53 {
			proto = corev1.ProtocolUDP
		}
		o := l.Dial(t.Context(), c.from, dst, proto, DialOptions{Timeout: 2 * time.Second})
		if o.Result != ResultOK || o.Reply != "x/dual" {
			t.Errorf("%s -> %s: %+v; want an answer from x/dual", c.from, c.dst, o)
		}
	}
	for range 2 {
		o := l.Dial(t.Context(), ExternalSource, netip.MustParseAddrPort("[2001:db8::50]:53"), corev1.ProtocolUDP,
			DialOptions{SourcePort: 40053})
		if o.Result != ResultOK || o.FromPort != 40053 || o.FromAddr.String() != "fc00:f853:ccd:e793:ffff:ffff:ffff:fffe" {
			t.Errorf("from [%s]:40053: %+v", ext.Addrs[1], o)
		}
	}
}

// natRule sends dst:port (protocol) to `to`.
type natRule struct {
	dst      netip.Addr
	protocol corev1.Protocol
	port     uint16
	to       netip.AddrPort
}

// installNAT programs a minimal stand-in for the proxy into a node: the
// rules as DNAT in prerouting and output, and SNAT of whatever was
// DNATed to the node's first address of its family in postrouting (so
// replies come back through the node, hairpin included). It tests the
// lab's routing, not the product's NAT.
func installNAT(t *testing.T, n *Node, rules []natRule) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(n.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "labtest"})
	chain := func(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: table, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: prio})
	}
	pre := chain("pre", nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	out := chain("out", nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
	post := chain("post", nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	family := func(a netip.Addr) (nfproto byte, daddrOffset uint32) {
		if a.Is4() {
			return unix.NFPROTO_IPV4, 16
		}
		return unix.NFPROTO_IPV6, 24
	}
	l4 := map[corev1.Protocol]byte{corev1.ProtocolTCP: unix.IPPROTO_TCP, corev1.ProtocolUDP: unix.IPPROTO_UDP}
	for _, r := range rules {
		nfproto, off := family(r.dst)
		exprs := []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: uint32(r.dst.BitLen() / 8)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.dst.AsSlice()},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{l4[r.protocol]}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.port)},
			&expr.Immediate{Register: 1, Data: r.to.Addr().AsSlice()},
			&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.to.Port())},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nfproto), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		}
		c.AddRule(&nftables.Rule{Table: table, Chain: pre, Exprs: exprs})
		c.AddRule(&nftables.Rule{Table: table, Chain: out, Exprs: exprs})
	}
	for _, f := range []bool{true, false} {
		i := slices.IndexFunc(n.Addrs, func(a netip.Addr) bool { return a.Is4() == f })
		if i < 0 {
			continue
		}
		nfproto, _ := family(n.Addrs[i])
		c.AddRule(&nftables.Rule{Table: table, Chain: post, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}},
			&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(1 << 5), // IPS_DST_NAT
				Xor:  binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
			&expr.Immediate{Register: 1, Data: n.Addrs[i].AsSlice()},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: uint32(nfproto), RegAddrMin: 1},
		}})
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("node %s: installing the test NAT: %v", n.Name, err)
	}
}
