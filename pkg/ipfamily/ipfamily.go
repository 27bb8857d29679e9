// Package ipfamily is an address's IP family, defined once for every
// package: which family an address is (an IPv4-mapped IPv6 address is
// IPv4, as the kernel and the pod addresses have it), how a user writes a
// family, and how Kubernetes spells it. nft.Family and the lab's families
// add what netfilter and netlink need to this one.
package ipfamily

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Family is IPv4, IPv6, or Any (none chosen: a pod's primary address).
type Family string

const (
	Any  Family = ""
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// Of is a's family (IPv6 for the zero address).
func Of(a netip.Addr) Family {
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// Has reports whether a is of family f (any address for Any).
func (f Family) Has(a netip.Addr) bool {
	return f == Any || Of(a) == f
}

// Parse reads "ipv4" or "4", "ipv6" or "6", in any case, or "" (Any).
func Parse(s string) (Family, error) {
	switch strings.ToLower(s) {
	case "":
		return Any, nil
	case "ipv4", "4":
		return IPv4, nil
	case "ipv6", "6":
		return IPv6, nil
	}
	return Any, fmt.Errorf("unknown address family %q (ipv4 or ipv6)", s)
}

// FromKubernetes is the family Kubernetes calls f (IPv4Protocol,
// IPv6Protocol; Any for anything else).
func FromKubernetes(f corev1.IPFamily) Family {
	switch f {
	case corev1.IPv4Protocol:
		return IPv4
	case corev1.IPv6Protocol:
		return IPv6
	}
	return Any
}

// Kubernetes is f as Kubernetes spells it ("" for Any).
func (f Family) Kubernetes() corev1.IPFamily {
	switch f {
	case IPv4:
		return corev1.IPv4Protocol
	case IPv6:
		return corev1.IPv6Protocol
	}
	return ""
}
