package compiler

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/netpol/netpol/pkg/nft"
)

// AgentPorts protects the agent's own TCP ports on its node (debug,
// metrics, the secure port): the node's input chain accepts them only
// from the node itself (`fib saddr type local`: any address of the node,
// loopback included) and from the operator's Allowed networks, and drops
// every other packet to them. Policy cannot do this: a NetworkPolicy never
// selects host-network endpoints, and pod -> node traffic is allowed by
// default.
type AgentPorts struct {
	// Ports are the protected TCP ports.
	Ports []uint16
	// Allowed are the networks besides the node itself that may connect
	// (a Prometheus, an operator's bastion).
	Allowed []netip.Prefix
}

// Names of the agent-port objects.
const (
	setAgentPorts   = "agent-ports"   // meta l4proto . th dport of the agent's ports
	setAgentClients = "agent-clients" // + family suffix: the Allowed networks
	chainAgentPorts = "agent-ports"   // who may connect to them
)

// Rule comments: netpol explain and trace show them.
const (
	commentAgentPortsLocal   = "the netpol agent's own ports (debug, metrics, secure): the node itself may connect"
	commentAgentPortsAllowed = "the netpol agent's own ports: a network the operator allows (--agent-ports-allow)"
	commentAgentPortsDrop    = "the netpol agent's own ports: nobody else (--protect-agent-ports)"
	commentAgentPortsEnter   = "the netpol agent's own ports: who may connect is checked first"
)

// Empty says there is nothing to protect.
func (p *AgentPorts) Empty() bool { return p == nil || len(p.Ports) == 0 }

// Admits says whether the protection lets a new TCP connection from src to
// port on to the rest of the input chain (the pod's egress policy), and
// which rule decided (its comment); decided is false when the port is not
// one of the agent's. srcLocal is whether src is one of the node's own
// addresses. It is the evaluator's eval.NodeGuard for these rules.
func (p *AgentPorts) Admits(src netip.Addr, srcLocal bool, proto uint8, port uint16) (allowed, decided bool, rule string) {
	if p.Empty() || proto != 6 || !slices.Contains(p.Ports, port) {
		return true, false, ""
	}
	if srcLocal {
		return true, true, commentAgentPortsLocal
	}
	for _, n := range p.Allowed {
		if n.Contains(src.Unmap()) {
			return true, true, commentAgentPortsAllowed
		}
	}
	return false, true, commentAgentPortsDrop
}

// String is the protection as flags would say it.
func (p *AgentPorts) String() string {
	if p.Empty() {
		return "none"
	}
	var ports, nets []string
	for _, x := range p.Ports {
		ports = append(ports, fmt.Sprint(x))
	}
	for _, n := range p.Allowed {
		nets = append(nets, n.String())
	}
	return fmt.Sprintf("tcp ports %s from the node and %s", strings.Join(ports, ","), strings.Join(nets, ","))
}

// protectAgentPorts sends new connections to the agent's ports, right
// after the conntrack and neighbour-discovery rules of the input chain,
// through a chain of their own that returns for the node itself and the
// allowed networks and drops the rest. It only ever drops: what it lets
// through goes on to the pod's egress policy, as any other connection to
// the node (established connections, the replies of the node's own, pass
// before it).
//
//	meta l4proto . th dport @agent-ports jump agent-ports
//	chain agent-ports {
//		fib saddr type local return
//		ip saddr @agent-clients4 return
//		ip6 saddr @agent-clients6 return
//		drop
//	}
func (c *compiler) protectAgentPorts(p *AgentPorts) {
	ports := c.t.AddSet(&nft.Set{Name: setAgentPorts, Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}})
	seen := map[uint16]bool{}
	for _, port := range p.Ports {
		if !seen[port] {
			seen[port] = true
			ports.Elements = append(ports.Elements, nft.Element{Key: nft.Key(nft.ProtoBytes(6), nft.PortBytes(port))})
		}
	}
	guard := c.t.AddChain(&nft.Chain{Name: chainAgentPorts})
	local := nft.NewRule().FibSaddrLocal().Verdict(verdictReturn)
	local.Comment = commentAgentPortsLocal
	guard.Rules = []*nft.Rule{local}
	for _, f := range nft.Families {
		var rs []addrRange
		for _, n := range p.Allowed {
			n = netip.PrefixFrom(n.Addr().Unmap(), n.Bits()).Masked()
			if n.Addr().Unmap().Is4() == (f == nft.IPv4) {
				rs = append(rs, prefixRange(n))
			}
		}
		s := c.t.AddSet(&nft.Set{Name: setAgentClients + f.Suffix, Fields: []nft.FieldType{f.Field}, Interval: true})
		s.Elements = rangeElements(union(rs), f)
		r := nft.NewRule().AddrInSet(f, nft.Src, s.Name).Verdict(verdictReturn)
		r.Comment = commentAgentPortsAllowed
		guard.Rules = append(guard.Rules, r)
	}
	drop := nft.NewRule().Verdict(verdictDrop)
	drop.Comment = commentAgentPortsDrop
	guard.Rules = append(guard.Rules, drop)
	enter := nft.NewRule().L4ProtoPortInSet(setAgentPorts).Verdict(nft.Verdict{Kind: nft.Jump, Chain: chainAgentPorts})
	enter.Comment = commentAgentPortsEnter
	in := c.t.Chains[chainInput]
	// After `ct state established,related accept` and ICMPv6 ND.
	at := min(2, len(in.Rules))
	in.Rules = slices.Insert(in.Rules, at, enter)
}
