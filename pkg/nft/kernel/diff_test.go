package kernel

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// smallTable: a base chain dispatching through a vmap to two class chains
// that look up a hash set and an interval set.
func smallTable() *nft.Table {
	t := nft.NewTable("netpol")
	t.AddSet(&nft.Set{Name: "hosts4", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{single("10.0.0.1"), single("10.0.0.2")}})
	t.AddSet(&nft.Set{Name: "nets4", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true, Elements: []nft.Element{cidr("10.1.0.0/16")}})
	t.AddSet(&nft.Set{Name: "pods4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true, Elements: []nft.Element{
		to(single("10.0.0.1"), jump("class-a")), to(single("10.0.0.2"), jump("class-b")),
	}})
	t.AddChain(&nft.Chain{Name: "forward", Base: &nft.Hook{Type: "filter", Hook: "forward", Policy: "accept"}, Rules: []*nft.Rule{
		nft.NewRule().Vmap(nft.IPv4, nft.Src, "pods4"),
	}})
	t.AddChain(&nft.Chain{Name: "class-a", Rules: []*nft.Rule{
		nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "hosts4").Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	t.AddChain(&nft.Chain{Name: "class-b", Rules: []*nft.Rule{
		nft.NewRule().AddrInSet(nft.IPv4, nft.Dst, "nets4").Verdict(nft.Verdict{Kind: nft.Accept}),
		nft.NewRule().Verdict(nft.Verdict{Kind: nft.Drop}),
	}})
	return t
}

// readBackForm turns rules into what Read returns: no text, the ID only.
func readBackForm(t *nft.Table) *nft.Table {
	c := clone(t)
	for _, ch := range c.Chains {
		for i, r := range ch.Rules {
			ch.Rules[i] = nft.RuleWithID(r.ID(), nil)
		}
	}
	return c
}

func TestDiff(t *testing.T) {
	lines := func(l ...string) string {
		if len(l) == 0 {
			return ""
		}
		return strings.Join(l, "\n") + "\n"
	}
	tests := []struct {
		name    string
		current func() *nft.Table // nil: smallTable()
		change  func(d *nft.Table)
		want    string
	}{
		{name: "identical", change: func(d *nft.Table) {}, want: ""},
		{
			name:    "identical to read-back form",
			current: func() *nft.Table { return readBackForm(smallTable()) },
			change:  func(d *nft.Table) {},
			want:    "",
		},
		{
			name: "element order and singleton ranges do not matter",
			current: func() *nft.Table {
				c := smallTable()
				c.Sets["nets4"].Elements = append(c.Sets["nets4"].Elements, single("10.2.0.1"))
				return c
			},
			change: func(d *nft.Table) {
				s := d.Sets["hosts4"]
				s.Elements[0], s.Elements[1] = s.Elements[1], s.Elements[0]
				d.Sets["nets4"].Elements = append(d.Sets["nets4"].Elements, span("10.2.0.1", "10.2.0.1"), span("10.2.0.1", "10.2.0.1"))
			},
			want: "",
		},
		{
			name:   "exact element adds and deletes",
			change: func(d *nft.Table) { d.Sets["hosts4"].Elements = []nft.Element{single("10.0.0.2"), single("10.0.0.3")} },
			want: lines(
				"delete element inet netpol hosts4 { 10.0.0.1 }",
				"add element inet netpol hosts4 { 10.0.0.3 }"),
		},
		{
			name:   "range change is delete and add",
			change: func(d *nft.Table) { d.Sets["nets4"].Elements = []nft.Element{cidr("10.0.0.0/8")} },
			want: lines(
				"delete element inet netpol nets4 { 10.1.0.0/16 }",
				"add element inet netpol nets4 { 10.0.0.0/8 }"),
		},
		{
			name: "only the changed chain is rewritten",
			change: func(d *nft.Table) {
				d.Chains["class-a"].Rules[1] = nft.NewRule().Verdict(nft.Verdict{Kind: nft.Return})
			},
			want: lines(
				"flush chain inet netpol class-a",
				"add rule inet netpol class-a ip daddr @hosts4 accept",
				"add rule inet netpol class-a return"),
		},
		{
			name: "foreign rule makes its chain rewritten",
			current: func() *nft.Table {
				c := readBackForm(smallTable())
				c.Chains["class-b"].Rules = append(c.Chains["class-b"].Rules, nft.RuleWithID("handle:9", nil))
				return c
			},
			change: func(d *nft.Table) {},
			want: lines(
				"flush chain inet netpol class-b",
				"add rule inet netpol class-b ip daddr @nets4 accept",
				"add rule inet netpol class-b drop"),
		},
		{
			name:   "vmap verdict change is delete and add",
			change: func(d *nft.Table) { d.Sets["pods4"].Elements[1] = to(single("10.0.0.2"), gotoV("class-a")) },
			want: lines(
				"delete element inet netpol pods4 { 10.0.0.2 }",
				"add element inet netpol pods4 { 10.0.0.2 : goto class-a }"),
		},
		{
			name: "removed chain goes after its vmap element",
			change: func(d *nft.Table) {
				delete(d.Chains, "class-b")
				d.Sets["pods4"].Elements = d.Sets["pods4"].Elements[:1]
			},
			want: lines(
				"delete element inet netpol pods4 { 10.0.0.2 }",
				"flush chain inet netpol class-b",
				"delete chain inet netpol class-b"),
		},
		{
			name:   "set spec change rewrites the chains that use it",
			change: func(d *nft.Table) { d.Sets["hosts4"].Interval = true },
			want: lines(
				"flush chain inet netpol class-a",
				"delete set inet netpol hosts4",
				"add set inet netpol hosts4 { type ipv4_addr; flags interval; }",
				"add element inet netpol hosts4 { 10.0.0.1, 10.0.0.2 }",
				"add rule inet netpol class-a ip daddr @hosts4 accept",
				"add rule inet netpol class-a drop"),
		},
		{
			name: "set spec change seen from read-back (rules without text)",
			current: func() *nft.Table {
				c := readBackForm(smallTable())
				c.Sets["hosts4"].Interval = true
				return c
			},
			change: func(d *nft.Table) {},
			want: lines(
				"flush chain inet netpol class-a",
				"delete set inet netpol hosts4",
				"add set inet netpol hosts4 { type ipv4_addr; }",
				"add element inet netpol hosts4 { 10.0.0.1, 10.0.0.2 }",
				"add rule inet netpol class-a ip daddr @hosts4 accept",
				"add rule inet netpol class-a drop"),
		},
		{
			name:   "base chain policy is updated in place",
			change: func(d *nft.Table) { d.Chains["forward"].Base.Policy = "drop" },
			want:   lines("add chain inet netpol forward { type filter hook forward priority filter; policy drop; }"),
		},
		{
			name:   "base chain priority change recreates the chain",
			change: func(d *nft.Table) { d.Chains["forward"].Base.Priority = 5 },
			want: lines(
				"flush chain inet netpol forward",
				"delete chain inet netpol forward",
				"add chain inet netpol forward { type filter hook forward priority filter + 5; policy accept; }",
				"add rule inet netpol forward ip saddr vmap @pods4"),
		},
		{
			name: "new chain comes before the vmap element that jumps to it",
			change: func(d *nft.Table) {
				d.AddChain(&nft.Chain{Name: "class-c", Rules: []*nft.Rule{nft.NewRule().Verdict(nft.Verdict{Kind: nft.Accept})}})
				d.Sets["pods4"].Elements = append(d.Sets["pods4"].Elements, to(single("10.0.0.3"), jump("class-c")))
			},
			want: lines(
				"add chain inet netpol class-c",
				"add element inet netpol pods4 { 10.0.0.3 : jump class-c }",
				"add rule inet netpol class-c accept"),
		},
		{
			name: "removed set goes after the flush of its user",
			change: func(d *nft.Table) {
				delete(d.Sets, "nets4")
				d.Chains["class-b"].Rules = d.Chains["class-b"].Rules[1:]
			},
			want: lines(
				"flush chain inet netpol class-b",
				"delete set inet netpol nets4",
				"add rule inet netpol class-b drop"),
		},
		{
			name: "many deletes from a concatenated interval set recreate it",
			current: func() *nft.Table {
				c := smallTable()
				s := c.AddSet(&nft.Set{Name: "allow4", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Interval: true})
				for i := 0; i < 10; i++ {
					s.Elements = append(s.Elements, tuple(fmt.Sprintf("10.9.%d.0/24", i), tcp, 80, 80))
				}
				return c
			},
			change: func(d *nft.Table) {
				d.AddSet(&nft.Set{Name: "allow4", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Interval: true,
					Elements: []nft.Element{tuple("10.9.0.0/24", tcp, 80, 80)}})
			},
			want: lines(
				"delete set inet netpol allow4",
				"add set inet netpol allow4 { type ipv4_addr . inet_proto . inet_service; flags interval; }",
				"add element inet netpol allow4 { 10.9.0.0/24 . tcp . 80 }"),
		},
		{
			name:   "empty desired removes everything",
			change: func(d *nft.Table) { d.Chains, d.Sets = map[string]*nft.Chain{}, map[string]*nft.Set{} },
			want: lines(
				"flush chain inet netpol forward",
				"flush chain inet netpol class-a",
				"flush chain inet netpol class-b",
				"delete set inet netpol hosts4",
				"delete set inet netpol nets4",
				"delete map inet netpol pods4",
				"delete chain inet netpol forward",
				"delete chain inet netpol class-a",
				"delete chain inet netpol class-b"),
		},
		{
			name:    "absent table is created in dependency order",
			current: func() *nft.Table { return nil },
			change:  func(d *nft.Table) {},
			want: lines(
				"add table inet netpol",
				"add chain inet netpol forward { type filter hook forward priority filter; policy accept; }",
				"add chain inet netpol class-a",
				"add chain inet netpol class-b",
				"add set inet netpol hosts4 { type ipv4_addr; }",
				"add set inet netpol nets4 { type ipv4_addr; flags interval; }",
				"add map inet netpol pods4 { type ipv4_addr : verdict; }",
				"add element inet netpol hosts4 { 10.0.0.1, 10.0.0.2 }",
				"add element inet netpol nets4 { 10.1.0.0/16 }",
				"add element inet netpol pods4 { 10.0.0.1 : jump class-a, 10.0.0.2 : jump class-b }",
				"add rule inet netpol forward ip saddr vmap @pods4",
				"add rule inet netpol class-a ip daddr @hosts4 accept",
				"add rule inet netpol class-a drop",
				"add rule inet netpol class-b ip daddr @nets4 accept",
				"add rule inet netpol class-b drop"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := smallTable()
			if tt.current != nil {
				cur = tt.current()
			}
			desired := clone(smallTable())
			tt.change(desired)
			p := Diff(cur, desired)
			if got := p.String(); got != tt.want {
				t.Errorf("plan:\n%s\nwant:\n%s", got, tt.want)
			}
			if p.Empty() != (tt.want == "") {
				t.Errorf("Empty() = %v", p.Empty())
			}
			if p.Stats.Messages != len(p.Ops) {
				t.Errorf("Stats.Messages = %d, %d ops", p.Stats.Messages, len(p.Ops))
			}
		})
	}
}

func TestDiffStats(t *testing.T) {
	cur := smallTable()
	d := clone(cur)
	d.Sets["hosts4"].Elements = []nft.Element{single("10.0.0.3")}                     // 2 deleted, 1 added
	d.Sets["nets4"].Interval = false                                                  // re-added: 1 added
	d.Sets["nets4"].Elements = []nft.Element{single("10.1.0.1")}                      //
	delete(d.Chains, "class-b")                                                       // deleted
	d.Sets["pods4"].Elements = []nft.Element{to(single("10.0.0.1"), jump("class-c"))} // 2 deleted, 1 added
	d.AddChain(&nft.Chain{Name: "class-c", Rules: []*nft.Rule{nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "nets4").Verdict(nft.Verdict{Kind: nft.Drop})}})
	d.Chains["forward"].Base.Policy = "drop" // rewritten
	got := Diff(cur, d).Stats
	want := Stats{
		SetsAdded: 1, SetsDeleted: 1,
		ChainsAdded: 1, ChainsRewritten: 1, ChainsDeleted: 1,
		RulesWritten:  1,
		ElementsAdded: 3, ElementsDeleted: 4,
		Messages: 12,
	}
	if got != want {
		t.Errorf("stats %+v\nwant  %+v\nplan:\n%s", got, want, Diff(cur, d))
	}
}

