package conformance

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
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
// source node's service model and the evaluator, which judges the endpoint
// after DNAT: a Service with no endpoint anywhere refuses; one with none
// usable from the source's node, or none policy lets the source reach,
// times out; one whose usable endpoints policy all allows answers, from one
// of them; with some allowed and some not, either, and an answer comes
// from an allowed endpoint. NodePort probes are not compared: their
// clients are masqueraded, so policy sees a node, not the client. It
// returns the differences and how many probes it compared.
func CompareServices(snap *cluster.Snapshot, ev *eval.Evaluator, rows []lab.ServiceObservation) ([]ServiceDifference, int, error) {
	nodeOf := map[string]string{}
	for _, p := range snap.Pods {
		nodeOf[p.Namespace+"/"+p.Name] = p.Spec.NodeName
	}
	models := map[string]*proxy.Model{}
	var diffs []ServiceDifference
	compared := 0
	for _, row := range rows {
		node, fromPod := nodeOf[row.From]
		if !strings.HasPrefix(row.To, "service/") || !fromPod {
			continue
		}
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
		port := m.Services[i]
		family := eval.FamilyIPv4
		if row.Family == corev1.IPv6Protocol {
			family = eval.FamilyIPv6
		}
		eps := port.InternalEndpoints()
		var allowed []string
		for _, ep := range eps {
			v, err := ev.Explain(row.From, ep.PodNamespace+"/"+ep.PodName, eval.Probe{Protocol: row.Protocol, Port: ep.Port}, family)
			if err != nil {
				return nil, compared, fmt.Errorf("%s -> %s: endpoint %s: %w", row.From, row.To, ep, err)
			}
			if v.Allowed && !slices.Contains(allowed, ep.PodNamespace+"/"+ep.PodName) {
				allowed = append(allowed, ep.PodNamespace+"/"+ep.PodName)
			}
		}
		var want []string
		switch {
		case !port.AnyEndpoints:
			want = []string{lab.ResultRefused}
		case len(allowed) == 0:
			want = []string{lab.ResultTimeout}
		case len(allowed) == len(eps):
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
