package compiler_test

import (
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"reflect"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

// TestIdentityIncrementalMatchesCompile is TestIncrementalMatchesCompile for the identity
// layout: on every corpus world and a realistic synthetic cluster, random
// pod and namespace changes go to an IdentityIncremental as Changes; each update
// it takes must leave a table that renders exactly as a full compile of
// the changed snapshot with the same numbering, and each it refuses
// (NeedsFullError) is followed, as in the agent, by a new IdentityIncremental.
// Replicas of existing workloads (an identity that exists), the most
// common event of a real cluster, are added often; each must be taken.
func TestIdentityIncrementalMatchesCompile(t *testing.T) {
	var stats identityIncrementalStats
	for wi, w := range identityWorlds(t) {
		for _, n := range w.snap.Nodes {
			t.Run(w.name+"/"+n.Name, func(t *testing.T) {
				// Every other world with the agent's per-rule counters.
				identityIncrementalAgrees(t, w.snap, n.Name, rand.New(rand.NewPCG(uint64(wi), 11)), &stats, worldDNS(wi, w.name), wi%2 == 1 || w.name == "realistic", nil)
			})
		}
	}
	t.Logf("%d updates compared with a full compile (%d to pods of the node, %d replicas, %d namespaces relabelled, %d of them with chains built again, %d with sets swapped, %d numbering a new identity), %d refused, %d policies added, deleted or changed that apply to no pod of the node, %d that do compiled by Rebase (%d refused, %d chains reused); %d DNS client elements",
		stats.updates, stats.local, stats.replicas, stats.relabels, stats.rebuilt, stats.setsSwapped, stats.fresh, stats.refused, stats.unconcerned, stats.rebased, stats.rebaseRefused, stats.reusedChains, stats.dnsClients)
	if stats.updates < 1000 || stats.local < 30 || stats.replicas < 300 || stats.unconcerned < 50 || stats.dnsClients == 0 || stats.relabels < 50 || stats.rebuilt < 10 || stats.setsSwapped == 0 || stats.fresh < 50 || stats.rebased < 300 || stats.reusedChains < 1000 {
		t.Fatalf("too little compared: want at least 1,000 updates, 30 to pods of the node, 300 replicas, 50 unconcerned policies, a DNS client, 50 namespaces relabelled, 10 of them rewriting chains and one swapping sets, 50 new identities, 300 rebases and 1,000 chains they reused")
	}
}

// TestIdentityIncrementalStagedMatchesCompile is TestIdentityIncrementalMatchesCompile
// with a staged policy beside the enforced ones (a copy of one of the
// realistic cluster's Admin policies, which selects pods of every node):
// the updates an IdentityIncremental takes with the shadow evaluation in
// the table (a replica on another node: its pod-ids entries, which both
// evaluations share) leave the table a full compile makes, and it refuses
// the rest (a pod of the node, a new identity, a namespace relabelled).
func TestIdentityIncrementalStagedMatchesCompile(t *testing.T) {
	var stats identityIncrementalStats
	worlds := identityWorlds(t)
	w := worlds[len(worlds)-1]
	m := policy.Build(w.snap)
	var staged *policy.Policy
	for _, p := range m.Policies {
		if p.Tier == policy.TierAdmin {
			staged = p.Renamed("staged-" + p.Name)
			staged.Staged = true
			break
		}
	}
	if staged == nil {
		t.Fatal("no Admin policy to stage")
	}
	shadowed := 0
	for i, n := range w.snap.Nodes {
		t.Run(n.Name, func(t *testing.T) {
			table, err := compiler.Compile(eval.New(w.snap, m).Resolved(), compiler.Options{Node: n.Name, Layout: compiler.LayoutIdentities, Staged: []*policy.Policy{staged}})
			if err != nil {
				t.Fatal(err)
			}
			if table.Chains["staged-forward"] != nil {
				shadowed++
			}
			identityIncrementalAgrees(t, w.snap, n.Name, rand.New(rand.NewPCG(uint64(i), 13)), &stats, nil, true, []*policy.Policy{staged})
		})
	}
	t.Logf("%s staged; %d of %d nodes with a shadow evaluation; %d updates compared with a full compile (%d replicas), %d refused",
		staged.Ref(), shadowed, len(w.snap.Nodes), stats.updates, stats.replicas, stats.refused)
	if shadowed == 0 || stats.replicas < 20 || stats.refused == 0 {
		t.Fatal("too little compared: want a node with a shadow evaluation, 20 replicas taken and one change refused")
	}
}

// identityWorlds are the corpus worlds and a realistic cluster.
func identityWorlds(t *testing.T) []world {
	realistic, err := synth.Snapshot(synth.Spec{Shape: synth.ShapeRealistic, Namespaces: 8, Pods: 600, Nodes: 6, NetworkPolicies: 60, AdminPolicies: 8, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	return append(corpusWorlds(t), world{"realistic", realistic})
}

type identityIncrementalStats struct {
	updates, local, replicas, refused, dnsClients int
	// relabels counts namespaces relabelled (with pods elsewhere) that an
	// update followed; rebuilt those whose update rewrote chains, and
	// setsSwapped those that also added and deleted identity sets.
	relabels, rebuilt, setsSwapped int
	// fresh counts updates that numbered a new identity in place.
	fresh int
	// unconcerned counts policies added, deleted or changed that apply to no pod
	// of the node; rebased those that do, which Rebase followed, and
	// rebaseRefused those it refused.
	unconcerned, rebased, rebaseRefused int
	// reusedChains counts the chains rebases took from the last compile.
	reusedChains int
}

func identityIncrementalAgrees(t *testing.T, base *cluster.Snapshot, node string, r *rand.Rand, stats *identityIncrementalStats, dns *compiler.DNS, counters bool,
	staged []*policy.Policy) {
	snap := mutableCopy(base)
	numbering := &compiler.Identities{}
	opts := compiler.Options{Node: node, DNS: dns, Layout: compiler.LayoutIdentities, Identities: numbering, RuleCounters: counters, Staged: staged}
	// The model from a policy.Cache, as the agent has it: an unchanged
	// policy keeps its *policy.Policy, and Rebase reuses its chains.
	var cache policy.Cache
	model := func() *policy.Model {
		m, problems := cache.Build(snap.PolicyObjects(), func(obj any) (*cluster.Snapshot, []error) { return snap.PolicyAlone(obj), nil })
		if len(problems) > 0 {
			t.Fatal(problems)
		}
		return m
	}
	build := func() *compiler.IdentityIncremental {
		l, err := compiler.NewIdentityIncremental(eval.New(&snap, model()).Resolved(), opts)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	check := func(live *compiler.IdentityIncremental, what string) {
		t.Helper()
		o := opts
		o.Identities = numbering.Clone() // a compile of the same pods keeps it
		var ls liveStats
		compare(t, live, &snap, o, what, &ls)
		stats.dnsClients += ls.dnsClients
	}
	nsLabels := namespaceLabels(&snap)
	live := build()
	check(live, "start")
	for step := range 48 {
		ch := compiler.Changes{Pods: map[string]*compiler.PodState{}, NamespaceLabels: nsLabels}
		var what string
		var local, replica bool
		switch r.IntN(7) {
		case 0, 1:
			what, local, replica = addReplica(&snap, node, r, step, &ch)
		case 5:
			// A namespace takes another's labels (a team's namespace moved
			// to another environment): peers that select namespaces by
			// their labels now hold its identities, or no longer do.
			what, local = relabelLike(&snap, node, r, &ch)
		case 2, 6:
			// A policy is added ahead of the others (the policies are
			// renumbered), deleted, or changed under its name: if it
			// applies to no pod here, the table must not change, chain
			// names included; if it does, Rebase compiles the node's
			// classes again (with a replica added at the same time, now
			// and then), reusing the chains of unchanged policies.
			var pol *policy.Policy
			switch r.IntN(3) {
			case 0:
				var name string
				pol, name = addPolicyFirst(&snap, r, step)
				what = "policy " + name + " added"
			case 1:
				pol, what = deletePolicy(&snap, r)
			default:
				pol, what = widenPolicy(&snap, r)
			}
			if pol == nil {
				continue
			}
			if !live.SelectsLocal(pol.Subject) {
				stats.unconcerned++
				check(live, fmt.Sprintf("step %d (%s)", step, what))
				continue
			}
			if r.IntN(3) == 0 {
				var rep string
				rep, local, _ = addReplica(&snap, node, r, step, &ch)
				what += ", " + rep
			}
			_, err := live.Rebase(ch, model(), snap.Nodes)
			var full *compiler.NeedsFullError
			switch {
			case errors.As(err, &full):
				stats.refused++
				stats.rebaseRefused++
				t.Logf("step %d (%s): rebase refused: %v", step, what, err)
				live = build()
			case err != nil:
				t.Fatalf("step %d (%s): %v", step, what, err)
			default:
				stats.rebased++
				stats.reusedChains += live.ReusedChains()
			}
			check(live, fmt.Sprintf("step %d (%s)", step, what))
			continue
		default:
			what, local = mutate(&snap, node, r, step, &ch)
		}
		if step == 20 && dns != nil {
			moveDNS(t, live, &opts)
		}
		prev, numbered := live.Snapshot(), numbering.Len()
		_, err := live.Update(ch)
		var full *compiler.NeedsFullError
		switch {
		case errors.As(err, &full):
			if replica && !strings.Contains(err.Error(), "named ports") && (staged == nil || !local) {
				// (With staged policies, a pod of the node is a full
				// compile: the shadow evaluation's dispatch.)
				// (A pod in the networks of a rule with named ports is
				// allowed by address: only a full compile places it.)
				t.Fatalf("step %d (%s): a replica of an existing workload was refused: %v", step, what, err)
			}
			if d := kernel.Diff(prev, live.Table()); !d.Empty() {
				t.Fatalf("step %d (%s): a refused update changed the table", step, what)
			}
			stats.refused++
			live = build()
		case err != nil:
			t.Fatalf("step %d (%s): %v", step, what, err)
		default:
			stats.updates++
			if local {
				stats.local++
			}
			if numbering.Len() > numbered {
				stats.fresh++
			}
			if strings.HasPrefix(what, "namespace ") {
				stats.relabels++
				if d := kernel.Diff(prev, live.Table()); d.Stats.ChainsRewritten > 0 {
					stats.rebuilt++
					if d.Stats.SetsAdded > 0 && d.Stats.SetsDeleted > 0 {
						stats.setsSwapped++
					}
				}
			}
			if replica {
				stats.replicas++
				// On another node, a new pod of an existing identity is
				// its pod-ids entry; on its own, its entries in the
				// dispatch, pass, self, DNS and named-port sets too.
				most := 1
				if local {
					most = 12
				}
				d := kernel.Diff(prev, live.Table())
				if w := d.Stats.ElementsAdded + d.Stats.ElementsDeleted; w > most || d.Stats.ChainsRewritten > 0 {
					t.Errorf("step %d (%s): %d element writes and %d chains for a replica, want at most %d and none", step, what, w, d.Stats.ChainsRewritten, most)
				}
			}
		}
		check(live, fmt.Sprintf("step %d (%s)", step, what))
	}
}

// relabelLike gives a namespace another namespace's labels (its own name
// label kept) and says what it did and whether pods of node are in it.
func relabelLike(snap *cluster.Snapshot, node string, r *rand.Rand, ch *compiler.Changes) (string, bool) {
	if len(snap.Namespaces) < 2 {
		return "nothing", false
	}
	i, j := r.IntN(len(snap.Namespaces)), r.IntN(len(snap.Namespaces))
	ns := snap.Namespaces[i].DeepCopy()
	ns.Labels = maps.Clone(snap.Namespaces[j].Labels)
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels["kubernetes.io/metadata.name"] = ns.Name
	snap.Namespaces[i] = ns
	ch.Namespaces = append(ch.Namespaces, ns.Name)
	local := slices.ContainsFunc(snap.Pods, func(p *corev1.Pod) bool {
		return p.Namespace == ns.Name && p.Spec.NodeName == node && !p.Spec.HostNetwork && compiler.PodStateOf(p) != nil
	})
	return "namespace " + ns.Name + " relabelled like " + snap.Namespaces[j].Name, local
}

// addPolicyFirst adds a copy of one of snap's policies under a name that
// sorts before every other, and returns its model policy and name (nil
// when snap has none).
func addPolicyFirst(snap *cluster.Snapshot, r *rand.Rand, step int) (*policy.Policy, string) {
	name := fmt.Sprintf("aaa-%d", step)
	switch n, a, c := len(snap.NetworkPolicies), len(snap.AdminPolicies), len(snap.ClusterPolicies); {
	case c > 0 && r.IntN(2) == 0:
		p := snap.ClusterPolicies[r.IntN(c)].DeepCopy()
		p.Name = name
		snap.ClusterPolicies = append(snap.ClusterPolicies, p)
	case a > 0 && r.IntN(2) == 0:
		p := snap.AdminPolicies[r.IntN(a)].DeepCopy()
		p.Name = name
		snap.AdminPolicies = append(snap.AdminPolicies, p)
	case n > 0:
		p := snap.NetworkPolicies[r.IntN(n)].DeepCopy()
		p.Name = name
		snap.NetworkPolicies = append(snap.NetworkPolicies, p)
	default:
		return nil, ""
	}
	for _, p := range policy.Build(snap).Policies {
		if p.Name == name {
			return p, name
		}
	}
	panic("policy " + name + " not in the model")
}

// deletePolicy deletes one of snap's policies and returns its model
// policy (as it was) and what it did (nil when snap has none).
func deletePolicy(snap *cluster.Snapshot, r *rand.Rand) (*policy.Policy, string) {
	model := policy.Build(snap).Policies
	if len(model) == 0 {
		return nil, ""
	}
	pol := model[r.IntN(len(model))]
	switch pol.Kind {
	case cluster.KindNetworkPolicy:
		snap.NetworkPolicies = slices.DeleteFunc(snap.NetworkPolicies, func(p *networkingv1.NetworkPolicy) bool {
			return p.Namespace == pol.Namespace && p.Name == pol.Name
		})
	case cluster.KindClusterPolicy:
		snap.ClusterPolicies = slices.DeleteFunc(snap.ClusterPolicies, func(p *cnpv1beta1.ClusterNetworkPolicy) bool { return p.Name == pol.Name })
	case cluster.KindBaselinePolicy:
		snap.BaselinePolicies = slices.DeleteFunc(snap.BaselinePolicies, func(p *anpv1alpha1.BaselineAdminNetworkPolicy) bool { return p.Name == pol.Name })
	case cluster.KindAdminPolicy:
		snap.AdminPolicies = slices.DeleteFunc(snap.AdminPolicies, func(p *anpv1alpha1.AdminNetworkPolicy) bool { return p.Name == pol.Name })
	default:
		return nil, ""
	}
	return pol, "policy " + pol.Ref() + " deleted"
}

// widenPolicy replaces one of snap's policies by a copy (same name, same
// subject, same number of rules) whose first rule's peers are every
// namespace, and returns its model policy and what it did (nil when it
// picked a policy without rules): an update that keeps every chain's name.
// The copy is made through the object's unstructured form, where the
// three kinds differ only in the peer field's name.
func widenPolicy(snap *cluster.Snapshot, r *rand.Rand) (*policy.Policy, string) {
	objs := snap.PolicyObjects()
	if len(objs) == 0 {
		return nil, ""
	}
	i := r.IntN(len(objs))
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(objs[i])
	if err != nil {
		panic(err)
	}
	everyNamespace := "namespaces" // AdminNetworkPolicy, ClusterNetworkPolicy
	if _, ok := objs[i].(*networkingv1.NetworkPolicy); ok {
		everyNamespace = "namespaceSelector"
	}
	widened := false
	for _, dir := range [][2]string{{"ingress", "from"}, {"egress", "to"}} {
		if rules, _ := u["spec"].(map[string]any)[dir[0]].([]any); len(rules) > 0 && !widened {
			rules[0].(map[string]any)[dir[1]] = []any{map[string]any{everyNamespace: map[string]any{}}}
			widened = true
		}
	}
	if !widened {
		return nil, ""
	}
	copied := reflect.New(reflect.TypeOf(objs[i]).Elem()).Interface()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, copied); err != nil {
		panic(err)
	}
	switch o := copied.(type) {
	case *networkingv1.NetworkPolicy:
		snap.NetworkPolicies[slices.Index(snap.NetworkPolicies, objs[i].(*networkingv1.NetworkPolicy))] = o
	case *anpv1alpha1.AdminNetworkPolicy:
		snap.AdminPolicies[slices.Index(snap.AdminPolicies, objs[i].(*anpv1alpha1.AdminNetworkPolicy))] = o
	case *anpv1alpha1.BaselineAdminNetworkPolicy:
		snap.BaselinePolicies[slices.Index(snap.BaselinePolicies, objs[i].(*anpv1alpha1.BaselineAdminNetworkPolicy))] = o
	case *cnpv1beta1.ClusterNetworkPolicy:
		snap.ClusterPolicies[slices.Index(snap.ClusterPolicies, objs[i].(*cnpv1beta1.ClusterNetworkPolicy))] = o
	}
	meta := copied.(metav1.Object)
	for _, p := range policy.Build(snap).Policies {
		if p.Namespace == meta.GetNamespace() && p.Name == meta.GetName() && reflect.TypeOf(objs[i]).Elem().Name() == p.Kind {
			return p, "policy " + p.Ref() + " widened"
		}
	}
	panic(meta.GetName() + " not in the model")
}

// addReplica adds a copy of a running pod-network pod under a new name and
// address (a Deployment scaled up): its identity exists. It says what it
// did, whether the copy is on node, and whether it is such a replica (an
// original sharing its address with another pod is no model).
func addReplica(snap *cluster.Snapshot, node string, r *rand.Rand, step int, ch *compiler.Changes) (string, bool, bool) {
	held := map[string]int{}
	for _, p := range snap.Pods {
		if compiler.PodStateOf(p) != nil && !p.Spec.HostNetwork {
			for _, ip := range p.Status.PodIPs {
				held[ip.IP]++
			}
		}
	}
	var models []*corev1.Pod
	for _, p := range snap.Pods {
		if st := compiler.PodStateOf(p); st != nil && !p.Spec.HostNetwork && len(st.Addrs) > 0 &&
			!slices.ContainsFunc(p.Status.PodIPs, func(ip corev1.PodIP) bool { return held[ip.IP] > 1 }) {
			models = append(models, p)
		}
	}
	if len(models) == 0 {
		return "no replica", false, false
	}
	p := models[r.IntN(len(models))].DeepCopy()
	p.Name = fmt.Sprintf("%s-replica%d", p.Name, step)
	p.Status.PodIP = fmt.Sprintf("10.250.%d.%d", step/200, step%200+1)
	p.Status.PodIPs = []corev1.PodIP{{IP: p.Status.PodIP}}
	snap.Pods = append(snap.Pods, p)
	st := compiler.PodStateOf(p)
	ch.Pods[st.Key] = st
	return "replica " + st.Key, st.Node == node, true
}

// inOnePod yields each of pods as one reused Pod with one reused container
// list, as the agent's full sync does (agent.thinPodsInOrder): what the
// representatives' path keeps of a pod must not change with the next.
func inOnePod(pods []*corev1.Pod) iter.Seq[*corev1.Pod] {
	return func(yield func(*corev1.Pod) bool) {
		var pod corev1.Pod
		var containers []corev1.Container
		for _, p := range pods {
			pod = *p
			containers = append(containers[:0], p.Spec.Containers...)
			pod.Spec.Containers = containers
			if !yield(&pod) {
				return
			}
		}
	}
}

// TestIdentityIncrementalFromPods: the table compiled from one pod of each
// identity (NewIdentityIncrementalFromPods, the agent's full path) is the table
// compiled from every pod, on every node of every corpus world and of a
// realistic cluster, with and without the DNS objects.
func TestIdentityIncrementalFromPods(t *testing.T) {
	compared, fewer := 0, 0
	for wi, w := range identityWorlds(t) {
		model := policy.Build(w.snap)
		for _, n := range w.snap.Nodes {
			opts := compiler.Options{Node: n.Name, Layout: compiler.LayoutIdentities, DNS: worldDNS(wi, w.name)}
			opts.Identities = &compiler.Identities{}
			all, err := compiler.NewIdentityIncremental(eval.New(w.snap, model).Resolved(), opts)
			if err != nil {
				t.Fatal(err)
			}
			opts.Identities = &compiler.Identities{}
			reps, err := compiler.NewIdentityIncrementalFromPods(w.snap, model, inOnePod(w.snap.Pods), len(w.snap.Pods), opts)
			if err != nil {
				t.Fatal(err)
			}
			var a, b strings.Builder
			all.Table().Render(&a)
			reps.Table().Render(&b)
			if a.String() != b.String() {
				t.Fatalf("%s/%s: the table from representatives differs:\n%s", w.name, n.Name, lineDiff(a.String(), b.String()))
			}
			compared++
			if reps.ResolvedPods() < len(w.snap.Pods) {
				fewer++
			}
		}
	}
	t.Logf("%d tables compared, %d of them resolved fewer pods than the cluster has", compared, fewer)
	if fewer == 0 {
		t.Fatal("no table was built from fewer pods than the cluster's")
	}
}

// TestRebaseKeepsNoEarlierCompile: the compile a rebase replaces is
// garbage once the rebase is done (a rebase takes the last compile's
// records, not the compile, which held its own predecessor and, through
// the first, the evaluator of the cluster's identities).
func TestRebaseKeepsNoEarlierCompile(t *testing.T) {
	snap, err := synth.Snapshot(synth.Spec{Shape: synth.ShapeRealistic, Namespaces: 6, Pods: 300, Nodes: 3, NetworkPolicies: 30, AdminPolicies: 6, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	model := policy.Build(snap)
	opts := compiler.Options{Node: snap.Nodes[0].Name, Layout: compiler.LayoutIdentities, Identities: &compiler.Identities{}}
	l, err := compiler.NewIdentityIncrementalFromPods(snap, model, slices.Values(snap.Pods), len(snap.Pods), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer goruntime.KeepAlive(l) // the compiles are reachable only through l
	collected := compiler.CompileCollected(l)
	for range 2 {
		if _, err := l.Rebase(compiler.Changes{}, model, snap.Nodes); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		if collected() {
			return
		}
		goruntime.GC()
	}
	t.Fatal("a compile two rebases back is still reachable")
}
