package generator

import (
	"fmt"
	"strings"
)

// The admin-tier families: AdminNetworkPolicy and BaselineAdminNetworkPolicy
// v1alpha1, ClusterNetworkPolicy v1alpha2 and v1beta1 in both tiers.

var (
	adminAPIs = []string{apiANP, apiCNP2, apiCNP1}
	// baselineAPIs are the baseline-tier generations: the BANP and the
	// Baseline CNPs.
	baselineAPIs = []string{apiBANP, apiCNP2, apiCNP1}
)

// apiTag is the tag naming an API generation.
func apiTag(api string) string {
	switch api {
	case apiANP:
		return "anp"
	case apiBANP:
		return "banp"
	case apiCNP2:
		return "cnp-v1alpha2"
	}
	return "cnp-v1beta1"
}

// adminPol is an admin-tier policy of api with rules in direction dir.
func adminPol(api, name string, prio int, subj ASubject, dir string, rules ...ARule) Admin {
	p := Admin{API: api, Tier: tierA, Name: name, Priority: prio, Subject: subj}
	if dir == "ingress" {
		p.Ingress = rules
	} else {
		p.Egress = rules
	}
	return p
}

// baselinePol is a baseline-tier policy: the BANP, or a Baseline CNP.
func baselinePol(api, name string, prio int, subj ASubject, dir string, rules ...ARule) Admin {
	p := adminPol(api, name, prio, subj, dir, rules...)
	p.Tier = tierB
	if api == apiBANP {
		p.Name, p.Priority = "default", 0
	}
	return p
}

func rule(action string, peers ...APeer) ARule { return ARule{Action: action, Peers: peers} }

func (r ARule) on(ports ...APort) ARule { r.Ports = ports; return r }

var (
	subjX     = subjNS(nsSel("x"))
	subjAll   = subjNS(sel())
	peerY     = peerNS(nsSel("y"))
	peerAllNS = peerNS(sel())
)

// npDeny is a deny-all NetworkPolicy in ns for dir ("ingress"/"egress").
func npDeny(ns, dir string) NP {
	t := strings.ToUpper(dir[:1]) + dir[1:]
	return NP{NS: ns, Name: "deny-all-" + dir, Types: []string{t}}
}

func npAllowFrom(ns, dir string, peers ...M) NP {
	d := dirIngress
	if dir == "egress" {
		d = dirEgress
	}
	return policyFor(ns, "allow-"+dir, sel(), d, NPRule{Peers: peers})
}

func actionName(a string) string {
	return strings.ToLower(a)
}

func adminCase(name, desc string, t []string, docs ...any) Case {
	return one("admin/"+name, desc, append(tags("admin"), t...), docs...)
}

func baselineCase(name, desc string, t []string, docs ...any) Case {
	return one("baseline/"+name, desc, append(tags("baseline"), t...), docs...)
}

func adminActionCases() []Case {
	var out []Case
	for _, api := range adminAPIs {
		for _, dir := range []string{"ingress", "egress"} {
			for _, act := range []string{actAllw, actDeny, actPass} {
				t := tags("action", apiTag(api), dir)
				if act == actPass {
					t = append(t, "pass")
				}
				out = append(out, adminCase(fmt.Sprintf("action/%s/%s/%s", apiTag(api), dir, actionName(act)),
					fmt.Sprintf("%s %s of x with y over a NetworkPolicy deny-all in x", act, dir), t,
					adminPol(api, "x-"+actionName(act)+"-y", 10, subjX, dir, rule(act, peerY)), npDeny("x", dir)))
			}
		}
	}
	return out
}

