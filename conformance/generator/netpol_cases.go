package generator

import "fmt"

// The NetworkPolicy families, after cyclonus's generator: target, peers,
// ports, action, rules, conflict, namespaces, and the upstream e2e cases.

type namedSel struct {
	name string
	sel  M
}

type dirSpec struct {
	name    string
	types   []string
	ingress bool
	egress  bool
}

var (
	dirIngress = dirSpec{"ingress", []string{"Ingress"}, true, false}
	dirEgress  = dirSpec{"egress", []string{"Egress"}, false, true}
	dirBoth    = dirSpec{"both", []string{"Ingress", "Egress"}, true, true}
	dirsOne    = []dirSpec{dirIngress, dirEgress}
)

// policyFor is an NP in ns selecting pods, with rules for the directions of d.
func policyFor(ns, name string, pods M, d dirSpec, rules ...NPRule) NP {
	p := NP{NS: ns, Name: name, Pods: pods, Types: d.types}
	if rules == nil {
		rules = []NPRule{}
	}
	if d.ingress {
		p.Ingress = rules
	}
	if d.egress {
		p.Egress = rules
	}
	return p
}

func mdSel(name string) M { return sel("kubernetes.io/metadata.name", name) }

func cidr32(pod string) string { return podIP(pod) + "/32" }

func targetCases() []Case {
	targets := []namedSel{
		{"all", sel()},
		{"pod-a", podSel("a")},
		{"pod-in-a-b", expr("pod", "In", "a", "b")},
		{"pod-notin-a", expr("pod", "NotIn", "a")},
		{"pod-exists", expr("pod", "Exists")},
		{"pod-doesnotexist", expr("pod", "DoesNotExist")},
		{"pod-nomatch", podSel("zz")},
	}
	var out []Case
	for _, ns := range []string{"x", "z"} {
		for _, d := range []dirSpec{dirIngress, dirEgress, dirBoth} {
			for _, t := range targets {
				p := policyFor(ns, "target", t.sel, d, NPRule{Peers: []M{npPods(podSel("b"))}, Ports: []M{npPort("TCP", 80)}})
				out = append(out, one(fmt.Sprintf("target/%s/%s/%s", d.name, ns, t.name),
					fmt.Sprintf("%s policy in %s selecting %s allows only pod=b of %s on TCP 80", d.name, ns, t.name, ns),
					tags("target", "np", d.name), p))
			}
		}
	}
	return out
}

// ruleSet is a list of NetworkPolicy peers or ports that a rule may
// hold: its name in case names, tag its kind.
type ruleSet struct {
	name  string
	tag   string
	items []M
}

