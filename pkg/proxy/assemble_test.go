package proxy

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestCompilePortBuffer: ports compiled into one buffer keep their own
// contributions (the next port's appends do not write over them).
func TestCompilePortBuffer(t *testing.T) {
	port := func(cip string, eps ...string) *ServicePort {
		p := &ServicePort{Namespace: "ns", Name: "web", PortName: "http", Protocol: corev1.ProtocolTCP, Family: corev1.IPv4Protocol,
			ClusterIP: netip.MustParseAddr(cip), Port: 80}
		for _, a := range eps {
			p.ClusterEndpoints = append(p.ClusterEndpoints, Endpoint{Address: netip.MustParseAddr(a), Port: 8080, Ready: true, Serving: true})
		}
		p.AnyEndpoints = len(eps) > 0
		return p
	}
	ports := []*ServicePort{port("10.96.0.1", "10.244.1.1", "10.244.1.2"), port("10.96.0.2", "10.244.2.1"), port("10.96.0.3")}
	var want []string
	for _, p := range ports {
		alone, _, err := compilePort(p, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprint(alone.elems))
	}
	buf := make([]contribution, 0, 1) // too small: the first port grows it
	var frags []*fragment
	for _, p := range ports {
		fr, more, err := compilePort(p, nil, buf)
		if err != nil {
			t.Fatal(err)
		}
		frags, buf = append(frags, fr), more
	}
	for i, fr := range frags {
		if got := fmt.Sprint(fr.elems); got != want[i] {
			t.Errorf("port %d compiled into the shared buffer: %s\nwant (alone) %s", i, got, want[i])
		}
	}
	if all := len(buf); all != len(frags[0].elems)+len(frags[1].elems)+len(frags[2].elems) {
		t.Errorf("the buffer holds %d contributions, want every port's", all)
	}
	if fmt.Sprint(buf[len(buf)-len(frags[2].elems):]) != fmt.Sprint(frags[2].elems) {
		t.Error("the buffer does not end with the last port's contributions")
	}
}
