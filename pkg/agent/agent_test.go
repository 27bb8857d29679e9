package agent

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/policy"
)

func TestDiffLines(t *testing.T) {
	tests := []struct {
		prev, next, want []string
	}{
		{nil, []string{"a", "b"}, []string{"+ a", "+ b"}},
		{[]string{"a", "b"}, []string{"b", "c"}, []string{"- a", "+ c"}},
		{[]string{"a"}, []string{"a"}, nil},
	}
	for _, tt := range tests {
		if got := DiffLines(tt.prev, tt.next); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("DiffLines(%v, %v) = %v, want %v", tt.prev, tt.next, got, tt.want)
		}
	}
}

func TestModelViewLines(t *testing.T) {
	tb := nft.NewTable("netpol")
	tb.AddChain(&nft.Chain{Name: "forward", Rules: []*nft.Rule{nft.NewRule().CtEstablishedRelated().Verdict(nft.Verdict{Kind: nft.Accept})}})
	tb.AddSet(&nft.Set{Name: "peers4", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{{Key: []byte{10, 0, 0, 1}}}})
	got := newModelView("node-1", 3, tb).Lines()
	want := []string{"chain forward [0] ct state established,related accept", "set peers4 10.0.0.1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Lines() = %q, want %q", got, want)
	}
}

func TestDesiredStatus(t *testing.T) {
	key := func(name string) cluster.ObjectKey {
		return cluster.ObjectKey{Kind: cluster.KindClusterPolicy, Name: name}
	}
	obj := func(name string) policyObject {
		return policyObject{gvr: cluster.GVRClusterPolicyV1beta1, obj: &policyRecord{recordMeta: recordMeta{Name: name}, generation: 2}}
	}
	model := &policy.Model{
		Errors: []error{
			&policy.ObjectError{Object: key("rejected"), Field: "spec.subject", Message: "bad (policy not loaded)", Rejected: true},
			&policy.ObjectError{Object: key("partial"), Field: "spec.ingress[0].from[0]", Message: "invalid CIDR"},
			errors.New("a problem of no object"),
		},
		ObjectWarnings: map[cluster.ObjectKey][]string{key("warned"): {"unknown field; the rule fails closed"}},
		Staged:         []*policy.Policy{{Kind: cluster.KindClusterPolicy, Name: "staged"}},
	}
	objs := map[cluster.ObjectKey]policyObject{key("ok"): obj("ok"), key("rejected"): obj("rejected"), key("partial"): obj("partial"), key("warned"): obj("warned"),
		key("staged"): obj("staged")}
	want := map[string][2]string{"ok": {"True", "Valid"}, "rejected": {"False", "Invalid"}, "partial": {"True", "RulesFailClosed"}, "warned": {"True", "RulesFailClosed"},
		"staged": {"True", "Staged"}}
	got := desiredStatus(objs, objectProblems(model), stagedKeys(model))
	if len(got) != len(want) {
		t.Fatalf("got %d statuses, want %d", len(got), len(want))
	}
	for _, st := range got {
		w := want[st.obj.Name]
		if string(st.status) != w[0] || st.reason != w[1] {
			t.Errorf("%s: %s/%s, want %s/%s (%s)", st.obj.Name, st.status, st.reason, w[0], w[1], st.msg)
		}
		if current(st) {
			t.Errorf("%s: an object without conditions counts as current", st.obj.Name)
		}
		// The object's own condition: current only when it says the same
		// of the object's generation.
		same := condition{status: string(st.status), reason: st.reason, message: st.msg, observedGeneration: 2}
		st.obj.accepted = &same
		if !current(st) {
			t.Errorf("%s: the same condition does not count as current", st.obj.Name)
		}
		for _, other := range []condition{
			{status: "Unknown", reason: same.reason, message: same.message, observedGeneration: 2},
			{status: same.status, reason: "Other", message: same.message, observedGeneration: 2},
			{status: same.status, reason: same.reason, message: "other", observedGeneration: 2},
			{status: same.status, reason: same.reason, message: same.message, observedGeneration: 1},
		} {
			st.obj.accepted = &other
			if current(st) {
				t.Errorf("%s: condition %+v counts as current", st.obj.Name, other)
			}
		}
	}
}

func TestHealth(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name                      string
		ready                     bool
		pendingSince, lastSuccess time.Time
		healthy                   bool
	}{
		{"starting", false, now.Add(-time.Hour), time.Time{}, true},
		{"up to date", true, time.Time{}, now.Add(-time.Second), true},
		{"a change waits a little", true, now.Add(-5 * time.Second), now.Add(-time.Second), true},
		{"a change waits too long", true, now.Add(-2 * time.Minute), now.Add(-time.Second), false},
		{"no successful sync for too long", true, time.Time{}, now.Add(-10 * time.Minute), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &Agent{opts: Options{}, tables: []*tableState{{table: node.Policy}, {table: node.Services}}}
			a.opts.defaults()
			a.ready.Store(tt.ready)
			a.tables[1].pending, a.lastSuccess = tt.pendingSince, tt.lastSuccess
			if err := a.health(); (err == nil) != tt.healthy {
				t.Errorf("health() = %v, want healthy=%v", err, tt.healthy)
			}
		})
	}
}

