package generator

// The upstream e2e cases (k8s.io/kubernetes test/e2e/network/netpol, as
// testdata/cases/e2e holds them) re-expressed on the base: namespaces are
// selected by kubernetes.io/metadata.name, as upstream does.

func upstreamCases() []Case {
	xa := podSel("a")
	in, eg := []string{"Ingress"}, []string{"Egress"}
	fromRule := func(peers ...M) NPRule { return NPRule{Peers: peers} }
	portRule := func(ports ...M) NPRule { return NPRule{Ports: ports} }
	allowXA := func(name string, r NPRule) NP {
		return NP{NS: "x", Name: name, Pods: xa, Types: in, Ingress: []NPRule{r}}
	}
	egressXA := func(name string, r NPRule) NP {
		return NP{NS: "x", Name: name, Pods: xa, Types: eg, Egress: []NPRule{r}}
	}
	denyIngressX := NP{NS: "x", Name: "deny-ingress", Types: in, Ingress: []NPRule{}}
	nsPodA := func(proto string) NP {
		r := fromRule(npBoth(mdSel("y"), podSel("a")))
		if proto != "" {
			r.Ports = []M{npPort(proto, 80)}
		}
		return allowXA("allow-ns-y-pod-a", r)
	}
	nsY81 := func(proto string) NP {
		return allowXA("allow-client-a-via-ns-selector", NPRule{Peers: []M{npNS(mdSel("y"))}, Ports: []M{npPort(proto, 81)}})
	}
	x := func(name string, docs ...any) Case {
		return one("upstream-e2e/"+name, name, tags("upstream-e2e", "np"), docs...)
	}
	xs := func(name string, steps ...Step) Case {
		return newCase("upstream-e2e/"+name, name, tags("upstream-e2e", "np"), steps...)
	}
	updatedPod := basePodYAML("x", "a", map[string]string{"pod": "a", "target": "isolated"})
	labelledY := namespaceYAML("y", map[string]string{"ns": "y", "kubernetes.io/metadata.name": "y", "ns2": "updated"})
	updatedXB := basePodYAML("x", "b", map[string]string{"pod": "b", "pod2": "updated"})
	deleteAll := del(step("delete every network policy"), npRef("x", "deny-all"))
	return []Case{
		x("allow-all", NP{NS: "x", Name: "allow-all", Types: in, Ingress: []NPRule{{}}}),
		x("allow-from-pods-within-namespace-podselector", allowXA("x-a-allows-x-b", fromRule(npPods(podSel("b"))))),
		xs("allow-ingress-for-target", step("deny all ingress in x, then allow all ingress to x/a", denyIngressX,
			NP{NS: "x", Name: "allow-all-to-x-a", Pods: xa, Types: in, Ingress: []NPRule{{}}})),
		x("allow-ingress-from-all-namespaces", allowXA("allow-client-a-via-ns-selector", fromRule(npNS(sel())))),
		x("allow-only-from-different-namespace-nsselector", allowXA("allow-client-a-via-ns-selector", fromRule(npNS(mdSel("y"))))),
		x("allow-pod-in-different-namespace-pod-and-ns-selector", nsPodA("")),
		x("any-podselectors", allowXA("allow-b-or-c", fromRule(npPods(podSel("b")), npPods(podSel("c"))))),
		xs("cidr-and-except-overlap",
			step("x/a egress to 0.0.0.0/4 except x/b", egressXA("allow-client-a-via-cidr-egress-rule", fromRule(npIP("0.0.0.0/4", cidr32("x/b"))))),
			step("update the policy to allow egress from x/a to x/b's IP only", egressXA("allow-client-a-via-cidr-egress-rule", fromRule(npIP(cidr32("x/b")))))),
		x("default-deny-all", NP{NS: "x", Name: "deny-all", Types: []string{"Ingress", "Egress"}, Ingress: []NPRule{}, Egress: []NPRule{}}),
		x("default-deny-ingress", denyIngressX),
		x("deny-egress-all-pods-in-namespace", NP{NS: "x", Name: "deny-egress", Types: eg, Egress: []NPRule{}}),
		x("deny-egress-client-side",
			egressXA("allow-to-ns-y-pod-a", fromRule(npBoth(mdSel("y"), podSel("a")))),
			NP{NS: "y", Name: "allow-from-xa-on-ya", Pods: podSel("a"), Types: in, Ingress: []NPRule{fromRule(npBoth(mdSel("x"), xa))}},
			NP{NS: "y", Name: "allow-from-xa-on-yb", Pods: podSel("b"), Types: in, Ingress: []NPRule{fromRule(npBoth(mdSel("x"), xa))}}),
		x("deny-egress-podselector", NP{NS: "x", Name: "deny-egress-x-a", Pods: xa, Types: eg, Egress: []NPRule{}}),
		x("deny-ingress-from-other-namespaces", NP{NS: "x", Name: "deny-others", Types: in, Ingress: []NPRule{fromRule(npPods(sel()))}}),
		xs("deny-ingress-to-updated-pod",
			step("deny ingress to pods labelled target=isolated (none yet)", NP{NS: "x", Name: "deny-ingress-via-label-selector", Pods: sel("target", "isolated"), Types: in, Ingress: []NPRule{}}),
			step("add label target=isolated to x/a", updatedPod)),
		x("egress-cidr-block", egressXA("allow-client-a-via-cidr-egress-rule", fromRule(npIP(cidr32("y/b"))))),
		x("egress-cidr-except", egressXA("allow-client-a-via-cidr-egress-rule", fromRule(npIP("0.0.0.0/4", cidr32("x/b"))))),
		x("egress-named-port", NP{NS: "x", Name: "allow-egress-serve-80", Types: eg, Egress: []NPRule{portRule(npPort("", "serve-80-tcp"))}}),
		x("egress-to-pod-in-different-namespace-pod-and-ns-selector", egressXA("allow-to-ns-y-pod-a", fromRule(npBoth(mdSel("y"), podSel("a"))))),
		x("ingress-and-egress-together", NP{NS: "x", Name: "in-and-out", Pods: xa, Types: []string{"Ingress", "Egress"},
			Ingress: []NPRule{fromRule(npPods(podSel("b")))}, Egress: []NPRule{portRule(npPort("TCP", 80))}}),
		x("ingress-any-port-specific-protocol", allowXA("allow-tcp", portRule(npPort("TCP", nil)))),
		xs("ingress-egress-independent",
			step("x/a allows all egress", NP{NS: "x", Name: "allow-egress", Pods: xa, Types: eg, Egress: []NPRule{{}}}),
			step("x/a denies all ingress", NP{NS: "x", Name: "deny-ingress", Pods: xa, Types: in, Ingress: []NPRule{}})),
		x("ingress-from-namespace-named-port", allowXA("allow-ns-y-serve-80", NPRule{Peers: []M{npNS(mdSel("y"))}, Ports: []M{npPort("", "serve-80-tcp")}})),
		xs("ingress-from-updated-namespace",
			step("x/a allows ingress from namespaces labelled ns2=updated (none yet)", allowXA("allow-updated-ns", fromRule(npNS(sel("ns2", "updated"))))),
			step("label namespace y with ns2=updated", labelledY)),
		xs("ingress-from-updated-pod",
			step("x/a allows ingress from pods labelled pod=b,pod2=updated (none yet)", allowXA("allow-updated-pod", fromRule(npPods(sel("pod", "b", "pod2", "updated"))))),
			step("add labels pod=b,pod2=updated to x/b", updatedXB)),
		x("ingress-named-port", NP{NS: "x", Name: "allow-serve-81", Types: in, Ingress: []NPRule{portRule(npPort("", "serve-81-tcp"))}}),
		xs("multiple-egress-allow-all-precedence",
			step("pods in x allow egress to port 80 only", NP{NS: "x", Name: "egress-80", Types: eg, Egress: []NPRule{portRule(npPort("TCP", 80))}}),
			step("add an allow-all egress policy in x", NP{NS: "x", Name: "allow-all-egress", Types: eg, Egress: []NPRule{{}}})),
		xs("multiple-ingress-allow-all-precedence",
			step("pods in x allow ingress on port 80 only", NP{NS: "x", Name: "ingress-80", Types: in, Ingress: []NPRule{portRule(npPort("TCP", 80))}}),
			step("add an allow-all ingress policy in x", NP{NS: "x", Name: "allow-all-ingress", Types: in, Ingress: []NPRule{{}}})),
		x("multiple-podselectors-and-nsselectors", allowXA("multi", fromRule(npBoth(expr("kubernetes.io/metadata.name", "NotIn", "x"), expr("pod", "In", "b", "c"))))),
		x("nonexistent-named-port", allowXA("allow-nonexistent", portRule(npPort("", "serve-82-tcp")))),
		x("nsselector-match-expressions-default-ns-label", egressXA("to-not-y", fromRule(npNS(expr("kubernetes.io/metadata.name", "NotIn", "y"))))),
		x("nsselector-match-expressions", allowXA("from-in-y", fromRule(npNS(expr("kubernetes.io/metadata.name", "In", "y"))))),
		x("nsselector-match-labels-default-ns-label", allowXA("from-y", fromRule(npNS(mdSel("y"))))),
		x("podselector-and-nsselector", allowXA("pod-b-not-x", fromRule(npBoth(expr("kubernetes.io/metadata.name", "NotIn", "x"), podSel("b"))))),
		x("podselector-match-expressions", allowXA("pod-in-b", fromRule(npPods(expr("pod", "In", "b"))))),
		x("podselector-or-nsselector", allowXA("not-x-or-pod-b", fromRule(npNS(expr("kubernetes.io/metadata.name", "NotIn", "x")), npPods(podSel("b"))))),
		x("ports", nsY81("TCP")),
		x("sctp-default-deny-ingress", NP{NS: "x", Name: "deny-ingress", Types: in}),
		x("sctp-not-treated-as-tcp", denyIngressX, allowXA("allow-sctp-81", portRule(npPort("SCTP", 81)))),
		x("sctp-pod-in-different-namespace-pod-and-ns-selector", nsPodA("SCTP")),
		x("sctp-policy-isolates-tcp", allowXA("allow-sctp-80", portRule(npPort("SCTP", 80)))),
		x("sctp-ports", nsY81("SCTP")),
		xs("stacked-policies-overlapping-podselectors",
			step("x/a allows ingress from namespace y on TCP 81 only", nsY81("TCP")),
			step("a second policy on x/a unblocks TCP 80 from namespace y", allowXA("allow-80", NPRule{Peers: []M{npNS(mdSel("y"))}, Ports: []M{npPort("TCP", 80)}}))),
		xs("stop-enforcing-after-delete",
			step("deny all ingress and egress in x", NP{NS: "x", Name: "deny-all", Types: []string{"Ingress", "Egress"}}),
			deleteAll),
		x("udp-default-deny-ingress", NP{NS: "x", Name: "deny-ingress", Types: in, Ingress: []NPRule{}}),
		x("udp-pod-in-different-namespace-pod-and-ns-selector", nsPodA("UDP")),
		x("udp-policy-no-tcp", allowXA("allow-udp-81", portRule(npPort("UDP", 81)))),
		x("udp-ports", nsY81("UDP")),
		xs("updated-policy",
			step("allow all ingress in x", NP{NS: "x", Name: "allow-ingress", Types: in, Ingress: []NPRule{{}}}),
			step("update the same policy to deny all ingress", NP{NS: "x", Name: "allow-ingress", Types: in, Ingress: []NPRule{}})),
	}
}