func peerSets() []ruleSet {
	var out []ruleSet
	pods := []namedSel{
		{"empty", sel()}, {"pod-b", podSel("b")}, {"pod-in-b-c", expr("pod", "In", "b", "c")},
		{"pod-notin-b", expr("pod", "NotIn", "b")}, {"pod-exists", expr("pod", "Exists")},
		{"pod-doesnotexist", expr("pod", "DoesNotExist")}, {"pod-nomatch", podSel("zz")},
	}
	for _, p := range pods {
		out = append(out, ruleSet{"pods/" + p.name, "peer-pods", []M{npPods(p.sel)}})
	}
	nss := []namedSel{
		{"empty", sel()}, {"ns-y", nsSel("y")}, {"ns-in-x-y", expr("ns", "In", "x", "y")},
		{"ns-notin-x", expr("ns", "NotIn", "x")}, {"metadata-name-z", mdSel("z")},
		{"ns-exists", expr("ns", "Exists")}, {"ns-nomatch", nsSel("zz")},
	}
	for _, n := range nss {
		out = append(out, ruleSet{"namespaces/" + n.name, "peer-namespaces", []M{npNS(n.sel)}})
	}
	both := []struct {
		name     string
		ns, pods M
	}{
		{"empty-empty", sel(), sel()},
		{"empty-pod-b", sel(), podSel("b")},
		{"ns-y-pod-b", nsSel("y"), podSel("b")},
		{"ns-notin-x-pod-in-b-c", expr("ns", "NotIn", "x"), expr("pod", "In", "b", "c")},
		{"ns-y-empty", nsSel("y"), sel()},
		{"ns-z-pod-notin-a", nsSel("z"), expr("pod", "NotIn", "a")},
		{"ns-in-x-z-pod-c", expr("ns", "In", "x", "z"), podSel("c")},
	}
	for _, b := range both {
		out = append(out, ruleSet{"both/" + b.name, "peer-both", []M{npBoth(b.ns, b.pods)}})
	}
	ips := []struct {
		name  string
		block M
	}{
		{"node-1-pod-cidr", npIP(node1CIDR)},
		{"node-2-pod-cidr", npIP(node2CIDR)},
		{"pods-except-node-1", npIP(podsCIDR, node1CIDR)},
		{"pods-except-x-b-y-b", npIP(podsCIDR, cidr32("x/b"), cidr32("y/b"))},
		{"x-b-32", npIP(cidr32("x/b"))},
		{"all", npIP("0.0.0.0/0")},
		{"all-except-pods", npIP("0.0.0.0/0", podsCIDR)},
		{"nodes", npIP(nodesCIDR)},
		{"outside", npIP(outsideCIDR)},
		{"all-except-node-1", npIP("0.0.0.0/0", node1IP+"/32")},
		{"pods-except-half-of-node-1", npIP(podsCIDR, "10.244.1.0/28")},
	}
	for _, b := range ips {
		out = append(out, ruleSet{"ipblock/" + b.name, "ipblock", []M{b.block}})
	}
	out = append(out,
		ruleSet{"multi/pod-b-or-ns-y", "peer-multi", []M{npPods(podSel("b")), npNS(nsSel("y"))}},
		ruleSet{"multi/ipblock-x-b-or-pod-c", "peer-multi", []M{npIP(cidr32("x/b")), npPods(podSel("c"))}},
		ruleSet{"multi/ns-z-or-ipblock-y-a", "peer-multi", []M{npNS(nsSel("z")), npIP(cidr32("y/a"))}},
		ruleSet{"multi/pod-b-or-pod-c", "peer-multi", []M{npPods(podSel("b")), npPods(podSel("c"))}},
		ruleSet{"missing", "peer-missing", nil},
		ruleSet{"empty-list", "peer-empty", []M{}},
	)
	return out
}

func peerCases() []Case {
	return oneRuleCases("peers", "x/a %s allows only peers %s", peerSets(), func(peers []M) NPRule { return NPRule{Peers: peers} })
}