func TestChunkElements(t *testing.T) {
	sets := []*nft.Set{
		{Name: "v4", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true},
		{Name: "c6", Fields: []nft.FieldType{nft.FieldIPv6, nft.FieldProto, nft.FieldPort}, Interval: true},
		{Name: "m4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true},
	}
	for _, s := range sets {
		var elems []nft.Element
		for i := 0; i < 5000; i++ {
			a := []byte{10, byte(i >> 8), byte(i), 0}
			switch s.Name {
			case "v4":
				elems = append(elems, nft.Element{Key: a, KeyEnd: []byte{10, byte(i >> 8), byte(i), 15}})
			case "c6":
				lo := make([]byte, 16)
				copy(lo, a)
				elems = append(elems, nft.Element{Key: nft.Key(lo, nft.ProtoBytes(tcp), nft.PortBytes(1)), KeyEnd: nft.Key(lo, nft.ProtoBytes(tcp), nft.PortBytes(1023))})
			case "m4":
				elems = append(elems, to(nft.Element{Key: a}, jump("class-with-a-long-name-0123456789")))
			}
		}
		chunks := chunkElements(s, elems)
		if len(chunks) < 2 {
			t.Errorf("%s: %d chunks for 5000 elements", s.Name, len(chunks))
		}
		n := 0
		for _, c := range chunks {
			size := 0
			for _, e := range c {
				size += elementBytes(s, e)
			}
			if size > maxElementBytes {
				t.Errorf("%s: chunk of %d bytes", s.Name, size)
			}
			if got := encodedListBytes(t, kernelElements(s, c, false)); got > size {
				t.Errorf("%s: estimate %d below the encoding %d", s.Name, size, got)
			}
			n += len(c)
		}
		if n != len(elems) {
			t.Errorf("%s: chunks hold %d of %d elements", s.Name, n, len(elems))
		}
	}
}

// encodedListBytes has the library encode an element message (into a
// fake netlink socket) and returns the length of its element list
// attribute, the one whose 16-bit length must not wrap.
func encodedListBytes(t *testing.T, kes []nftables.SetElement) int {
	t.Helper()
	conn, sent := capturingConn(t)
	kt := &nftables.Table{Name: "netpol", Family: nftables.TableFamilyINet}
	if err := conn.SetAddElements(&nftables.Set{Table: kt, Name: "s"}, kes); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, m := range *sent {
		if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM) {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return len(ad.Bytes())
			}
		}
	}
	t.Fatal("no element list sent")
	return 0
}