func adminPriorityCases() []Case {
	pairs := [][2]string{{apiANP, apiANP}, {apiANP, apiCNP1}, {apiCNP2, apiCNP1}, {apiCNP1, apiANP}}
	var out []Case
	for _, pr := range pairs {
		for _, dir := range []string{"ingress", "egress"} {
			for _, order := range []struct {
				name              string
				denyPrio, allowPr int
			}{{"deny-first", 10, 20}, {"allow-first", 20, 10}, {"same-priority", 10, 10}} {
				t := tags("priority", apiTag(pr[0]), apiTag(pr[1]), dir)
				if order.denyPrio == order.allowPr {
					t = append(t, "same-priority")
				}
				out = append(out, adminCase(fmt.Sprintf("priority/%s-%s/%s/%s", apiTag(pr[0]), apiTag(pr[1]), dir, order.name),
					fmt.Sprintf("deny y/a at priority %d, allow y at priority %d", order.denyPrio, order.allowPr), t,
					adminPol(pr[0], "deny-y-a", order.denyPrio, subjX, dir, rule(actDeny, peerPods(nsSel("y"), podSel("a")))),
					adminPol(pr[1], "allow-y", order.allowPr, subjX, dir, rule(actAllw, peerY)),
					npDeny("x", dir)))
			}
		}
	}
	return out
}

func adminRuleOrderCases() []Case {
	var out []Case
	deny := rule(actDeny, peerPods(nsSel("y"), podSel("a")))
	allow := rule(actAllw, peerY)
	for _, api := range adminAPIs {
		for _, dir := range []string{"ingress", "egress"} {
			out = append(out,
				adminCase(fmt.Sprintf("rule-order/%s/%s/deny-then-allow", apiTag(api), dir), "rules: deny y/a, then allow y",
					tags("rules", apiTag(api), dir), adminPol(api, "ordered", 10, subjX, dir, deny, allow), npDeny("x", dir)),
				adminCase(fmt.Sprintf("rule-order/%s/%s/allow-then-deny", apiTag(api), dir), "rules: allow y, then deny y/a (never reached)",
					tags("rules", apiTag(api), dir), adminPol(api, "ordered", 10, subjX, dir, allow, deny), npDeny("x", dir)),
			)
		}
	}
	return out
}

func passCases() []Case {
	var out []Case
	for _, api := range adminAPIs {
		for _, dir := range []string{"ingress", "egress"} {
			pass := adminPol(api, "pass-y", 10, subjX, dir, rule(actPass, peerY))
			name := func(s string) string { return fmt.Sprintf("pass/%s/%s/%s", apiTag(api), dir, s) }
			t := func(more ...string) []string { return append(tags("pass", apiTag(api), dir), more...) }
			npYB := npAllowFrom("x", dir, npBoth(nsSel("y"), podSel("b")))
			banpDenyY := baselinePol(apiBANP, "", 0, subjX, dir, rule(actDeny, peerY))
			out = append(out,
				adminCase(name("to-networkpolicy"), "Pass y, then a NetworkPolicy in x allows y/b only", t(), pass, npYB),
				adminCase(name("to-banp"), "Pass y, no NetworkPolicy, the BANP denies y", t("baseline"), pass, banpDenyY),
				adminCase(name("networkpolicy-before-banp"), "Pass y, a NetworkPolicy allows y/b, the BANP denies y", t("baseline"), pass, npYB, banpDenyY),
				adminCase(name("to-baseline-cnp"), "Pass y, a Baseline CNP denies y/a", t("baseline"), pass,
					baselinePol(apiCNP1, "baseline-deny-y-a", 50, subjX, dir, rule(actDeny, peerPods(nsSel("y"), podSel("a"))))),
				adminCase(name("skips-rest-of-admin-tier"), "Pass y at priority 10 skips a Deny y at priority 20; a NetworkPolicy allows y/b only", t("priority"), pass,
					adminPol(api, "deny-y", 20, subjX, dir, rule(actDeny, peerY)), npYB),
				adminCase(name("baseline-cnp-pass-skips-banp"), "Pass y in both tiers: the Baseline CNP pass skips the BANP deny", t("baseline"), pass,
					baselinePol(apiCNP2, "baseline-pass-y", 5, subjX, dir, rule(actPass, peerY)),
					baselinePol(apiBANP, "", 0, subjX, dir, rule(actDeny, peerAllNS))),
			)
		}
	}
	return out
}

