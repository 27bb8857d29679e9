package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/conntrack"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/proxy"
	"github.com/netpol/netpol/pkg/proxy/healthcheck"
)

// serviceProxy is the agent's Service load balancer: each sync compiles the
// node's service model into the NAT table and applies the difference, then
// deletes the UDP conntrack entries the change made stale and updates the
// externalTrafficPolicy Local health-check servers.
type serviceProxy struct {
	syncer  *proxy.Syncer
	log     *slog.Logger
	ns      netns.NsHandle // the programmed namespace; netns.None() for the agent's own
	applier *nft.Applier
	cleaner *conntrack.Cleaner
	health  *healthcheck.Server
	// programmed is the model of the last successful apply; conntrack
	// cleanup compares against it.
	programmed *proxy.Model
}

func newServiceProxy(opts Options, log *slog.Logger) (*serviceProxy, error) {
	s := &serviceProxy{log: log, ns: netns.None(),
		syncer: proxy.NewSyncer(opts.NodeName, proxy.Options{NodePortAddresses: opts.NodePortAddresses, ClusterCIDRs: opts.ClusterCIDRs},
			proxy.CompileOptions{Table: opts.ProxyTable})}
	fd := -1
	if opts.NetNS != "" {
		h, err := netns.GetFromPath(netnsPath(opts.NetNS))
		if err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", opts.NetNS, err)
		}
		s.ns, fd = h, int(h)
	}
	var err error
	if s.applier, err = nft.NewApplier(fd, opts.ProxyTable); err != nil {
		s.close()
		return nil, err
	}
	if s.cleaner, err = conntrack.NewCleaner(s.ns); err != nil {
		s.close()
		return nil, err
	}
	s.health = healthcheck.NewServer(healthcheck.Options{Addresses: opts.NodePortAddresses, NetNS: s.ns, Logger: log})
	return s, nil
}

// netnsPath is the file of a network namespace given by name (under
// /run/netns, as `ip netns` makes them) or by path.
func netnsPath(name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	return filepath.Join("/run/netns", name)
}

// sync programs snap's services. Problems in the input are returned as
// warnings (the rest is programmed); an error means the kernel kept its
// previous table.
func (s *serviceProxy) sync(snap *cluster.Snapshot) (stats nft.Stats, counts nft.Counts, warnings []error, err error) {
	// Only the Services whose objects changed are rebuilt; the table's
	// sets carry their changes, so the transaction follows the change.
	model, table := s.syncer.Sync(snap)
	if stats, err = s.applier.Apply(table); err != nil {
		return stats, counts, model.Errors, err
	}
	prev := s.programmed
	s.programmed = model
	// Best effort after the commit: a failure here leaves some flows on
	// their old endpoint until they go idle, and the next sync will not
	// retry them, so say so.
	var errs []error
	frontends, endpoints := proxy.StaleUDP(prev, model)
	if n, err := s.cleaner.Delete(conntrack.TargetsOf(frontends, endpoints)); err != nil {
		errs = append(errs, fmt.Errorf("deleting stale UDP conntrack entries: %w", err))
	} else if n > 0 {
		s.log.Info("deleted stale UDP conntrack entries", "entries", n, "frontends", len(frontends), "endpoints", len(endpoints))
	}
	if err := s.health.Sync(model.HealthChecks); err != nil {
		errs = append(errs, fmt.Errorf("health-check node ports: %w", err))
	}
	return stats, table.Count(), append(model.Errors, errs...), nil
}

func (s *serviceProxy) close() {
	if s.health != nil {
		s.health.Close()
	}
	if s.cleaner != nil {
		s.cleaner.Close()
	}
	if s.applier != nil {
		s.applier.Close()
	}
	if s.ns != netns.None() {
		s.ns.Close()
	}
}

// ParseAddrs parses addresses (the values of a list flag).
func ParseAddrs(values []string) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	for _, v := range values {
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, a)
	}
	return out, errors.Join(errs...)
}
