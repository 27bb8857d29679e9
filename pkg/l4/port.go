// Package l4 is a transport protocol and destination port, the one type
// for "tcp/80" below the evaluator: what a truth-table cell, an explain and
// a trace are asked about (pkg/probe is what dials).
package l4

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Port is a protocol and destination port.
type Port struct {
	Protocol corev1.Protocol
	Port     int32
}

func (p Port) String() string {
	return fmt.Sprintf("%s/%d", strings.ToLower(string(p.Protocol)), p.Port)
}

// ParsePort reads "tcp/80" (protocol tcp, udp or sctp; "80" alone is TCP).
func ParsePort(s string) (Port, error) {
	proto, port, found := strings.Cut(strings.TrimSpace(s), "/")
	if !found {
		proto, port = "tcp", proto
	}
	p := Port{Protocol: corev1.Protocol(strings.ToUpper(proto))}
	switch p.Protocol {
	case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
	default:
		return Port{}, fmt.Errorf("port %q: unknown protocol %q (tcp, udp or sctp)", s, proto)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return Port{}, fmt.Errorf("port %q: %q is not a port number 1-65535", s, port)
	}
	p.Port = int32(n)
	return p, nil
}

// ParsePorts reads comma-separated lists of ports.
func ParsePorts(list []string) ([]Port, error) {
	var out []Port
	for _, item := range list {
		for _, s := range strings.Split(item, ",") {
			if strings.TrimSpace(s) == "" {
				continue
			}
			p, err := ParsePort(s)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
	}
	return out, nil
}
