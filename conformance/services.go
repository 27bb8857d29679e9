package conformance

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/proxy"
)

// ServiceDifference is a ClusterIP probe the kernel answered otherwise than
// the service model and policy predict.
type ServiceDifference struct {
	Row lab.ServiceObservation
	// Want are the acceptable results; Allowed the endpoints policy lets
	// the source reach (an answer must come from one of them).
	Want    []string
	Allowed []string
}

func (d ServiceDifference) String() string {
	return fmt.Sprintf("%s -> %s %s/%d (%s): kernel %s from %q; expected %s from one of %v",
		d.Row.From, d.Row.To, d.Row.Protocol, d.Row.Port, d.Row.ToAddr, d.Row.Result, d.Row.Endpoint,
		strings.Join(d.Want, " or "), d.Allowed)
}

// CompareServices checks every ClusterIP probe made from a pod against the
// source node's NAT rules as the service model answers them (proxy.Route)
// and the evaluator, which judges each endpoint after DNAT from the source
// policy sees there: a refused connection must be refused; a dropped one,
// or one to endpoints policy all denies, times out; one whose endpoints
// policy all allows answers, from one of them; with some allowed and some
// not, either, and an answer comes from an allowed endpoint. NodePort
// probes are not compared: their clients are masqueraded, so policy sees a
// node, not the client. It returns the differences and how many probes it
// compared.
func CompareServices(snap *cluster.Snapshot, ev *eval.Evaluator, rows []lab.ServiceObservation) ([]ServiceDifference, int, error) {
	pods := map[string]*corev1.Pod{}
	for _, p := range snap.Pods {
		pods[p.Namespace+"/"+p.Name] = p
	}
	models := map[string]*proxy.Model{}
	var diffs []ServiceDifference
	compared := 0
	for _, row := range rows {
		pod, fromPod := pods[row.From]
		if !strings.HasPrefix(row.To, "service/") || !fromPod {
			continue
		}
		node := pod.Spec.NodeName
		m := models[node]
		if m == nil {
			m = proxy.Build(snap, node, proxy.Options{})
			models[node] = m
		}
		i := slices.IndexFunc(m.Services, func(p *proxy.ServicePort) bool {
			return lab.ServiceTo(p.Namespace, p.Name) == row.To && p.Protocol == row.Protocol && p.Port == row.Port && p.ClusterIP == row.ToAddr
		})
		if i < 0 {
			return nil, compared, fmt.Errorf("%s -> %s %s/%d: no such Service port in node %s's model", row.From, row.To, row.Protocol, row.Port, node)
		}
		family := ipfamily.IPv4
		if row.Family == corev1.IPv6Protocol {
			family = ipfamily.IPv6
		}
		route := m.Route(m.Services[i], proxy.FrontendClusterIP, proxy.Client{Addr: row.FromAddr, NodeLocal: pod.Spec.HostNetwork})
		var allowed []string
		// The client's own node DNATs a ClusterIP connection: policy sees
		// the client, or, when it is masqueraded (a host-network client),
		// that node, whose address the client has.
		for _, ep := range route.Endpoints {
			v, err := ev.Explain(row.From, ep.PodNamespace+"/"+ep.PodName, l4.Port{Protocol: row.Protocol, Port: ep.Port}, family)
			if err != nil {
				return nil, compared, fmt.Errorf("%s -> %s: endpoint %s: %w", row.From, row.To, ep.Endpoint, err)
			}
			if v.Allowed && !slices.Contains(allowed, ep.PodNamespace+"/"+ep.PodName) {
				allowed = append(allowed, ep.PodNamespace+"/"+ep.PodName)
			}
		}
		var want []string
		switch {
		case route.Outcome == proxy.Refused:
			want = []string{lab.ResultRefused}
		case len(allowed) == 0:
			want = []string{lab.ResultTimeout}
		case len(allowed) == len(route.Endpoints):
			want = []string{lab.ResultOK}
		default:
			want = []string{lab.ResultOK, lab.ResultTimeout}
		}
		compared++
		if !slices.Contains(want, row.Result) || (row.Allowed && !slices.Contains(allowed, row.Endpoint)) {
			diffs = append(diffs, ServiceDifference{Row: row, Want: want, Allowed: allowed})
		}
	}
	return diffs, compared, nil
}
