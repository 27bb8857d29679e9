package trace

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/netpol/netpol/pkg/nft"
)

var (
	podA = netip.MustParseAddr("10.0.0.1")
	podB = netip.MustParseAddr("10.0.1.2")
	podC = netip.MustParseAddr("10.0.1.3")
	vip  = netip.MustParseAddr("10.96.0.10")
)

func tcpTo(src, dst netip.Addr, port uint16) Packet {
	return Packet{Family: nft.FamilyOf(dst), Src: src, Dst: dst, L4Proto: 6, SrcPort: 40000, DstPort: port}
}

func addrElem(a netip.Addr) nft.Element { return nft.Element{Key: nft.FamilyOf(a).AddrBytes(a)} }

// policyLike is a small table with the shapes the policy compiler emits:
// conntrack shortcut, a verdict map into a class chain, a goto to a next
// tier, a concatenated interval set of protocol . port, a drop.
func policyLike() *nft.Table {
	t := nft.NewTable("pol")
	t.AddSet(&nft.Set{Name: "egress", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true,
		Elements: []nft.Element{{Key: nft.IPv4.AddrBytes(podA), Verdict: &nft.Verdict{Kind: nft.Jump, Chain: "class"}}}})
	t.AddSet(&nft.Set{Name: "peers", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true,
		Elements: []nft.Element{{Key: nft.IPv4.AddrBytes(podB), KeyEnd: nft.IPv4.AddrBytes(podC)}}})
	t.AddSet(&nft.Set{Name: "ports", Fields: []nft.FieldType{nft.FieldProto, nft.FieldPort}, Interval: true,
		Elements: []nft.Element{{Key: nft.Key(nft.ProtoBytes(6), nft.PortBytes(80)), KeyEnd: nft.Key(nft.ProtoBytes(6), nft.PortBytes(90))}}})
	t.AddSet(&nft.Set{Name: "denied", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort},
		Elements: []nft.Element{{Key: nft.Key(nft.IPv4.AddrBytes(podC), nft.ProtoBytes(6), nft.PortBytes(85))}}})
	fwd := t.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: nft.HookForward, Policy: "accept"}})
	fwd.Rules = []*nft.Rule{
		nft.NewRule().CtEstablishedRelated().Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().Vmap(nft.IPv4, nft.Src, "egress"),
		// Reached after the class chain returns.
		nft.NewRule().In(nft.IPv4, "denied", nft.AddrOf(nft.IPv4, nft.Dst), nft.L4Proto(), nft.DstPort()).Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	class := t.AddChain(&nft.Chain{Name: "class"})
	class.Rules = []*nft.Rule{
		nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "peers").Verdict(nft.Verdict{Kind: nft.Goto, Chain: "next"}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	next := t.AddChain(&nft.Chain{Name: "next"})
	next.Rules = []*nft.Rule{
		nft.NewRule().L4ProtoPortInSet("ports").Verdict(nft.Verdict{Kind: nft.Return}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	return t
}

// newTracer is a Tracer of tables, or the end of t.
func newTracer(t *testing.T, tables ...*nft.Table) *Tracer {
	t.Helper()
	tr, err := NewTracer(tables...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// mustTrace is what tr traces of pkt from hook, or the end of t.
func mustTrace(t *testing.T, tr *Tracer, hook string, pkt Packet) []Result {
	t.Helper()
	rs, err := tr.Trace(hook, pkt)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestTraceVerdicts(t *testing.T) {
	tr := newTracer(t, policyLike())
	established := tcpTo(podA, netip.MustParseAddr("192.0.2.1"), 1)
	established.CtState = expr.CtStateBitESTABLISHED
	udp := tcpTo(podA, podB, 80)
	udp.L4Proto = 17
	tests := []struct {
		name string
		pkt  Packet
		want Verdict
		// chains visited, in order
		path []string
	}{
		{"established shortcut", established, Accept, []string{"forward"}},
		{"not dispatched: no policy", tcpTo(podB, podA, 80), Accept, []string{"forward", "forward", "forward", "forward"}},
		{"peer and port in range: goto next, return to forward", tcpTo(podA, podB, 80), Accept,
			[]string{"forward", "forward", "class", "next", "forward", "forward"}},
		{"upper bounds of both ranges", tcpTo(podA, podC, 90), Accept,
			[]string{"forward", "forward", "class", "next", "forward", "forward"}},
		{"port past the range", tcpTo(podA, podB, 91), Drop, []string{"forward", "forward", "class", "next", "next"}},
		{"protocol field of the concatenation", udp, Drop, []string{"forward", "forward", "class", "next", "next"}},
		{"peer outside the interval", tcpTo(podA, netip.MustParseAddr("10.0.1.4"), 80), Drop, []string{"forward", "forward", "class", "class"}},
		{"after the return, the hash set of address . proto . port", tcpTo(podA, podC, 85), Drop,
			[]string{"forward", "forward", "class", "next", "forward"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := mustTrace(t, tr, nft.HookForward, tc.pkt)
			if len(rs) != 1 {
				t.Fatalf("%d results, want 1", len(rs))
			}
			if rs[0].Verdict != tc.want {
				t.Errorf("verdict %s, want %s", rs[0].Verdict, tc.want)
			}
			var chains []string
			for _, s := range rs[0].Steps {
				chains = append(chains, s.Chain)
			}
			if !slices.Equal(chains, tc.path) {
				t.Errorf("chains %v, want %v\n%s", chains, tc.path, stepsText(rs[0].Steps))
			}
			// The fast path agrees.
			var fast []Verdict
			if err := tr.Verdicts(nft.HookForward, tc.pkt, func(r Result) bool { fast = append(fast, r.Verdict); return true }); err != nil {
				t.Fatal(err)
			}
			if len(fast) != 1 || fast[0] != tc.want {
				t.Errorf("Verdicts gave %v", fast)
			}
		})
	}
}

func stepsText(steps []Step) string {
	var b strings.Builder
	for _, s := range steps {
		b.WriteString(s.String() + "\n")
	}
	return b.String()
}

func TestTraceRecordsElementAndComment(t *testing.T) {
	tab := policyLike()
	tab.Chains["class"].Rules[0].Comment = "anp/x ingress[0]: Pass"
	tr := newTracer(t, tab)
	rs := mustTrace(t, tr, nft.HookForward, tcpTo(podA, podB, 80))
	var found bool
	for _, s := range rs[0].Steps {
		if s.Chain == "class" && s.Rule == 0 {
			found = true
			if s.Comment != "anp/x ingress[0]: Pass" || s.Element != "10.0.1.2/31" || s.Verdict != "goto next" || !s.Matched {
				t.Errorf("step %+v", s)
			}
		}
	}
	if !found {
		t.Fatalf("class rule 0 not visited:\n%s", stepsText(rs[0].Steps))
	}
	if last := rs[0].Steps[len(rs[0].Steps)-1]; last.Rule != -1 || last.Verdict != "accept" {
		t.Errorf("last step %+v, want the base chain policy", last)
	}
}

// natLike has a DNAT by numgen into a backends map, a mark read back in
// postrouting for masquerade, and a reject before DNAT, in a second table
// whose chains run before and after the policy table's by priority.
func natLike() *nft.Table {
	t := nft.NewTable("nat")
	f := nft.IPv4
	frontend := []nft.Value{nft.AddrOf(f, nft.Dst), nft.L4Proto(), nft.DstPort()}
	feKey := nft.Key(f.AddrBytes(vip), nft.ProtoBytes(6), nft.PortBytes(80))
	t.AddSet(&nft.Set{Name: "n3", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Elements: []nft.Element{{Key: feKey}}})
	back := &nft.Set{Name: "backends", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort, nft.FieldInteger}, Data: []nft.FieldType{nft.FieldIPv4, nft.FieldPort}}
	for i, a := range []netip.Addr{podA, podB, podC} {
		back.Elements = append(back.Elements, nft.Element{Key: nft.Key(feKey, nft.IntegerBytes(uint32(i))), Data: nft.AddrPortBytes(f, a, 8080)})
	}
	t.AddSet(back)
	t.AddSet(&nft.Set{Name: "noep", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort},
		Elements: []nft.Element{{Key: nft.Key(f.AddrBytes(vip), nft.ProtoBytes(6), nft.PortBytes(81))}}})
	pre := t.AddChain(&nft.Chain{Name: "pre", Base: &nft.Hook{Type: "nat", Hook: nft.HookPrerouting, Priority: -100, Policy: "accept"}})
	pre.Rules = []*nft.Rule{
		nft.NewRule().In(f, "n3", frontend...).MarkSet(0x4000).Done(),
		nft.NewRule().In(f, "n3", frontend...).DNATMap(f, "backends", append(slices.Clone(frontend), nft.Numgen(3))...),
	}
	check := t.AddChain(&nft.Chain{Name: "check", Base: &nft.Hook{Type: "filter", Hook: nft.HookPrerouting, Priority: -110, Policy: "accept"}})
	check.Rules = []*nft.Rule{nft.NewRule().CtStateNew().In(f, "noep", frontend...).L4ProtoIs(6).RejectTCPReset()}
	post := t.AddChain(&nft.Chain{Name: "post", Base: &nft.Hook{Type: "nat", Hook: nft.HookPostrouting, Priority: 100, Policy: "accept"}})
	post.Rules = []*nft.Rule{nft.NewRule().CtStatusDNAT().MarkHas(0x4000).MarkClear(0x4000).Masquerade()}
	return t
}

func TestTraceNATAlternatives(t *testing.T) {
	tr := newTracer(t, natLike(), policyLike())
	client := netip.MustParseAddr("10.0.2.9")
	rs := mustTrace(t, tr, nft.HookPrerouting, tcpTo(client, vip, 80))
	var got []string
	for i, r := range rs {
		if r.Verdict != Accept || r.Packet.DstPort != 8080 || r.Packet.CtStatus&nft.IPSDstNAT == 0 || r.Packet.Mark != 0x4000 {
			t.Errorf("alternative %d: %+v", i, r)
		}
		if !slices.Equal(r.Choices, []uint32{uint32(i)}) {
			t.Errorf("alternative %d: choices %v", i, r.Choices)
		}
		if r.Packet.OrigDst != vip || r.Packet.OrigDstPort != 80 {
			t.Errorf("alternative %d: conntrack original %s:%d", i, r.Packet.OrigDst, r.Packet.OrigDstPort)
		}
		got = append(got, r.Packet.Dst.String())
	}
	if want := []string{"10.0.0.1", "10.0.1.2", "10.0.1.3"}; !slices.Equal(got, want) {
		t.Errorf("endpoints %v, want %v", got, want)
	}

	// Postrouting masquerades what prerouting marked.
	after := rs[1].Packet
	after.MasqueradeTo = netip.MustParseAddr("192.168.1.1")
	post := mustTrace(t, tr, nft.HookPostrouting, after)
	if p := post[0].Packet; p.Src != after.MasqueradeTo || p.Mark != 0 {
		t.Errorf("after postrouting: src %s mark %#x", p.Src, p.Mark)
	}
	// An unmarked connection is not masqueraded.
	plain, _ := tr.Trace(nft.HookPostrouting, tcpTo(client, podB, 80))
	if plain[0].Packet.Src != client {
		t.Errorf("unmarked packet masqueraded to %s", plain[0].Packet.Src)
	}

	// The reject runs before DNAT (priority -110 < -100).
	rej, err := tr.Trace(nft.HookPrerouting, tcpTo(client, vip, 81))
	if err != nil || len(rej) != 1 || rej[0].Verdict != Reject {
		t.Fatalf("reject: %v %+v", err, rej)
	}
	if rej[0].Steps[0].Chain != "check" {
		t.Errorf("first chain %s, want check", rej[0].Steps[0].Chain)
	}

	// Established packets skip NAT chains.
	est := tcpTo(client, vip, 80)
	est.CtState = expr.CtStateBitESTABLISHED
	rs, _ = tr.Trace(nft.HookPrerouting, est)
	if len(rs) != 1 || rs[0].Packet.Dst != vip {
		t.Errorf("established packet NATed: %+v", rs)
	}
}

func TestTracerRefusesWhatItDoesNotModel(t *testing.T) {
	tests := []struct {
		name string
		rule *nft.Rule
		want string
	}{
		{"xtables target", &nft.Rule{Exprs: []expr.Any{&expr.Target{Name: "LOG"}}, Text: "log"}, "not modelled"},
		{"NFQUEUE without its info", &nft.Rule{Exprs: []expr.Any{&expr.Target{Name: "NFQUEUE"}}, Text: "nfqueue"}, "not modelled"},
		{"missing set", nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "nope").Verdict(nft.Verdict{Kind: nft.Accept}), "missing set nope"},
		{"missing chain", nft.NewRule().Verdict(nft.Verdict{Kind: nft.Jump, Chain: "nowhere"}), "missing chain nowhere"},
		{"meta iiftype", &nft.Rule{Exprs: []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFTYPE, Register: 1}}, Text: "iiftype"}, "meta key"},
		{"register overrun", &nft.Rule{Exprs: []expr.Any{&expr.Payload{DestRegister: 23, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}}, Text: "ip6 saddr"}, "overrun"},
		{"snat", &nft.Rule{Exprs: []expr.Any{&expr.NAT{Type: expr.NATTypeSourceNAT, RegAddrMin: 8, RegProtoMin: 9}}, Text: "snat"}, "only dnat"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := nft.NewTable("x")
			tab.AddChain(&nft.Chain{Name: "in", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "accept"}, Rules: []*nft.Rule{tc.rule}})
			_, err := NewTracer(tab)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestTraceBasePolicyDropAndJumpLimit(t *testing.T) {
	tab := nft.NewTable("x")
	tab.AddChain(&nft.Chain{Name: "in", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "drop"},
		Rules: []*nft.Rule{nft.NewRule().Verdict(nft.Verdict{Kind: nft.Jump, Chain: "loop"})}})
	tab.AddChain(&nft.Chain{Name: "loop", Rules: []*nft.Rule{nft.NewRule().Verdict(nft.Verdict{Kind: nft.Jump, Chain: "loop"})}})
	tr := newTracer(t, tab)
	if _, err := tr.Trace(nft.HookInput, tcpTo(podA, podB, 1)); err == nil || !strings.Contains(err.Error(), "jump stack") {
		t.Errorf("error %v, want the jump stack limit", err)
	}
	tab.Chains["loop"].Rules = nil
	tr, _ = NewTracer(tab)
	rs, err := tr.Trace(nft.HookInput, tcpTo(podA, podB, 1))
	if err != nil || rs[0].Verdict != Drop {
		t.Errorf("got %v %+v, want the base policy drop", err, rs)
	}
}

// meta iifname / oifname compare the zero-padded interface name, as nft
// emits `iifname "veth0"` (a cmp of the name and its terminating zero).
func TestTraceInterfaceNames(t *testing.T) {
	name := func(key expr.MetaKey, n string) *nft.Rule {
		return &nft.Rule{Exprs: []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: append([]byte(n), 0)},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}, Text: "ifname " + n + " drop"}
	}
	tab := nft.NewTable("x")
	tab.AddChain(&nft.Chain{Name: "fwd", Base: &nft.Hook{Type: "filter", Hook: nft.HookForward, Policy: "accept"},
		Rules: []*nft.Rule{name(expr.MetaKeyIIFNAME, "veth-a"), name(expr.MetaKeyOIFNAME, "eth0")}})
	tr := newTracer(t, tab)
	tests := []struct {
		iif, oif string
		want     Verdict
	}{
		{"veth-a", "br0", Drop},
		{"veth-ab", "br0", Accept}, // a longer name is another name
		{"veth", "eth0", Drop},
		{"", "", Accept},
	}
	for _, tc := range tests {
		p := tcpTo(podA, podB, 80)
		p.IIF, p.OIF = tc.iif, tc.oif
		rs, err := tr.Trace(nft.HookForward, p)
		if err != nil || rs[0].Verdict != tc.want {
			t.Errorf("iif %q oif %q: %v %v, want %s", tc.iif, tc.oif, err, rs, tc.want)
		}
	}
}