func portSets() []ruleSet {
	return []ruleSet{
		{"tcp-80", "port-number", []M{npPort("TCP", 80)}},
		{"tcp-81", "port-number", []M{npPort("TCP", 81)}},
		{"udp-80", "port-number", []M{npPort("UDP", 80)}},
		{"udp-81", "port-number", []M{npPort("UDP", 81)}},
		{"sctp-80", "port-number", []M{npPort("SCTP", 80)}},
		{"sctp-81", "port-number", []M{npPort("SCTP", 81)}},
		{"default-protocol-80", "port-number", []M{npPort("", 80)}},
		{"tcp-82-unserved", "port-number", []M{npPort("TCP", 82)}},
		{"protocol-tcp", "protocol-only", []M{npPort("TCP", nil)}},
		{"protocol-udp", "protocol-only", []M{npPort("UDP", nil)}},
		{"protocol-sctp", "protocol-only", []M{npPort("SCTP", nil)}},
		{"named-serve-80-tcp", "named-port", []M{npPort("", "serve-80-tcp")}},
		{"named-serve-81-udp", "named-port", []M{npPort("UDP", "serve-81-udp")}},
		{"named-serve-80-sctp", "named-port", []M{npPort("SCTP", "serve-80-sctp")}},
		{"named-wrong-protocol-udp-serve-80-tcp", "named-port-wrong-protocol", []M{npPort("UDP", "serve-80-tcp")}},
		{"named-wrong-protocol-default-serve-81-udp", "named-port-wrong-protocol", []M{npPort("", "serve-81-udp")}},
		{"named-nonexistent", "named-port", []M{npPort("TCP", "serve-82-tcp")}},
		{"endport-tcp-80-81", "endport", []M{npRange("TCP", 80, 81)}},
		{"endport-udp-80-81", "endport", []M{npRange("UDP", 80, 81)}},
		{"endport-sctp-79-80", "endport", []M{npRange("SCTP", 79, 80)}},
		{"endport-tcp-81-90", "endport", []M{npRange("TCP", 81, 90)}},
		{"endport-tcp-all", "endport", []M{npRange("TCP", 1, 65535)}},
		{"multi-tcp-80-udp-81", "port-multi", []M{npPort("TCP", 80), npPort("UDP", 81)}},
		{"multi-named-tcp-81-sctp-80", "port-multi", []M{npPort("TCP", "serve-81-tcp"), npPort("SCTP", 80)}},
		{"multi-udp-any-tcp-81", "port-multi", []M{npPort("UDP", nil), npPort("TCP", 81)}},
		{"empty-list", "port-empty", []M{}},
	}
}

func portCases() []Case {
	return oneRuleCases("ports", "x/a %s allows every peer on %s only", portSets(), func(ports []M) NPRule { return NPRule{Ports: ports} })
}

// oneRuleCases are a family's cases (peers, ports): for each direction
// and each set, x/a isolated with the one rule that rule makes of the
// set. title has the direction and the set's name to fill in.
func oneRuleCases(family, title string, sets []ruleSet, rule func([]M) NPRule) []Case {
	var out []Case
	for _, d := range dirsOne {
		for _, s := range sets {
			pol := policyFor("x", family, podSel("a"), d, rule(s.items))
			out = append(out, one(fmt.Sprintf("%s/%s/%s", family, d.name, s.name),
				fmt.Sprintf(title, d.name, s.name), tags(family, "np", d.name, s.tag), pol))
		}
	}
	return out
}

func actionCases() []Case {
	allow := []NPRule{{}}
	deny := []NPRule{}
	acts := []struct {
		name string
		pol  func(ns string) NP
	}{
		{"deny-all-ingress", func(ns string) NP { return NP{NS: ns, Name: "deny-all", Types: []string{"Ingress"}} }},
		{"deny-all-egress", func(ns string) NP { return NP{NS: ns, Name: "deny-all", Types: []string{"Egress"}} }},
		{"deny-all-both", func(ns string) NP { return NP{NS: ns, Name: "deny-all", Types: []string{"Ingress", "Egress"}} }},
		{"allow-all-ingress", func(ns string) NP {
			return NP{NS: ns, Name: "allow-all", Types: []string{"Ingress"}, Ingress: allow}
		}},
		{"allow-all-egress", func(ns string) NP {
			return NP{NS: ns, Name: "allow-all", Types: []string{"Egress"}, Egress: allow}
		}},
		{"allow-all-both", func(ns string) NP {
			return NP{NS: ns, Name: "allow-all", Types: []string{"Ingress", "Egress"}, Ingress: allow, Egress: allow}
		}},
		{"default-types-no-rules", func(ns string) NP { return NP{NS: ns, Name: "defaulted"} }},
		{"default-types-egress-rules", func(ns string) NP {
			return NP{NS: ns, Name: "defaulted", Egress: []NPRule{{Peers: []M{npNS(nsSel("y"))}}}}
		}},
		{"egress-type-ignores-ingress-rules", func(ns string) NP {
			return NP{NS: ns, Name: "egress-only", Types: []string{"Egress"}, Ingress: allow}
		}},
		{"deny-ingress-allow-egress", func(ns string) NP {
			return NP{NS: ns, Name: "mixed", Types: []string{"Ingress", "Egress"}, Ingress: deny, Egress: allow}
		}},
		{"allow-ingress-deny-egress", func(ns string) NP {
			return NP{NS: ns, Name: "mixed", Types: []string{"Ingress", "Egress"}, Ingress: allow, Egress: deny}
		}},
	}
	var out []Case
	for _, ns := range baseNamespaces {
		for _, a := range acts {
			out = append(out, one(fmt.Sprintf("action/%s/%s", ns, a.name),
				fmt.Sprintf("%s for every pod of %s", a.name, ns), tags("action", "np"), a.pol(ns)))
		}
	}
	return out
}

