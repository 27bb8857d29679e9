package conformance_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/domain"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

const domainsFixture = "../examples/lab-dns.yaml"

var web = l4.Port{Protocol: corev1.ProtocolTCP, Port: 80}

// domainLab brings up the lab of examples/lab-dns.yaml (a zone served as
// kube-dns's endpoint, its addresses on the outside serving tcp/80) and
// programs its nodes with DNS learning, as the agent does.
func domainLab(t *testing.T) (*cluster.Snapshot, *lab.Lab, *conformance.Enforcer) {
	return domainLabFrom(t, compiler.LayoutAddresses, domainsFixture, web)
}

// domainLabFrom is domainLab for another state file, the outside serving
// ports.
func domainLabFrom(t *testing.T, layout compiler.Layout, path string, ports ...l4.Port) (*cluster.Snapshot, *lab.Lab, *conformance.Enforcer) {
	t.Helper()
	return domainLabWith(t, layout, path, nil, ports...)
}

// domainLabWith is domainLabFrom with the Enforcer configured by
// configure (when not nil) before its first Sync.
func domainLabWith(t *testing.T, layout compiler.Layout, path string, configure func(*conformance.Enforcer), ports ...l4.Port) (*cluster.Snapshot, *lab.Lab, *conformance.Enforcer) {
	t.Helper()
	requireRoot(t)
	snap, report := cluster.LoadPaths([]string{path}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	l := labtest.Up(t, snap, lab.Options{OutsidePorts: ports})
	enf := conformance.NewEnforcer(l)
	enf.DNS = &node.DNSOptions{}
	enf.Layout = layout
	if configure != nil {
		configure(enf)
	}
	t.Cleanup(enf.Close)
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	for name, st := range enf.DNSStatus() {
		if st == nil || st.QueueNum == 0 {
			t.Fatalf("node %s does not learn from DNS: %+v", name, st)
		}
		t.Logf("node %s: %s, queue %d, servers %v, patterns %v", name, st.Queue, st.QueueNum, st.Servers, st.Patterns)
	}
	return snap, l, enf
}

// TestDomainNamesInKernel compares the kernel's domain probes with the
// evaluator's over UDP and TCP DNS: names resolved from inside each pod
// through kube-dns's ClusterIP (netpol's Service NAT), the answers learned
// by the node's agent side from the queue, then a connection to the first
// address. The table covers an exact-and-wildcard pattern
// (*.example.com), a CNAME to a name the pattern does not match
// (www.example.com -> cdn.example.net), a name outside it
// (api.example.org), the apex a wildcard does not match (example.com),
// an exact name (mirror.example.net), two policies whose patterns overlap
// (x/b's www.example.com and *.example.com), a 100-address answer over
// 1,232 bytes, the DNS pod on the client's node and on another.
func TestDomainNamesInKernel(t *testing.T) {
	for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) { domainNamesInKernel(t, layout) })
	}
}

func domainNamesInKernel(t *testing.T, layout compiler.Layout) {
	snap, l, enf := domainLabFrom(t, layout, domainsFixture, web)
	for _, tcp := range []bool{false, true} {
		cells := domainsAgree(t, snap, l, tcp)
		for cell, allowed := range map[string]bool{
			"x/a dns/allowed.example.com": true,
			"x/b dns/allowed.example.com": true, // the DNS pod is on the other node
			"x/a dns/www.example.com":     true, // asked for www.example.com: the CNAME's target is not matched
			// Asked for directly, cdn.example.net teaches nothing; its
			// address was learned through www.example.com.
			"x/a dns/cdn.example.net":                 true,
			"x/a dns/api.example.org":                 false,
			"x/b dns/api.example.org":                 true,  // x/b's own policy
			"x/b dns/www.example.com":                 true,  // both policies' patterns match it
			"x/a dns/example.com":                     false, // *.example.com is not example.com
			"x/a dns/mirror.example.net":              true,  // an exact name
			"x/b dns/big.example.com":                 true,
			"kube-system/coredns dns/api.example.org": true, // no policy selects it
		} {
			if got, ok := cells[cell]; !ok || got != allowed {
				t.Errorf("tcp=%v: %s allowed %v (probed %v), want %v", tcp, cell, got, ok, allowed)
			}
		}
	}
	var learned int
	for _, st := range enf.DNSStatus() {
		learned += int(st.Stats.Known)
		for _, e := range st.Entries {
			// What a pattern learned came from a name it matches: the
			// CNAME's target (cdn.example.net) taught nothing.
			p, err := domain.ParsePattern(e.Pattern)
			if err != nil || !p.Matches(e.Name) || e.Name == "cdn.example.net" {
				t.Errorf("learned %+v: not from a name the pattern matches", e)
			}
		}
		if st.Stats.Errors > 0 {
			t.Errorf("%d answers taught nothing", st.Stats.Errors)
		}
	}
	if learned < 100 {
		t.Errorf("%d addresses learned, want at least big.example.com's 100", learned)
	}
}