// An immediate continue does not end the rule: the kernel evaluates the
// rule's next expression (here a drop).
func TestTraceContinueGoesOnInTheRule(t *testing.T) {
	tab := nft.NewTable("x")
	rule := &nft.Rule{Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictContinue}, &expr.Verdict{Kind: expr.VerdictDrop}}, Text: "continue drop"}
	tab.AddChain(&nft.Chain{Name: "in", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "accept"}, Rules: []*nft.Rule{rule}})
	tr := newTracer(t, tab)
	rs := mustTrace(t, tr, nft.HookInput, tcpTo(podA, podB, 1))
	if len(rs) != 1 || rs[0].Verdict != "drop" {
		t.Errorf("traced %+v, want the rule's drop", rs)
	}
}

// TestDynamicSetsHoldAll: a dynamic set (a domain set the agent fills)
// is empty to the tracer unless asked to hold every key; a dynamic map
// stays empty either way, and an inverted lookup of a set that holds
// everything never matches.
func TestDynamicSetsHoldAll(t *testing.T) {
	tb := nft.NewTable("pol")
	tb.AddSet(&nft.Set{Name: "learned", Fields: []nft.FieldType{nft.FieldIPv4}, Dynamic: true})
	tb.AddSet(&nft.Set{Name: "learned-map", Fields: []nft.FieldType{nft.FieldIPv4}, Data: []nft.FieldType{nft.FieldInteger}, Dynamic: true})
	fwd := tb.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: nft.HookForward, Policy: "accept"}})
	fwd.Rules = []*nft.Rule{
		nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "learned").DstPortIs(443).Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	inverted := tb.AddChain(&nft.Chain{Name: "input", Base: &nft.Hook{Type: "filter", Hook: nft.HookInput, Policy: "accept"}})
	inverted.Rules = []*nft.Rule{
		nft.NewRule().NotIn(nft.IPv4, "learned", nft.AddrOf(nft.IPv4, nft.Dst)).Verdict(nft.Verdict{Kind: nft.Drop}),
	}
	tests := []struct {
		name string
		opts Options
		hook string
		pkt  Packet
		want Verdict
	}{
		{"empty: the accept never matches", Options{}, nft.HookForward, tcpTo(podA, podB, 443), Drop},
		{"holding all: the accept matches", Options{DynamicSetsHoldAll: true}, nft.HookForward, tcpTo(podA, podB, 443), Accept},
		{"holding all: the rule's other matches still apply", Options{DynamicSetsHoldAll: true}, nft.HookForward, tcpTo(podA, podB, 80), Drop},
		{"empty: not in it", Options{}, nft.HookInput, tcpTo(podA, podB, 443), Drop},
		{"holding all: never not in it", Options{DynamicSetsHoldAll: true}, nft.HookInput, tcpTo(podA, podB, 443), Accept},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := NewTracerWith(tc.opts, tb)
			if err != nil {
				t.Fatal(err)
			}
			rs := mustTrace(t, tr, tc.hook, tc.pkt)
			if len(rs) != 1 || rs[0].Verdict != tc.want {
				t.Fatalf("got %v, want %s\n%s", rs, tc.want, stepsText(rs[0].Steps))
			}
		})
	}
	tr, err := NewTracerWith(Options{DynamicSetsHoldAll: true}, tb)
	if err != nil {
		t.Fatal(err)
	}
	if tr.hooks[nft.HookForward][0].table.sets["learned-map"].all {
		t.Error("a dynamic map is traced as holding every key")
	}
}