func ruleCases() []Case {
	tcp80, tcp81 := npPort("TCP", 80), npPort("TCP", 81)
	ruleSets := []struct {
		name  string
		rules []NPRule
	}{
		{"pod-b-tcp-80-and-ns-y-tcp-81", []NPRule{{Peers: []M{npPods(podSel("b"))}, Ports: []M{tcp80}}, {Peers: []M{npNS(nsSel("y"))}, Ports: []M{tcp81}}}},
		{"pod-b-and-pod-c", []NPRule{{Peers: []M{npPods(podSel("b"))}}, {Peers: []M{npPods(podSel("c"))}}}},
		{"pod-b-udp-80-and-udp-81", []NPRule{{Peers: []M{npPods(podSel("b"))}, Ports: []M{npPort("UDP", 80)}}, {Peers: []M{npPods(podSel("b"))}, Ports: []M{npPort("UDP", 81)}}}},
		{"ns-y-tcp-udp-80-and-ns-z-sctp-81", []NPRule{{Peers: []M{npNS(nsSel("y"))}, Ports: []M{tcp80, npPort("UDP", 80)}}, {Peers: []M{npNS(nsSel("z"))}, Ports: []M{npPort("SCTP", 81)}}}},
		{"ipblock-x-b-tcp-80-and-pod-c-tcp-81", []NPRule{{Peers: []M{npIP(cidr32("x/b"))}, Ports: []M{tcp80}}, {Peers: []M{npPods(podSel("c"))}, Ports: []M{tcp81}}}},
		{"pod-b-and-allow-all", []NPRule{{Peers: []M{npPods(podSel("b"))}}, {}}},
		{"ns-y-pod-b-tcp-80-and-anyone-udp-81", []NPRule{{Peers: []M{npBoth(nsSel("y"), podSel("b"))}, Ports: []M{tcp80}}, {Ports: []M{npPort("UDP", 81)}}}},
		{"three-rules", []NPRule{{Peers: []M{npPods(podSel("b"))}, Ports: []M{tcp80}}, {Peers: []M{npPods(podSel("c"))}, Ports: []M{tcp81}}, {Peers: []M{npNS(nsSel("z"))}, Ports: []M{npPort("SCTP", 80)}}}},
		{"duplicate-rules", []NPRule{{Peers: []M{npPods(podSel("b"))}, Ports: []M{tcp80}}, {Peers: []M{npPods(podSel("b"))}, Ports: []M{tcp80}}}},
		{"named-tcp-81-and-ns-y-udp-range", []NPRule{{Ports: []M{npPort("TCP", "serve-81-tcp")}}, {Peers: []M{npNS(nsSel("y"))}, Ports: []M{npRange("UDP", 80, 81)}}}},
	}
	var out []Case
	for _, d := range dirsOne {
		for _, r := range ruleSets {
			out = append(out, one(fmt.Sprintf("rules/%s/%s", d.name, r.name),
				fmt.Sprintf("x/a %s rules: %s", d.name, r.name), tags("rules", "np", d.name),
				policyFor("x", "rules", podSel("a"), d, r.rules...)))
		}
	}
	return out
}

