package nfttest

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// The identity statements: a data map from address to a number written
// into the packet mark, and interval sets keyed by the mark alone and by
// mark . protocol . port.
var (
	// IdentityLoopback has an identity; every case's packet goes to it.
	IdentityLoopback = netip.MustParseAddr("127.0.0.1")
	identityOther    = netip.MustParseAddr("127.0.0.2") // not in the map: mark 0
)

const (
	idNamespace = 0x00050000 // a namespace's range of identities, /16
	idOfLoop    = idNamespace | 1
	idPort      = 9000
)

// IdentityTable judges UDP to ports 9000-9009 from loopback addresses by
// the source's identity, in the output hook: 9000-9001 allowed for the
// namespace, 9002 denied for it, anything else (and any address without
// an identity) dropped at the end.
func IdentityTable() *nft.Table {
	t := nft.NewTable("netpol")
	t.AddSet(&nft.Set{Name: "ids4", Fields: []nft.FieldType{nft.FieldIPv4}, Data: []nft.FieldType{nft.FieldInteger}, Typeof: "ip saddr : meta mark",
		Elements: []nft.Element{{Key: nft.IPv4.AddrBytes(IdentityLoopback), Data: nft.IntegerBytes(idOfLoop)}}})
	t.AddSet(&nft.Set{Name: "ids", Fields: []nft.FieldType{nft.FieldInteger}, Interval: true, Typeof: "meta mark",
		Elements: []nft.Element{{Key: nft.MarkKeyBytes(idNamespace), KeyEnd: nft.MarkKeyBytes(idNamespace | 0xffff)}}})
	t.AddSet(&nft.Set{Name: "allow", Fields: []nft.FieldType{nft.FieldInteger, nft.FieldProto, nft.FieldPort}, Interval: true,
		Typeof: "meta mark . meta l4proto . th dport",
		Elements: []nft.Element{{Key: nft.Key(nft.MarkKeyBytes(idNamespace), nft.ProtoBytes(unix.IPPROTO_UDP), nft.PortBytes(idPort)),
			KeyEnd: nft.Key(nft.MarkKeyBytes(idNamespace|0xffff), nft.ProtoBytes(unix.IPPROTO_UDP), nft.PortBytes(idPort+1))}}})
	t.AddSet(&nft.Set{Name: "probed", Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true,
		Elements: []nft.Element{{Key: nft.Key(nft.ProtoBytes(unix.IPPROTO_UDP), nft.PortBytes(idPort)), KeyEnd: nft.Key(nft.ProtoBytes(unix.IPPROTO_UDP), nft.PortBytes(idPort+9))}}})
	t.AddSet(&nft.Set{Name: "denied-ports", Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true,
		Elements: []nft.Element{{Key: nft.Key(nft.ProtoBytes(unix.IPPROTO_UDP), nft.PortBytes(idPort+2))}}})
	out := t.AddChain(&nft.Chain{Name: "output", Base: &nft.Hook{Type: "filter", Hook: nft.HookOutput, Policy: "accept"}})
	out.Rules = []*nft.Rule{nft.NewRule().L4ProtoPortInSet("probed").Verdict(nft.Verdict{Kind: nft.Jump, Chain: "judge"})}
	judge := t.AddChain(&nft.Chain{Name: "judge"})
	judge.Rules = []*nft.Rule{
		nft.NewRule().MarkSetConst(0).Done(),
		nft.NewRule().MarkSetMap(nft.IPv4, "ids4", nft.AddrOf(nft.IPv4, nft.Src)).Done(),
		nft.NewRule().In(nil, "allow", nft.MarkKey(), nft.L4Proto(), nft.DstPort()).Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().In(nil, "ids", nft.MarkKey()).L4ProtoPortInSet("denied-ports").Verdict(nft.Verdict{Kind: nft.Drop}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	return t
}

// IdentityCases are UDP packets from Src to IdentityLoopback's port
// Port, and the verdict IdentityTable gives them (accept or drop).
var IdentityCases = []struct {
	Name    string
	Src     netip.Addr
	Port    uint16
	Verdict string
}{
	{"identity allowed on the port", IdentityLoopback, idPort, "accept"},
	{"upper bound of the port range", IdentityLoopback, idPort + 1, "accept"},
	{"identity in the denying set", IdentityLoopback, idPort + 2, "drop"},
	{"identity on a port nothing allows", IdentityLoopback, idPort + 5, "drop"},
	{"no identity: mark 0", identityOther, idPort, "drop"},
	{"not judged", IdentityLoopback, idPort + 20, "accept"},
}
