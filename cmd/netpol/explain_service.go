package main

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/report"
)

// serviceVerdict explains a connection to a Service: policy sees the
// endpoint the connection is sent to (after DNAT), so each endpoint the
// DNATing node may choose is explained on its own. Allowed is true iff
// there is such an endpoint and policy allows every one of them.
type serviceVerdict struct {
	From string `json:"from"`
	// To is the destination as given (svc/..., nodeport/..., or an
	// address); Frontend says how it reaches the Service.
	To        string          `json:"to"`
	Allowed   bool            `json:"allowed"`
	Service   string          `json:"service"`
	Frontend  string          `json:"frontend"`
	ClusterIP string          `json:"clusterIP"`
	Address   string          `json:"address"` // the address dialed
	Protocol  corev1.Protocol `json:"protocol"`
	Port      int32           `json:"port"` // the port dialed
	// Node is the node whose rules DNAT the connection.
	Node string `json:"node"`
	// EgressBeforeDNAT is the source pod's egress verdict when its own
	// node does not DNAT the connection (a NodePort on another node): its
	// node sees the node address and port dialed, not the endpoint.
	EgressBeforeDNAT *eval.Verdict     `json:"egressBeforeDNAT,omitempty"`
	Endpoints        []endpointVerdict `json:"endpoints"`
	// Note says what the Service's traffic policy and masquerading do, and
	// what happens with no endpoint.
	Note string `json:"note,omitempty"`
	// DroppedBy says why the connection fails when it does:
	// "no endpoint", "traffic policy" or "policy".
	DroppedBy string `json:"droppedBy,omitempty"`
}

type endpointVerdict struct {
	Endpoint string `json:"endpoint"` // namespace/pod, or the address
	Address  string `json:"address"`
	Port     int32  `json:"port"`
	Node     string `json:"node,omitempty"`
	// PolicySource is the source the endpoint's ingress policy sees: the
	// client, or the DNATing node's address when the client is
	// masqueraded on its way to an endpoint on another node.
	PolicySource string `json:"policySource"`
	// Allowed is the connection's verdict to this endpoint: Verdict's,
	// or with EgressBeforeDNAT, that egress and Verdict's ingress.
	Allowed bool          `json:"allowed"`
	Verdict *eval.Verdict `json:"verdict"`
}

// serviceTarget is a destination that DNAT rewrites: one frontend of a
// Service.
type serviceTarget struct {
	given     string
	namespace string
	name      string
	frontend  proxy.FrontendKind
	node      string     // NodePort: the node whose address is dialed
	addr      netip.Addr // the address dialed, when given as one
}

// parseServiceName reads the names explain accepts for a Service:
// svc/NS/NAME and service/NS/NAME (its ClusterIP), nodeport/NODE/NS/NAME
// (its NodePort on NODE's address). ok is false for other names.
func parseServiceName(s string) (serviceTarget, bool, error) {
	kind, rest, _ := strings.Cut(s, "/")
	t := serviceTarget{given: s}
	switch kind {
	case "svc", "service":
		ns, name, ok := strings.Cut(rest, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return t, true, fmt.Errorf("%q: a Service is %s/NAMESPACE/NAME", s, kind)
		}
		t.namespace, t.name, t.frontend = ns, name, proxy.FrontendClusterIP
		return t, true, nil
	case "nodeport":
		parts := strings.Split(rest, "/")
		if len(parts) != 3 || slices.Contains(parts, "") {
			return t, true, fmt.Errorf("%q: a NodePort is nodeport/NODE/NAMESPACE/NAME", s)
		}
		t.node, t.namespace, t.name, t.frontend = parts[0], parts[1], parts[2], proxy.FrontendNodePort
		return t, true, nil
	}
	return t, false, nil
}

// serviceDestination reads a destination as a Service frontend: a
// svc/, service/ or nodeport/ name, or an address that is a frontend at
// probe's port. ok is false for any other destination (a pod, an address
// not DNATed).
func serviceDestination(snap *cluster.Snapshot, dst string, probe l4.Port) (t serviceTarget, ok bool, err error) {
	if t, ok, err = parseServiceName(dst); ok || err != nil {
		return t, ok, err
	}
	if a, perr := netip.ParseAddr(dst); perr == nil {
		return serviceByAddress(snap, a, probe)
	}
	return t, false, nil
}

