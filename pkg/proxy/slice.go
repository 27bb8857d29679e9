package proxy

import (
	"cmp"
	"net/netip"
	"slices"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/ipfamily"
	"github.com/netpol/netpol/pkg/policy"
)

// Slice is one EndpointSlice as the proxy reads it: validated and parsed
// once (ParseSlice) for one node, then read only. The agent's informer
// stores these in place of the API objects, so that an endpoint is held
// once, as the model's Endpoint (104 bytes), where the lean API object's
// took about 270 beside it (its address strings and target reference);
// the models a Syncer builds share the endpoint lists.
type Slice struct {
	Namespace, Name string
	// Service is the kubernetes.io/service-name label: the Service the
	// slice belongs to ("" is an error: the slice serves nothing).
	Service string
	// Family is the address type's IP family; "" when the slice is not
	// proxied (address type FQDN, or one not supported: an error).
	Family corev1.IPFamily
	Ports  []SlicePort
	// Endpoints are the valid endpoints, sorted by address, one per
	// address (the copy kube-proxy keeps: dedupSorted). With exactly
	// one port their Port is that port's, so that a Service's model
	// shares the list; with more, Port is 0 and each port's list is
	// made when a Service is built.
	Endpoints []Endpoint
	// Errors are the slice's problems (*FieldError); the rest was parsed.
	Errors []error
}

// SlicePort is one valid port of a Slice.
type SlicePort struct {
	Name     string
	Protocol corev1.Protocol // defaulted: TCP when unset
	Port     int32
}

func (p SlicePort) key() portKey { return portKey{p.Name, p.Protocol} }

// ParseSlice parses es for node (the endpoints' Local). It never fails:
// problems are in Slice.Errors and the rest is parsed.
func ParseSlice(es *discoveryv1.EndpointSlice, node string) *Slice {
	ps := &Slice{Namespace: es.Namespace, Name: es.Name, Service: es.Labels[discoveryv1.LabelServiceName]}
	obj := cluster.ObjectKey{Kind: cluster.KindEndpointSlice, Namespace: es.Namespace, Name: es.Name}
	errorf := func(field, format string, args ...any) {
		ps.Errors = append(ps.Errors, newFieldError(obj, field, format, args...))
	}
	if ps.Service == "" {
		errorf("metadata.labels["+discoveryv1.LabelServiceName+"]", "missing: the slice belongs to no Service")
		return ps
	}
	// kube-proxy watches only slices without these labels: a headless
	// Service's slice, or one another proxy implements.
	if _, ok := es.Labels[corev1.IsHeadlessService]; ok {
		return ps
	}
	if _, ok := es.Labels[LabelServiceProxyName]; ok {
		return ps
	}
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		ps.Family = corev1.IPv4Protocol
	case discoveryv1.AddressTypeIPv6:
		ps.Family = corev1.IPv6Protocol
	case discoveryv1.AddressTypeFQDN:
		return ps // not proxied
	default:
		errorf("addressType", "unsupported address type %q", es.AddressType)
		return ps
	}
	for j, p := range es.Ports {
		field := "ports[" + itoa(j) + "]"
		if p.Name == nil {
			// kube-proxy ignores such ports; unnamed is name: "".
			errorf(field+".name", "unset (use \"\" for an unnamed port)")
			continue
		}
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			errorf(field+".port", "missing or out of range")
			continue
		}
		var proto corev1.Protocol
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		proto = policy.DefaultProtocol(proto)
		if !validProtocol(proto) {
			errorf(field+".protocol", "unsupported protocol %q", proto)
			continue
		}
		ps.Ports = append(ps.Ports, SlicePort{Name: *p.Name, Protocol: proto, Port: *p.Port})
	}
	var port int32
	if len(ps.Ports) == 1 {
		port = ps.Ports[0].Port
	}
	eps := make([]Endpoint, 0, len(es.Endpoints))
	for k, e := range es.Endpoints {
		field := "endpoints[" + itoa(k) + "]"
		if len(e.Addresses) == 0 {
			errorf(field+".addresses", "empty")
			continue
		}
		// Only the first address is used, as in kube-proxy.
		ip, err := netip.ParseAddr(e.Addresses[0])
		if err != nil || ip.Zone() != "" {
			errorf(field+".addresses[0]", "invalid IP %q", e.Addresses[0])
			continue
		}
		ip = ip.Unmap()
		if ipfamily.Of(ip).Kubernetes() != ps.Family {
			errorf(field+".addresses[0]", "%s is not of address type %s", ip, es.AddressType)
			continue
		}
		ep := Endpoint{
			Address:     ip,
			Port:        port,
			Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
			Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		}
		// Node, zone and namespace names are shared: a handful for
		// 100,000 endpoints.
		if e.NodeName != nil {
			ep.NodeName = unique.Make(*e.NodeName).Value()
			ep.Local = node != "" && ep.NodeName == node
		}
		if e.Zone != nil {
			ep.Zone = unique.Make(*e.Zone).Value()
		}
		if e.TargetRef != nil && (e.TargetRef.Kind == "" || e.TargetRef.Kind == "Pod") {
			ep.PodNamespace = unique.Make(cmp.Or(e.TargetRef.Namespace, es.Namespace)).Value()
			ep.PodName = e.TargetRef.Name
		}
		if h := e.Hints; h != nil && len(h.ForZones)+len(h.ForNodes) > 0 {
			ep.Hints = &EndpointHints{}
			for _, z := range h.ForZones {
				ep.Hints.Zones = append(ep.Hints.Zones, z.Name)
			}
			for _, n := range h.ForNodes {
				ep.Hints.Nodes = append(ep.Hints.Nodes, n.Name)
			}
		}
		eps = append(eps, ep)
	}
	// De-duplicated here, a Service's lists from several slices need it
	// again (dedupSorted keeps the same copy either way), one slice's not.
	ps.Endpoints = dedupSorted(eps)
	return ps
}

// ParseSlices parses each of all (nil ones are skipped) for node.
func ParseSlices(all []*discoveryv1.EndpointSlice, node string) []*Slice {
	out := make([]*Slice, 0, len(all))
	for _, es := range all {
		if es != nil {
			out = append(out, ParseSlice(es, node))
		}
	}
	return out
}

// groupSlices groups slices by Service, each group sorted by slice name
// (for a deterministic de-duplication), into by (emptied first; its
// lists are reused).
func groupSlices(by map[svcKey][]*Slice, all []*Slice) {
	for k, v := range by {
		by[k] = v[:0]
	}
	for _, ps := range all {
		if ps != nil {
			k := svcKey{ps.Namespace, ps.Service}
			by[k] = append(by[k], ps)
		}
	}
	for k, list := range by {
		if len(list) == 0 {
			delete(by, k) // that Service's slices are gone
			continue
		}
		slices.SortFunc(list, func(x, y *Slice) int { return cmp.Compare(x.Name, y.Name) })
	}
}
