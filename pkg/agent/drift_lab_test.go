package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/nftables"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/proxy"
)

// labAgent runs the agent's loop for one lab node: fake API clients, the
// real kernel of the node's namespace.
func labAgent(t *testing.T, snap *cluster.Snapshot, n *lab.Node, period time.Duration) *Agent {
	t.Helper()
	kube := kubefake.NewClientset(apiObjects(snap)...)
	kube.Discovery().(*fakediscovery.FakeDiscovery).Resources = nil
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvrCRD: "CustomResourceDefinitionList"})
	opts := Options{NodeName: n.Name, NoStatus: true, ResyncPeriod: period, MinSyncInterval: 10 * time.Millisecond}
	opts.defaults()
	prog, err := node.New(programmerOptions(opts, n.Handle))
	if err != nil {
		t.Fatal(err)
	}
	a := newAgent(opts, kube, dyn, prog)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent %s: %v", n.Name, err)
		}
	})
	return a
}

func readTable(t *testing.T, n *lab.Node, table string) *nft.Table {
	t.Helper()
	got, err := kernel.Read(int(n.Handle), table)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// e2eLab brings up a lab of testdata/base/e2e.yaml with docs (YAML)
// added, taken down at the end of the test.
func e2eLab(t *testing.T, docs string) (*cluster.Snapshot, *lab.Lab) {
	t.Helper()
	snap := loadSnapshot(t, "e2e.yaml")
	if r := snap.AddDocuments([]byte(docs), "test", true); len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	l := labtest.Up(t, snap, lab.Options{})
	return snap, l
}

// TestResyncRepairsTamperedLab: agents program a lab's two nodes; each of
// four changes made to node-1's tables behind the agent's back (a rule
// deleted, an element added, a NAT chain flushed, `nft flush ruleset`) is
// repaired within the resync period, and real probes agree with the
// evaluator afterwards.
func TestResyncRepairsTamperedLab(t *testing.T) {
	kerneltest.Require(t, "it creates network namespaces")
	const period = time.Second
	snap, l := e2eLab(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-from-y, namespace: "y"}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}}]}]
