package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// DefaultTable is the nftables table the service proxy owns.
const DefaultTable = "netpol-proxy"

// MasqueradeMark is the connection-mark bit that asks nat postrouting to
// masquerade a connection (kube-proxy's bit, which kube-proxy sets in the
// packet mark). NAT chains see only a connection's first packet, so the
// connection mark means the same; the packet mark is left to the policy
// table, whose chains may write it.
const MasqueradeMark = 0x4000

// CompileOptions tune Compile.
type CompileOptions struct {
	Table string // default DefaultTable
}

// Compile renders the model as the node's NAT table.
//
// The layout keeps services in set and map elements, not in rules, so that
// adding or removing a Service (or an endpoint) changes elements only and
// never makes the kernel re-validate the table (which every jump/goto map
// element does; docs/nft-notes.md section 7). Per family F (4 or 6):
//
//   - A frontend is `daddr . l4proto . dport`: a ClusterIP port, a
//     NodePort on each NodePort address, a load-balancer IP port or an
//     externalIP port.
//   - services.F (from nat prerouting and output): marks what must be
//     masqueraded, sends eTP Local frontends' in-cluster and node-local
//     clients to cluster.F, sends affinity frontends through the vmap
//     affinity.F to their own chains, then DNATs every other frontend with
//     one rule per distinct endpoint count N: `frontend @nN.F dnat to
//     frontend . numgen random mod N map @backends.F`. The backends map
//     holds `frontend . index : address . port` for every frontend, so no
//     Service has a map of its own.
//   - service-checks (filter, before DNAT, from prerouting and output):
//     loadBalancerSourceRanges, then frontends without endpoints and
//     ClusterIP ports that no Service serves, refused through the chain
//     refuse (a TCP reset, else ICMP port unreachable).
//   - nat postrouting masquerades marked connections and hairpin ones
//     (a pod reaching itself through its Service).
//
// A rule that needs an element of an empty set is left out, so each new
// connection costs one set lookup per distinct endpoint count and one per
// kind of frontend the cluster has, whatever the number of Services;
// later packets never reach these chains (conntrack).
func Compile(m *Model, opts CompileOptions) (*nft.Table, error) {
	tb := newTableBuilder(opts)
	var frags []*fragment
	var contributions []contribution
	for _, p := range m.Services {
		f, more, err := compilePort(p, m.NodePortAddresses, contributions)
		if err != nil {
			return nil, err
		}
		frags, contributions = append(frags, f), more
	}
	tb.change(nil, frags)
	return tb.table(m.ClusterCIDRs, m.ServiceCIDRs), nil
}

// fragment is what one ServicePort puts in the table: elements of shared
// sets, and (for ClientIP affinity) chains and sets of its own.
type fragment struct {
	elems  []contribution
	chains []*nft.Chain
	sets   []*nft.Set
}

// contribution is one element of a shared set.
type contribution struct {
	set  string
	elem nft.Element
}

// frontend is where a Service port is reached.
type frontend struct {
	addr  netip.Addr
	proto uint8
	port  uint16
}

func (fe frontend) key(f *nft.Family) []byte {
	return nft.Key(f.AddrBytes(fe.addr), nft.ProtoBytes(fe.proto), nft.PortBytes(fe.port))
}

// Shared set names, per family (suffixed ".4" or ".6").
const (
	setClusterIPs     = "cluster-ips"
	setFrontends      = "frontends"
	setNoEndpoints    = "no-endpoints"
	setNoLocal        = "no-local-endpoints"
	setFirewall       = "firewall"
	setFirewallAllow  = "firewall-allow"
	setClusterCIDRs   = "cluster-cidrs"
	setServiceCIDRs   = "service-cidrs"
	setHairpin        = "hairpin"
	setMasqExternal   = "external-masquerade"
	setLocalExternal  = "external-local"
	setBackends       = "backends"
	setClusterBackend = "cluster-backends"
	setAffinity       = "affinity"
	setClusterAff     = "cluster-affinity"
	prefixCount       = "n"         // n<N>: frontends with N endpoints
	prefixClusterCnt  = "cluster-n" // the same, for eTP Local frontends' cluster scope
)

// scope says which endpoint list a frontend uses in which chain.
type scope int

const (
	mainScope    scope = iota // services.F: the frontend's own list
	clusterScope              // cluster.F: eTP Local frontends' cluster list
)

