package lab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/probe"
)

// Interface names (at most 15 characters; indexes never repeat in a lab).
const (
	bridgeName = "br0"
	uplinkName = "uplink" // a node's leg into the underlay
	podIfName  = "eth0"
)

func underlayPortName(node int) string { return fmt.Sprintf("n%d", node) }
func podLinkName(pod int) string       { return fmt.Sprintf("p%d", pod) }

// labRouteProtocol marks the routes the lab manages on node uplinks, so
// that reconciling never touches kernel-made routes.
const labRouteProtocol netlink.RouteProtocol = 108

// testHookAddPod, when set, runs while a pod-network pod is half made.
var testHookAddPod func(key string) error

func (l *Lab) createUnderlay() error {
	ns, err := createNamespace(l.prefix+"-underlay", commonSysctls)
	if err != nil {
		return err
	}
	l.underlay = ns
	off := false
	// No multicast snooping: IPv6 neighbour discovery must always flood.
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}, MulticastSnooping: &off}
	if err := ns.nl.LinkAdd(br); err != nil {
		return fmt.Errorf("underlay: creating bridge %s: %w", bridgeName, err)
	}
	if err := ns.linkUp(bridgeName); err != nil {
		return err
	}
	link, err := ns.nl.LinkByName(bridgeName)
	if err != nil {
		return fmt.Errorf("underlay: finding bridge %s: %w", bridgeName, err)
	}
	l.bridge = link.Attrs().Index
	return nil
}

// apply makes the lab match the plan: remove what went or changed, add
// nodes, reconcile every node's addresses and routes, add pods. Each node
// and pod is added whole or not at all, so a failed apply can be retried.
func (l *Lab) apply(ctx context.Context, p *plan, snap *cluster.Snapshot) error {
	wantPod := map[string]*podPlan{}
	for _, pp := range p.pods {
		wantPod[pp.key] = pp
	}
	for key, lp := range l.pods {
		pp := wantPod[key]
		switch {
		case pp == nil || !pp.sameNetwork(lp.plan):
			if err := l.removePod(lp); err != nil {
				return err
			}
		case !pp.sameServers(lp.plan):
			// Stop first, start once every pod has stopped: a port can
			// move between host-network pods, or from a probe server to
			// a DNS server.
			if err := l.stopUnwanted(lp, pp); err != nil {
				return err
			}
		}
	}
	for name, ln := range l.nodes {
		if p.node(name) == nil {
			if err := l.removeNode(ln); err != nil {
				return err
			}
		}
	}
	for _, np := range p.nodes {
		if ln := l.nodes[np.name]; ln != nil {
			ln.plan = np
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.addNode(np); err != nil {
			return err
		}
	}
	for _, np := range p.nodes {
		if err := l.reconcileNode(l.nodes[np.name], p); err != nil {
			return err
		}
	}
	if err := l.reconcileUnderlay(p); err != nil {
		return err
	}
	l.zone.Store(p.zone())
	for _, pp := range p.pods {
		if lp := l.pods[pp.key]; lp != nil {
			if !pp.sameServers(lp.plan) {
				if err := l.startMissing(lp, pp); err != nil {
					return err
				}
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.addPod(pp); err != nil {
			return err
		}
	}
	l.plan = p
	l.eval = eval.New(snap, emptyModel)
	return nil
}

func (l *Lab) addNode(np *nodePlan) (err error) {
	index := l.nextNode
	l.nextNode++
	ns, err := createNamespace(fmt.Sprintf("%s-n-%d", l.prefix, index), nodeSysctls)
	if err != nil {
		return fmt.Errorf("node %s: %w", np.name, err)
	}
	port := underlayPortName(index)
	defer func() {
		if err != nil {
			err = fmt.Errorf("node %s: %w", np.name, err)
			// Deleting one end of a veth deletes both, at once.
			if link, lerr := l.underlay.nl.LinkByName(port); lerr == nil {
				l.underlay.nl.LinkDel(link)
			}
			err = errors.Join(err, ns.delete())
		}
	}()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port, MasterIndex: l.bridge},
		PeerName:      uplinkName,
		PeerNamespace: netlink.NsFd(int(ns.handle)),
	}
	if err := l.underlay.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth %s (underlay) - %s (%s): %w", port, uplinkName, ns.name, err)
	}
	if err := l.underlay.linkUp(port); err != nil {
		return err
	}
	if err := ns.linkUp(uplinkName); err != nil {
		return err
	}
	uplink, err := ns.nl.LinkByName(uplinkName)
	if err != nil {
		return fmt.Errorf("%s: finding %s: %w", ns.name, uplinkName, err)
	}
	l.nodes[np.name] = &labNode{plan: np, index: index, ns: ns, uplink: uplink.Attrs().Index}
	return nil
}

