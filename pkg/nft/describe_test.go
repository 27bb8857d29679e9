package nft_test

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/nftrace"
)

// DescribeExprs, for rules read back from the kernel (no text), writes
// what the Builder wrote for the common rules.
func TestDescribeExprs(t *testing.T) {
	tr, _ := nftrace.Table(nftrace.Match{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), L4Proto: unix.IPPROTO_TCP, DstPort: 80})
	rules := []*nft.Rule{
		tr.Chains[nft.HookPrerouting].Rules[0],
		nft.NewRule().CtEstablishedRelated().Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().CtStateNew().CtStatusDNAT().Verdict(nft.Verdict{Kind: nft.Return}),
		nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "peers").L4ProtoPortInSet("ports").Verdict(nft.Verdict{Kind: nft.Drop}),
		nft.NewRule().Vmap(nft.IPv6, nft.Dst, "ingress-pods6"),
		nft.NewRule().MatchFamily(nft.IPv4).Verdict(nft.Verdict{Kind: nft.Jump, Chain: "services.4"}),
		nft.NewRule().AddrL4ProtoPortInSet(nft.IPv4, nft.Dst, "allow").Verdict(nft.Verdict{Kind: nft.Goto, Chain: "next"}),
	}
	for _, r := range rules {
		if got := nft.DescribeExprs(r.Exprs); got != r.Text {
			t.Errorf("described as %q, built as %q", got, r.Text)
		}
	}
}

func TestVerdictCodeText(t *testing.T) {
	for code, want := range map[int32]string{0: "drop", 1: "accept", -1: "continue", -5: "return", -4: "goto c", 0x10000: "drop"} {
		if got := nft.VerdictCodeText(code, "c"); got != want {
			t.Errorf("verdict %d: %q, want %q", code, got, want)
		}
	}
}
