package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

// TestSyncTablesOnTheirOwn: one table's failure leaves the other synced,
// and only the tables asked for are touched.
func TestSyncTablesOnTheirOwn(t *testing.T) {
	snap, report := cluster.LoadPaths([]string{filepath.Join("..", "..", "testdata", "base", "e2e.yaml")}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	in := Prepare(snap)
	fail := func(*kernel.Plan) error { return errors.New("injected") }
	tests := []struct {
		name                     string
		tables                   Tables
		failPolicy, failServices bool
		wantFailed               Tables
		wantPolicy, wantServices bool // table in the kernel afterwards
	}{
		{"both", All, false, false, 0, true, true},
		{"policy only", Policy, false, false, 0, true, false},
		{"services only", Services, false, false, 0, false, true},
		{"policy fails", All, true, false, Policy, false, true},
		{"services fail", All, false, true, Services, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol, nat := kernel.NewFake("netpol"), kernel.NewFake("netpol-proxy")
			if tt.failPolicy {
				pol.FailWith(fail)
			}
			if tt.failServices {
				nat.FailWith(fail)
			}
			p, err := NewWith(Options{Node: "node-1"}, pol, nat)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			res := p.Sync(in, tt.tables)
			if got := res.Failed(); got != tt.wantFailed {
				t.Errorf("failed tables %v, want %v (%v)", got, tt.wantFailed, res.Err())
			}
			if got := pol.Kernel() != nil; got != tt.wantPolicy {
				t.Errorf("policy table in the kernel: %v, want %v", got, tt.wantPolicy)
			}
			if got := nat.Kernel() != nil; got != tt.wantServices {
				t.Errorf("NAT table in the kernel: %v, want %v", got, tt.wantServices)
			}
		})
	}
}

// TestVerify reports the table changed behind the programmer's back.
func TestVerify(t *testing.T) {
	snap, _ := cluster.LoadPaths([]string{filepath.Join("..", "..", "testdata", "base", "e2e.yaml")}, nil)
	pol, nat := kernel.NewFake("netpol"), kernel.NewFake("netpol-proxy")
	p, err := NewWith(Options{Node: "node-1"}, pol, nat)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Sync(Prepare(snap), All).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := p.Verify(All); d != 0 || err != nil {
		t.Fatalf("Verify after a sync: %v, %v; want nothing", d, err)
	}
	nat.Tamper(func(*nft.Table) *nft.Table { return nil })
	if d, err := p.Verify(All); d != Services || err != nil {
		t.Fatalf("Verify after deleting the NAT table: %v, %v; want services", d, err)
	}
	if err := p.Sync(Prepare(snap), All).Err(); err != nil || nat.Kernel() == nil {
		t.Fatalf("the next sync did not restore the NAT table: %v", err)
	}
}