func baselineCases() []Case {
	var out []Case
	for _, api := range baselineAPIs {
		for _, dir := range []string{"ingress", "egress"} {
			name := func(s string) string { return fmt.Sprintf("%s/%s/%s", apiTag(api), dir, s) }
			t := func(more ...string) []string { return append(tags(apiTag(api), dir), more...) }
			out = append(out,
				baselineCase(name("allow-y-deny-rest"), "baseline: allow y, deny the rest", t("action"),
					baselinePol(api, "baseline", 10, subjX, dir, rule(actAllw, peerY), rule(actDeny, peerAllNS))),
				baselineCase(name("deny-y"), "baseline: deny y", t("action"),
					baselinePol(api, "baseline", 10, subjX, dir, rule(actDeny, peerY))),
				baselineCase(name("networkpolicy-overrides"), "baseline denies all; a NetworkPolicy in x allows y/b", t("action"),
					baselinePol(api, "baseline", 10, subjAll, dir, rule(actDeny, peerAllNS)),
					npAllowFrom("x", dir, npBoth(nsSel("y"), podSel("b")))),
				baselineCase(name("admin-overrides"), "baseline denies all; an ANP allows y into x", t("admin"),
					baselinePol(api, "baseline", 10, subjAll, dir, rule(actDeny, peerAllNS)),
					adminPol(apiANP, "allow-y", 10, subjX, dir, rule(actAllw, peerY))),
			)
			if api != apiBANP {
				out = append(out,
					baselineCase(name("pass-y-deny-rest"), "Baseline CNP: pass y (default allow), deny the rest", t("pass"),
						baselinePol(api, "baseline", 10, subjX, dir, rule(actPass, peerY), rule(actDeny, peerAllNS))),
					baselineCase(name("priority"), "Baseline CNPs: deny y/a at 10, accept y at 20, then the BANP denies all", t("priority"),
						baselinePol(api, "deny-y-a", 10, subjX, dir, rule(actDeny, peerPods(nsSel("y"), podSel("a")))),
						baselinePol(api, "accept-y", 20, subjX, dir, rule(actAllw, peerY)),
						baselinePol(apiBANP, "", 0, subjX, dir, rule(actDeny, peerAllNS))),
					baselineCase(name("before-banp"), "a Baseline CNP at priority 1000 accepts y before the BANP denies every namespace", t("priority"),
						baselinePol(api, "accept-y", 1000, subjX, dir, rule(actAllw, peerY)),
						baselinePol(apiBANP, "", 0, subjX, dir, rule(actDeny, peerAllNS))),
				)
			}
		}
	}
	return out
}

func networksCases() []Case {
	nets := []struct {
		name  string
		cidrs []string
	}{
		{"node-2-pod-cidr", []string{node2CIDR}},
		{"two-pods", []string{cidr32("x/b"), cidr32("y/a")}},
		{"nodes", []string{nodesCIDR}},
		{"all", []string{"0.0.0.0/0"}},
		{"outside", []string{outsideCIDR}},
		{"pods", []string{podsCIDR}},
		{"node-1-address", []string{node1IP + "/32"}},
	}
	var out []Case
	for _, api := range adminAPIs {
		for _, n := range nets {
			out = append(out, adminCase(fmt.Sprintf("networks/%s/deny-%s", apiTag(api), n.name), "x denies egress to networks "+n.name,
				tags("networks", apiTag(api), "egress"), adminPol(api, "deny-networks", 10, subjX, "egress", rule(actDeny, peerNets(n.cidrs...)))))
		}
		out = append(out,
			adminCase(fmt.Sprintf("networks/%s/allow-node-2-deny-all", apiTag(api)), "x allows egress to node-2's pod CIDR, denies every other address",
				tags("networks", apiTag(api), "egress", "rules"), adminPol(api, "networks", 10, subjX, "egress",
					rule(actAllw, peerNets(node2CIDR)), rule(actDeny, peerNets("0.0.0.0/0")))),
			adminCase(fmt.Sprintf("networks/%s/pass-node-1-to-networkpolicy", apiTag(api)), "x passes egress to node-1's pod CIDR to a NetworkPolicy deny-all",
				tags("networks", apiTag(api), "egress", "pass"), adminPol(api, "pass-networks", 10, subjX, "egress",
					rule(actPass, peerNets(node1CIDR))), npDeny("x", "egress")),
		)
	}
	for _, api := range baselineAPIs {
		for _, n := range nets[:3] {
			out = append(out, baselineCase(fmt.Sprintf("networks/%s/deny-%s", apiTag(api), n.name), "baseline: x denies egress to networks "+n.name,
				tags("networks", apiTag(api), "egress"), baselinePol(api, "deny-networks", 10, subjX, "egress", rule(actDeny, peerNets(n.cidrs...)))))
		}
	}
	return out
}

