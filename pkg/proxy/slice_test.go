package proxy

import (
	"fmt"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestParseSlice: a parsed slice's endpoints are sorted, one per address
// (the last copy that is not terminating), carry the port when the slice
// has one and 0 when it has more, know which are on the node, and share
// node and zone names; bad ports and endpoints are errors naming the
// field, and the rest is parsed.
func TestParseSlice(t *testing.T) {
	yes, no := true, false
	ep := func(addr, node string, terminating *bool) discoveryv1.Endpoint {
		n, z := node, "zone-"+node // separate strings, as decoded
		return discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: &n, Zone: &z,
			Conditions: discoveryv1.EndpointConditions{Terminating: terminating},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "pod-" + addr}}
	}
	port := func(name string, p int32) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: &name, Port: &p}
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{port("http", 8080), {Port: ptr.To(int32(9090))}},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.0.0.9", "n2", nil),
			ep("10.0.0.3", "n1", &yes),
			ep("10.0.0.3", "n2", &no), // kept: not terminating
			ep("10.0.0.3", "n3", &yes),
			{Addresses: []string{"fd00::1"}},
			ep("10.0.0.5", "n1", nil),
		},
	}
	ps := ParseSlice(es, "n1")
	if ps.Service != "web" || ps.Family != v4 || len(ps.Ports) != 1 || ps.Ports[0] != (SlicePort{"http", corev1.ProtocolTCP, 8080}) {
		t.Fatalf("parsed %+v", ps)
	}
	var got []string
	for _, e := range ps.Endpoints {
		got = append(got, fmt.Sprintf("%s node=%s local=%v terminating=%v pod=%s/%s", e, e.NodeName, e.Local, e.Terminating, e.PodNamespace, e.PodName))
	}
	want := []string{
		"10.0.0.3:8080 node=n2 local=false terminating=false pod=shop/pod-10.0.0.3",
		"10.0.0.5:8080 node=n1 local=true terminating=false pod=shop/pod-10.0.0.5",
		"10.0.0.9:8080 node=n2 local=false terminating=false pod=shop/pod-10.0.0.9",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("endpoints\n%v\nwant\n%v", got, want)
	}
	if cap(ps.Endpoints) != len(ps.Endpoints) {
		t.Error("the endpoint list has room: a Service's build could append to it in place")
	}
	if unsafe.StringData(ps.Endpoints[0].NodeName) != unsafe.StringData(ps.Endpoints[2].NodeName) ||
		unsafe.StringData(ps.Endpoints[0].Zone) != unsafe.StringData(ps.Endpoints[2].Zone) {
		t.Error("endpoints on one node do not share its name and zone")
	}
	var fields []string
	for _, err := range ps.Errors {
		fields = append(fields, err.(*FieldError).Field)
	}
	if fmt.Sprint(fields) != "[ports[1].name endpoints[4].addresses[0]]" {
		t.Errorf("errors on %v", fields)
	}

	es.Ports = append(es.Ports, port("metrics", 9090))
	for _, e := range ParseSlice(es, "n1").Endpoints {
		if e.Port != 0 {
			t.Errorf("with two ports, %s has a port", e)
		}
	}
	if ps := ParseSlice(&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4}, "n1"); len(ps.Errors) != 1 || ps.Endpoints != nil {
		t.Errorf("a slice of no Service: %+v", ps)
	}
	if ps := ParseSlice(&discoveryv1.EndpointSlice{ObjectMeta: es.ObjectMeta, AddressType: discoveryv1.AddressTypeFQDN,
		Endpoints: es.Endpoints}, "n1"); ps.Family != "" || len(ps.Errors) != 0 || ps.Endpoints != nil {
		t.Errorf("an FQDN slice is proxied: %+v", ps)
	}
}