// domainsAgree probes the lab's domain rows and requires the evaluator's;
// it returns the kernel's cells ("from to") by allowed.
func domainsAgree(t *testing.T, snap *cluster.Snapshot, l *lab.Lab, tcp bool) map[string]bool {
	t.Helper()
	ev := eval.New(snap, policy.Build(snap))
	ev.LearnDomains(conformance.ZoneOracle(l.Zone()))
	opts := conformance.DomainProbeOptions{Probes: []l4.Port{web}, TCP: tcp}
	want, err := conformance.ExpectedDomains(ev, snap, l.Zone(), opts)
	if err != nil {
		t.Fatal(err)
	}
	got, err := conformance.ProbeDomains(context.Background(), l, opts)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := conformance.CompareDomains(want, got); len(diffs) > 0 {
		t.Fatalf("tcp=%v: the kernel and the evaluator differ:\n%s", tcp, strings.Join(diffs, "\n"))
	}
	cells := map[string]bool{}
	for _, r := range got {
		cells[r.From+" "+r.To] = r.Allowed
	}
	return cells
}

// TestDomainNamesInKernelIPv6: AAAA answers through kube-dns's IPv6
// ClusterIP, learned into the patterns' IPv6 sets, admit IPv6
// connections; a pod whose primary address is IPv4 asks for A records.
func TestDomainNamesInKernelIPv6(t *testing.T) {
	snap, l, enf := domainLabFrom(t, compiler.LayoutAddresses, "testdata/lab-dns-dualstack.yaml", web)
	cells := domainsAgree(t, snap, l, false)
	for cell, allowed := range map[string]bool{
		"x/b dns/allowed.example.com": true, // 2001:db8:113::10
		"x/b dns/v6only.example.com":  true,
		"x/b dns/www.example.com":     true, // AAAA through the CNAME
		"x/b dns/api.example.org":     false,
		"x/a dns/allowed.example.com": true, // A: x/a's primary is IPv4
		"x/a dns/v6only.example.com":  false,
	} {
		if got, ok := cells[cell]; !ok || got != allowed {
			t.Errorf("%s allowed %v (probed %v), want %v", cell, got, ok, allowed)
		}
	}
	var v6 int
	for _, st := range enf.DNSStatus() {
		for _, e := range st.Entries {
			if e.Addr.Is6() {
				v6++
			}
		}
	}
	if v6 == 0 {
		t.Error("no IPv6 address learned")
	}
}

