package generator

import "fmt"

// churnCases change the cluster between steps: pod, namespace and node
// labels, policy updates and deletes, pods added and removed.
func churnCases() []Case {
	in := []string{"Ingress"}
	allowFrom := func(name string, peers ...M) NP {
		return NP{NS: "x", Name: name, Pods: podSel("a"), Types: in, Ingress: []NPRule{{Peers: peers}}}
	}
	c := func(name, desc string, t []string, steps ...Step) Case {
		return newCase("churn/"+name, desc, append(tags("churn"), t...), steps...)
	}
	xcAsB := basePodYAML("x", "c", map[string]string{"pod": "b"})
	xcBase := basePodYAML("x", "c", nil)
	zAsY := namespaceYAML("z", map[string]string{"ns": "y", "kubernetes.io/metadata.name": "z"})
	yUnlabelled := namespaceYAML("y", map[string]string{"kubernetes.io/metadata.name": "y"})
	yd := podYAML("y", "d", "node-2", "10.244.2.23", map[string]string{"pod": "d"})
	xd := podYAML("x", "d", "node-1", "10.244.1.13", map[string]string{"pod": "b"})
	xaMoved := podYAML("x", "a", "node-2", "10.244.2.14", map[string]string{"pod": "a"})
	xaTarget := basePodYAML("x", "a", map[string]string{"pod": "a", "target": "yes"})
	ySubject := namespaceYAML("y", map[string]string{"ns": "y", "kubernetes.io/metadata.name": "y", "tenant": "t1"})
	node1R2 := fmt.Sprintf(nodeTemplate, "node-1", "r2", node1CIDR, node1IP)
	node1R1 := fmt.Sprintf(nodeTemplate, "node-1", "r1", node1CIDR, node1IP)

	denyYA := adminPol(apiANP, "deny-y-a", 10, subjX, "ingress", rule(actDeny, peerPods(nsSel("y"), podSel("a"))))
	banpDenyY := baselinePol(apiBANP, "", 0, subjX, "ingress", rule(actDeny, peerY))
	cnpAllowY := adminPol(apiCNP1, "allow-y", 20, subjX, "ingress", rule(actAllw, peerY))
	cnpPassY := adminPol(apiCNP2, "pass-y", 10, subjX, "egress", rule(actPass, peerY))
	cnpDenyY := adminPol(apiCNP2, "pass-y", 10, subjX, "egress", rule(actDeny, peerY))
	nets := func(cidrs ...string) Admin {
		return adminPol(apiCNP1, "deny-nets", 10, subjX, "egress", rule(actDeny, peerNets(cidrs...)))
	}
	nodesR2 := adminPol(apiANP, "deny-rack-r2", 10, subjAll, "egress", rule(actDeny, peerNodes(sel("rack", "r2"))))

	return []Case{
		c("pod-label-gains-access", "x/a allows pod=b; x/c is relabelled pod=b, then back", tags("np", "peers"),
			step("x/a allows ingress from pod=b", allowFrom("from-b", npPods(podSel("b")))),
			step("relabel x/c pod=b", xcAsB), step("restore x/c's labels", xcBase)),
		c("namespace-label-gains-access", "x/a allows ns=y; z is relabelled ns=y, then y loses its label", tags("np", "namespaces"),
			step("x/a allows ingress from ns=y", allowFrom("from-y", npNS(nsSel("y")))),
			step("relabel z ns=y", zAsY), step("y loses its ns label", yUnlabelled)),
		c("np-update-and-delete", "x/a allows pod=b, then pod=c, then the policy is deleted", tags("np"),
			step("allow pod=b", allowFrom("allow", npPods(podSel("b")))),
			step("update: allow pod=c", allowFrom("allow", npPods(podSel("c")))),
			del(step("delete the policy"), npRef("x", "allow"))),
		c("np-policytypes-update", "a deny-all ingress policy in x gains Egress, then loses Ingress", tags("np", "action"),
			step("deny-all ingress", NP{NS: "x", Name: "deny", Types: in}),
			step("deny-all both", NP{NS: "x", Name: "deny", Types: []string{"Ingress", "Egress"}}),
			step("deny-all egress", NP{NS: "x", Name: "deny", Types: []string{"Egress"}})),
		c("pod-added-and-removed", "x/a allows pod=d; y/d is added, then removed", tags("np", "peers"),
			step("x/a allows ingress from pod=d in any namespace", allowFrom("from-d", npBoth(sel(), podSel("d")))),
			step("add y/d", yd), del(step("remove y/d"), podRef("y", "d"))),
		c("pod-removed-and-readded", "x/a allows pod=b; x/b is deleted, then a new pod=b x/d starts", tags("np", "peers"),
			step("x/a allows ingress from pod=b", allowFrom("from-b", npPods(podSel("b")))),
			del(step("remove x/b"), podRef("x", "b")), step("add x/d labelled pod=b", xd)),
		c("pod-moves-node-and-address", "x/b allows ingress from x/a's address; x/a is recreated on node-2 with a new address", tags("np", "ipblock"),
			step("x/b allows ingress from x/a's address", NP{NS: "x", Name: "from-xa-ip", Pods: podSel("b"), Types: in, Ingress: []NPRule{{Peers: []M{npIP(cidr32("x/a"))}}}}),
			del(step("recreate x/a on node-2", xaMoved), podRef("x", "a"))),
		c("anp-delete-falls-to-banp", "ANP deny y/a over BANP deny y; ANP deleted; BANP deleted", tags("admin", "baseline", "anp", "banp"),
			step("ANP deny y/a, CNP allow y at 20, BANP deny y", denyYA, cnpAllowY, banpDenyY),
			del(step("delete the ANP"), adminRef(denyYA)),
			del(step("delete the CNP"), adminRef(cnpAllowY)),
			del(step("delete the BANP"), adminRef(banpDenyY))),
		c("anp-subject-pod-label", "an ANP whose subject is pods labelled target=yes; x/a gains the label", tags("admin", "anp", "target"),
			step("ANP deny from y to target=yes pods", adminPol(apiANP, "deny-target", 10, subjPods(sel(), sel("target", "yes")), "ingress", rule(actDeny, peerY))),
			step("label x/a target=yes", xaTarget)),
		c("cnp-subject-namespace-label", "a CNP whose subject is namespaces tenant=t1; y gains the label", tags("admin", "cnp-v1beta1", "namespaces"),
			step("CNP deny egress to x from tenant=t1", adminPol(apiCNP1, "tenant", 10, subjNS(sel("tenant", "t1")), "egress", rule(actDeny, peerNS(nsSel("x"))))),
			step("label y tenant=t1", ySubject)),
		c("priority-flip", "deny y/a at 10 and allow y at 20, then the priorities swap", tags("admin", "priority", "anp", "cnp-v1beta1"),
			step("deny first", denyYA, cnpAllowY, npDeny("x", "ingress")),
			step("swap priorities", adminPol(apiANP, "deny-y-a", 30, subjX, "ingress", rule(actDeny, peerPods(nsSel("y"), podSel("a")))),
				adminPol(apiCNP1, "allow-y", 5, subjX, "ingress", rule(actAllw, peerY)))),
		c("pass-becomes-deny", "a CNP v1alpha2 Pass y in front of a NetworkPolicy allow y/b becomes Deny", tags("admin", "pass", "cnp-v1alpha2"),
			step("Pass y, NetworkPolicy allows y/b", cnpPassY, npAllowFrom("x", "egress", npBoth(nsSel("y"), podSel("b")))),
			step("update the rule to Deny", cnpDenyY)),
		c("networks-update", "a CNP denying egress to node-2's pod CIDR is narrowed to one pod, then widened to all pods", tags("admin", "networks", "cnp-v1beta1"),
			step("deny node-2's pod CIDR", nets(node2CIDR)), step("deny x/b only", nets(cidr32("x/b"))), step("deny all pods", nets(podsCIDR))),
		c("node-label-change", "an ANP denies egress to rack=r2 nodes; node-1 moves to rack r2, then back", tags("admin", "nodes", "hostnet", "anp"),
			step("deny egress to rack=r2", nodesR2), step("node-1 to rack r2", node1R2), step("node-1 back to rack r1", node1R1)),
		c("hostnet-pod-removed", "x egress only to node addresses; the host-network pod is removed", tags("np", "hostnet"),
			step("x egress only to nodes", policyFor("x", "to-nodes", sel(), dirEgress, NPRule{Peers: []M{npIP(nodesCIDR)}})),
			del(step("remove h/h"), podRef("h", "h"))),
		c("banp-update", "the BANP allows y then denies all; it is updated to deny y only", tags("baseline", "banp"),
			step("BANP allow y, deny all", baselinePol(apiBANP, "", 0, subjX, "ingress", rule(actAllw, peerY), rule(actDeny, peerAllNS))),
			step("BANP deny y", banpDenyY)),
		c("tiers-stack-up", "a NetworkPolicy, then an ANP, then a BANP; then the NetworkPolicy is deleted", tags("np", "admin", "baseline", "anp", "banp"),
			step("NetworkPolicy: x/a allows pod=b", allowFrom("from-b", npPods(podSel("b")))),
			step("ANP denies y/a into x", denyYA),
			step("BANP denies y into x", banpDenyY),
			del(step("delete the NetworkPolicy"), npRef("x", "from-b"))),
		c("baseline-cnp-tier-change", "a CNP v1beta1 denying y is moved from the Admin to the Baseline tier under a NetworkPolicy allow-all", tags("admin", "baseline", "cnp-v1beta1"),
			step("Admin tier deny y, NetworkPolicy allows all into x", adminPol(apiCNP1, "deny-y", 10, subjX, "ingress", rule(actDeny, peerY)),
				NP{NS: "x", Name: "allow-all", Types: in, Ingress: []NPRule{{}}}),
			step("move it to the Baseline tier", baselinePol(apiCNP1, "deny-y", 10, subjX, "ingress", rule(actDeny, peerY)))),
		c("policy-added-to-other-namespace", "deny-all in x, then in y, then x's is deleted", tags("np", "namespaces"),
			step("deny-all in x", NP{NS: "x", Name: "deny-all", Types: []string{"Ingress", "Egress"}}),
			step("deny-all in y", NP{NS: "y", Name: "deny-all", Types: []string{"Ingress", "Egress"}}),
			del(step("delete x's"), npRef("x", "deny-all"))),
		c("pod-added-to-subject-namespace", "an ANP denies egress from x to y; a new pod x/d starts and is a subject", tags("admin", "anp", "target"),
			step("deny x to y", adminPol(apiANP, "deny-x-y", 10, subjX, "egress", rule(actDeny, peerY))),
			step("add x/d", xd)),
	}
}
