package ipfamily_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/ipfamily"
)

func TestOf(t *testing.T) {
	for _, tt := range []struct {
		addr string
		want ipfamily.Family
	}{
		{"10.244.1.10", ipfamily.IPv4},
		{"::ffff:10.244.1.10", ipfamily.IPv4}, // mapped: IPv4, as the kernel has it
		{"fd00::1", ipfamily.IPv6},
	} {
		a := netip.MustParseAddr(tt.addr)
		if got := ipfamily.Of(a); got != tt.want || !tt.want.Has(a) || !ipfamily.Any.Has(a) {
			t.Errorf("%s: %q, want %q", tt.addr, got, tt.want)
		}
		if back := ipfamily.FromKubernetes(tt.want.Kubernetes()); back != tt.want {
			t.Errorf("%q through Kubernetes' spelling came back %q", tt.want, back)
		}
	}
	if ipfamily.IPv4.Kubernetes() != corev1.IPv4Protocol || ipfamily.IPv6.Kubernetes() != corev1.IPv6Protocol {
		t.Error("Kubernetes spellings")
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]ipfamily.Family{"": ipfamily.Any, "ipv4": ipfamily.IPv4, "IPv6": ipfamily.IPv6, "4": ipfamily.IPv4, "6": ipfamily.IPv6} {
		if got, err := ipfamily.Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ipfamily.Parse("ipx"); err == nil {
		t.Error("Parse(ipx): no error")
	}
}