func TestKernelElementsRoundTrip(t *testing.T) {
	v4 := &nft.Set{Name: "v4", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true}
	elems := []nft.Element{cidr("10.0.0.0/8"), single("192.0.2.7"), span("198.51.100.10", "198.51.100.20"),
		span("198.51.100.21", "198.51.100.30"), cidr("224.0.0.0/3"), cidr("0.0.0.0/32")}
	kes := kernelElements(v4, normalElements(&nft.Set{Fields: v4.Fields, Interval: true, Elements: elems}), false)
	if len(kes) != 11 { // 6 ranges, the one reaching the top has no end
		t.Fatalf("%d kernel elements, want 11", len(kes))
	}
	// The kernel returns them in its own order.
	for i, j := 0, len(kes)-1; i < j; i, j = i+1, j-1 {
		kes[i], kes[j] = kes[j], kes[i]
	}
	back, mismatch := fromKernelElements(v4, kes)
	if mismatch != "" {
		t.Fatal(mismatch)
	}
	got := &nft.Set{Name: "v4", Fields: v4.Fields, Interval: true, Elements: back}
	want := &nft.Set{Name: "v4", Fields: v4.Fields, Interval: true, Elements: elems}
	if del, add := elementDiff(&cachedSet{set: got}, want); len(del)+len(add) != 0 {
		t.Errorf("round trip differs: extra %v, missing %v", del, add)
	}

	bad := []struct {
		name string
		kes  []nftables.SetElement
	}{
		{"orphan end", []nftables.SetElement{{Key: addr("10.0.0.0"), IntervalEnd: true}}},
		{"start without end", []nftables.SetElement{{Key: addr("10.0.0.0")}, {Key: addr("10.0.0.9")}, {Key: addr("10.0.0.12"), IntervalEnd: true}}},
	}
	for _, b := range bad {
		if _, mismatch := fromKernelElements(v4, b.kes); mismatch == "" {
			t.Errorf("%s: accepted", b.name)
		}
	}
}

