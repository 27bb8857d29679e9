// Command agnhost-sctp is /agnhost in the agnhost image of make e2e-images
// (the upstream binary is /agnhost-upstream next to it). It runs the
// upstream binary with the same arguments and environment, with one
// exception, taken only on a kernel without SCTP sockets: `agnhost porter`
// is run without its SERVE_SCTP_PORT_* variables. Upstream's porter exits
// when it cannot listen on one of them, so on such a kernel every pod of
// network-policy-api's conformance manifests (each has porter containers
// for SCTP ports 9003 and 9005) would crash-loop and no test would start;
// the tests that connect over SCTP are skipped on such a kernel anyway
// (hack/conformance-upstream.sh). docs/conformance.md says the same.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

const upstream = "/agnhost-upstream"

func main() {
	env := os.Environ()
	if len(os.Args) > 1 && os.Args[1] == "porter" && !sctpSockets() {
		var kept, dropped []string
		for _, kv := range env {
			if strings.HasPrefix(kv, "SERVE_SCTP_PORT_") {
				dropped = append(dropped, kv[:strings.IndexByte(kv, '=')])
				continue
			}
			kept = append(kept, kv)
		}
		if len(dropped) > 0 {
			fmt.Fprintf(os.Stderr, "agnhost: this kernel has no SCTP sockets: porter serves none of %s\n", strings.Join(dropped, ", "))
		}
		env = kept
	}
	argv := append([]string{"/agnhost"}, os.Args[1:]...)
	err := syscall.Exec(upstream, argv, env)
	fmt.Fprintf(os.Stderr, "agnhost: exec %s: %v\n", upstream, err)
	os.Exit(127)
}

// sctpSockets reports whether the kernel makes SCTP sockets (the socket
// call loads the sctp module where it is a module).
func sctpSockets() bool {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_SCTP)
	if err != nil {
		return false
	}
	syscall.Close(fd)
	return true
}