// TestClusterDNSSlice: which EndpointSlice events move the cluster DNS
// (a --no-proxy agent then syncs its policy table).
func TestClusterDNSSlice(t *testing.T) {
	slice := func(ns, svc string) *leanSlice { // as the informer stores it
		return leanObject(&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: discoveryv1.AddressTypeIPv4}, "node-1").(*leanSlice)
	}
	for _, c := range []struct {
		name string
		objs []any
		want bool
	}{
		{"kube-dns", []any{slice("kube-system", "kube-dns")}, true},
		{"kube-dns deleted, last state unknown", []any{cache.DeletedFinalStateUnknown{Key: "kube-system/kube-dns-1", Obj: slice("kube-system", "kube-dns")}}, true},
		{"update: old and new", []any{slice("kube-system", "other"), slice("kube-system", "kube-dns")}, true},
		{"another Service", []any{slice("kube-system", "metrics-server")}, false},
		{"kube-dns in another namespace", []any{slice("default", "kube-dns")}, false},
		{"no objects", nil, false},
	} {
		if got := clusterDNSSlice(c.objs); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestDesiredEvents(t *testing.T) {
	snap := cluster.New()
	if r := snap.AddDocuments([]byte(`
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: deny-dev}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {}}
  ingress: [{name: dev, action: Deny, from: [{namespaces: {matchLabels: {env: dev}}}]}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: allow-all}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {team: a}}}
  ingress: [{name: all, action: Accept, from: [{namespaces: {}}]}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: other-priority}
spec:
  tier: Admin
  priority: 11
  subject: {namespaces: {}}
  ingress: [{name: all, action: Accept, from: [{namespaces: {}}]}]
`), "test.yaml", false); len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	model := policy.Build(snap)
	np := cluster.ObjectKey{Kind: cluster.KindNetworkPolicy, Namespace: "x", Name: "bad"}
	model.Errors = append(model.Errors, &policy.ObjectError{Object: np, Field: "spec.ingress[0].from[0].ipBlock.cidr", Message: "invalid CIDR (policy not loaded)", Rejected: true})
	cnp := func(name string) cluster.ObjectKey {
		return cluster.ObjectKey{Kind: cluster.KindClusterPolicy, Name: name}
	}
	model.ObjectWarnings[cnp("other-priority")] = []string{"spec.ingress[0]: unknown field; the rule fails closed"}
	objs := map[cluster.ObjectKey]policyObject{}
	for _, name := range []string{"deny-dev", "allow-all", "other-priority"} {
		objs[cnp(name)] = policyObject{gvr: cluster.GVRClusterPolicyV1beta1, obj: &policyRecord{
			TypeMeta:   metav1.TypeMeta{Kind: cluster.KindClusterPolicy, APIVersion: "policy.networking.k8s.io/v1beta1"},
			recordMeta: recordMeta{Name: name}, uid: types.UID("uid-" + name)}}
	}
	var looked []string
	npRef := func(namespace, name string) (corev1.ObjectReference, bool) {
		looked = append(looked, namespace+"/"+name)
		return corev1.ObjectReference{Kind: cluster.KindNetworkPolicy, Namespace: namespace, Name: name, UID: types.UID("uid-" + name)}, true
	}
	got := map[string]string{}
	names := map[string]bool{}
	for _, ev := range desiredEvents(objs, npRef, model, objectProblems(model)) {
		got[ev.ref.Name+" "+ev.reason] = ev.msg
		if names[ev.name()] {
			t.Errorf("two events named %s", ev.name())
		}
		names[ev.name()] = true
		if ev.ref.UID != types.UID("uid-"+ev.ref.Name) {
			t.Errorf("event %s names UID %q", ev.name(), ev.ref.UID)
		}
	}
	for key, text := range map[string]string{
		"bad " + reasonNotEnforced:                "not enforced: spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR",
		"other-priority " + reasonRulesFailClosed: "fail closed",
		"deny-dev " + reasonPriorityAmbiguous:     "ClusterNetworkPolicy allow-all and ClusterNetworkPolicy deny-dev have the same priority 10",
		"allow-all " + reasonPriorityAmbiguous:    "the API leaves their order undefined",
	} {
		if msg, ok := got[key]; !ok || !strings.Contains(msg, text) {
			t.Errorf("event %s: %q, want it, saying %q", key, msg, text)
		}
	}
	if len(got) != 4 {
		t.Errorf("events %v, want 4", got)
	}
	// NetworkPolicies are looked up only when one has a problem.
	if len(looked) != 1 || looked[0] != "x/bad" {
		t.Errorf("NetworkPolicies looked up: %v, want x/bad alone", looked)
	}
}
