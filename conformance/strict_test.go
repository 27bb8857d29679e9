package conformance_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/lab"
)

// A Service in front of x/b for the strict-mode cases (UDP 8080 -> 80,
// both families).
const strictService = `
apiVersion: v1
kind: Service
metadata: {name: svc-b, namespace: x}
spec:
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50, 'fd00:96::50']
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  selector: {pod: b}
  ports:
  - {name: dns, port: 8080, targetPort: 80, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-b-4, namespace: x, labels: {kubernetes.io/service-name: svc-b}}
addressType: IPv4
ports:
- {name: dns, port: 80, protocol: UDP}
endpoints:
- addresses: [10.244.1.11]
  nodeName: node-1
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: x, name: b}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: svc-b-6, namespace: x, labels: {kubernetes.io/service-name: svc-b}}
addressType: IPv6
ports:
- {name: dns, port: 80, protocol: UDP}
endpoints:
- addresses: ['fd00:10:244:1::11']
  nodeName: node-1
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: x, name: b}
`

// Policies the strict-mode cases add to the e2e base.
const (
	// x/b admits ingress from x/c alone.
	npOnlyFromC = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: c}}}]
`
	// x/b admits ingress from pods labelled pod=c of any namespace.
	npFromAnyC = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-any-c, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{namespaceSelector: {}, podSelector: {matchLabels: {pod: c}}}]
`
	// x/b admits ingress from pods labelled pod=a of x.
	npOnlyFromA = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-from-a, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {pod: a}}}]
`
	// x/b admits ingress on its port named serve-80-udp only.
	npNamedPort = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-named, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: serve-80-udp, protocol: UDP}]
`
	// x/b is isolated with no ingress allowed.
	npIsolateB = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-isolated, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  policyTypes: [Ingress]
`
	adminDenyAToB = `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: deny-a-to-b}
spec:
  tier: Admin
  priority: 10
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      podSelector: {matchLabels: {pod: b}}
  ingress:
  - name: from-a
    action: Deny
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
        podSelector: {matchLabels: {pod: a}}
`
	adminAcceptAToB = `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: accept-a-to-b}
spec:
  tier: Admin
  priority: 20
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      podSelector: {matchLabels: {pod: b}}
  ingress:
  - name: from-a
    action: Accept
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
        podSelector: {matchLabels: {pod: a}}
`
	adminPassAToB = `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: pass-a-to-b}
spec:
  tier: Admin
  priority: 5
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      podSelector: {matchLabels: {pod: b}}
  ingress:
  - name: from-a
    action: Pass
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
        podSelector: {matchLabels: {pod: a}}
`
	baselineDenyToB = `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: baseline-deny-to-b}
spec:
  tier: Baseline
  priority: 10
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}
      podSelector: {matchLabels: {pod: b}}
  ingress:
  - name: everyone
    action: Deny
    from:
    - namespaces: {}
