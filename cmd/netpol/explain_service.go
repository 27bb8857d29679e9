package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/report"
)

// serviceVerdict explains a connection to a Service: policy sees the
// endpoint the connection is sent to (after DNAT), so each endpoint the
// source's node would choose is explained on its own.
type serviceVerdict struct {
	From      string            `json:"from"`
	Service   string            `json:"service"`
	ClusterIP string            `json:"clusterIP"`
	Protocol  corev1.Protocol   `json:"protocol"`
	Port      int32             `json:"port"`
	Node      string            `json:"node"`
	Endpoints []endpointVerdict `json:"endpoints"`
	// Note says what happens with no endpoint (kube-proxy rejects).
	Note string `json:"note,omitempty"`
}

type endpointVerdict struct {
	Endpoint string        `json:"endpoint"` // namespace/pod, or the address
	Address  string        `json:"address"`
	Port     int32         `json:"port"`
	Verdict  *eval.Verdict `json:"verdict"`
}

// explainService resolves "svc/NAMESPACE/NAME" for a source pod: the
// service port of probe's protocol and port, in the source's family, with
// the endpoints the source's node uses for ClusterIP traffic (readiness,
// terminating fallback, internalTrafficPolicy, topology hints), each
// explained at its target port.
func explainService(l *loaded, src, svc string, probe eval.Probe, family eval.Family) (*serviceVerdict, error) {
	ns, name, ok := strings.Cut(strings.TrimPrefix(svc, "svc/"), "/")
	if !ok || name == "" {
		return nil, fmt.Errorf("%q: a service is svc/NAMESPACE/NAME", svc)
	}
	srcNS, srcName, _ := strings.Cut(src, "/")
	pod := l.snap.Pod(srcNS, srcName)
	if pod == nil {
		return nil, fmt.Errorf("source: pod %s is not in the snapshot (a service's endpoints depend on the source's node)", src)
	}
	fam := corev1.IPv4Protocol
	if a, err := netip.ParseAddr(pod.Status.PodIP); err == nil && a.Is6() {
		fam = corev1.IPv6Protocol
	}
	switch family {
	case eval.FamilyIPv4:
		fam = corev1.IPv4Protocol
	case eval.FamilyIPv6:
		fam = corev1.IPv6Protocol
	}
	model := proxy.Build(l.snap, pod.Spec.NodeName, proxy.Options{})
	var sp *proxy.ServicePort
	for _, s := range model.Services {
		if s.Namespace == ns && s.Name == name && s.Protocol == probe.Protocol && s.Port == probe.Port && s.Family == fam {
			sp = s
		}
	}
	if sp == nil {
		return nil, fmt.Errorf("service %s/%s has no %s port %s with a ClusterIP", ns, name, fam, probe)
	}
	sv := &serviceVerdict{From: src, Service: ns + "/" + name, ClusterIP: sp.ClusterIP.String(), Protocol: sp.Protocol,
		Port: sp.Port, Node: pod.Spec.NodeName, Endpoints: []endpointVerdict{}}
	eps := sp.InternalEndpoints()
	if len(eps) == 0 {
		sv.Note = "no endpoint serves this port for this node: the connection is rejected (ICMP port unreachable), before any policy"
	}
	for _, ep := range eps {
		dst := ep.Address.String()
		if ep.PodName != "" {
			dst = ep.PodNamespace + "/" + ep.PodName
		}
		v, err := l.evaluator.Explain(src, dst, eval.Probe{Protocol: probe.Protocol, Port: ep.Port}, familyOf(fam))
		if err != nil {
			return nil, fmt.Errorf("endpoint %s: %w", dst, err)
		}
		sv.Endpoints = append(sv.Endpoints, endpointVerdict{Endpoint: dst, Address: ep.Address.String(), Port: ep.Port, Verdict: v})
	}
	return sv, nil
}

func familyOf(f corev1.IPFamily) eval.Family {
	if f == corev1.IPv6Protocol {
		return eval.FamilyIPv6
	}
	return eval.FamilyIPv4
}

func writeServiceVerdict(out io.Writer, sv *serviceVerdict, style report.Style) {
	fmt.Fprintf(out, "%s -> service %s %s/%d (ClusterIP %s), endpoints as node %s chooses them: %d\n",
		sv.From, sv.Service, strings.ToLower(string(sv.Protocol)), sv.Port, sv.ClusterIP, sv.Node, len(sv.Endpoints))
	if sv.Note != "" {
		fmt.Fprintf(out, "  %s\n", sv.Note)
	}
	for _, e := range sv.Endpoints {
		fmt.Fprintf(out, "\nendpoint %s (%s port %d), policy sees the connection after DNAT:\n", e.Endpoint, e.Address, e.Port)
		report.Explain(out, e.Verdict, style)
	}
}