func nodesCases() []Case {
	nodes := []namedSel{
		{"all", sel()},
		{"hostname-node-1", sel("kubernetes.io/hostname", "node-1")},
		{"hostname-node-2", sel("kubernetes.io/hostname", "node-2")},
		{"rack-r1", sel("rack", "r1")},
		{"rack-in-r1-r2", expr("rack", "In", "r1", "r2")},
		{"rack-notin-r1", expr("rack", "NotIn", "r1")},
	}
	var out []Case
	for _, api := range adminAPIs {
		for _, n := range nodes {
			out = append(out, adminCase(fmt.Sprintf("nodes/%s/deny-%s", apiTag(api), n.name), "every pod denies egress to nodes "+n.name,
				tags("nodes", "hostnet", apiTag(api), "egress"), adminPol(api, "deny-nodes", 10, subjAll, "egress", rule(actDeny, peerNodes(n.sel)))))
		}
		out = append(out, adminCase(fmt.Sprintf("nodes/%s/allow-node-1-deny-all", apiTag(api)), "x allows egress to node-1, denies every other address",
			tags("nodes", "hostnet", "networks", apiTag(api), "egress", "rules"), adminPol(api, "nodes", 10, subjX, "egress",
				rule(actAllw, peerNodes(sel("kubernetes.io/hostname", "node-1"))), rule(actDeny, peerNets("0.0.0.0/0")))))
	}
	for _, api := range baselineAPIs {
		out = append(out, baselineCase(fmt.Sprintf("nodes/%s/deny-all", apiTag(api)), "baseline: every pod denies egress to every node",
			tags("nodes", "hostnet", apiTag(api), "egress"), baselinePol(api, "deny-nodes", 10, subjAll, "egress", rule(actDeny, peerNodes(sel())))))
	}
	return out
}

func adminPortCases() []Case {
	ports := []struct {
		name  string
		ports []APort
	}{
		{"tcp-80", []APort{aport("TCP", 80)}},
		{"udp-81", []APort{aport("UDP", 81)}},
		{"sctp-80", []APort{aport("SCTP", 80)}},
		{"range-tcp-80-81", []APort{arange("TCP", 80, 81)}},
		{"range-udp-81-90", []APort{arange("UDP", 81, 90)}},
		{"named-serve-80-tcp", []APort{anamed("serve-80-tcp")}},
		{"named-serve-81-udp", []APort{anamed("serve-81-udp")}},
		{"named-nonexistent", []APort{anamed("serve-82-tcp")}},
		{"any-tcp", []APort{aany("TCP")}},
		{"tcp-81-and-sctp-81", []APort{aport("TCP", 81), aport("SCTP", 81)}},
	}
	var out []Case
	for _, api := range adminAPIs {
		for _, p := range ports {
			out = append(out, adminCase(fmt.Sprintf("ports/%s/ingress/deny-%s", apiTag(api), p.name), "x denies ingress from y on "+p.name,
				tags("ports", apiTag(api), "ingress"), adminPol(api, "deny-ports", 10, subjX, "ingress", rule(actDeny, peerY).on(p.ports...))))
		}
	}
	for _, p := range []int{5, 3, 8} {
		out = append(out, adminCase(fmt.Sprintf("ports/%s/egress/deny-%s", apiTag(apiCNP1), ports[p].name), "x denies egress to y on "+ports[p].name,
			tags("ports", apiTag(apiCNP1), "egress"), adminPol(apiCNP1, "deny-ports", 10, subjX, "egress", rule(actDeny, peerY).on(ports[p].ports...))))
	}
	out = append(out, baselineCase("ports/banp/ingress/allow-named-serve-81-tcp-deny-rest", "BANP: x allows ingress from y on serve-81-tcp, denies the rest",
		tags("ports", "banp", "ingress"), baselinePol(apiBANP, "", 0, subjX, "ingress",
			rule(actAllw, peerY).on(anamed("serve-81-tcp")), rule(actDeny, peerAllNS))))
	return out
}

