package trace

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/nft/internal/nfttest"
)

func TestTraceIdentities(t *testing.T) {
	tr := newTracer(t, nfttest.IdentityTable())
	for _, tc := range nfttest.IdentityCases {
		t.Run(tc.Name, func(t *testing.T) {
			pkt := Packet{Family: nft.IPv4, Src: tc.Src, Dst: nfttest.IdentityLoopback, L4Proto: unix.IPPROTO_UDP, SrcPort: 40000, DstPort: tc.Port, Mark: 0x4000}
			rs := mustTrace(t, tr, nft.HookOutput, pkt)
			if len(rs) != 1 || rs[0].Verdict != Verdict(tc.Verdict) {
				t.Fatalf("got %+v, want %s", rs, tc.Verdict)
			}
		})
	}
}
