package agent

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/proxy/proxier"
)

// newProxier prepares the agent's Service load balancer for the namespace
// it programs.
func newProxier(opts Options, a *Agent) (*proxier.Proxier, error) {
	popts := proxier.Options{Node: opts.NodeName, Table: opts.ProxyTable, HealthChecks: true, Logger: a.log,
		Build: proxy.Options{NodePortAddresses: opts.NodePortAddresses, ClusterCIDRs: opts.ClusterCIDRs}}
	if opts.NetNS != "" {
		h, err := netns.GetFromPath(netnsPath(opts.NetNS))
		if err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", opts.NetNS, err)
		}
		defer h.Close() // the Proxier keeps its own copy
		popts.NetNS = h
	}
	return proxier.New(popts)
}

// netnsPath is the file of a network namespace given by name (under
// /run/netns, as `ip netns` makes them) or by path.
func netnsPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return filepath.Join("/run/netns", name)
}