// compilePort computes one ServicePort's fragment. It depends on nothing
// but the port and the NodePort addresses, so a port that did not change
// keeps its fragment. The fragment's contributions are appended to buf,
// which is returned (the Syncer reuses one buffer for every Service: a list
// per port is garbage once the shared sets hold its elements).
func compilePort(p *ServicePort, nodePortAddresses []netip.Addr, buf []contribution) (*fragment, []contribution, error) {
	proto, ok := policy.IPProtocol(p.Protocol)
	if !ok {
		return nil, buf, fmt.Errorf("service port %s: unsupported protocol %q", p, p.Protocol)
	}
	if !p.ClusterIP.IsValid() || p.Port < 1 || p.Port > 65535 {
		return nil, buf, fmt.Errorf("service port %s: invalid ClusterIP %s or port %d", p, p.ClusterIP, p.Port)
	}
	f := nft.FamilyOf(p.ClusterIP)
	reachable := p.ReachableEndpoints()
	start := len(buf)
	// Room for a ClusterIP port's contributions: a hairpin pair and a
	// backend per endpoint, and its frontend's few.
	fr := &fragment{elems: slices.Grow(buf, 2*len(reachable)+4)}
	add := func(set string, e nft.Element) { fr.add(f, set, e) }
	for _, ep := range reachable {
		if nft.FamilyOf(ep.Address) != f || ep.Port < 1 || ep.Port > 65535 {
			return nil, buf, fmt.Errorf("service port %s: endpoint %s: not an %s address and port", p, ep, p.Family)
		}
		a := f.AddrBytes(ep.Address)
		add(setHairpin, nft.Element{Key: nft.Key(a, a)})
	}

	cip := frontend{p.ClusterIP, proto, uint16(p.Port)}
	add(setClusterIPs, nft.Element{Key: f.AddrBytes(p.ClusterIP)})
	add(setFrontends, nft.Element{Key: cip.key(f)})
	fr.route(p, f, cip, p.InternalEndpoints(), mainScope)

	for _, ap := range p.externalAddrPorts(nodePortAddresses) {
		fe := frontend{ap.Addr(), proto, ap.Port()}
		if p.ExternalPolicyLocal {
			add(setLocalExternal, nft.Element{Key: fe.key(f)})
			fr.route(p, f, fe, p.ClusterEndpoints, clusterScope)
		} else {
			add(setMasqExternal, nft.Element{Key: fe.key(f)})
		}
		fr.route(p, f, fe, p.ExternalEndpoints(), mainScope)
	}
	// Source ranges guard the load-balancer IPs (as in kube-proxy).
	if len(p.LoadBalancerSourceRanges) > 0 {
		for _, ip := range p.LoadBalancerIPs {
			fe := frontend{ip, proto, uint16(p.Port)}
			add(setFirewall, nft.Element{Key: fe.key(f)})
			for _, r := range p.LoadBalancerSourceRanges {
				add(setFirewallAllow, nft.Element{
					Key:    nft.Key(fe.key(f), f.AddrBytes(r.Masked().Addr())),
					KeyEnd: nft.Key(fe.key(f), f.AddrBytes(nft.LastAddr(r)))})
			}
		}
	}
	// The fragment's own contributions, capped: an append to them cannot
	// write over the next port's in buf.
	buf, fr.elems = fr.elems, fr.elems[start:len(fr.elems):len(fr.elems)]
	return fr, buf, nil
}

// externalAddrPorts are where the port is reached from outside: the
// NodePort on each NodePort address of its family, and the service port on
// its load-balancer IPs and external IPs.
func (p *ServicePort) externalAddrPorts(nodePortAddresses []netip.Addr) []netip.AddrPort {
	var out []netip.AddrPort
	if p.NodePort != 0 {
		for _, a := range nodePortAddresses {
			if nft.FamilyOf(a) == nft.FamilyOf(p.ClusterIP) {
				out = append(out, netip.AddrPortFrom(a, uint16(p.NodePort)))
			}
		}
	}
	for _, ip := range append(slices.Clone(p.LoadBalancerIPs), p.ExternalIPs...) {
		out = append(out, netip.AddrPortFrom(ip, uint16(p.Port)))
	}
	return out
}

// add contributes an element to the shared set base of family f.
func (fr *fragment) add(f *nft.Family, base string, e nft.Element) {
	fr.addNamed(setName(f, base, 0), e)
}

func (fr *fragment) addNamed(set string, e nft.Element) {
	fr.elems = append(fr.elems, contribution{set, e})
}

// setNames holds each shared set's name once: a sync makes two or more
// contributions per endpoint of a port, and each formatted its set's name
// again.
var setNames struct {
	sync.Mutex
	m map[setNameKey]string
}

