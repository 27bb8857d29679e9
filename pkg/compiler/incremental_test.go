package compiler_test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

// TestIncrementalMatchesCompile: on every corpus case (each base cluster with the
// case's objects) and on a synthetic cluster, random changes to pods of
// other nodes (added, deleted, relabelled, moved to another address,
// named ports changed, finished) and to namespace labels are applied both
// to the snapshot and, as Changes, to a Incremental; after each, Incremental's table
// must render exactly as a full compile of the changed snapshot. A change
// to the node's own pods is either programmed the same way or refused
// with a NeedsFullError (then a full compile starts again).
// world is a snapshot the equivalence tests compile every node of.
type world struct {
	name string
	snap *cluster.Snapshot
}

// corpusWorlds are the corpus cases' clusters (their bases with their
// applied policies) and a synthetic 600-pod cluster.
func corpusWorlds(t *testing.T) []world {
	bases, cases := loadCorpus(t)
	var worlds []world
	for _, c := range cases {
		docs := c.AppliedYAML()
		if docs == "" {
			continue
		}
		base := filepath.Join(testdata, "base", c.Base+".yaml")
		if !slices.Contains(bases, base) {
			base = bases[0]
		}
		worlds = append(worlds, world{c.Name, baseWith(t, base, []byte(docs), c.Name)})
	}
	synthetic, err := synth.Snapshot(synth.Spec{Namespaces: 10, Pods: 600, Nodes: 6, NetworkPolicies: 60, AdminPolicies: 8, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	return append(worlds, world{"synth", synthetic})
}

// baseWith is the cluster of the base file with docs, named name, added
// to it (objects of the same name replaced).
func baseWith(t testing.TB, base string, docs []byte, name string) *cluster.Snapshot {
	t.Helper()
	data, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	snap := cluster.New()
	snap.AddDocuments(data, "base", false)
	snap.AddDocuments(docs, name, true)
	return snap
}

// TestResolvedFromPodSequence: the resolution made from a sequence that
// reuses one Pod for every pod (as the agent's full sync does,
// eval.NewFromPods) compiles every node of every world to the table the
// snapshot's own pods give. An index that kept a yielded pod would see
// only the last one.
func TestResolvedFromPodSequence(t *testing.T) {
	compared := 0
	for _, w := range corpusWorlds(t) {
		model := policy.Build(w.snap)
		sorted := slices.SortedFunc(slices.Values(w.snap.Pods), func(a, b *corev1.Pod) int {
			return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
		})
		reused := func(yield func(*corev1.Pod) bool) {
			var pod corev1.Pod
			for _, p := range sorted {
				pod = *p
				if !yield(&pod) {
					return
				}
			}
			pod = corev1.Pod{} // what an index kept would now be empty
		}
		noPods := *w.snap
		noPods.Pods = nil
		for _, n := range w.snap.Nodes {
			opts := compiler.Options{Node: n.Name}
			want, err := compiler.Compile(eval.New(w.snap, model).Resolved(), opts)
			if err != nil {
				t.Fatalf("%s/%s: %v", w.name, n.Name, err)
			}
			got, err := compiler.Compile(eval.NewFromPods(&noPods, model, reused, 0).Resolved(), opts)
			if err != nil {
				t.Fatalf("%s/%s from the sequence: %v", w.name, n.Name, err)
			}
			if d := kernel.Diff(want, got); !d.Empty() {
				t.Errorf("%s/%s: the table from the pod sequence differs: %d operations, the first %v", w.name, n.Name, len(d.Ops), d.Ops[0])
			}
			compared++
		}
	}
	t.Logf("%d node tables compiled from the pod sequence, equal to the snapshot's", compared)
	if compared < 100 {
		t.Fatalf("only %d node tables compared, want at least 100", compared)
	}
}

func TestIncrementalMatchesCompile(t *testing.T) {
	worlds := corpusWorlds(t)
	var stats liveStats
	for wi, w := range worlds {
		for _, n := range w.snap.Nodes {
			t.Run(w.name+"/"+n.Name, func(t *testing.T) {
				liveAgrees(t, w.snap, n.Name, rand.New(rand.NewPCG(uint64(wi), 7)), &stats, worldDNS(wi, w.name))
			})
		}
	}
	t.Logf("%d incremental updates compared with a full compile, %d of them to pods of the node, %d rebased (%d sets kept); %d tables built from pods; %d DNS client elements",
		stats.compared, stats.localIncremental, stats.rebased, stats.kept, stats.fromPods, stats.dnsClients)
	if stats.dnsClients == 0 {
		t.Fatal("no table compared had a DNS client")
	}
	if stats.compared < 1000 || stats.localIncremental < 50 || stats.rebased < 300 || stats.kept < 1000 {
		t.Fatalf("only %d incremental updates (%d to pods of the node, %d rebased keeping %d sets) compared with a full compile, want at least 1,000 (50, 300, 1,000)",
			stats.compared, stats.localIncremental, stats.rebased, stats.kept)
	}
}

// worldDNS gives every other world (and those about domains) the DNS
// objects, whose clients follow the pods and whose servers change once.
func worldDNS(wi int, name string) *compiler.DNS {
	if wi%2 == 1 || strings.Contains(name, "domain") {
		return &compiler.DNS{Queue: nft.QueueXtables, QueueNum: 53, Servers: []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53")}}
	}
	return nil
}

// liveStats counts what liveAgrees compared.
type liveStats struct {
	compared, localIncremental int
	// rebased counts Rebase results compared, kept the sets they took
	// over from the old table; fromPods the tables NewIncrementalFromPods built.
	rebased, kept, fromPods int
	// dnsClients counts the dns-clients elements of the tables compared.
	dnsClients int
}

// liveAgrees runs 30 random changes against one node's Incremental and counts
// the updates it compared with a full compile (and among them those to
// the node's own pods: a pod of the node with the labels and ports of a
// compiled one needs no full compile).
func liveAgrees(t *testing.T, base *cluster.Snapshot, node string, r *rand.Rand, stats *liveStats, dns *compiler.DNS) {
	snap := mutableCopy(base)
	// The agent's models come from a policy.Cache: an unchanged object
	// keeps its policies, whose allow-lists Rebase reuses.
	var models policy.Cache
	model := func() *policy.Model {
		m, _ := models.Build(snap.PolicyObjects(), func(id any) (*cluster.Snapshot, []error) { return snap.PolicyAlone(id), nil })
		return m
	}
	opts := compiler.Options{Node: node, DNS: dns}
	live, err := compiler.NewIncremental(eval.New(&snap, model()).Resolved(), opts)
	if err != nil {
		t.Fatal(err)
	}
	compare(t, live, &snap, opts, "start", stats)
	nsLabels := namespaceLabels(&snap)
	fromPods := func(what string) *compiler.Incremental {
		var pods []*compiler.PodState
		for _, p := range snap.Pods {
			if st := compiler.PodStateOf(p); st != nil {
				pods = append(pods, st)
			}
		}
		l, err := compiler.NewIncrementalFromPods(pods, nsLabels, snap.Nodes, model(), opts)
		if err != nil {
			t.Fatal(err)
		}
		compare(t, l, &snap, opts, what+": built from pods", stats)
		stats.fromPods++
		return l
	}
	fromPods("start")
	for step := range 30 {
		if step == 15 {
			// Go on from a table built from pods.
			live = fromPods(fmt.Sprintf("step %d", step))
		}
		if step == 10 && dns != nil {
			moveDNS(t, live, &opts)
			compare(t, live, &snap, opts, "new DNS servers", stats)
		}
		ch := compiler.Changes{Pods: map[string]*compiler.PodState{}, NamespaceLabels: nsLabels}
		var what string
		var local, policyChange bool
		if r.IntN(5) == 0 {
			what, policyChange = mutatePolicy(&snap, r, step), true
		} else {
			what, local = mutate(&snap, node, r, step, &ch)
		}
		prev := live.Snapshot()
		var prevText bytes.Buffer
		prev.Render(&prevText)
		revisions := map[string]uint64{}
		for name, s := range live.Table().Sets {
			revisions[name] = s.Revision
		}
		var got *nft.Table
		var err error
		if !policyChange {
			got, err = live.Update(ch)
		}
		var full *compiler.NeedsFullError
		switch {
		case policyChange || local && errors.As(err, &full):
			// What only the node's classes' compile builds.
			if got, err = live.Rebase(ch, model(), snap.Nodes); err != nil {
				t.Fatalf("step %d (%s): %v", step, what, err)
			}
			stats.rebased++
			for name, s := range got.Sets {
				if revisions[name] == s.Revision {
					stats.kept++
				}
			}
		case err != nil:
			t.Fatalf("step %d (%s): %v", step, what, err)
		case local:
			stats.localIncremental++
		}
		if got != live.Table() {
			t.Fatalf("step %d (%s): the table returned is not Incremental's", step, what)
		}
		compare(t, live, &snap, opts, fmt.Sprintf("step %d (%s)", step, what), stats)
		var again bytes.Buffer
		prev.Render(&again)
		if again.String() != prevText.String() {
			t.Fatalf("step %d (%s): the update changed an earlier snapshot", step, what)
		}
		stats.compared++
	}
	fromPods("end")
}

// moveDNS moves the cluster DNS to other servers, in live and in opts
// (what a full compile to compare with is given): the servers' sets
// change in place.
func moveDNS(t *testing.T, live interface {
	SetDNSServers([]netip.AddrPort) (*nft.Table, error)
}, opts *compiler.Options) {
	t.Helper()
	servers := []netip.AddrPort{netip.MustParseAddrPort("10.244.9.9:53"), netip.MustParseAddrPort("[fd00::9]:5353")}
	if _, err := live.SetDNSServers(servers); err != nil {
		t.Fatal(err)
	}
	d := *opts.DNS
	d.Servers = servers
	opts.DNS = &d
}

// mutableCopy is base with its own lists of the objects the random
// changes (mutate, mutatePolicy and the identity tests' own) add, delete
// or replace: the objects stay shared, and a change replaces an object by
// a copy.
func mutableCopy(base *cluster.Snapshot) cluster.Snapshot {
	snap := *base
	snap.Pods = slices.Clone(base.Pods)
	snap.Namespaces = slices.Clone(base.Namespaces)
	snap.NetworkPolicies = slices.Clone(base.NetworkPolicies)
	snap.AdminPolicies = slices.Clone(base.AdminPolicies)
	snap.ClusterPolicies = slices.Clone(base.ClusterPolicies)
	snap.BaselinePolicies = slices.Clone(base.BaselinePolicies)
	return snap
}

// namespaceLabels is Changes.NamespaceLabels for snap as it is when called.
func namespaceLabels(snap *cluster.Snapshot) func(string) labels.Set {
	return func(ns string) labels.Set {
		for _, n := range snap.Namespaces {
			if n.Name == ns {
				return compiler.NamespaceLabelsOf(ns, n)
			}
		}
		return compiler.NamespaceLabelsOf(ns, nil)
	}
}

// incrementalTable is Incremental or IdentityIncremental.
type incrementalTable interface {
	Snapshot() *nft.Table
	Table() *nft.Table
}

// compare checks Incremental against a full compile: its snapshot must render
// alike, and its table (elements in any order) must need no change.
func compare(t *testing.T, live incrementalTable, snap *cluster.Snapshot, opts compiler.Options, what string, stats *liveStats) {
	t.Helper()
	got := live.Snapshot()
	want, err := compiler.Compile(eval.New(snap, policy.Build(snap)).Resolved(), opts)
	if err != nil {
		t.Fatal(err)
	}
	var g, w bytes.Buffer
	got.Render(&g)
	want.Render(&w)
	if g.String() != w.String() {
		os.WriteFile("/tmp/got.nft", g.Bytes(), 0o644)
		os.WriteFile("/tmp/want.nft", w.Bytes(), 0o644)
		t.Fatalf("%s: the incremental table differs from a full compile:\n%s", what, lineDiff(w.String(), g.String()))
	}
	if d := kernel.Diff(live.Table(), want); !d.Empty() {
		t.Fatalf("%s: the snapshot renders alike, but the table differs: %d operations", what, len(d.Ops))
	}
	for _, f := range nft.Families {
		if s := want.Sets["dns-clients"+f.Suffix]; s != nil {
			stats.dnsClients += len(s.Elements)
		}
	}
}

// mutate makes one random change to snap, records it in ch, and reports
// what it was and whether it touched the node's own pods.
func mutate(snap *cluster.Snapshot, node string, r *rand.Rand, step int, ch *compiler.Changes) (string, bool) {
	isLocal := func(p *corev1.Pod) bool {
		return compiler.PodStateOf(p) != nil && p.Spec.NodeName == node && !p.Spec.HostNetwork
	}
	record := func(p *corev1.Pod) {
		key := p.Namespace + "/" + p.Name
		if st := compiler.PodStateOf(p); st != nil {
			ch.Pods[key] = st
		} else {
			ch.Pods[key] = nil
		}
	}
	if len(snap.Pods) == 0 || r.IntN(8) == 0 {
		// A namespace's labels: one of the labels policies use, changed.
		if len(snap.Namespaces) == 0 {
			return "nothing", false
		}
		i := r.IntN(len(snap.Namespaces))
		ns := snap.Namespaces[i].DeepCopy()
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		keys := slices.Sorted(maps.Keys(ns.Labels))
		if len(keys) > 0 && r.IntN(2) == 0 {
			k := keys[r.IntN(len(keys))]
			if k != "kubernetes.io/metadata.name" {
				ns.Labels[k] = fmt.Sprintf("v%d", r.IntN(3))
			}
		} else {
			ns.Labels[[]string{"team", "env", "tier"}[r.IntN(3)]] = []string{"a", "dev", "prod", "team-1"}[r.IntN(4)]
		}
		snap.Namespaces[i] = ns
		ch.Namespaces = append(ch.Namespaces, ns.Name)
		local := slices.ContainsFunc(snap.Pods, func(p *corev1.Pod) bool { return p.Namespace == ns.Name && isLocal(p) })
		return "namespace " + ns.Name + " relabelled", local
	}
	i := r.IntN(len(snap.Pods))
	old := snap.Pods[i]
	p := old.DeepCopy()
	var what string
	switch r.IntN(8) {
	case 0: // deleted
		snap.Pods = slices.Delete(snap.Pods, i, i+1)
		ch.Pods[p.Namespace+"/"+p.Name] = nil
		return "pod " + p.Name + " deleted", isLocal(old)
	case 1: // a copy added under a new name, with another address
		p.Name = fmt.Sprintf("%s-copy%d", p.Name, step)
		p.Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 100+r.IntN(3), r.IntN(4), r.IntN(250)+1)
		p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		if r.IntN(3) == 0 {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00:10:%x::%x", r.IntN(4), r.IntN(250)+1)})
		}
		snap.Pods = append(snap.Pods, p)
		record(p)
		return "pod " + p.Name + " added", isLocal(p)
	case 2: // labels
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		others := snap.Pods[r.IntN(len(snap.Pods))].Labels
		if len(others) > 0 && r.IntN(2) == 0 {
			p.Labels = maps.Clone(others)
		} else {
			p.Labels[[]string{"app", "role", "tier"}[r.IntN(3)]] = []string{"a", "b", "web", "db"}[r.IntN(4)]
		}
		what = "pod " + p.Name + " relabelled"
	case 3: // address taken from another pod, or new
		if q := snap.Pods[r.IntN(len(snap.Pods))]; r.IntN(2) == 0 && len(q.Status.PodIPs) > 0 {
			p.Status.PodIP, p.Status.PodIPs = q.Status.PodIP, slices.Clone(q.Status.PodIPs)
		} else {
			p.Status.PodIP = fmt.Sprintf("10.%d.%d.%d", 100+r.IntN(3), r.IntN(4), r.IntN(250)+1)
			p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
		}
		what = "pod " + p.Name + " readdressed"
	case 4: // named container ports
		if len(p.Spec.Containers) == 0 {
			p.Spec.Containers = []corev1.Container{{Name: "c"}}
		}
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: []string{"http", "dns", "serve-80-tcp", "web"}[r.IntN(4)],
			ContainerPort: int32(80 + r.IntN(3)), Protocol: []corev1.Protocol{"", corev1.ProtocolTCP, corev1.ProtocolUDP}[r.IntN(3)]}}
		what = "pod " + p.Name + " ports changed"
	case 5: // finished
		p.Status.Phase = corev1.PodSucceeded
		what = "pod " + p.Name + " finished"
	case 7: // host network on or off (a host-network pod has its node's address)
		p.Spec.HostNetwork = !p.Spec.HostNetwork
		for _, n := range snap.Nodes {
			if n.Name == p.Spec.NodeName && len(n.Status.Addresses) > 0 && p.Spec.HostNetwork {
				p.Status.PodIP = n.Status.Addresses[0].Address
				p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
			}
		}
		what = "pod " + p.Name + " host network switched"
	case 6: // moved to another node (a new pod of the same name)
		if len(snap.Nodes) > 0 {
			p.Spec.NodeName = snap.Nodes[r.IntN(len(snap.Nodes))].Name
		}
		what = "pod " + p.Name + " rescheduled"
	}
	snap.Pods[i] = p
	record(p)
	return what, isLocal(old) || isLocal(p)
}