// TestUpdatePolicy: updatePolicy programs a change to another node's pod
// as a full compile would, without one; a change to a pod of the node asks
// for a full compile; and CheckIncremental notices an incremental table that
// differs from the full compile (here: Incremental told of a deletion the
// snapshot does not have).
func TestUpdatePolicy(t *testing.T) {
	snap, err := synth.Snapshot(synth.Spec{Namespaces: 6, Pods: 300, Nodes: 3, NetworkPolicies: 30, AdminPolicies: 6, Seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	pol := kernel.NewFake("netpol")
	p, err := NewWith(Options{Node: "node-1", NoProxy: true}, pol, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if res := p.Sync(Prepare(snap), Policy); res.Err() != nil {
		t.Fatal(res.Err())
	}
	full := func(s *cluster.Snapshot) *nft.Table {
		t.Helper()
		tab, err := compiler.Compile(Prepare(s).Resolved, compiler.Options{Node: "node-1"})
		if err != nil {
			t.Fatal(err)
		}
		return tab
	}
	// A remote pod whose deletion changes node-1's table.
	var gone *corev1.Pod
	var after *cluster.Snapshot
	for i, pod := range snap.Pods {
		if pod.Spec.NodeName == "node-1" {
			continue
		}
		s := *snap
		s.Pods = slices.Delete(slices.Clone(snap.Pods), i, i+1)
		if !kernel.Diff(full(snap), full(&s)).Empty() {
			gone, after = pod, &s
			break
		}
	}
	if gone == nil {
		t.Fatal("no remote pod matters to node-1's table")
	}
	key := gone.Namespace + "/" + gone.Name
	nsLabels := func(ns string) labels.Set { return compiler.NamespaceLabelsOf(ns, nil) }
	for _, n := range snap.Namespaces {
		if n.Name == gone.Namespace {
			nsLabels = func(string) labels.Set { return compiler.NamespaceLabelsOf(n.Name, n) }
		}
	}
	r := p.updatePolicy(compiler.Changes{Pods: map[string]*compiler.PodState{key: nil}, NamespaceLabels: nsLabels})
	if r.Err != nil || !r.Incremental || r.Stats.Messages == 0 {
		t.Fatalf("updatePolicy: err %v, incremental %v, %d messages; want an incremental transaction", r.Err, r.Incremental, r.Stats.Messages)
	}
	if d := kernel.Diff(pol.Kernel(), full(after)); !d.Empty() {
		t.Fatalf("after the update the kernel differs from a full compile: %d operations", len(d.Ops))
	}
	in := Prepare(after)
	in.CheckIncremental = true
	if res := p.Sync(in, Policy); res.Err() != nil || res.Policy.IncrementalDiffers {
		t.Fatalf("resync: err %v, live differs %v; want agreement", res.Err(), res.Policy.IncrementalDiffers)
	}

	// A pod of node-1 with labels no compiled pod has: its classes are
	// unknown.
	local := slices.IndexFunc(after.Pods, func(p *corev1.Pod) bool { return p.Spec.NodeName == "node-1" })
	relabelled := after.Pods[local].DeepCopy()
	relabelled.Labels = map[string]string{"app": "never-compiled"}
	localKey := relabelled.Namespace + "/" + relabelled.Name
	r = p.updatePolicy(compiler.Changes{Pods: map[string]*compiler.PodState{localKey: compiler.PodStateOf(relabelled)}, NamespaceLabels: nsLabels})
	var needsFull *compiler.NeedsFullError
	if !errors.As(r.Err, &needsFull) {
		t.Fatalf("relabelling node-1's pod %s: err %v, want a NeedsFullError", localKey, r.Err)
	}

	// Incremental is told the pod went while the snapshot brings it back.
	if r := p.updatePolicy(compiler.Changes{Pods: map[string]*compiler.PodState{key: compiler.PodStateOf(gone)}, NamespaceLabels: nsLabels}); r.Err != nil {
		t.Fatal(r.Err)
	}
	in = Prepare(after)
	in.CheckIncremental = true
	if res := p.Sync(in, Policy); !res.Policy.IncrementalDiffers {
		t.Fatal("CheckIncremental did not notice an incremental table that differs from the full compile")
	}
	if d := kernel.Diff(pol.Kernel(), full(after)); !d.Empty() {
		t.Fatalf("after the resync the kernel differs from the full compile: %d operations", len(d.Ops))
	}
}

// TestPolicySyncPaths drives one Programmer per layout through the policy
// table's paths, in order, on the Fake: each step is a full sync or a set
// of changes (SyncPolicyChanges, which decides the kind of sync), and says
// which kind it must take (a full sync, an update, a rebase, a refusal
// that leaves the kernel alone for a full sync to follow, or a
// transaction the kernel fails); the kernel must then hold what a full
// compile of the state gives (with the numbering the Programmer kept).
func TestPolicySyncPaths(t *testing.T) {
	base, err := synth.Snapshot(synth.Spec{Shape: synth.ShapeRealistic, Namespaces: 6, Pods: 300, Nodes: 3, NetworkPolicies: 30, AdminPolicies: 6, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	node := base.Nodes[0].Name
	const (
		full        = "full"
		incremental = "incremental"
		rebase      = "rebase"
		refused     = "refused"     // SyncFull from SyncPolicyChanges: nothing sent
		failed      = "apply fails" // the kernel keeps its table
	)
	for _, layout := range []compiler.Layout{compiler.LayoutAddresses, compiler.LayoutIdentities} {
		t.Run(layout.String(), func(t *testing.T) {
			snap := *base
			snap.Pods = slices.Clone(base.Pods)
			snap.NetworkPolicies = slices.Clone(base.NetworkPolicies)
			pol := kernel.NewFake("netpol")
			p, err := NewWith(Options{Node: node, NoProxy: true, Layout: layout}, pol, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			compiled := func() *nft.Table {
				t.Helper()
				opts := compiler.Options{Node: node, Layout: layout}
				if layout == compiler.LayoutIdentities {
					ids := p.Identities()
					opts.Identities = &ids
				}
				tab, err := compiler.Compile(Prepare(&snap).Resolved, opts)
				if err != nil {
					t.Fatal(err)
				}
				return tab
			}
			in := ChangeInputs{
				Pod: func(key string) (*corev1.Pod, error) {
					for _, pod := range snap.Pods {
						if pod.Namespace+"/"+pod.Name == key {
							return pod, nil
						}
					}
					return nil, nil
				},
				NamespaceLabels: func(ns string) labels.Set {
					for _, n := range snap.Namespaces {
						if n.Name == ns {
							return compiler.NamespaceLabelsOf(ns, n)
						}
					}
					return compiler.NamespaceLabelsOf(ns, nil)
				},
				Model: func() (*policy.Model, error) { return policy.Build(&snap), nil },
				Nodes: func() ([]*corev1.Node, error) { return snap.Nodes, nil },
			}
			pick := func(local bool) *corev1.Pod {
				for _, pod := range snap.Pods {
					if (pod.Spec.NodeName == node) == local && !pod.Spec.HostNetwork && pod.Status.PodIP != "" {
						return pod
					}
				}
				t.Fatalf("no pod-network pod (on %s: %v)", node, local)
				return nil
			}
			replace := func(pod *corev1.Pod) {
				i := slices.IndexFunc(snap.Pods, func(p *corev1.Pod) bool { return p.Namespace == pod.Namespace && p.Name == pod.Name })
				snap.Pods[i] = pod
			}
			pods := func(pods ...*corev1.Pod) *PolicyChanges {
				ch := &PolicyChanges{}
				for _, pod := range pods {
					ch.Pod(pod.Namespace + "/" + pod.Name)
				}
				return ch
			}
			replica := pick(false).DeepCopy()
			replica.Name, replica.Status.PodIP = "replica-remote", "10.250.0.7"
			replica.Status.PodIPs = []corev1.PodIP{{IP: replica.Status.PodIP}}
			local := pick(true)
			stranger := local.DeepCopy()
			stranger.Labels = map[string]string{"app": "never-compiled", "app.kubernetes.io/component": "never-compiled"}
			// A NetworkPolicy that isolates the namespace of a pod of the node.
			isolating := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "isolate-all", Namespace: local.Namespace},
				Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
			steps := []struct {
				name    string
				before  func()                // the state's change (snap)
				changes func() *PolicyChanges // nil: a full sync
				want    string
			}{
				{"first sync", nil, nil, full},
				{"a replica on another node", func() { snap.Pods = append(snap.Pods, replica) }, func() *PolicyChanges { return pods(replica) }, incremental},
				{"a policy that applies to the node's pods", func() { snap.NetworkPolicies = append(snap.NetworkPolicies, isolating) },
					func() *PolicyChanges {
						ch := &PolicyChanges{}
						ch.Policies(policy.Build(&cluster.Snapshot{NetworkPolicies: []*networkingv1.NetworkPolicy{isolating}}).Policies...)
						return ch
					}, rebase},
				{"more changes than an update is worth", nil, func() *PolicyChanges {
					ch := &PolicyChanges{}
					for i := range MaxPolicyChanges + 1 {
						ch.Pod(fmt.Sprintf("nowhere/pod-%d", i))
					}
					return ch
				}, refused},
				{"a transaction the kernel refuses", func() {
					pol.FailWith(func(*kernel.Plan) error { return errors.New("injected") })
					gone := *replica
					gone.Status.PodIP, gone.Status.PodIPs = "", nil // its address released
					replace(&gone)
				}, func() *PolicyChanges { return pods(replica) }, failed},
				{"the full sync after it", func() {
					pol.FailWith(nil)
					snap.Pods = slices.DeleteFunc(snap.Pods, func(p *corev1.Pod) bool { return p.Name == replica.Name })
				}, nil, full},
			}
			// A pod of the node with labels no pod had: an update cannot
			// number it; the address layout rebases, the identity layout
			// refuses (its rebase keeps the numbering).
			strangerWant := map[compiler.Layout]string{compiler.LayoutAddresses: rebase, compiler.LayoutIdentities: refused}[layout]
			steps = append(steps, struct {
				name    string
				before  func()
				changes func() *PolicyChanges
				want    string
			}{"a pod of the node with labels no pod had", func() { replace(stranger) }, func() *PolicyChanges { return pods(stranger) }, strangerWant})
			for _, st := range steps {
				kernelBefore := pol.Kernel()
				if st.before != nil {
					st.before()
				}
				got := full
				var r PolicyResult
				if st.changes == nil {
					r = p.Sync(Prepare(&snap), Policy).Policy
				} else {
					cs := p.SyncPolicyChanges(st.changes(), in)
					r, got = cs.PolicyResult, cs.Kind.String()
					if cs.Kind == SyncFull {
						got = refused
						if cs.NeedsFull == "" {
							t.Errorf("%s: no reason for a full sync", st.name)
						}
					}
				}
				if r.Err != nil {
					got = failed
				}
				if got != st.want {
					t.Fatalf("%s: took %q (err %v), want %q", st.name, got, r.Err, st.want)
				}
				switch st.want {
				case refused, failed:
					if d := kernel.Diff(kernelBefore, pol.Kernel()); !d.Empty() {
						t.Fatalf("%s: the kernel changed (%d operations)", st.name, len(d.Ops))
					}
					if st.want == failed && p.PolicyTable() != nil {
						t.Errorf("%s: PolicyTable is not nil after a failed transaction", st.name)
					}
				default:
					if d := kernel.Diff(pol.Kernel(), compiled()); !d.Empty() {
						t.Fatalf("%s: the kernel differs from a full compile (%d operations)", st.name, len(d.Ops))
					}
				}
			}
		})
	}
}

// TestPolicyChanges: changes are kept by kind until one needs a full
// sync (or there are more than MaxPolicyChanges); from then on nothing
// more is kept, the first reason stays, and nothing is left behind.
func TestPolicyChanges(t *testing.T) {
	pol := policy.Build(&cluster.Snapshot{NetworkPolicies: []*networkingv1.NetworkPolicy{
		{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "x"}}}}).Policies
	var ch PolicyChanges
	if !ch.Empty() {
		t.Fatal("zero changes are not empty")
	}
	ch.Pod("x/a")
	ch.Namespace("x")
	ch.Policies(pol...)
	if ch.Empty() || !ch.HasPolicies() || ch.FullReason() != "" {
		t.Fatalf("empty %v, policies %v, full %q", ch.Empty(), ch.HasPolicies(), ch.FullReason())
	}
	ch.NeedFull("first")
	ch.NeedFull("second")
	ch.Pod("x/b")
	ch.Policies(pol...)
	if ch.FullReason() != "first" || ch.HasPolicies() || len(ch.pods)+len(ch.namespaces)+len(ch.policies) != 0 {
		t.Errorf("after a full reason: reason %q, %d pods, %d namespaces, %d policies kept", ch.FullReason(), len(ch.pods), len(ch.namespaces), len(ch.policies))
	}
	var many PolicyChanges
	for i := range MaxPolicyChanges + 1 {
		many.Pod(fmt.Sprintf("x/%d", i))
	}
	if many.FullReason() == "" || len(many.pods) != 0 {
		t.Errorf("%d pods: reason %q, %d kept", MaxPolicyChanges+1, many.FullReason(), len(many.pods))
	}
}