type setNameKey struct {
	base   string
	count  int // N of an n<N> set; 0 for the others
	suffix string
}

// setName is "base.suffix", or "baseN.suffix" for a count set (count > 0).
func setName(f *nft.Family, base string, count int) string {
	k := setNameKey{base, count, f.Suffix}
	setNames.Lock()
	defer setNames.Unlock()
	name, ok := setNames.m[k]
	if !ok {
		if setNames.m == nil {
			setNames.m = map[setNameKey]string{}
		}
		name = base + "." + f.Suffix
		if count > 0 {
			name = base + strconv.Itoa(count) + "." + f.Suffix
		}
		setNames.m[k] = name
	}
	return name
}

// route sends a frontend to its endpoints in one scope.
func (fr *fragment) route(p *ServicePort, f *nft.Family, fe frontend, eps []Endpoint, sc scope) {
	key := fe.key(f)
	add := func(set string, e nft.Element) { fr.add(f, set, e) }
	if len(eps) == 0 {
		switch {
		case sc == clusterScope:
		case p.AnyEndpoints:
			add(setNoLocal, nft.Element{Key: key}) // none usable from this node
		default:
			add(setNoEndpoints, nft.Element{Key: key})
		}
		return
	}
	if p.AffinityTimeout > 0 {
		chain := fr.affinityChains(p, f, eps, sc)
		vmap := setAffinity
		if sc == clusterScope {
			vmap = setClusterAff
		}
		add(vmap, nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.Goto, Chain: chain}})
		return
	}
	counts, backends := prefixCount, setBackends
	if sc == clusterScope {
		counts, backends = prefixClusterCnt, setClusterBackend
	}
	fr.addNamed(setName(f, counts, len(eps)), nft.Element{Key: key})
	for i, ep := range eps {
		add(backends, nft.Element{Key: nft.Key(key, nft.IntegerBytes(uint32(i))),
			Data: nft.AddrPortBytes(f, ep.Address, uint16(ep.Port))})
	}
}

// affinityChains builds, once per Service port, scope and endpoint list,
// the ClientIP affinity chains (as kube-proxy does): a client set per
// endpoint, remembered for the timeout; a known client goes to its
// endpoint, a new one to a random endpoint, which records it. Only
// affinity Services have chains and maps of their own.
func (fr *fragment) affinityChains(p *ServicePort, f *nft.Family, eps []Endpoint, sc scope) string {
	id := shortHash(fmt.Sprint(p.String(), "|", sc, "|", eps))
	name := "affinity." + id
	for _, c := range fr.chains {
		if c.Name == name {
			return name
		}
	}
	proto, _ := policy.IPProtocol(p.Protocol)
	svc := &nft.Chain{Name: name}
	pick := &nft.Set{Name: "pick." + id, Fields: []nft.FieldType{nft.FieldInteger}, Verdict: true,
		Typeof: "numgen random mod 1 : verdict"}
	fr.chains = append(fr.chains, svc)
	fr.sets = append(fr.sets, pick)
	for i, ep := range eps {
		epID := shortHash(ep.String())
		clients := &nft.Set{Name: "clients." + id + "." + epID, Fields: []nft.FieldType{f.Field},
			Dynamic: true, Timeout: time.Duration(p.AffinityTimeout) * time.Second}
		fr.sets = append(fr.sets, clients)
		r := nft.NewRule().In(f, clients.Name, nft.AddrOf(f, nft.Src)).L4ProtoIs(proto).
			DNAT(f, ep.Address, uint16(ep.Port))
		r.Comment = fmt.Sprintf("%s: clients of %s", p, ep)
		svc.Rules = append(svc.Rules, r)

		epChain := &nft.Chain{Name: name + "." + epID, Rules: []*nft.Rule{
			nft.NewRule().L4ProtoIs(proto).Update(f, clients.Name, nft.AddrOf(f, nft.Src)).DNAT(f, ep.Address, uint16(ep.Port))}}
		fr.chains = append(fr.chains, epChain)
		pick.Elements = append(pick.Elements, nft.Element{Key: nft.IntegerBytes(uint32(i)),
			Verdict: &nft.Verdict{Kind: nft.Goto, Chain: epChain.Name}})
	}
	r := nft.NewRule().VmapKey(nil, pick.Name, nft.Numgen(uint32(len(eps))))
	r.Comment = fmt.Sprintf("%s: new clients, affinity %ds", p, p.AffinityTimeout)
	svc.Rules = append(svc.Rules, r)
	return name
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:5])
}