func (l *Lab) removeNode(ln *labNode) error {
	delete(l.nodes, ln.plan.name)
	var errs []error
	if link, err := l.underlay.nl.LinkByName(underlayPortName(ln.index)); err == nil {
		errs = append(errs, l.underlay.nl.LinkDel(link))
	}
	errs = append(errs, ln.ns.delete())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing node %s: %w", ln.plan.name, err)
	}
	return nil
}

// reconcileNode gives the node's uplink exactly the plan's addresses and
// lab routes, leaving kernel-made ones (link-local, ...) alone.
func (l *Lab) reconcileNode(ln *labNode, p *plan) error {
	routes := append(p.routesFor(ln.plan), p.outsideRoutes(ln.plan)...)
	if err := syncLink(ln.ns, ln.uplink, ln.plan.addrs, routes); err != nil {
		return fmt.Errorf("node %s: %w", ln.plan.name, err)
	}
	return nil
}

// syncLink gives the link exactly addrs (as host prefixes; link-local
// addresses aside) and, among the routes the lab manages on it, exactly
// routes: on-link when via is not valid, else through via (on-link).
func syncLink(ns *namespace, ifindex int, addrs []netip.Addr, routes []route) error {
	nl := ns.nl
	link, err := nl.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("%s: finding link %d: %w", ns.name, ifindex, err)
	}
	name := link.Attrs().Name
	wantAddr := map[netip.Addr]bool{}
	for _, a := range addrs {
		wantAddr[a] = true
	}
	have, err := nl.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing addresses of %s: %w", name, err)
	}
	for _, a := range have {
		addr := addrFromNet(a.IP)
		if addr.IsLinkLocalUnicast() {
			continue
		}
		if !wantAddr[addr] {
			if err := nl.AddrDel(link, &a); err != nil {
				return fmt.Errorf("removing address %s from %s: %w", addr, name, err)
			}
		}
		delete(wantAddr, addr)
	}
	for _, a := range addrs {
		if wantAddr[a] {
			if err := addAddr(nl, link, hostPrefix(a)); err != nil {
				return err
			}
		}
	}

	type routeKey struct {
		dst netip.Prefix
		via netip.Addr
	}
	wantRoute := map[routeKey]bool{}
	for _, r := range routes {
		wantRoute[routeKey{r.dst, r.via}] = true
	}
	haveRoutes, err := nl.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{LinkIndex: ifindex, Protocol: labRouteProtocol}, netlink.RT_FILTER_OIF|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("listing routes on %s: %w", name, err)
	}
	for _, r := range haveRoutes {
		k := routeKey{prefixFromNet(r.Dst), addrFromNet(r.Gw)}
		if !wantRoute[k] {
			if err := nl.RouteDel(&r); err != nil {
				return fmt.Errorf("removing route %s via %s on %s: %w", k.dst, k.via, name, err)
			}
		}
		delete(wantRoute, k)
	}
	for _, r := range routes {
		if !wantRoute[routeKey{r.dst, r.via}] {
			continue
		}
		nr := &netlink.Route{LinkIndex: ifindex, Dst: ipNet(r.dst), Protocol: labRouteProtocol}
		if r.via.IsValid() {
			nr.Gw, nr.Flags = r.via.AsSlice(), int(netlink.FLAG_ONLINK)
		} else {
			nr.Scope = netlink.SCOPE_LINK
		}
		if err := nl.RouteAdd(nr); err != nil {
			return fmt.Errorf("adding route %s via %v on %s: %w", r.dst, r.via, name, err)
		}
	}
	return nil
}