`)
	for _, n := range l.Nodes() {
		labAgent(t, snap, n, period)
	}
	n1 := l.Node("node-1")
	// The agents learn domainNames from DNS (the default): their tables
	// have the queue chains, with the statement this kernel takes.
	queue, err := kernel.DetectQueue(int(n1.Handle))
	if err != nil {
		t.Fatal(err)
	}
	want, err := compiler.Compile(node.Prepare(snap).Resolved, compiler.Options{Node: "node-1",
		DNS: &compiler.DNS{Queue: queue, QueueNum: node.DefaultDNSQueue}})
	if err != nil {
		t.Fatal(err)
	}
	policyOK := func() bool {
		got := readTable(t, n1, compiler.DefaultTable)
		return got != nil && kernel.Diff(got, want).Empty()
	}
	waitFor := func(what string, timeout time.Duration, cond func() bool) time.Duration {
		t.Helper()
		return waitUntil(t, what, timeout, 10*time.Millisecond, cond)
	}
	waitFor("node-1's policy table", 10*time.Second, policyOK)
	var natWant *nft.Table
	waitFor("node-1's NAT table", 10*time.Second, func() bool {
		natWant = readTable(t, n1, proxy.DefaultTable)
		return natWant != nil
	})
	natOK := func() bool {
		got := readTable(t, n1, proxy.DefaultTable)
		return got != nil && kernel.Diff(got, natWant).Empty()
	}
	probes := []l4.Port{{Protocol: "TCP", Port: 80}}
	agree := func(when string) {
		t.Helper()
		expected := eval.New(snap, node.Prepare(snap).Model).TruthTable(eval.TruthTableOptions{Probes: probes})
		if err := l.FlushConntrack(); err != nil {
			t.Fatal(err)
		}
		got, _, err := l.Probe(context.Background(), lab.ProbeOptions{Probes: probes})
		if err != nil {
			t.Fatal(err)
		}
		if diffs := differences(expected, got); len(got.Results) != len(expected.Results) || len(diffs) > 0 {
			t.Fatalf("%s: the kernel disagrees with the evaluator (%d vs %d cells): %v", when, len(got.Results), len(expected.Results), diffs)
		}
	}
	time.Sleep(200 * time.Millisecond) // node-2's agent
	agree("before tampering")

	conn, err := nftables.New(nftables.WithNetNSFd(int(n1.Handle)), nftables.AsLasting())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseLasting()
	policyTable := &nftables.Table{Name: compiler.DefaultTable, Family: nftables.TableFamilyINet}
	natTable := &nftables.Table{Name: proxy.DefaultTable, Family: nftables.TableFamilyINet}
	tamperings := []struct {
		name  string
		do    func()
		check func() bool
	}{
		{"policy rule deleted", func() {
			rules, err := conn.GetRules(policyTable, &nftables.Chain{Name: "forward", Table: policyTable})
			if err != nil || len(rules) == 0 {
				t.Fatalf("rules of forward: %v", err)
			}
			conn.DelRule(rules[len(rules)-1])
		}, policyOK},
		{"policy element added", func() {
			for name, s := range want.Sets {
				if len(s.Fields) == 1 && s.Fields[0] == nft.FieldIPv4 && !s.Interval && !s.IsMap() {
					conn.SetAddElements(&nftables.Set{Table: policyTable, Name: name, KeyType: nftables.TypeIPAddr},
						[]nftables.SetElement{{Key: []byte{10, 99, 99, 99}}})
					return
				}
			}
			t.Fatal("no plain IPv4 set in the policy table")
		}, policyOK},
		{"NAT chain flushed", func() {
			conn.FlushChain(&nftables.Chain{Name: "nat-prerouting", Table: natTable})
		}, natOK},
		{"nft flush ruleset", func() { conn.FlushRuleset() }, func() bool { return policyOK() && natOK() }},
	}
	for _, tc := range tamperings {
		t.Run(tc.name, func(t *testing.T) {
			tc.do()
			if err := conn.Flush(); err != nil {
				t.Fatal(err)
			}
			if tc.check() {
				t.Fatal("the tampering changed nothing")
			}
			took := waitUntil(t, "repair", period+time.Second, 10*time.Millisecond, tc.check)
			t.Logf("repaired after %v (--resync-period %v)", took.Round(time.Millisecond), period)
		})
	}
	agree("after the repairs")
}

// differences lists the cells where observed differs from expected.
func differences(expected, observed *eval.TruthTable) []string {
	type cell struct {
		from, to string
		probe    l4.Port
	}
	want := map[cell]bool{}
	for _, r := range expected.Results {
		want[cell{r.From, r.To, l4.Port{Protocol: r.Protocol, Port: r.Port}}] = r.Allowed
	}
	var out []string
	for _, r := range observed.Results {
		c := cell{r.From, r.To, l4.Port{Protocol: r.Protocol, Port: r.Port}}
		if w, ok := want[c]; !ok || w != r.Allowed {
			out = append(out, fmt.Sprintf("%s -> %s %s: kernel %v, evaluator %v", r.From, r.To, c.probe, r.Allowed, w))
		}
	}
	return out
}

// TestDebugDNS: an agent on a lab node says at /debug/dns which queue
// statement its kernel took and what it learned, and its metrics carry
// the DNS counts.
func TestDebugDNS(t *testing.T) {
	kerneltest.Require(t, "it creates network namespaces")
	snap, l := e2eLab(t, "")
	a := labAgent(t, snap, l.Node("node-1"), time.Minute)
	// Ready first: an agent stopped before its caches synced fails its
	// Run, which the cleanup reports (seen under a loaded make test).
	for deadline := time.Now().Add(30 * time.Second); !a.ready.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent was not ready within 30s")
		}
	}
	rec := httptest.NewRecorder()
	a.debugMux().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/dns", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/debug/dns: %d %s", rec.Code, rec.Body)
	}
	var st node.DNSStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	queue, err := kernel.DetectQueue(int(l.Node("node-1").Handle))
	if err != nil {
		t.Fatal(err)
	}
	if st.Queue != queue.String() || st.QueueNum != node.DefaultDNSQueue {
		t.Errorf("/debug/dns says queue %q %d, want %q %d", st.Queue, st.QueueNum, queue, node.DefaultDNSQueue)
	}
	families, err := a.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, f := range families {
		found[f.GetName()] = true
	}
	for _, name := range []string{"netpol_dns_answers_total", "netpol_dns_addresses", "netpol_dns_queue_packets_total"} {
		if !found[name] {
			t.Errorf("metric %s missing", name)
		}
	}
}