// serviceByAddress finds the Service frontend at addr and probe's port: a
// ClusterIP, load-balancer IP or external IP with that port, or a node
// address with a NodePort of that number. ok is false when addr and port
// are not a Service frontend (the connection is not DNATed); a ClusterIP
// without that port is an error (the node rejects such connections).
func serviceByAddress(snap *cluster.Snapshot, addr netip.Addr, probe l4.Port) (serviceTarget, bool, error) {
	addr = addr.Unmap()
	t := serviceTarget{given: addr.String(), addr: addr}
	hasPort := func(svc *corev1.Service, nodePort bool) bool {
		for _, p := range svc.Spec.Ports {
			if policy.DefaultProtocol(p.Protocol) != probe.Protocol {
				continue
			}
			if (!nodePort && p.Port == probe.Port) || (nodePort && p.NodePort == probe.Port) {
				return true
			}
		}
		return false
	}
	is := func(list []string) bool {
		return slices.ContainsFunc(list, func(s string) bool {
			a, err := netip.ParseAddr(s)
			return err == nil && a.Unmap() == addr
		})
	}
	services := slices.Clone(snap.Services)
	sort.Slice(services, func(i, j int) bool {
		return services[i].Namespace+"/"+services[i].Name < services[j].Namespace+"/"+services[j].Name
	})
	for _, svc := range services {
		t.namespace, t.name = svc.Namespace, svc.Name
		ips := svc.Spec.ClusterIPs
		if len(ips) == 0 && svc.Spec.ClusterIP != "" {
			ips = []string{svc.Spec.ClusterIP}
		}
		var lbs []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			lbs = append(lbs, in.IP)
		}
		switch {
		case is(ips) && !hasPort(svc, false):
			return t, false, fmt.Errorf("%s is the ClusterIP of Service %s/%s, which has no port %s (the node rejects such connections)", addr, svc.Namespace, svc.Name, probe)
		case is(ips):
			t.frontend = proxy.FrontendClusterIP
		case is(lbs) && hasPort(svc, false):
			t.frontend = proxy.FrontendLoadBalancer
		case is(svc.Spec.ExternalIPs) && hasPort(svc, false):
			t.frontend = proxy.FrontendExternalIP
		default:
			continue
		}
		return t, true, nil
	}
	for _, n := range snap.Nodes {
		var addrs []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				addrs = append(addrs, a.Address)
			}
		}
		if !is(addrs) {
			continue
		}
		for _, svc := range services {
			if hasPort(svc, true) {
				t.namespace, t.name, t.frontend, t.node = svc.Namespace, svc.Name, proxy.FrontendNodePort, n.Name
				return t, true, nil
			}
		}
	}
	return serviceTarget{}, false, nil
}

// explainSource is the client of a Service connection.
type explainSource struct {
	name     string // as given: namespace/pod or an address
	pod      *corev1.Pod
	node     string // the node it runs on or is ("" outside the cluster)
	addr     netip.Addr
	external bool // neither a pod nor a node address
}

func resolveSource(snap *cluster.Snapshot, s string) (explainSource, error) {
	src := explainSource{name: s}
	if a, err := netip.ParseAddr(s); err == nil {
		src.addr = a.Unmap()
		for _, p := range snap.Pods {
			if p.Spec.HostNetwork {
				continue
			}
			for _, ip := range p.Status.PodIPs {
				if b, err := netip.ParseAddr(ip.IP); err == nil && b.Unmap() == src.addr {
					src.pod, src.node = p, p.Spec.NodeName
					return src, nil
				}
			}
		}
		if n := nodeWithAddress(snap, src.addr); n != "" {
			src.node = n
			return src, nil
		}
		src.external = true
		return src, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return src, fmt.Errorf("source %q is neither namespace/pod nor an IP address", s)
	}
	src.pod = snap.Pod(ns, name)
	if src.pod == nil {
		return src, fmt.Errorf("source: pod %s is not in the snapshot", s)
	}
	src.node = src.pod.Spec.NodeName
	if a, err := netip.ParseAddr(src.pod.Status.PodIP); err == nil {
		src.addr = a.Unmap()
	}
	return src, nil
}