func addAddr(nl *netlink.Handle, link netlink.Link, p netip.Prefix) error {
	// NODAD: no tentative phase, usable at once.
	a := &netlink.Addr{IPNet: ipNet(p), Flags: unix.IFA_F_NODAD}
	if err := nl.AddrAdd(link, a); err != nil {
		return fmt.Errorf("adding address %s to %s: %w", p, link.Attrs().Name, err)
	}
	return nil
}

func (l *Lab) addPod(pp *podPlan) (err error) {
	ln := l.nodes[pp.node]
	lp := &labPod{plan: pp, node: ln}
	if pp.hostNetwork {
		if err := l.startServers(lp, ln.ns); err != nil {
			return fmt.Errorf("host-network pod %s on node %s (%s): %w", pp.key, pp.node, ln.ns.name, err)
		}
		l.pods[pp.key] = lp
		return nil
	}
	index := l.nextPod
	l.nextPod++
	lp.ns, err = createNamespace(fmt.Sprintf("%s-p-%d", l.prefix, index), commonSysctls)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pp.key, err)
	}
	lp.nodeLink = podLinkName(index)
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("pod %s on node %s (%s): %w", pp.key, pp.node, lp.ns.name, err), l.removePod(lp))
		}
	}()
	if err := l.wirePod(lp); err != nil {
		return err
	}
	if testHookAddPod != nil {
		if err := testHookAddPod(pp.key); err != nil {
			return err
		}
	}
	if err := l.startServers(lp, lp.ns); err != nil {
		return err
	}
	l.pods[pp.key] = lp
	return nil
}

// startServers starts every server of a new pod inside ns: probe servers,
// and DNS servers for its dns ports; all or nothing.
func (l *Lab) startServers(lp *labPod, ns *namespace) error {
	pp := lp.plan
	servers, err := probe.StartServers(ns.handle, pp.key, pp.addrs, pp.probeServes())
	if err != nil {
		return err
	}
	var dns []*dnsServer
	for _, a := range pp.addrs {
		for _, pr := range pp.dns {
			s, err := l.serveDNS(ns.handle, pp.key, a, pr)
			if err != nil {
				return errors.Join(err, probe.StopServers(servers), stopDNS(dns))
			}
			dns = append(dns, s)
		}
	}
	lp.servers, lp.dns = servers, dns
	return nil
}

// wirePod connects a pod namespace to its node: a veth, the pod's
// addresses and default routes on eth0, the gateway addresses and a host
// route per pod address on the node side.
func (l *Lab) wirePod(lp *labPod) error {
	node, pod := lp.node.ns, lp.ns
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: lp.nodeLink},
		PeerName:      podIfName,
		PeerNamespace: netlink.NsFd(int(pod.handle)),
	}
	if err := node.nl.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth %s (%s) - %s: %w", lp.nodeLink, node.name, podIfName, err)
	}
	if err := node.linkUp(lp.nodeLink); err != nil {
		return err
	}
	if err := pod.linkUp(podIfName); err != nil {
		return err
	}
	nodeLink, err := node.nl.LinkByName(lp.nodeLink)
	if err != nil {
		return fmt.Errorf("%s: finding %s: %w", node.name, lp.nodeLink, err)
	}
	eth0, err := pod.nl.LinkByName(podIfName)
	if err != nil {
		return fmt.Errorf("finding %s: %w", podIfName, err)
	}
	var families []*ipFamily
	for _, a := range lp.plan.addrs {
		if f := familyOf(a); !slices.Contains(families, f) {
			families = append(families, f)
		}
	}
	for _, f := range families {
		if err := addAddr(node.nl, nodeLink, f.gateway); err != nil {
			return fmt.Errorf("%s: %w", node.name, err)
		}
	}
	for _, a := range lp.plan.addrs {
		if err := addAddr(pod.nl, eth0, hostPrefix(a)); err != nil {
			return err
		}
		hostRoute := &netlink.Route{LinkIndex: nodeLink.Attrs().Index, Dst: ipNet(hostPrefix(a)),
			Scope: netlink.SCOPE_LINK, Protocol: labRouteProtocol}
		if err := node.nl.RouteAdd(hostRoute); err != nil {
			return fmt.Errorf("%s: adding route %s dev %s: %w", node.name, a, lp.nodeLink, err)
		}
	}
	for _, f := range families {
		def := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(f.defaultDst),
			Gw: f.gateway.Addr().AsSlice(), Flags: int(netlink.FLAG_ONLINK), Protocol: labRouteProtocol}
		if err := pod.nl.RouteAdd(def); err != nil {
			return fmt.Errorf("adding %s default route via %s: %w", f.name, f.gateway.Addr(), err)
		}
	}
	return nil
}

