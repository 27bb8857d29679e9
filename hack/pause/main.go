// Command pause is the pod sandbox's process (the "pause" image,
// hack/cluster-up.sh and make image): it holds the pod's namespaces open,
// sleeps, reaps any child that is reparented to it (it is PID 1 of a pod
// that shares its PID namespace), and exits on SIGTERM or SIGINT. Static
// (CGO_ENABLED=0) so the image needs nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