func nodeWithAddress(snap *cluster.Snapshot, a netip.Addr) string {
	for _, n := range snap.Nodes {
		for _, na := range n.Status.Addresses {
			if b, err := netip.ParseAddr(na.Address); err == nil && b.Unmap() == a {
				return n.Name
			}
		}
	}
	return ""
}

// nodeAddress is the node's first InternalIP (else any address) of fam.
func nodeAddress(snap *cluster.Snapshot, node string, fam corev1.IPFamily) netip.Addr {
	for _, n := range snap.Nodes {
		if n.Name != node {
			continue
		}
		var fallback netip.Addr
		for _, na := range n.Status.Addresses {
			a, err := netip.ParseAddr(na.Address)
			if err != nil || (a.Is6() != (fam == corev1.IPv6Protocol)) {
				continue
			}
			if na.Type == corev1.NodeInternalIP {
				return a
			}
			if !fallback.IsValid() {
				fallback = a
			}
		}
		return fallback
	}
	return netip.Addr{}
}

// explainService explains src -> t on probe (the protocol and the port
// dialed): the node whose rules DNAT the connection (the source's for a
// ClusterIP, the dialed node's for a NodePort, the source's or else the
// first node for load-balancer and external IPs), that node's endpoints
// for the frontend under the Service's traffic policies, and each one as
// policy sees it: at its target port, from the client or, when the client
// is masqueraded, from the node.
func explainService(l *loaded, srcName string, t serviceTarget, probe l4.Port, family ipfamily.Family) (*serviceVerdict, error) {
	snap := l.snap
	var svc *corev1.Service
	for _, s := range snap.Services {
		if s.Namespace == t.namespace && s.Name == t.name {
			svc = s
		}
	}
	if svc == nil {
		return nil, fmt.Errorf("no such Service %s/%s in the snapshot", t.namespace, t.name)
	}
	src, err := resolveSource(snap, srcName)
	if err != nil {
		return nil, err
	}
	switch t.frontend {
	case proxy.FrontendClusterIP:
		if src.external {
			return nil, fmt.Errorf("source %s is neither a pod nor a node: a ClusterIP is reached from inside the cluster (from outside, use nodeport/NODE/%s/%s)", src.name, t.namespace, t.name)
		}
	case proxy.FrontendNodePort:
		if nodeAddress(snap, t.node, corev1.IPv4Protocol) == (netip.Addr{}) && nodeAddress(snap, t.node, corev1.IPv6Protocol) == (netip.Addr{}) {
			return nil, fmt.Errorf("nodeport: node %s is not in the snapshot or has no address", t.node)
		}
	}
	// From outside, a load-balancer or external IP is routed to a node;
	// the lab routes them to the first node by name.
	entry := ""
	for _, n := range snap.Nodes {
		if entry == "" || n.Name < entry {
			entry = n.Name
		}
	}
	if src.external && entry == "" && t.frontend != proxy.FrontendNodePort {
		return nil, fmt.Errorf("%s: the snapshot has no Node to receive the connection", t.given)
	}
	node := proxy.DNATNode(t.frontend, src.node, t.node, entry)
	if node == "" {
		return nil, fmt.Errorf("source %s has no node (spec.nodeName)", src.name)
	}
	fam := corev1.IPv4Protocol
	switch {
	case family == ipfamily.IPv4:
	case family == ipfamily.IPv6:
		fam = corev1.IPv6Protocol
	case t.addr.IsValid():
		if t.addr.Is6() {
			fam = corev1.IPv6Protocol
		}
	case src.addr.IsValid() && src.addr.Is6():
		fam = corev1.IPv6Protocol
	}
	model := proxy.Build(snap, node, proxy.Options{})
	var sp *proxy.ServicePort
	var have []string
	for _, s := range model.Services {
		if s.Namespace != t.namespace || s.Name != t.name {
			continue
		}
		p := l4.Port{Protocol: s.Protocol, Port: s.Port}.String()
		if s.NodePort != 0 {
			p += fmt.Sprintf(" (NodePort %d)", s.NodePort)
		}
		have = append(have, fmt.Sprintf("%s %s", s.Family, p))
		if s.Protocol != probe.Protocol || s.Family != fam {
			continue
		}
		switch t.frontend {
		case proxy.FrontendNodePort:
			if s.NodePort != 0 && (s.NodePort == probe.Port || s.Port == probe.Port) {
				sp = s
			}
		default:
			if s.Port == probe.Port {
				sp = s
			}
		}
	}
	if sp == nil {
		what := fmt.Sprintf("port %s", probe)
		if t.frontend == proxy.FrontendNodePort {
			what = fmt.Sprintf("NodePort %s", probe)
		}
		if len(have) == 0 {
			return nil, fmt.Errorf("Service %s/%s has no %s %s (it has no port node %s proxies: headless, ExternalName or without ports)", t.namespace, t.name, fam, what, node)
		}
		return nil, fmt.Errorf("Service %s/%s has no %s %s; it has %s", t.namespace, t.name, fam, what, strings.Join(have, ", "))
	}
	sv := &serviceVerdict{From: src.name, To: t.given, Service: t.namespace + "/" + t.name, Frontend: t.frontend.String(),
		ClusterIP: sp.ClusterIP.String(), Protocol: sp.Protocol, Port: probe.Port, Node: node, Endpoints: []endpointVerdict{}}
	switch {
	case t.addr.IsValid():
		sv.Address = t.addr.String()
	case t.frontend == proxy.FrontendNodePort:
		sv.Address = nodeAddress(snap, node, fam).String()
		sv.Port = sp.NodePort
	default:
		sv.Address = sv.ClusterIP
	}
	// Which endpoints, and who policy sees as the client: the NAT rules'
	// answer (proxy.Route), from the client's address of the family.
	nodeAddr := nodeAddress(snap, node, fam)
	client := proxy.Client{Addr: src.addr, NodeLocal: !src.external && src.node == node && (src.pod == nil || src.pod.Spec.HostNetwork)}
	podNetwork := src.pod != nil && !src.pod.Spec.HostNetwork
	switch {
	case podNetwork:
		client.Addr = podAddress(src.pod, fam)
	case !src.external:
		client.Addr = nodeAddress(snap, src.node, fam)
	}
	route := model.Route(sp, t.frontend, client)
	notes := route.Why
	// A pod whose own node does not DNAT the connection (a NodePort of
	// another node) is judged for egress there, against the address dialed.
	if podNetwork && src.node != node {
		before, err := l.evaluator.Explain(src.name, nodeAddr.String(), probe, ipfamily.FromKubernetes(fam))
		if err != nil {
			return nil, fmt.Errorf("source %s before DNAT: %w", src.name, err)
		}
		sv.EgressBeforeDNAT = before
		notes = append(notes, fmt.Sprintf("node %s of %s does not DNAT it: %s's egress is judged there against %s port %d", src.node, src.name, src.name, nodeAddr, probe.Port))
	}
	switch route.Outcome {
	case proxy.Refused:
		sv.DroppedBy = "no endpoint"
	case proxy.Dropped:
		sv.DroppedBy = "traffic policy"
	case proxy.Filtered:
		sv.DroppedBy = "loadBalancerSourceRanges"
	}
	sv.Allowed = route.Outcome == proxy.Routed
	for _, ep := range route.Endpoints {
		dst := ep.Address.String()
		if ep.PodName != "" {
			dst = ep.PodNamespace + "/" + ep.PodName
		}
		policySrc, shown := src.name, src.name
		if ep.NodeSource {
			if !nodeAddr.IsValid() {
				return nil, fmt.Errorf("node %s has no %s address to masquerade the client to", node, fam)
			}
			policySrc, shown = nodeAddr.String(), nodeAddr.String()+" (node "+node+")"
		}
		if ep.Hairpin && ep.NodeSource {
			notes = append(notes, fmt.Sprintf("endpoint %s is the client itself, reached through node %s: that node masquerades it (hairpin), so policy sees node %s", dst, node, node))
		}
		v, err := l.evaluator.Explain(policySrc, dst, l4.Port{Protocol: probe.Protocol, Port: ep.Port}, ipfamily.FromKubernetes(fam))
		if err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", dst, err)
		}
		allowed := v.Allowed
		if sv.EgressBeforeDNAT != nil {
			allowed = sv.EgressBeforeDNAT.Egress.Allowed && (v.Ingress == nil || v.Ingress.Allowed)
			if v.Reason != "" { // the pod itself, through a remote node
				allowed = sv.EgressBeforeDNAT.Egress.Allowed
			}
		}
		if !allowed {
			sv.Allowed = false
			sv.DroppedBy = "policy"
		}
		sv.Endpoints = append(sv.Endpoints, endpointVerdict{Endpoint: dst, Address: ep.Address.String(), Port: ep.Port, Node: ep.NodeName,
			PolicySource: shown, Allowed: allowed, Verdict: v})
	}
	sv.Note = strings.Join(notes, "; ")
	return sv, nil
}

