package conformance_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/node"
)

// dnsQueueVariants are states of examples/lab-dns.yaml that a sync moves
// between, each rewriting what the DNS answers of x's pods pass through:
// an Admin policy with a domain pattern more (the DNS chains' patterns
// and x's class chains change), a NetworkPolicy isolating x/a (its class
// gets a NetworkPolicy tier), and the file as it is. None denies DNS.
var dnsQueueVariants = []string{"", `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: x-mirror-org}
spec:
  tier: Admin
  priority: 7
  subject:
    namespaces:
      matchLabels: {kubernetes.io/metadata.name: x}
  egress:
  - name: mirror-org
    action: Accept
    to:
    - domainNames: ["mirror.example.org"]
    protocols:
    - tcp: {destinationPort: {number: 443}}
`, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-ingress-80, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress]
  ingress:
  - ports: [{port: 80, protocol: TCP}]
`}

// TestDNSQueueSurvivesSyncs: DNS answers wait in the kernel's queue for
// the node's reader; a sync must not drop them (kube-network-policies
// #402 lost them on every table rebuild). Pods of x resolve names over
// UDP and TCP, four at a time, while both nodes are synced again and
// again between states whose transactions rewrite the chains those
// answers pass (each sync a difference applied, as the agent's: every
// other one a full sync, the others the agent's sync of
// the changed policies, a rebase of the node whose pods they apply to).
// Every resolution must be answered, and the answers must have gone
// through the queue.
func TestDNSQueueSurvivesSyncs(t *testing.T) {
	for _, layout := range []compiler.Layout{compiler.LayoutIdentities, compiler.LayoutAddresses} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) { dnsQueueSurvivesSyncs(t, layout) })
	}
}

func dnsQueueSurvivesSyncs(t *testing.T, layout compiler.Layout) {
	// Strict mode is on, as in the agent, and checks the open flows (the
	// resolutions' thousands of UDP entries among them) at most every
	// 250 ms, as the agent does every second: a check after each of
	// these syncs would leave a tenth of them.
	_, l, enf := domainLabWith(t, layout, domainsFixture, func(e *conformance.Enforcer) { e.StrictInterval = 250 * time.Millisecond }, web)
	snaps := make([]*cluster.Snapshot, len(dnsQueueVariants))
	for i, extra := range dnsQueueVariants {
		snap, report := cluster.LoadPaths([]string{domainsFixture}, nil)
		if extra != "" {
			report = snap.AddDocuments([]byte(extra), fmt.Sprintf("variant %d", i), false)
		}
		if len(report.Errors) > 0 {
			t.Fatal(report.Errors)
		}
		snaps[i] = snap
	}
	queued := func() uint64 {
		var n uint64
		for _, st := range enf.DNSStatus() {
			n += st.QueuePackets
		}
		return n
	}
	before := queued()

	ctx := context.Background()
	stop := make(chan struct{})
	var answered, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	names := []string{"allowed.example.com", "www.example.com", "mirror.example.net", "big.example.com"}
	for w := range 4 {
		wg.Go(func() {
			pod := []string{"x/a", "x/b"}[w%2]
			tcp := w >= 2
			server, ok := l.ClusterDNS(netip.MustParseAddr("10.244.1.10"))
			if !ok {
				firstErr.CompareAndSwap(nil, "no cluster DNS address")
				failed.Add(1)
				return
			}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.Resolve(ctx, pod, names[i%len(names)], tcp, server); err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					failed.Add(1)
					continue
				}
				answered.Add(1)
			}
		})
	}
	// Every other sync is the agent's sync of changed policies (a rebase
	// of the nodes whose pods they apply to, an update of the others),
	// the rest full syncs.
	syncs := 0
	kinds := map[node.SyncKind]int{}
	var syncErr error
	for start := time.Now(); time.Since(start) < 4*time.Second; syncs++ {
		snap := snaps[(syncs+1)%len(snaps)]
		if syncs%2 == 1 {
			got, err := enf.SyncPolicies(snap)
			if syncErr = err; err != nil {
				break
			}
			for _, k := range got {
				kinds[k]++
			}
			continue
		}
		if _, syncErr = enf.Sync(snap); syncErr != nil {
			break
		}
		kinds[node.SyncFull] += 2
	}
	close(stop)
	wg.Wait()
	if syncErr != nil {
		t.Fatalf("sync %d: %v", syncs, syncErr)
	}
	t.Logf("%d syncs (node syncs by kind: %v), %d resolutions answered, %d failed; strict mode traced %d open flows", syncs, kinds, answered.Load(), failed.Load(), enf.StrictChecked)
	if enf.StrictChecked == 0 {
		t.Error("strict mode traced no open flow during the syncs: the test says nothing of it")
	}
	if n := failed.Load(); n > 0 {
		t.Errorf("%d resolutions were not answered while the nodes were synced; the first: %v", n, firstErr.Load())
	}
	if syncs < 10 || kinds[node.SyncRebase] < syncs/4 {
		t.Errorf("%d syncs, by kind %v: the test did not sync and rebase the nodes often enough to say anything", syncs, kinds)
	}
	if answered.Load() < 100 {
		t.Errorf("%d resolutions answered: too few to say anything", answered.Load())
	}
	// Every answer to a pod of x passed the queue on its node.
	if got := queued() - before; got < uint64(answered.Load()) {
		t.Errorf("the queue readers read %d answers, fewer than the %d resolutions answered: answers passed unread", got, answered.Load())
	}
}