`
)

// strictFlow is an open flow of a strict-mode case: from a pod to a pod
// (or to Service svc-b when service), over UDP to the probe servers' port
// or over TCP to an echo server of the test's own, in one family.
type strictFlow struct {
	from, to string
	protocol corev1.Protocol
	port     uint16
	ipv6     bool
	service  bool
}

func (f strictFlow) String() string {
	family, to := "IPv4", f.to
	if f.ipv6 {
		family = "IPv6"
	}
	if f.service {
		to = "svc-b (" + f.to + ")"
	}
	return fmt.Sprintf("%s -> %s %s/%d %s", f.from, to, f.protocol, f.port, family)
}

// strictCase: the flows are opened on before; after is synced; denied
// flows must be ended (and then dropped), kept ones left alone (and
// still answered).
type strictCase struct {
	name          string
	before, after string                  // YAML added to the e2e base
	edit          func(*cluster.Snapshot) // applied to after's snapshot
	denied, kept  []strictFlow
}

const echoPort = 9000 // the TCP echo servers' port (the probe servers close after one answer)

var strictCases = []strictCase{
	{
		name:  "a Deny added",
		after: adminDenyAToB,
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 80},
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 80, ipv6: true},
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort},
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort, ipv6: true},
		},
		kept: []strictFlow{
			{from: "x/c", to: "x/b", protocol: corev1.ProtocolUDP, port: 80},
			{from: "y/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort},
			{from: "x/a", to: "y/b", protocol: corev1.ProtocolUDP, port: 81, ipv6: true},
		},
	},
	{
		name:  "a NetworkPolicy newly isolating a pod",
		after: npOnlyFromC,
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 81},
			{from: "z/c", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort, ipv6: true},
		},
		kept: []strictFlow{
			{from: "x/c", to: "x/b", protocol: corev1.ProtocolUDP, port: 81},
			{from: "x/c", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort, ipv6: true},
		},
	},
	{
		name:   "the last Accept removed",
		before: baselineDenyToB + "---" + adminAcceptAToB,
		after:  baselineDenyToB,
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 80},
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort, ipv6: true},
		},
		kept: []strictFlow{{from: "x/a", to: "y/b", protocol: corev1.ProtocolUDP, port: 80}},
	},
	{
		name:   "a Pass that now hands the flow to a tier that denies",
		before: npIsolateB + "---" + adminAcceptAToB,
		after:  npIsolateB + "---" + adminAcceptAToB + "---" + adminPassAToB,
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 81, ipv6: true},
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort},
		},
		kept: []strictFlow{{from: "y/a", to: "y/b", protocol: corev1.ProtocolUDP, port: 81}},
	},
	{
		name:   "a named port that now resolves elsewhere",
		before: npNamedPort,
		after:  npNamedPort,
		edit: func(s *cluster.Snapshot) {
			// serve-80-udp and serve-81-udp swap numbers: the name now
			// resolves to 81 (the pod serves both).
			for _, c := range podOf(s, "x/b").Spec.Containers {
				for i, p := range c.Ports {
					switch p.Name {
					case "serve-80-udp":
						c.Ports[i].ContainerPort = 81
					case "serve-81-udp":
						c.Ports[i].ContainerPort = 80
					}
				}
			}
		},
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 80},
			{from: "y/c", to: "x/b", protocol: corev1.ProtocolUDP, port: 80, ipv6: true},
		},
		kept: []strictFlow{{from: "x/a", to: "x/c", protocol: corev1.ProtocolUDP, port: 80}},
	},
	{
		name:   "a pod relabelled out of a peer set",
		before: npOnlyFromA,
		after:  npOnlyFromA,
		edit:   func(s *cluster.Snapshot) { podOf(s, "x/a").Labels = map[string]string{"pod": "a-moved"} },
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 80},
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolTCP, port: echoPort, ipv6: true},
		},
		kept: []strictFlow{{from: "x/a", to: "y/b", protocol: corev1.ProtocolUDP, port: 80}},
	},
	{
		name:   "flows through a Service",
		before: strictService,
		after:  strictService + "---" + npFromAnyC,
		// From node-2 the flow is DNATed there and denied on node-1 (the
		// endpoint's); from node-1's y/a both happen on node-1, which
		// must trace the endpoint's tuple, not the Service's.
		denied: []strictFlow{
			{from: "x/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true},
			{from: "y/b", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true, ipv6: true},
			{from: "y/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true},
			{from: "y/a", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true, ipv6: true},
		},
		kept: []strictFlow{
			{from: "x/c", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true},
			{from: "y/c", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true},
			{from: "y/c", to: "x/b", protocol: corev1.ProtocolUDP, port: 8080, service: true, ipv6: true},
		},
	},
}

func podOf(s *cluster.Snapshot, key string) *corev1.Pod {
	for _, p := range s.Pods {
		if p.Namespace+"/"+p.Name == key {
			return p
		}
	}
	panic("no pod " + key)
}

// strictSnapshot is the e2e base with extra's objects (and edit).
func strictSnapshot(t *testing.T, extra string, edit func(*cluster.Snapshot)) *cluster.Snapshot {
	t.Helper()
	snap := baseSnapshot(t, "e2e")
	if extra != "" {
		if report := snap.AddDocuments([]byte(extra), "strict case", false); len(report.Errors) > 0 {
			t.Fatal(report.Errors)
		}
	}
	if edit != nil {
		edit(snap)
	}
	return snap
}

// TestStrictModeEndsDeniedFlows: after each kind of change that can deny
// an open flow, strict mode ends exactly the flows the new tables deny
// (their conntrack entries go, and the next packet is dropped as a new
// connection), TCP and UDP, IPv4 and IPv6, direct and through a Service,
// and leaves the others open. The same change without strict mode
// leaves a denied flow running: what strict mode is for. (SCTP is
// ended the same way, by tuple; this kernel test has no SCTP flow where
// the kernel has no SCTP sockets.)
func TestStrictModeEndsDeniedFlows(t *testing.T) {
	requireRoot(t)
	if ok, why := lab.SCTPSupported(); !ok {
		t.Logf("no SCTP flows in this test: %s", why)
	}
	l := labtest.Up(t, baseSnapshot(t, "e2e"), lab.Options{})
	enf := conformance.NewEnforcer(l)
	defer enf.Close()
	startEchoServers(t, l)
	sport := uint16(41000)
	for _, tc := range strictCases {
		t.Run(tc.name, func(t *testing.T) {
			ended, open := runStrictCase(t, l, enf, tc, &sport)
			t.Logf("ended: %v", ended)
			for _, f := range tc.denied {
				if !slices.ContainsFunc(ended, open[f].is) {
					t.Errorf("%s: not ended (ended: %v)", f, ended)
				}
				if open[f].answers() {
					t.Errorf("%s: still answered after the change", f)
				}
			}
			for _, f := range tc.kept {
				if slices.ContainsFunc(ended, open[f].is) {
					t.Errorf("%s: ended, but the new policy allows it", f)
				}
				if !open[f].answers() {
					t.Errorf("%s: no longer answered", f)
				}
			}
			for _, fl := range ended {
				if !slices.ContainsFunc(append(slices.Clone(tc.denied), tc.kept...), func(f strictFlow) bool { return open[f].is(fl) }) {
					t.Errorf("ended a flow the case did not open: %s", fl)
				}
			}
		})
	}
	// Without strict mode, the first case's flows all go on, the denied
	// ones too.
	t.Run("without strict mode", func(t *testing.T) {
		l := labtest.Up(t, baseSnapshot(t, "e2e"), lab.Options{})
		enf := conformance.NewEnforcer(l)
		enf.NoStrict = true
		defer enf.Close()
		startEchoServers(t, l)
		tc := strictCases[0]
		ended, open := runStrictCase(t, l, enf, tc, &sport)
		t.Logf("control: ended %v, flows %d", ended, len(open))
		if len(ended) > 0 {
			t.Errorf("ended %v with strict mode off", ended)
		}
		for _, f := range slices.Concat(tc.denied, tc.kept) {
			if !open[f].answers() {
				t.Errorf("%s: cut without strict mode: the test cannot tell what strict mode does", f)
			}
		}
	})
}

// runStrictCase syncs tc.before, opens the case's flows (each must be
// answered), syncs tc.after and returns the flows strict mode ended on
// every node, with the open flows.
func runStrictCase(t *testing.T, l *lab.Lab, enf *conformance.Enforcer, tc strictCase, sport *uint16) ([]conntrack.Flow, map[strictFlow]*openFlow) {
	t.Helper()
	if _, err := enf.Sync(strictSnapshot(t, tc.before, nil)); err != nil {
		t.Fatal(err)
	}
	if err := l.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	open := map[strictFlow]*openFlow{}
	for _, f := range slices.Concat(tc.denied, tc.kept) {
		*sport++
		o := openStrictFlow(t, l, f, *sport)
		t.Cleanup(o.close)
		if !o.answers() {
			t.Fatalf("%s: not answered before the change", f)
		}
		open[f] = o
	}
	rep, err := enf.Sync(strictSnapshot(t, tc.after, tc.edit))
	if err != nil {
		t.Fatal(err)
	}
	var ended []conntrack.Flow
	for _, n := range rep.Nodes {
		ended = append(ended, n.Ended...)
	}
	return ended, open
}

// openFlow is a flow the test holds open: answers sends on it again.
type openFlow struct {
	// dst is what the client sent to; endpoint the pod behind it.
	src, dst, endpoint netip.AddrPort
	answers            func() bool
	close              func()
}

// is says whether strict mode's fl is this flow: on the client's node a
// flow through the Service is its endpoint with the Service beside it,
// on the endpoint's node the endpoint alone.
func (o *openFlow) is(fl conntrack.Flow) bool {
	return fl.Src == o.src && fl.Dst == o.endpoint
}

func openStrictFlow(t *testing.T, l *lab.Lab, f strictFlow, sport uint16) *openFlow {
	t.Helper()
	from, to := labPod(t, l, f.from), labPod(t, l, f.to)
	src, dst := podAddr(t, from, f.ipv6), podAddr(t, to, f.ipv6)
	if f.service {
		dst = netip.MustParseAddr("10.96.0.50")
		if f.ipv6 {
			dst = netip.MustParseAddr("fd00:96::50")
		}
	}
	o := &openFlow{src: netip.AddrPortFrom(src, sport), dst: netip.AddrPortFrom(dst, f.port), endpoint: netip.AddrPortFrom(dst, f.port), close: func() {}}
	if f.service {
		o.endpoint = netip.AddrPortFrom(podAddr(t, to, f.ipv6), 80) // svc-b's targetPort
	}
	if f.protocol == corev1.ProtocolUDP {
		// The same source port again is the same conntrack entry.
		o.answers = func() bool {
			obs := l.Dial(context.Background(), f.from, o.dst, corev1.ProtocolUDP, lab.DialOptions{SourcePort: sport, Timeout: time.Second})
			return obs.Allowed
		}
		return o
	}
	var conn net.Conn
	err := nsexec.In(from.Handle, func() error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(o.src)}
		var err error
		conn, err = d.Dial("tcp", o.dst.String())
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	r := bufio.NewReader(conn)
	o.close = func() { conn.Close() }
	o.answers = func() bool {
		conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			return false
		}
		line, err := r.ReadString('\n')
		return err == nil && line == "ping\n"
	}
	return o
}

func labPod(t *testing.T, l *lab.Lab, key string) *lab.Pod {
	t.Helper()
	for _, p := range l.Pods() {
		if p.Name == key {
			return p
		}
	}
	t.Fatalf("no pod %s in the lab", key)
	return nil
}

func podAddr(t *testing.T, p *lab.Pod, ipv6 bool) netip.Addr {
	t.Helper()
	for _, a := range p.Addrs {
		if a.Is6() == ipv6 {
			return a
		}
	}
	t.Fatalf("pod %s has no address of the family", p.Name)
	return netip.Addr{}
}

// startEchoServers serves TCP echoPort on every address of every pod
// (labtest.Echo), until t ends.
func startEchoServers(t *testing.T, l *lab.Lab) {
	t.Helper()
	for _, p := range l.Pods() {
		for _, a := range p.Addrs {
			labtest.Echo(t, p.Handle, a, echoPort)
		}
	}
}
