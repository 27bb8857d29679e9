package lab

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
)

// A drop rule in a node's forward hook must show up as exactly the denied
// cells: everything to that pod except from itself (its own traffic never
// leaves it), as timeouts.
func TestDenialObserved(t *testing.T) {
	snap := loadBase(t, "e2e.yaml")
	l := upLab(t, snap, Options{})
	const target = "x/a" // on node-2, with x/c, y/b, z/a, z/c; the rest on node-1
	var targetAddr []byte
	for _, p := range l.Pods() {
		if p.Name == target {
			a, _ := pick(p.Addrs, ipfamily.IPv4)
			targetAddr = a.AsSlice()
		}
	}
	node := l.Node("node-2")
	conn, err := nftables.New(nftables.WithNetNSFd(int(node.Handle)))
	if err != nil {
		t.Fatalf("nftables in %s: %v", node.NetNS, err)
	}
	table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "labtest"})
	chain := conn.AddChain(&nftables.Chain{Name: "forward", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		// ip daddr <target> th dport < 1024 drop: the servers' ports, not
		// the target's own probes' replies (to its ephemeral ports).
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: targetAddr},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpLt, Register: 1, Data: binary.BigEndian.AppendUint16(nil, 1024)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	if err := conn.Flush(); err != nil {
		t.Fatalf("adding the drop rule in %s: %v", node.NetNS, err)
	}

	probes := mustProbes(t, "tcp/80", "udp/81")
	want := evalTable(snap, eval.TruthTableOptions{Probes: probes, Family: ipfamily.IPv4})
	for i, r := range want.Results {
		want.Results[i].Allowed = r.To != target || r.From == target
	}
	got, _ := probeLab(t, l, ProbeOptions{Probes: probes, Family: ipfamily.IPv4})
	sameTable(t, want, got)

	// Each denied cell is a timeout (a drop), from the same node and from
	// the other; IPv6 is untouched.
	var wg sync.WaitGroup
	for _, from := range got.Pods {
		for _, p := range probes {
			wg.Go(func() {
				o, err := l.ProbeOne(t.Context(), from, target, p, ipfamily.IPv4)
				wantResult := ResultTimeout
				if from == target {
					wantResult = ResultOK
				}
				if err != nil || o.Result != wantResult {
					t.Errorf("%s -> %s %s: %+v, %v; want %s", from, target, p, o, err, wantResult)
				}
			})
		}
	}
	wg.Wait()
	o, err := l.ProbeOne(t.Context(), "x/b", target, probes[0], ipfamily.IPv6)
	if err != nil || !o.Allowed {
		t.Errorf("IPv6 x/b -> %s: %+v, %v; want allowed", target, o, err)
	}
}
