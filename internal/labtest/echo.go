package labtest

import (
	"bufio"
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/probe"
)

// Echo serves TCP port on addr inside namespace h until tb ends, echoing
// every line back for as long as a connection lasts: a long-lived flow
// for tests that change policy under it (the lab's probe servers answer
// once and close).
func Echo(tb testing.TB, h netns.NsHandle, addr netip.Addr, port int) {
	tb.Helper()
	ln, err := probe.Listen(h, addr, port, corev1.ProtocolTCP)
	if err != nil {
		tb.Fatalf("echo server on %s:%d: %v", addr, port, err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}
