package policy_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/policy"
)

func mustSelector(t *testing.T, s string) labels.Selector {
	t.Helper()
	out, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSelectorContains(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"", "", true},
		{"", "team=a", true},
		{"team=a", "", false},
		{"team=a", "team=a,env=dev", true},
		{"team=a,env=dev", "team=a", false},
		{"team in (a,b)", "team=a", true},
		{"team in (a)", "team in (a,b)", false},
		{"team", "team=a", true},
		{"team", "team notin (a)", false}, // absent satisfies notin
		{"team notin (a,b)", "team=c", true},
		{"team notin (a)", "team notin (a,b)", true},
		{"team notin (a,b)", "team notin (a)", false},
		{"!team", "!team,env=dev", true},
		{"team!=a", "team=b", true},
		{"tier>3", "tier>5", true},
		{"tier>5", "tier>3", false},
		{"team=a", "team=a,team=b", true}, // b selects nothing
	} {
		if got := policy.SelectorContains(mustSelector(t, tc.a), mustSelector(t, tc.b)); got != tc.want {
			t.Errorf("SelectorContains(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if policy.SelectorContains(labels.Nothing(), labels.Everything()) {
		t.Error("Nothing contains Everything")
	}
	if !policy.SelectorContains(labels.Nothing(), labels.Nothing()) {
		t.Error("Nothing does not contain Nothing")
	}
}

func TestSubjectContains(t *testing.T) {
	sub := func(ns, nsSel, podSel string) policy.Subject {
		return policy.Subject{Namespace: ns, Namespaces: mustSelector(t, nsSel), Pods: mustSelector(t, podSel)}
	}
	for _, tc := range []struct {
		name string
		a, b policy.Subject
		want bool
	}{
		{"every pod contains one namespace's", sub("", "", ""), sub("x", "", "app=web"), true},
		{"one namespace does not contain another", sub("x", "", ""), sub("y", "", ""), false},
		{"a namespace contains its own pods", sub("x", "", ""), sub("x", "", "app=web"), true},
		{"a team's namespaces do not contain a named namespace", sub("", "team=a", ""), sub("x", "", ""), false},
		{"a selector by name contains that namespace", sub("", corev1.LabelMetadataName+"=x", ""), sub("x", "", "app=web"), true},
		{"a namespace contains a selector of it by name", sub("x", "", ""), sub("", corev1.LabelMetadataName+"=x", ""), true},
		{"pod selectors narrower", sub("", "team=a", "app=web"), sub("", "team=a", ""), false},
	} {
		if got := policy.SubjectContains(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: SubjectContains = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRuleCovers(t *testing.T) {
	pods := func(nsSel, podSel string) policy.Peer {
		return policy.Peer{Kind: policy.PeerPods, Namespaces: mustSelector(t, nsSel), Pods: mustSelector(t, podSel)}
	}
	nets := func(cidr string, except ...string) policy.Peer {
		p := policy.Peer{Kind: policy.PeerIPBlock, CIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}
		for _, e := range except {
			p.Except = append(p.Except, netip.MustParsePrefix(e))
		}
		return p
	}
	nodes := func(sel string) policy.Peer {
		return policy.Peer{Kind: policy.PeerNodes, Nodes: mustSelector(t, sel)}
	}
	domains := func(names ...string) policy.Peer {
		return policy.Peer{Kind: policy.PeerDomainNames, DomainNames: names}
	}
	tcp := func(start, end int32) policy.Port {
		return policy.Port{Protocol: corev1.ProtocolTCP, Start: start, End: end}
	}
	named := func(name string) policy.Port { return policy.Port{Name: name} }
	rule := func(ports []policy.Port, peers ...policy.Peer) *policy.Rule {
		return &policy.Rule{Peers: peers, Ports: ports, AllPorts: ports == nil}
	}
	all := &policy.Rule{AllPeers: true, AllPorts: true}
	for _, tc := range []struct {
		name string
		a, b *policy.Rule
		want bool
	}{
		{"every peer and port covers anything", all, rule([]policy.Port{tcp(80, 80)}, pods("team=a", "")), true},
		{"nothing covers every peer but every peer", rule(nil, pods("", "")), all, false},
		{"wider namespaces, every port", rule(nil, pods("", "")), rule([]policy.Port{tcp(80, 80)}, pods("team=a", "app=web")), true},
		{"narrower namespaces", rule(nil, pods("team=a", "")), rule(nil, pods("", "")), false},
		{"a port range around a port", rule([]policy.Port{tcp(80, 90)}, pods("", "")), rule([]policy.Port{tcp(85, 85)}, pods("", "")), true},
		{"a port outside the range", rule([]policy.Port{tcp(80, 90)}, pods("", "")), rule([]policy.Port{tcp(91, 91)}, pods("", "")), false},
		{"another protocol", rule([]policy.Port{tcp(0, 0)}, pods("", "")), rule([]policy.Port{{Protocol: corev1.ProtocolUDP, Start: 53, End: 53}}, pods("", "")), false},
		{"the same named port", rule([]policy.Port{named("http")}, pods("", "")), rule([]policy.Port{named("http")}, pods("", "")), true},
		{"a number does not cover a name", rule([]policy.Port{tcp(0, 0)}, pods("", "")), rule([]policy.Port{named("http")}, pods("", "")), false},
		{"every peer of b in some peer of a", rule(nil, pods("team=a", ""), pods("team=b", "")), rule(nil, pods("team=b", "app=db")), true},
		{"one peer of b in none", rule(nil, pods("team=a", "")), rule(nil, pods("team=a", ""), pods("team=b", "")), false},
		{"a network inside a network", rule(nil, nets("10.0.0.0/8")), rule(nil, nets("10.1.0.0/16")), true},
		{"an exception inside the network", rule(nil, nets("10.0.0.0/8", "10.1.2.0/24")), rule(nil, nets("10.1.0.0/16")), false},
		{"an exception the other has too", rule(nil, nets("10.0.0.0/8", "10.1.2.0/24")), rule(nil, nets("10.1.0.0/16", "10.1.0.0/20")), true},
		{"pods are not a network", rule(nil, nets("0.0.0.0/0")), rule(nil, pods("", "")), false},
		{"nodes by selector", rule(nil, nodes("")), rule(nil, nodes("role=worker")), true},
		{"a wildcard over a name", rule(nil, domains("*.example.com")), rule(nil, domains("www.example.com", "*.a.example.com")), true},
		{"a name does not cover a wildcard", rule(nil, domains("www.example.com")), rule(nil, domains("*.example.com")), false},
		{"a wildcard does not cover its apex", rule(nil, domains("*.example.com")), rule(nil, domains("example.com")), false},
		{"failing closed covers nothing", &policy.Rule{AllPeers: true, AllPorts: true, FailClosed: "x"}, rule(nil, pods("", "")), false},
	} {
		if got := policy.RuleCovers(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: RuleCovers = %v, want %v", tc.name, got, tc.want)
		}
	}
}