// mutatePolicy makes one random change to snap's policies: one deleted,
// copied under a new name (a NetworkPolicy, or an admin policy at another
// priority), or changed (a NetworkPolicy's subject moved to the labels of
// some pod, an admin policy's priority); it says what it did.
func mutatePolicy(snap *cluster.Snapshot, r *rand.Rand, step int) string {
	nps, anps, cnps := len(snap.NetworkPolicies), len(snap.AdminPolicies), len(snap.ClusterPolicies)
	if nps+anps+cnps == 0 {
		return "no policy"
	}
	i := r.IntN(nps + anps + cnps)
	op := r.IntN(3)
	switch {
	case i < nps:
		np := snap.NetworkPolicies[i].DeepCopy()
		switch op {
		case 0:
			snap.NetworkPolicies = slices.Delete(snap.NetworkPolicies, i, i+1)
			return "NetworkPolicy " + np.Name + " deleted"
		case 1:
			np.Name = fmt.Sprintf("%s-copy%d", np.Name, step)
			snap.NetworkPolicies = append(snap.NetworkPolicies, np)
			return "NetworkPolicy " + np.Name + " added"
		}
		if other := snap.NetworkPolicies[r.IntN(nps)]; r.IntN(2) == 0 {
			// Another policy's rules under this one's name.
			np.Spec.Ingress, np.Spec.Egress = other.Spec.Ingress, other.Spec.Egress
			snap.NetworkPolicies[i] = np
			return "NetworkPolicy " + np.Name + " has " + other.Name + "'s rules"
		}
		if len(snap.Pods) > 0 {
			np.Spec.PodSelector.MatchLabels = maps.Clone(snap.Pods[r.IntN(len(snap.Pods))].Labels)
			np.Spec.PodSelector.MatchExpressions = nil
		}
		snap.NetworkPolicies[i] = np
		return "NetworkPolicy " + np.Name + " selects other pods"
	case i < nps+anps:
		return mutatePriority(&snap.AdminPolicies, i-nps, op, "AdminNetworkPolicy", func(p *anpv1alpha1.AdminNetworkPolicy) *int32 { return &p.Spec.Priority }, r, step)
	default:
		return mutatePriority(&snap.ClusterPolicies, i-nps-anps, op, "ClusterNetworkPolicy", func(p *cnpv1beta1.ClusterNetworkPolicy) *int32 { return &p.Spec.Priority }, r, step)
	}
}

// mutatePriority deletes the ith of *objs, admin policies of kind (op 0),
// copies it under a new name at a random priority (op 1), or gives it a
// random priority (else); it says what it did.
func mutatePriority[T interface {
	metav1.Object
	DeepCopy() T
}](objs *[]T, i, op int, kind string, priority func(T) *int32, r *rand.Rand, step int) string {
	p := (*objs)[i].DeepCopy()
	switch op {
	case 0:
		*objs = slices.Delete(*objs, i, i+1)
		return kind + " " + p.GetName() + " deleted"
	case 1:
		p.SetName(fmt.Sprintf("%s-copy%d", p.GetName(), step))
		*priority(p) = int32(r.IntN(100))
		*objs = append(*objs, p)
		return kind + " " + p.GetName() + " added"
	}
	*priority(p) = int32(r.IntN(100))
	(*objs)[i] = p
	return kind + " " + p.GetName() + " reprioritised"
}