// TestElementEncoderReuse: one batch's encoder hands every operation the
// same list and shares verdict expressions; each operation's elements are
// still what kernelElements makes of them alone.
func TestElementEncoderReuse(t *testing.T) {
	sets := []*nft.Set{
		{Name: "pods4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true, Elements: []nft.Element{
			to(single("10.0.0.1"), jump("class-a")), to(single("10.0.0.2"), jump("class-b")), to(single("10.0.0.3"), jump("class-a"))}},
		{Name: "nets4", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true, Elements: []nft.Element{cidr("10.1.0.0/16"), single("192.0.2.7")}},
		{Name: "hosts4", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{single("10.0.0.1")}},
		{Name: "pods4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true, Elements: []nft.Element{to(single("10.0.0.4"), jump("class-b"))}},
	}
	var enc elementEncoder
	var firstB *expr.Verdict
	for i, s := range sets {
		for _, del := range []bool{false, true} {
			got := slices.Clone(enc.encode(s, s.Elements, del))
			if want := kernelElements(s, s.Elements, del); !reflect.DeepEqual(got, want) {
				t.Errorf("set %d (%s, delete %v): encoded %+v, want %+v", i, s.Name, del, got, want)
			}
			if s.Verdict && !del {
				if got[0].VerdictData == nil || got[0].VerdictData.Chain != s.Elements[0].Verdict.Chain {
					t.Fatalf("set %d: verdict %+v", i, got[0].VerdictData)
				}
				if i == 0 && got[0].VerdictData != got[2].VerdictData {
					t.Errorf("two jumps to class-a carry two expressions")
				}
				for _, ke := range got {
					if ke.VerdictData.Chain == "class-b" {
						if firstB != nil && ke.VerdictData != firstB {
							t.Errorf("the jump to class-b has a second expression in a later operation")
						}
						firstB = ke.VerdictData
					}
				}
			}
		}
	}
	if firstB == nil {
		t.Fatal("no jump to class-b encoded")
	}
}

