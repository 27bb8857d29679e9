package probe

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

var sctpSupport = sync.OnceValues(func() (bool, string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return false, fmt.Sprintf("the kernel has no SCTP sockets: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %v (no sctp module?)", err)
	}
	unix.Close(fd)
	return true, "the kernel has SCTP sockets"
})

// SCTPSupported reports, once per process, whether the kernel can make SCTP
// sockets, with a reason fit for an error message. Without them nothing
// serves SCTP ports and SCTP probes are refused.
func SCTPSupported() (bool, string) {
	return sctpSupport()
}