// podAddress is the pod's address of family fam (invalid when it has none).
func podAddress(p *corev1.Pod, fam corev1.IPFamily) netip.Addr {
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Unmap().Is6() == (fam == corev1.IPv6Protocol) {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

// serviceErrors are proxy.Build's errors about the Service namespace/name
// and its EndpointSlices: entries left out of what explain says about it.
// They do not depend on the node, so any node's build has them.
func serviceErrors(snap *cluster.Snapshot, namespace, name string) []error {
	ours := map[cluster.ObjectKey]bool{{Kind: cluster.KindService, Namespace: namespace, Name: name}: true}
	for _, es := range snap.EndpointSlices {
		if es != nil && es.Namespace == namespace && es.Labels[discoveryv1.LabelServiceName] == name {
			ours[cluster.ObjectKey{Kind: cluster.KindEndpointSlice, Namespace: es.Namespace, Name: es.Name}] = true
		}
	}
	var out []error
	for _, e := range proxy.Build(snap, "", proxy.Options{}).Errors {
		if key, ok := objectOf(e); ok && ours[key] {
			out = append(out, e)
		}
	}
	return out
}

// why says in one sentence why a connection to the Service fails ("" when
// every endpoint is allowed).
func (sv *serviceVerdict) why() string {
	switch sv.DroppedBy {
	case "policy":
		if sv.EgressBeforeDNAT != nil && !sv.EgressBeforeDNAT.Egress.Allowed {
			return fmt.Sprintf("policy before DNAT denies %s's egress to %s port %d (%s)", sv.From, sv.Address, sv.Port, sv.EgressBeforeDNAT.Egress.Reason)
		}
		var denied []string
		for _, e := range sv.Endpoints {
			if !e.Allowed {
				denied = append(denied, e.PolicySource+" -> endpoint "+e.Endpoint)
			}
		}
		return "policy after DNAT denies " + strings.Join(denied, ", ")
	case "":
		return ""
	}
	return sv.Note
}

func writeServiceVerdict(out io.Writer, sv *serviceVerdict, style report.Style, rules *report.Rules) {
	verdict := "ALLOWED"
	if !sv.Allowed {
		verdict = "DENIED"
	}
	if style.Color {
		verdict = style.Verdict(sv.Allowed)
	}
	what := "ClusterIP " + sv.ClusterIP
	if sv.Frontend != proxy.FrontendClusterIP.String() {
		what = fmt.Sprintf("%s %s, ClusterIP %s", sv.Frontend, sv.Address, sv.ClusterIP)
	}
	fmt.Fprintf(out, "%s -> service %s %s/%d (%s): %s\n", sv.From, sv.Service, strings.ToLower(string(sv.Protocol)), sv.Port, what, verdict)
	fmt.Fprintf(out, "  endpoints as node %s chooses them: %d\n", sv.Node, len(sv.Endpoints))
	if sv.Note != "" {
		for _, n := range strings.Split(sv.Note, "; ") {
			fmt.Fprintf(out, "  %s\n", n)
		}
	}
	if w := sv.why(); w != "" && sv.DroppedBy == "policy" {
		fmt.Fprintf(out, "  %s\n", w)
	}
	if sv.EgressBeforeDNAT != nil {
		fmt.Fprintf(out, "\nbefore DNAT, on the node of %s (egress only):\n", sv.From)
		report.ExplainRules(out, sv.EgressBeforeDNAT, style, rules)
	}
	for _, e := range sv.Endpoints {
		fmt.Fprintf(out, "\nendpoint %s (%s port %d), policy sees the connection after DNAT from %s:\n", e.Endpoint, e.Address, e.Port, e.PolicySource)
		report.ExplainRules(out, e.Verdict, style, rules)
	}
}
