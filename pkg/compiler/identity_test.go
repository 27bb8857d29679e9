package compiler

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/internal/synth"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

func TestOrderNamespaces(t *testing.T) {
	tests := []struct {
		name string
		ns   map[string]labels.Set
		want []string
	}{
		{"the least varied label first: env groups before team",
			map[string]labels.Set{
				"a-prod": {"env": "prod", "team": "a"}, "b-dev": {"env": "dev", "team": "b"},
				"a-dev": {"env": "dev", "team": "a"}, "c-prod": {"env": "prod", "team": "c"}, "b-prod": {"env": "prod", "team": "b"},
			},
			[]string{"a-dev", "b-dev", "a-prod", "b-prod", "c-prod"}},
		{"a namespace without the label after those with it",
			map[string]labels.Set{"x": {"env": "prod"}, "y": {}, "z": {"env": "dev"}},
			[]string{"z", "x", "y"}},
		{"no labels: by name", map[string]labels.Set{"b": {}, "a": {}}, []string{"a", "b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := orderNamespaces(tc.ns); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestIdentityRanges: a namespace all of whose identities are selected is
// its whole span, neighbouring spans merge, a namespace selected in part
// lists its identities.
func TestIdentityRanges(t *testing.T) {
	ids := &identities{
		of:         []uint32{0x10001, 0x10002, 0x20001, 0x30001, 0x30002, 0},
		namespaces: map[string][]uint32{"a": {0x10001, 0x10002}, "b": {0x20001}, "c": {0x30001, 0x30002}},
		base:       map[string]uint32{"a": 0x10000, "b": 0x20000, "c": 0x30000},
		nsOf:       map[uint32]string{0x10000: "a", 0x20000: "b", 0x30000: "c"},
	}
	span := func(lo, hi uint32) addrRange { return addrRange{idAddr(lo), idAddr(hi)} }
	tests := []struct {
		name string
		pods []int
		want []addrRange
	}{
		{"nothing", nil, nil},
		{"a host-network pod has no identity", []int{5}, nil},
		{"one identity of two", []int{0}, []addrRange{span(0x10001, 0x10001)}},
		{"every identity of a namespace: its span", []int{0, 1}, []addrRange{span(0x10000, 0x1ffff)}},
		{"two whole namespaces side by side: one range", []int{0, 1, 2}, []addrRange{span(0x10000, 0x2ffff)}},
		{"a whole namespace and part of another", []int{2, 4}, []addrRange{span(0x20000, 0x2ffff), span(0x30002, 0x30002)}},
		{"pods of one identity count once", []int{3, 3}, []addrRange{span(0x30001, 0x30001)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids.ranges(tc.pods); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestIdentityLayoutSize: on the realistic synthetic cluster the identity
// layout holds one map entry per pod address plus sets bounded by
// namespaces and identities; the address layout holds pods x policies.
func TestIdentityLayoutSize(t *testing.T) {
	spec := synth.Spec{Shape: synth.ShapeRealistic, Namespaces: 20, Pods: 2000, Nodes: 20, NetworkPolicies: 200, AdminPolicies: 20, Seed: 1}
	snap, err := synth.Snapshot(spec)
	if err != nil {
		t.Fatal(err)
	}
	r := eval.New(snap, policy.Build(snap)).Resolved()
	count := func(layout Layout) nft.Counts {
		tab, err := Compile(r, Options{Node: "node-001", Layout: layout})
		if err != nil {
			t.Fatal(err)
		}
		return tab.Count()
	}
	addrs, ids := count(LayoutAddresses), count(LayoutIdentities)
	podAddrs := 0
	for i := 0; i < r.NumPods(); i++ {
		if p := r.Pod(i); !p.HostNetwork {
			podAddrs += len(p.Addrs)
		}
	}
	t.Logf("address layout %+v; identity layout %+v; %d pod addresses", addrs, ids, podAddrs)
	if ids.Elements > 2*podAddrs {
		t.Errorf("identity layout: %d elements, more than twice the %d pod addresses", ids.Elements, podAddrs)
	}
	if addrs.Elements < 5*ids.Elements {
		t.Errorf("address layout %d elements, identity layout %d: the realistic shape should show the product", addrs.Elements, ids.Elements)
	}
}

func TestParseLayout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Layout
		err  bool
	}{{"addresses", LayoutAddresses, false}, {"identities", LayoutIdentities, false}, {"ids", 0, true}} {
		got, err := ParseLayout(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseLayout(%q) = %v, %v", tc.in, got, err)
		}
	}
}

// TestElementWritesPerEvent counts what one event changes in node-001's
// table (elements added and deleted, the difference the Applier sends),
// in both layouts, on the realistic shape: a new replica of an existing
// workload on another node (an identity that exists), the same pod
// relabelled, and a namespace relabelled. The identity layout writes one
// pod-ids element for the new pod, whatever the policies that select it,
// and nothing for a label no selector reads.
func TestElementWritesPerEvent(t *testing.T) {
	spec := synth.Spec{Shape: synth.ShapeRealistic, Namespaces: 20, Pods: 2000, Nodes: 20, NetworkPolicies: 200, AdminPolicies: 20, Seed: 1}
	base, err := synth.Snapshot(spec)
	if err != nil {
		t.Fatal(err)
	}
	// A pod-network pod of another node, in a namespace with pods on
	// node-001 too, to copy: its labels are an identity in use.
	var model *corev1.Pod
	local := map[string]bool{}
	for _, p := range base.Pods {
		if p.Spec.NodeName == "node-001" {
			local[p.Namespace] = true
		}
	}
	for _, p := range base.Pods {
		if !p.Spec.HostNetwork && p.Spec.NodeName != "node-001" && local[p.Namespace] && p.Labels["app.kubernetes.io/component"] == "backend" {
			model = p
			break
		}
	}
	if model == nil {
		t.Fatal("no pod to copy")
	}
	replica := model.DeepCopy()
	replica.Name += "-replica"
	replica.Status.PodIP = "10.127.255.1"
	replica.Status.PodIPs = []corev1.PodIP{{IP: "10.127.255.1"}}
	events := []struct {
		name  string
		apply func(s *cluster.Snapshot)
		// most element writes the identity layout may send (-1: no bound)
		most int
	}{
		{"a new replica (an identity that exists)", func(s *cluster.Snapshot) { s.Pods = append(s.Pods, replica) }, 1},
		{"a pod relabelled with a label no selector reads", func(s *cluster.Snapshot) {
			p := s.Pod(model.Namespace, model.Name)
			p.Labels = maps.Clone(p.Labels)
			p.Labels["version"] = "canary"
		}, 0},
		{"a pod relabelled into another workload of its namespace (an identity that exists)", func(s *cluster.Snapshot) {
			p := s.Pod(model.Namespace, model.Name)
			for _, q := range s.Pods {
				if q.Namespace == p.Namespace && !q.Spec.HostNetwork && q.Labels["app.kubernetes.io/name"] != p.Labels["app.kubernetes.io/name"] {
					p.Labels = maps.Clone(q.Labels)
					p.Spec.Containers = q.Spec.Containers // the same named ports
					return
				}
			}
			t.Fatal("no other workload in the namespace")
		}, 2}, // its pod-ids entry, deleted and added
		{"a namespace relabelled", func(s *cluster.Snapshot) {
			ns := s.Namespace(model.Namespace)
			ns.Labels = maps.Clone(ns.Labels)
			ns.Labels["env"] = "dev"
		}, -1},
	}
	for _, ev := range events {
		for _, layout := range []Layout{LayoutAddresses, LayoutIdentities} {
			numbering := &Identities{} // kept from one compile to the next, as node.Programmer keeps it
			before := compileNode(t, base, layout, numbering)
			after := deepCopySnapshot(base)
			ev.apply(after)
			plan := kernel.Diff(before, compileNode(t, after, layout, numbering))
			writes := plan.Stats.ElementsAdded + plan.Stats.ElementsDeleted
			t.Logf("%s, layout %d: %d element writes, %d chains rewritten", ev.name, layout, writes, plan.Stats.ChainsRewritten)
			if layout == LayoutIdentities && ev.most >= 0 && writes > ev.most {
				t.Errorf("%s: the identity layout writes %d elements, want at most %d", ev.name, writes, ev.most)
			}
		}
	}
}

func compileNode(t *testing.T, snap *cluster.Snapshot, layout Layout, numbering *Identities) *nft.Table {
	t.Helper()
	tab, err := Compile(eval.New(snap, policy.Build(snap)).Resolved(), Options{Node: "node-001", Layout: layout, Identities: numbering})
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// deepCopySnapshot copies the objects an event changes (pods, namespaces).
func deepCopySnapshot(s *cluster.Snapshot) *cluster.Snapshot {
	out := *s
	out.Pods = make([]*corev1.Pod, len(s.Pods))
	for i, p := range s.Pods {
		out.Pods[i] = p.DeepCopy()
	}
	out.Namespaces = make([]*corev1.Namespace, len(s.Namespaces))
	for i, ns := range s.Namespaces {
		out.Namespaces[i] = ns.DeepCopy()
	}
	return &out
}