// TestDomainNameExpiresAndSurvivesRestart: an address learned from a
// 2-second answer admits new connections until its TTL runs out and none
// after; while no agent reads the queue DNS works and nothing is learned;
// an address learned before the agent side restarts still admits after
// it, without a new answer.
func TestDomainNameExpiresAndSurvivesRestart(t *testing.T) {
	snap, l, enf := domainLab(t)
	ctx := context.Background()
	const pod = "x/a"
	server, ok := l.ClusterDNS(netip.MustParseAddr("10.244.1.10"))
	if !ok {
		t.Fatal("no cluster DNS address")
	}
	connect := func(addr netip.Addr) lab.Observation {
		return l.Dial(ctx, pod, netip.AddrPortFrom(addr, 80), corev1.ProtocolTCP, lab.DialOptions{Timeout: 500 * time.Millisecond})
	}
	resolve := func(name string) netip.Addr {
		addrs, err := l.Resolve(ctx, pod, name, false, server)
		if err != nil || len(addrs) == 0 {
			t.Fatalf("resolving %s: %v %v", name, addrs, err)
		}
		return addrs[0]
	}

	short := resolve("short.example.com")
	learnedAt := time.Now()
	if o := connect(short); !o.Allowed {
		t.Fatalf("right after the answer: %s", o.Result)
	}
	time.Sleep(time.Until(learnedAt.Add(2500 * time.Millisecond)))
	if o := connect(short); o.Allowed {
		t.Fatal("a new connection 2.5 s after a 2 s answer was admitted")
	}
	resolve("short.example.com")
	if o := connect(short); !o.Allowed {
		t.Fatalf("after a new answer: %s", o.Result)
	}

	// The agent side restarts between resolution and connection: the
	// learned elements stay in the kernel, and a new programmer keeps
	// them through its first sync.
	allowed := resolve("allowed.example.com")
	enf.Close()
	// No reader: answers pass (bypass), DNS keeps working, and nothing is
	// learned, so a name not resolved before admits nothing.
	mirror := resolve("mirror.example.net")
	if o := connect(mirror); o.Allowed {
		t.Fatal("with no agent reading the queue, an address was admitted that nothing learned")
	}
	enf2 := conformance.NewEnforcer(l)
	enf2.DNS = &node.DNSOptions{}
	t.Cleanup(enf2.Close)
	if _, err := enf2.Sync(snap); err != nil {
		t.Fatal(err)
	}
	if o := connect(allowed); !o.Allowed {
		t.Fatalf("after the restart, without a new answer: %s", o.Result)
	}
	if o := connect(netip.MustParseAddr("203.0.113.40")); o.Allowed {
		t.Fatal("api.example.org's address was admitted, never learned for *.example.com")
	}
}

// TestDomainNameEstablishedOutlivesTTL: a connection made while the
// address was learned goes on after the TTL ran out (`ct state
// established` comes first); a new one is denied. UDP, so that a fixed
// source port makes the later datagram part of the same conntrack entry.
func TestDomainNameEstablishedOutlivesTTL(t *testing.T) {
	data, err := os.ReadFile(domainsFixture)
	if err != nil {
		t.Fatal(err)
	}
	const tcp80 = "      - tcp: {destinationPort: {number: 80}}\n"
	text := string(data)
	if !strings.Contains(text, tcp80) {
		t.Fatalf("%s no longer has the line %q", domainsFixture, tcp80)
	}
	text = strings.Replace(text, tcp80, tcp80+"      - udp: {destinationPort: {number: 80}}\n", 1)
	path := filepath.Join(t.TempDir(), "lab-dns-udp.yaml")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	udp80 := l4.Port{Protocol: corev1.ProtocolUDP, Port: 80}
	_, l, _ := domainLabFrom(t, compiler.LayoutAddresses, path, web, udp80)
	ctx := context.Background()
	server, _ := l.ClusterDNS(netip.MustParseAddr("10.244.1.10"))
	addrs, err := l.Resolve(ctx, "x/a", "short.example.com", false, server)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("resolving: %v %v", addrs, err)
	}
	learnedAt := time.Now()
	dial := func(sport uint16) lab.Observation {
		return l.Dial(ctx, "x/a", netip.AddrPortFrom(addrs[0], 80), corev1.ProtocolUDP, lab.DialOptions{Timeout: 500 * time.Millisecond, SourcePort: sport})
	}
	if o := dial(40123); !o.Allowed {
		t.Fatalf("before the TTL ran out: %s", o.Result)
	}
	time.Sleep(time.Until(learnedAt.Add(2500 * time.Millisecond)))
	if o := dial(40124); o.Allowed {
		t.Fatal("a new flow 2.5 s after a 2 s answer was admitted")
	}
	if o := dial(40123); !o.Allowed {
		t.Fatalf("the flow made before the TTL ran out was cut: %s", o.Result)
	}
}