func conflictCases() []Case {
	denyIn := func(ns string) NP { return NP{NS: ns, Name: "deny-all-ingress", Types: []string{"Ingress"}} }
	denyEg := func(ns string) NP { return NP{NS: ns, Name: "deny-all-egress", Types: []string{"Egress"}} }
	denyBoth := func(ns string) NP { return NP{NS: ns, Name: "deny-all", Types: []string{"Ingress", "Egress"}} }
	xa := podSel("a")
	cs := []struct {
		name string
		docs []any
	}{
		{"deny-all-and-allow-all-to-x-a", []any{denyIn("x"), policyFor("x", "allow-x-a", xa, dirIngress, NPRule{})}},
		{"deny-all-and-allow-pod-b-to-x-a", []any{denyIn("x"), policyFor("x", "allow-x-a", xa, dirIngress, NPRule{Peers: []M{npPods(podSel("b"))}})}},
		{"two-policies-tcp-80-pod-b-tcp-81-ns-y", []any{
			policyFor("x", "tcp-80", xa, dirIngress, NPRule{Peers: []M{npPods(podSel("b"))}, Ports: []M{npPort("TCP", 80)}}),
			policyFor("x", "tcp-81", xa, dirIngress, NPRule{Peers: []M{npNS(nsSel("y"))}, Ports: []M{npPort("TCP", 81)}})}},
		{"egress-deny-beats-ingress-allow", []any{
			policyFor("x", "deny-egress", xa, dirEgress),
			policyFor("y", "allow-from-x-a", podSel("b"), dirIngress, NPRule{Peers: []M{npBoth(nsSel("x"), xa)}})}},
		{"ingress-deny-beats-egress-allow", []any{
			policyFor("x", "allow-egress-y", xa, dirEgress, NPRule{Peers: []M{npNS(nsSel("y"))}}), denyIn("y")}},
		{"deny-all-egress-and-allow-all-egress-x-a", []any{denyEg("x"), policyFor("x", "allow-x-a", xa, dirEgress, NPRule{})}},
		{"ingress-policy-and-egress-policy-same-pod", []any{
			policyFor("x", "in", xa, dirIngress, NPRule{Peers: []M{npNS(nsSel("y"))}}),
			policyFor("x", "out", xa, dirEgress, NPRule{Peers: []M{npNS(nsSel("z"))}})}},
		{"deny-all-both-and-allow-all-both", []any{denyBoth("x"), NP{NS: "x", Name: "allow-all", Types: []string{"Ingress", "Egress"}, Ingress: []NPRule{{}}, Egress: []NPRule{{}}}}},
		{"udp-only-and-sctp-only", []any{
			policyFor("x", "udp", xa, dirIngress, NPRule{Ports: []M{npPort("UDP", nil)}}),
			policyFor("x", "sctp", xa, dirIngress, NPRule{Ports: []M{npPort("SCTP", 81)}})}},
		{"x-ingress-from-y-y-egress-to-z", []any{
			policyFor("x", "from-y", sel(), dirIngress, NPRule{Peers: []M{npNS(nsSel("y"))}}),
			policyFor("y", "to-z", sel(), dirEgress, NPRule{Peers: []M{npNS(nsSel("z"))}})}},
		{"overlapping-pod-selectors", []any{
			policyFor("x", "a-b-from-z", expr("pod", "In", "a", "b"), dirIngress, NPRule{Peers: []M{npNS(nsSel("z"))}}),
			policyFor("x", "a-from-y", xa, dirIngress, NPRule{Peers: []M{npNS(nsSel("y"))}})}},
		{"ipblock-allow-and-deny-all", []any{denyIn("x"),
			policyFor("x", "ipblock", xa, dirIngress, NPRule{Peers: []M{npIP(podsCIDR, node2CIDR)}})}},
		{"egress-deny-all-and-two-allows", []any{denyEg("x"),
			policyFor("x", "x-a-node-2", xa, dirEgress, NPRule{Peers: []M{npIP(node2CIDR)}}),
			policyFor("x", "x-b-tcp-81", podSel("b"), dirEgress, NPRule{Ports: []M{npPort("TCP", 81)}})}},
		{"both-sides-allow-x-to-y-tcp-80", []any{denyBoth("x"), denyBoth("y"),
			policyFor("x", "to-y", sel(), dirEgress, NPRule{Peers: []M{npNS(nsSel("y"))}, Ports: []M{npPort("TCP", 80)}}),
			policyFor("y", "from-x", sel(), dirIngress, NPRule{Peers: []M{npNS(nsSel("x"))}, Ports: []M{npPort("TCP", 80)}})}},
		{"one-side-allows-x-to-y-tcp-80", []any{denyBoth("x"), denyBoth("y"),
			policyFor("x", "to-y", sel(), dirEgress, NPRule{Peers: []M{npNS(nsSel("y"))}, Ports: []M{npPort("TCP", 80)}})}},
		{"allow-all-and-deny-all-z-a", []any{
			NP{NS: "z", Name: "allow-all", Types: []string{"Ingress"}, Ingress: []NPRule{{}}},
			policyFor("z", "deny-z-a", xa, dirIngress)}},
		{"allow-pods-and-ipblock-except-same-pod", []any{
			policyFor("x", "pods", xa, dirIngress, NPRule{Peers: []M{npPods(podSel("b"))}}),
			policyFor("x", "except", xa, dirIngress, NPRule{Peers: []M{npIP(podsCIDR, cidr32("x/b"))}})}},
	}
	var out []Case
	for _, c := range cs {
		out = append(out, one("conflict/"+c.name, c.name, tags("conflict", "np"), c.docs...))
	}
	return out
}