// removePod stops the pod's servers and, for a pod-network pod, deletes
// its veth (at once, so that its addresses can be reused right away) and
// namespace.
func (l *Lab) removePod(lp *labPod) error {
	if l.pods[lp.plan.key] == lp {
		delete(l.pods, lp.plan.key)
	}
	errs := []error{probe.StopServers(lp.servers), stopDNS(lp.dns)}
	lp.servers, lp.dns = nil, nil
	if lp.ns != nil {
		if link, err := lp.node.ns.nl.LinkByName(lp.nodeLink); err == nil {
			errs = append(errs, lp.node.ns.nl.LinkDel(link))
		}
		errs = append(errs, lp.ns.delete())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing pod %s: %w", lp.plan.key, err)
	}
	return nil
}

type serverKey struct {
	addr  netip.Addr
	probe l4.Port
}

// stopUnwanted stops the pod's servers that pp no longer wants: probe
// servers on ports gone or now the DNS server's, DNS servers on ports
// gone or now a probe server's.
func (l *Lab) stopUnwanted(lp *labPod, pp *podPlan) error {
	wantProbe, wantDNS := pp.wanted()
	var keep, stop []*probe.Server
	for _, s := range lp.servers {
		if wantProbe[serverKey{s.Addr, s.Probe}] {
			keep = append(keep, s)
		} else {
			stop = append(stop, s)
		}
	}
	var keepDNS, stopped []*dnsServer
	for _, s := range lp.dns {
		if wantDNS[serverKey{s.addr, s.probe}] {
			keepDNS = append(keepDNS, s)
		} else {
			stopped = append(stopped, s)
		}
	}
	lp.servers, lp.dns = keep, keepDNS
	if err := errors.Join(probe.StopServers(stop), stopDNS(stopped)); err != nil {
		return fmt.Errorf("pod %s: %w", pp.key, err)
	}
	return nil
}

// wanted are the servers pp wants: probe servers and DNS servers.
func (pp *podPlan) wanted() (probes, dns map[serverKey]bool) {
	probes, dns = map[serverKey]bool{}, map[serverKey]bool{}
	for _, a := range pp.addrs {
		for _, pr := range pp.serves {
			if slices.Contains(pp.dns, pr) {
				dns[serverKey{a, pr}] = true
			} else {
				probes[serverKey{a, pr}] = true
			}
		}
	}
	return probes, dns
}

// startMissing starts the servers pp wants that the pod does not run; then
// the pod is pp's. If one fails the pod is removed, so that the next apply
// adds it whole.
func (l *Lab) startMissing(lp *labPod, pp *podPlan) error {
	if err := l.stopUnwanted(lp, pp); err != nil {
		return err
	}
	have := map[serverKey]bool{}
	for _, s := range lp.servers {
		have[serverKey{s.Addr, s.Probe}] = true
	}
	for _, s := range lp.dns {
		have[serverKey{s.addr, s.probe}] = true
	}
	ns := lp.node.ns
	if lp.ns != nil {
		ns = lp.ns
	}
	_, wantDNS := pp.wanted()
	for _, a := range pp.addrs {
		for _, pr := range pp.serves {
			k := serverKey{a, pr}
			if have[k] {
				continue
			}
			var err error
			if wantDNS[k] {
				var s *dnsServer
				if s, err = l.serveDNS(ns.handle, pp.key, a, pr); err == nil {
					lp.dns = append(lp.dns, s)
				}
			} else {
				var s *probe.Server
				if s, err = probe.Serve(ns.handle, pp.key, a, pr); err == nil {
					lp.servers = append(lp.servers, s)
				}
			}
			if err != nil {
				return errors.Join(fmt.Errorf("pod %s on node %s (%s): %w", pp.key, pp.node, ns.name, err), l.removePod(lp))
			}
		}
	}
	lp.plan = pp
	return nil
}
