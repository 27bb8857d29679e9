package healthcheck

import (
	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/nsexec"
)

// inNetNS runs fn inside the network namespace h, so that the sockets fn
// creates belong to h; a handle <= 0 means the caller's namespace.
func inNetNS(h netns.NsHandle, fn func() error) error { return nsexec.In(h, fn) }