func hostnetCases() []Case {
	return []Case{
		adminCase("hostnet/deny-all-namespaces-ingress", "every pod denies ingress from every namespace: the host-network pod is no namespace peer",
			tags("hostnet", "anp", "ingress"), adminPol(apiANP, "deny-all", 10, subjAll, "ingress", rule(actDeny, peerAllNS))),
		adminCase("hostnet/deny-all-namespaces-egress", "every pod denies egress to every namespace: the host-network pod is no namespace peer",
			tags("hostnet", "cnp-v1beta1", "egress"), adminPol(apiCNP1, "deny-all", 10, subjAll, "egress", rule(actDeny, peerAllNS))),
		adminCase("hostnet/deny-egress-to-node-1-address", "every pod denies egress to node-1's address (the host-network pod)",
			tags("hostnet", "networks", "cnp-v1alpha2", "egress"), adminPol(apiCNP2, "deny-node-1", 10, subjAll, "egress", rule(actDeny, peerNets(node1IP+"/32")))),
		adminCase("hostnet/subject-all-pods-deny-all", "an ANP selecting every pod denies everything: the host-network pod is never a subject",
			tags("hostnet", "anp", "ingress"), adminPol(apiANP, "deny-everything", 10, subjPods(sel(), sel()), "ingress", rule(actDeny, peerAllNS)),
			adminPol(apiANP, "deny-everything-egress", 11, subjPods(sel(), sel()), "egress", rule(actDeny, peerNets("0.0.0.0/0")))),
		one("hostnet/np-ipblock-nodes-to-x-b", "x/b (node-2) allows ingress from node addresses only", tags("hostnet", "np", "peers", "ipblock"),
			policyFor("x", "from-nodes", podSel("b"), dirIngress, NPRule{Peers: []M{npIP(nodesCIDR)}})),
		one("hostnet/np-deny-all-x", "deny-all ingress in x: the host-network pod reaches x's pods on node-1 only", tags("hostnet", "np", "action"),
			npDeny("x", "ingress")),
		one("hostnet/np-egress-to-nodes-only", "x egress only to node addresses", tags("hostnet", "np", "peers", "ipblock"),
			policyFor("x", "to-nodes", sel(), dirEgress, NPRule{Peers: []M{npIP(nodesCIDR)}})),
		one("hostnet/np-egress-to-all-except-node-1", "x egress to everything but node-1's address", tags("hostnet", "np", "peers", "ipblock"),
			policyFor("x", "not-node-1", sel(), dirEgress, NPRule{Peers: []M{npIP("0.0.0.0/0", node1IP+"/32")}})),
		baselineCase("hostnet/banp-deny-all-allow-nodes", "BANP: every pod allows egress to nodes, denies all other addresses",
			tags("hostnet", "nodes", "networks", "banp", "egress"), baselinePol(apiBANP, "", 0, subjAll, "egress",
				rule(actAllw, peerNodes(sel())), rule(actDeny, peerNets("0.0.0.0/0")))),
	}
}