func namespaceCases() []Case {
	var out []Case
	for _, ns := range baseNamespaces {
		out = append(out,
			one("namespaces/"+ns+"/ingress-from-own-namespace", "every pod of "+ns+" allows ingress from "+ns+" only",
				tags("namespaces", "np"), policyFor(ns, "own", sel(), dirIngress, NPRule{Peers: []M{npPods(sel())}})),
			one("namespaces/"+ns+"/ingress-from-other-namespaces", "every pod of "+ns+" allows ingress from other namespaces only",
				tags("namespaces", "np"), policyFor(ns, "others", sel(), dirIngress, NPRule{Peers: []M{npNS(expr("kubernetes.io/metadata.name", "NotIn", ns))}})),
			one("namespaces/"+ns+"/egress-to-own-namespace", "every pod of "+ns+" allows egress to "+ns+" only",
				tags("namespaces", "np"), policyFor(ns, "own", sel(), dirEgress, NPRule{Peers: []M{npPods(sel())}})),
			one("namespaces/"+ns+"/ingress-from-metadata-name-x", "every pod of "+ns+" allows ingress from namespace x (kubernetes.io/metadata.name)",
				tags("namespaces", "np"), policyFor(ns, "from-x", sel(), dirIngress, NPRule{Peers: []M{npNS(mdSel("x"))}})),
		)
	}
	var all []any
	for _, ns := range baseNamespaces {
		all = append(all, NP{NS: ns, Name: "deny-all", Types: []string{"Ingress", "Egress"}})
	}
	out = append(out,
		one("namespaces/h/deny-all-selects-no-pod-network-pod", "a deny-all policy in h, whose only pod is host-network",
			tags("namespaces", "np", "hostnet"), NP{NS: "h", Name: "deny-all", Types: []string{"Ingress", "Egress"}}),
		one("namespaces/deny-all-everywhere", "deny-all in x, y and z", tags("namespaces", "np"), all...),
		one("namespaces/x-from-ns-in-y-z", "x allows ingress from namespaces y and z",
			tags("namespaces", "np"), policyFor("x", "from-y-z", sel(), dirIngress, NPRule{Peers: []M{npNS(expr("ns", "In", "y", "z"))}})),
	)
	return out
}