func TestParseVerdict(t *testing.T) {
	tests := []struct {
		val  string // hex
		want string
	}{
		{"0800010000000000", "drop"},
		{"0800010000000001", "accept"},
		{"08000100fffffffd0600020078000000", "jump x"},
		{"08000100fffffffc0600020078000000", "goto x"},
		{"08000100fffffffb", "return"},
	}
	for _, tt := range tests {
		var val []byte
		for i := 0; i+1 < len(tt.val); i += 2 {
			var b byte
			for _, c := range tt.val[i : i+2] {
				b <<= 4
				b |= byte(bytes.IndexByte([]byte("0123456789abcdef"), byte(c)))
			}
			val = append(val, b)
		}
		v, err := parseVerdict(val)
		if err != nil || v.String() != tt.want {
			t.Errorf("parseVerdict(%s) = %v, %v; want %s", tt.val, v, err, tt.want)
		}
	}
}

func TestUsesAnyByExpressions(t *testing.T) {
	c := &nft.Chain{Rules: []*nft.Rule{nft.RuleWithID("x", []expr.Any{&expr.Lookup{SetName: "s"}})}}
	if !usesAny(c, map[string]bool{"s": true}) || usesAny(c, map[string]bool{"t": true}) {
		t.Error("usesAny does not follow lookups")
	}
	c = &nft.Chain{Rules: []*nft.Rule{nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "s2").Verdict(nft.Verdict{Kind: nft.Drop})}}
	if usesAny(c, map[string]bool{"s": true}) {
		t.Error("@s2 taken for @s")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(d *nft.Table)
		want   string
	}{
		{"short key", func(d *nft.Table) { d.Sets["hosts4"].Elements[0].Key = []byte{10} }, "set hosts4: element <bad key 0a>: key is 1 bytes, want 4"},
		{"range in a hash set", func(d *nft.Table) { d.Sets["hosts4"].Elements[0] = span("10.0.0.1", "10.0.0.9") }, "range in a set without intervals"},
		{"reversed range", func(d *nft.Table) { d.Sets["nets4"].Elements[0] = span("10.0.0.9", "10.0.0.1") }, "end below its start"},
		{"map without verdict", func(d *nft.Table) { d.Sets["pods4"].Elements[0].Verdict = nil }, "without a verdict"},
		{"verdict in a set", func(d *nft.Table) { d.Sets["hosts4"].Elements[0].Verdict = &nft.Verdict{Kind: nft.Drop} }, "not a map"},
		{"jump without chain", func(d *nft.Table) { d.Sets["pods4"].Elements[0].Verdict = &nft.Verdict{Kind: nft.Jump} }, "without a chain"},
		{"two verdicts for one key", func(d *nft.Table) {
			d.Sets["pods4"].Elements = append(d.Sets["pods4"].Elements, to(single("10.0.0.1"), nft.Verdict{Kind: nft.Drop}))
		}, "key already maps to jump class-a"},
		{"bad hook", func(d *nft.Table) { d.Chains["forward"].Base.Hook = "sideways" }, `chain forward: unknown hook "sideways"`},
	}
	if err := validate(smallTable(), Diff(nil, smallTable())); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		d := clone(smallTable())
		for _, s := range d.Sets {
			for i := range s.Elements {
				s.Elements[i].Key = append([]byte(nil), s.Elements[i].Key...)
			}
		}
		tt.change(d)
		err := validate(d, Diff(nil, d))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want it to contain %q", tt.name, err, tt.want)
		}
	}
}