// TestConcatenatedIntervalIndex: a lookup in a concatenated interval
// set, through the first-field index, finds the element the scan of
// every element finds (the first that holds the key), on random sets
// with overlapping first fields.
func TestConcatenatedIntervalIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	field := func(lo, hi uint32) ([]byte, []byte) {
		return nft.IntegerBytes(lo), nft.IntegerBytes(hi)
	}
	for round := range 200 {
		s := &nft.Set{Name: "ids-ports", Fields: []nft.FieldType{nft.FieldInteger, nft.FieldProto, nft.FieldPort}, Interval: true}
		for range 1 + rng.IntN(40) {
			lo := uint32(rng.IntN(64))
			hi := lo + uint32(rng.IntN(16))
			klo, khi := field(lo, hi)
			proto := []uint8{6, 17}[rng.IntN(2)]
			plo := uint16(rng.IntN(100))
			phi := plo + uint16(rng.IntN(20))
			s.Elements = append(s.Elements, nft.Element{
				Key:    nft.Key(klo, nft.ProtoBytes(proto), nft.PortBytes(plo)),
				KeyEnd: nft.Key(khi, nft.ProtoBytes(proto), nft.PortBytes(phi))})
		}
		ts, err := newTSet(s)
		if err != nil {
			t.Fatal(err)
		}
		if ts.byFirst == nil {
			t.Fatal("no first-field index")
		}
		scan := func(key []byte) int {
			for i := range s.Elements {
				if ts.fieldsWithin(key, &s.Elements[i]) {
					return i
				}
			}
			return -1
		}
		for range 200 {
			id, _ := field(uint32(rng.IntN(90)), 0)
			key := nft.Key(id, nft.ProtoBytes([]uint8{6, 17}[rng.IntN(2)]), nft.PortBytes(uint16(rng.IntN(130))))
			if got, want := ts.find(key), scan(key); got != want {
				t.Fatalf("round %d: key %x: index finds %d, the scan %d", round, key, got, want)
			}
		}
	}
}
