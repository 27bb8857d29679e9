package kernel

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// mustApply applies and checks that the kernel then holds exactly desired,
// read back by a fresh reader.
func mustApply(t *testing.T, a *Applier, fd int, desired *nft.Table) Stats {
	t.Helper()
	st, err := a.Apply(desired)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	checkKernel(t, fd, desired)
	return st
}

// checkKernel reads the table back and requires an empty diff to desired.
func checkKernel(t *testing.T, fd int, desired *nft.Table) *nft.Table {
	t.Helper()
	conn, err := NewConn(fd, false)
	if err != nil {
		t.Fatal(err)
	}
	st, err := readTable(conn, fd, "netpol", false)
	if err != nil {
		t.Fatalf("read back: %v", err)
	}
	if st == nil {
		t.Fatal("read back: no table")
	}
	for name, cs := range st.sets {
		if cs.mismatch != "" {
			t.Errorf("read back set %s: %s", name, cs.mismatch)
		}
	}
	if p := diff(st, desired); !p.Empty() {
		t.Fatalf("kernel differs from desired; plan:\n%s", p)
	}
	return st.table()
}

func TestApplyEveryKindAndReadBack(t *testing.T) {
	a, fd := newTestApplier(t)
	desired := fullTable()
	st := mustApply(t, a, fd, desired)
	c := desired.Count()
	if st.SetsAdded != c.Sets || st.ChainsAdded != c.Chains || st.RulesWritten != c.Rules || st.ElementsAdded != c.Elements {
		t.Errorf("stats %+v for %+v", st, c)
	}

	got, err := a.Read()
	if err != nil {
		t.Fatal(err)
	}
	if gc := got.Count(); gc != c {
		t.Errorf("read back %+v, want %+v", gc, c)
	}
	for name, s := range desired.Sets {
		g := got.Sets[name]
		if !reflect.DeepEqual(g.Fields, s.Fields) || g.Interval != s.Interval || g.Verdict != s.Verdict {
			t.Errorf("set %s read back as %v interval=%v verdict=%v", name, g.Fields, g.Interval, g.Verdict)
		}
		// Canonical form: what Read returns is what normalisation makes of desired.
		want := normalElements(s)
		gotText, wantText := elementTexts(g, g.Elements), elementTexts(s, want)
		if gotText != wantText {
			t.Errorf("set %s elements:\n got %s\nwant %s", name, gotText, wantText)
		}
	}
	for name, ch := range desired.Chains {
		g := got.Chains[name]
		if !reflect.DeepEqual(normalHook(g.Base), normalHook(ch.Base)) {
			t.Errorf("chain %s hook %+v, want %+v", name, g.Base, ch.Base)
		}
	}
	// Concatenated ranges carry a key end even for single values: nft
	// lists them as garbage otherwise.
	conn := inspectConn(t, fd)
	for _, name := range []string{"allow4", "allow6"} {
		kes, err := conn.GetSetElements(kernelSet(kernelTable(), desired.Sets[name]))
		if err != nil {
			t.Fatal(err)
		}
		for _, ke := range kes {
			if len(ke.KeyEnd) == 0 {
				t.Errorf("set %s: element %x without key end", name, ke.Key)
			}
		}
	}
	// Same applier again: nothing to do.
	if st, err := a.Apply(desired); err != nil || st != (Stats{}) {
		t.Errorf("second apply: %+v, %v", st, err)
	}
}

// elementTexts renders elements sorted, to compare sets regardless of order.
func elementTexts(s *nft.Set, elems []nft.Element) string {
	texts := make([]string, len(elems))
	for i, e := range elems {
		texts[i] = s.ElementText(e)
	}
	sortStrings(texts)
	return strings.Join(texts, ", ")
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// The Builder leaves Lookup.SetID at 0; the kernel finds a set added
// earlier in the same batch by name.
func TestLookupBySetNameInSameBatch(t *testing.T) {
	r := nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "fresh").Verdict(nft.Verdict{Kind: nft.Drop})
	for _, e := range r.Exprs {
		if l, ok := e.(*expr.Lookup); ok && l.SetID != 0 {
			t.Fatalf("Builder set SetID %d", l.SetID)
		}
	}
	a, fd := newTestApplier(t)
	d := nft.NewTable("netpol")
	d.AddSet(&nft.Set{Name: "fresh", Fields: []nft.FieldType{nft.FieldIPv4}, Elements: []nft.Element{single("10.9.9.9")}})
	d.AddChain(&nft.Chain{Name: "c", Rules: []*nft.Rule{r}})
	mustApply(t, a, fd, d)
}

func TestApplyIncremental(t *testing.T) {
	a, fd := newTestApplier(t)
	desired := fullTable()
	mustApply(t, a, fd, desired)
	conn := inspectConn(t, fd)

	steps := []struct {
		name   string
		change func(d *nft.Table)
		want   string // the plan
	}{
		{
			name:   "add a pod address to a hash set",
			change: func(d *nft.Table) { d.Sets["hosts4"].Elements = append(d.Sets["hosts4"].Elements, single("10.1.0.9")) },
			want:   "add element inet netpol hosts4 { 10.1.0.9 }\n",
		},
		{
			name: "change a vmap verdict",
			change: func(d *nft.Table) {
				s := d.Sets["pods4"]
				s.Elements = append(without(s, to(single("10.1.0.1"), jump("class-a"))), to(single("10.1.0.1"), gotoV("class-b")))
			},
			want: "delete element inet netpol pods4 { 10.1.0.1 }\nadd element inet netpol pods4 { 10.1.0.1 : goto class-b }\n",
		},
		{
			name: "replace ranges with overlapping ones in one batch",
			change: func(d *nft.Table) {
				p := d.Sets["peers4"]
				p.Elements = append(without(p, cidr("10.0.0.0/8"), span("198.51.100.10", "198.51.100.20")),
					cidr("10.0.0.0/9"), span("198.51.100.15", "198.51.100.20"))
				c := d.Sets["allow4"]
				c.Elements = append(without(c, tuple("10.0.0.0/8", tcp, 1, 1023)), tuple("10.0.0.0/16", tcp, 1, 2000))
				c6 := d.Sets["allow6"]
				c6.Elements = append(without(c6, tuple("::/0", udp, 53, 53)), tuple("::/0", udp, 53, 54))
			},
			want: "delete element inet netpol allow4 { 10.0.0.0/8 . tcp . 1-1023 }\n" +
				"delete element inet netpol allow6 { ::/0 . udp . 53 }\n" +
				"delete element inet netpol peers4 { 10.0.0.0/8, 198.51.100.10-198.51.100.20 }\n" +
				"add element inet netpol allow4 { 10.0.0.0/16 . tcp . 1-2000 }\n" +
				"add element inet netpol allow6 { ::/0 . udp . 53-54 }\n" +
				"add element inet netpol peers4 { 10.0.0.0/9, 198.51.100.15-198.51.100.20 }\n",
		},
		{
			name: "grow a range into its adjacent neighbour's place",
			change: func(d *nft.Table) {
				p := d.Sets["peers4"]
				p.Elements = append(without(p, span("198.51.100.21", "198.51.100.30")), span("198.51.100.21", "198.51.100.40"))
			},
			want: "delete element inet netpol peers4 { 198.51.100.21-198.51.100.30 }\nadd element inet netpol peers4 { 198.51.100.21-198.51.100.40 }\n",
		},
		{
			name: "rewrite one chain",
			change: func(d *nft.Table) {
				d.Chains["class-a"].Rules = d.Chains["class-a"].Rules[1:]
			},
			want: "flush chain inet netpol class-a\n" +
				"add rule inet netpol class-a ip daddr . meta l4proto . th dport @exact4 return\n" +
				"add rule inet netpol class-a drop\n",
		},
		{
			name: "remove a chain and the vmap entries that jump to it",
			change: func(d *nft.Table) {
				delete(d.Chains, "class-b")
				d.Sets["pods4"].Elements = without(d.Sets["pods4"], to(single("10.1.0.2"), gotoV("class-b")), to(single("10.1.0.1"), gotoV("class-b")))
				d.Sets["pods6"].Elements = without(d.Sets["pods6"], to(single("fd00::11"), gotoV("class-b")))
			},
			want: "delete element inet netpol pods4 { 10.1.0.2, 10.1.0.1 }\n" +
				"delete element inet netpol pods6 { fd00::11 }\n" +
				"flush chain inet netpol class-b\n" +
				"delete chain inet netpol class-b\n",
		},
		{
			name:   "change a set's spec (hash to interval)",
			change: func(d *nft.Table) { d.Sets["hosts4"].Interval = true },
			want: "flush chain inet netpol input\n" +
				"delete set inet netpol hosts4\n" +
				"add set inet netpol hosts4 { type ipv4_addr; flags interval; }\n" +
				"add element inet netpol hosts4 { 10.1.0.1, 10.1.0.2, 10.1.0.9 }\n" +
				"add rule inet netpol input ct state established,related accept\n" +
				"add rule inet netpol input ip saddr @hosts4 drop\n",
		},
		{
			name:   "change a base chain's policy",
			change: func(d *nft.Table) { d.Chains["output"].Base.Policy = "drop" },
			want:   "add chain inet netpol output { type filter hook output priority filter + 10; policy drop; }\n",
		},
		{
			name:   "change a base chain's priority",
			change: func(d *nft.Table) { d.Chains["input"].Base.Priority = 20 },
			want: "flush chain inet netpol input\n" +
				"delete chain inet netpol input\n" +
				"add chain inet netpol input { type filter hook input priority filter + 20; policy accept; }\n" +
				"add rule inet netpol input ct state established,related accept\n" +
				"add rule inet netpol input ip saddr @hosts4 drop\n",
		},
		{
			name: "add a chain and a vmap entry that jumps to it",
			change: func(d *nft.Table) {
				d.AddChain(&nft.Chain{Name: "class-c", Rules: []*nft.Rule{nft.NewRule().Verdict(nft.Verdict{Kind: nft.Return})}})
				d.Sets["pods6"].Elements = append(d.Sets["pods6"].Elements, to(single("fd00::12"), jump("class-c")))
			},
			want: "add chain inet netpol class-c\n" +
				"add element inet netpol pods6 { fd00::12 : jump class-c }\n" +
				"add rule inet netpol class-c return\n",
		},
		{
			name: "remove a set nothing uses any more",
			change: func(d *nft.Table) {
				delete(d.Sets, "svc")
			},
			want: "delete set inet netpol svc\n",
		},
	}
	for _, step := range steps {
		before := ruleHandles(t, conn, "netpol")
		desired = clone(desired)
		step.change(desired)
		plan, err := a.Plan(desired)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := plan.String(); got != step.want {
			t.Errorf("%s: plan:\n%s\nwant:\n%s", step.name, got, step.want)
		}
		st := mustApply(t, a, fd, desired)
		if st.Messages != len(plan.Ops) {
			t.Errorf("%s: %d messages for %d ops", step.name, st.Messages, len(plan.Ops))
		}
		// Rules of chains the plan does not touch keep their handles.
		touched := map[string]bool{}
		for _, op := range plan.Ops {
			if op.Chain != nil {
				touched[op.Chain.Name] = true
			}
		}
		after := map[string]bool{}
		for _, h := range ruleHandles(t, conn, "netpol") {
			after[h] = true
		}
		for _, h := range before {
			if chain := strings.SplitN(h, "/", 2)[0]; !touched[chain] && !after[h] {
				t.Errorf("%s: rule %s of an untouched chain changed", step.name, h)
			}
		}
	}
}

// A new Applier on an existing table adopts it: the plan is empty, nothing
// is sent (the ruleset generation stays), rule handles stay.
func TestAdoptionSendsNothing(t *testing.T) {
	a, fd := newTestApplier(t)
	desired := fullTable()
	mustApply(t, a, fd, desired)
	conn := inspectConn(t, fd)
	handles := ruleHandles(t, conn, "netpol")
	gen := generation(t, fd)

	b, err := NewApplier(fd, "netpol")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	plan, err := b.Plan(fullTable())
	if err != nil {
		t.Fatal(err)
	}
	if !plan.Empty() {
		t.Fatalf("adoption plan:\n%s", plan)
	}
	st, err := b.Apply(fullTable())
	if err != nil || st != (Stats{}) {
		t.Fatalf("adopting apply: %+v, %v", st, err)
	}
	if g := generation(t, fd); g != gen {
		t.Errorf("generation %d -> %d: something was committed", gen, g)
	}
	if got := ruleHandles(t, conn, "netpol"); !reflect.DeepEqual(got, handles) {
		t.Errorf("rule handles changed:\n%v\n%v", handles, got)
	}
	// And the adopted state is diffed incrementally afterwards.
	next := fullTable()
	next.Sets["hosts4"].Elements = append(next.Sets["hosts4"].Elements, single("10.1.0.77"))
	if st := mustApply(t, b, fd, next); st.Messages != 1 || st.ElementsAdded != 1 {
		t.Errorf("after adoption: %+v", st)
	}
}

// A rejected transaction leaves the kernel exactly as it was, and the next
// good Apply works.
func TestFailedApplyChangesNothing(t *testing.T) {
	tests := []struct {
		name   string
		change func(d *nft.Table)
		errno  error // nil: rejected before the kernel
	}{
		{
			name: "rule looks up a missing set",
			change: func(d *nft.Table) {
				d.Sets["hosts4"].Elements = append(d.Sets["hosts4"].Elements, single("10.1.0.50"))
				d.Chains["class-a"].Rules = append(d.Chains["class-a"].Rules, nft.NewRule().AddrInSet(nft.IPv4, nft.Src, "nosuchset").Verdict(nft.Verdict{Kind: nft.Drop}))
			},
			errno: unix.ENOENT,
		},
		{
			name: "overlapping range",
			change: func(d *nft.Table) {
				d.AddChain(&nft.Chain{Name: "class-c"})
				d.Sets["peers4"].Elements = append(d.Sets["peers4"].Elements, span("10.255.255.0", "11.0.0.5"))
			},
			errno: unix.EEXIST,
		},
		{
			name: "a new map and the chain it names, then an overlapping range",
			change: func(d *nft.Table) {
				d.AddChain(&nft.Chain{Name: "class-d", Rules: []*nft.Rule{nft.NewRule().Verdict(nft.Verdict{Kind: nft.Accept})}})
				d.AddSet(&nft.Set{Name: "pods-d4", Fields: []nft.FieldType{nft.FieldIPv4}, Verdict: true,
					Elements: []nft.Element{to(single("10.7.0.1"), jump("class-d"))}})
				d.Sets["peers4"].Elements = append(d.Sets["peers4"].Elements, span("10.255.255.0", "11.0.0.5"))
			},
			errno: unix.EEXIST,
		},
		{
			name: "overlapping range, element operations only",
			change: func(d *nft.Table) {
				d.Sets["peers4"].Elements = append(d.Sets["peers4"].Elements, span("10.255.255.0", "11.0.0.5"))
			},
			errno: unix.EEXIST,
		},
		{
			name: "vmap entry jumps to a missing chain",
			change: func(d *nft.Table) {
				d.Sets["pods4"].Elements = append(d.Sets["pods4"].Elements, to(single("10.1.0.60"), jump("nowhere")))
			},
			errno: unix.ENOENT,
		},
		{
			name: "malformed key",
			change: func(d *nft.Table) {
				d.Sets["hosts4"].Elements = append(d.Sets["hosts4"].Elements, nft.Element{Key: []byte{10, 1}})
			},
		},
	}
	a, fd := newTestApplier(t)
	good := fullTable()
	mustApply(t, a, fd, good)
	conn := inspectConn(t, fd)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, err := Read(fd, "netpol")
			if err != nil {
				t.Fatal(err)
			}
			handles, gen := ruleHandles(t, conn, "netpol"), generation(t, fd)
			bad := clone(good)
			tt.change(bad)
			// A change that adds objects adds them in a transaction of
			// their own first (Plan.inPhases); when the change fails, they
			// are deleted again: two more generations, the same table.
			wantGen := gen
			if stages := Diff(before, bad).stages(stageBytes); len(stages) > 1 && stages[1].undo != nil {
				wantGen += 2
			}
			_, err = a.Apply(bad)
			if err == nil {
				t.Fatal("apply succeeded")
			}
			if tt.errno != nil && !errors.Is(err, tt.errno) {
				t.Errorf("error %v, want %v", err, tt.errno)
			}
			after, err := Read(fd, "netpol")
			if err != nil {
				t.Fatal(err)
			}
			if p := Diff(after, before); !p.Empty() {
				t.Errorf("kernel changed:\n%s", p)
			}
			if got := ruleHandles(t, conn, "netpol"); !reflect.DeepEqual(got, handles) {
				t.Error("rule handles changed")
			}
			if g := generation(t, fd); g != wantGen {
				t.Errorf("generation %d -> %d, want %d", gen, g, wantGen)
			}
			// The cache was dropped: the next Apply reads back and works.
			good = clone(good)
			good.Sets["hosts4"].Elements = append(good.Sets["hosts4"].Elements, single(fmt.Sprintf("10.1.1.%d", len(good.Sets["hosts4"].Elements))))
			if st := mustApply(t, a, fd, good); st.ElementsAdded != 1 || st.Messages != 1 {
				t.Errorf("next apply: %+v", st)
			}
		})
	}
}

// Element lists far over 64 KiB are split so that nothing is lost.
func TestLargeSetsAreStoredCompletely(t *testing.T) {
	a, fd := newTestApplier(t)
	d := nft.NewTable("netpol")
	ranges := &nft.Set{Name: "ranges4", Fields: []nft.FieldType{nft.FieldIPv4}, Interval: true}
	for i := 0; i < 20000; i++ {
		lo := []byte{10, byte(i >> 8), byte(i), 0}
		ranges.Elements = append(ranges.Elements, nft.Element{Key: lo, KeyEnd: []byte{10, byte(i >> 8), byte(i), 9}})
	}
	tuples := &nft.Set{Name: "tuples6", Fields: []nft.FieldType{nft.FieldIPv6, nft.FieldProto, nft.FieldPort}, Interval: true}
	for i := 0; i < 5000; i++ {
		lo := addr(fmt.Sprintf("fd00::%x:0", i))
		hi := addr(fmt.Sprintf("fd00::%x:ffff", i))
		tuples.Elements = append(tuples.Elements, nft.Element{
			Key:    nft.Key(lo, nft.ProtoBytes(tcp), nft.PortBytes(1000)),
			KeyEnd: nft.Key(hi, nft.ProtoBytes(tcp), nft.PortBytes(1000+uint16(i%100))),
		})
	}
	d.AddSet(ranges)
	d.AddSet(tuples)
	st, err := a.Apply(d)
	if err != nil {
		t.Fatal(err)
	}
	if st.Messages < 10 {
		t.Errorf("%d messages: elements were not chunked", st.Messages)
	}
	got := checkKernel(t, fd, d)
	if n := len(got.Sets["ranges4"].Elements); n != 20000 {
		t.Errorf("ranges4 holds %d ranges, want 20000", n)
	}
	if n := len(got.Sets["tuples6"].Elements); n != 5000 {
		t.Errorf("tuples6 holds %d elements, want 5000", n)
	}
	// Removing them again: the 20k ranges one by one (exact deletes, cheap
	// in an rbtree), the concatenated set by recreating it (pipapo deletes
	// cost ~0.3 ms each).
	d2 := nft.NewTable("netpol")
	d2.AddSet(&nft.Set{Name: "ranges4", Fields: ranges.Fields, Interval: true})
	d2.AddSet(&nft.Set{Name: "tuples6", Fields: tuples.Fields, Interval: true, Elements: tuples.Elements[4000:]})
	st = mustApply(t, a, fd, d2)
	if st.ElementsDeleted != 20000 || st.SetsDeleted != 1 || st.SetsAdded != 1 || st.ElementsAdded != 1000 {
		t.Errorf("delete: %+v", st)
	}
}

func TestDeleteTable(t *testing.T) {
	a, fd := newTestApplier(t)
	mustApply(t, a, fd, fullTable())
	if err := a.Delete(); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Read(); err != nil || got != nil {
		t.Fatalf("after delete: %v, %v", got, err)
	}
	if err := a.Delete(); err != nil {
		t.Errorf("second delete: %v", err)
	}
	// An empty desired table still creates the (empty) table.
	if st, err := a.Apply(nft.NewTable("netpol")); err != nil || st.Messages != 1 {
		t.Fatalf("apply empty: %+v, %v", st, err)
	}
	if got, err := a.Read(); err != nil || got == nil {
		t.Fatalf("empty table not there: %v, %v", got, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Apply(nft.NewTable("netpol")); !errors.Is(err, ErrClosed) {
		t.Errorf("apply after close: %v", err)
	}
}

// Sets the package did not write (other flags, other key types) are
// recreated rather than diffed element by element.
func TestForeignSetIsRecreated(t *testing.T) {
	a, fd := newTestApplier(t)
	d := fullTable()
	mustApply(t, a, fd, d)

	// Behind the applier's back: replace hosts4 by an ipv6 set of the same name.
	conn := inspectConn(t, fd)
	kt := kernelTable()
	conn.FlushChain(kernelChain(kt, &nft.Chain{Name: "input"}))
	conn.DelSet(kernelSet(kt, d.Sets["hosts4"]))
	foreign := kernelSet(kt, &nft.Set{Name: "hosts4", Fields: []nft.FieldType{nft.FieldIPv6}})
	if err := conn.AddSet(foreign, nil); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}

	b, err := NewApplier(fd, "netpol")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	plan, err := b.Plan(d)
	if err != nil {
		t.Fatal(err)
	}
	want := "delete set inet netpol hosts4\n" +
		"add set inet netpol hosts4 { type ipv4_addr; }\n" +
		"add element inet netpol hosts4 { 10.1.0.1, 10.1.0.2 }\n" +
		"add rule inet netpol input ct state established,related accept\n" +
		"add rule inet netpol input ip saddr @hosts4 drop\n"
	if got := plan.String(); got != want {
		t.Errorf("plan:\n%s\nwant:\n%s", got, want)
	}
	mustApply(t, b, fd, d)
}

// A rule's ID is what it runs, not its text: after a restart (a new
// Applier adopting the kernel's table), a rule whose expressions changed
// while its text did not is rewritten, and the kernel runs the new
// expressions; the same expressions again are adopted with nothing sent.
func TestExpressionOnlyChangeAppliedAfterRestart(t *testing.T) {
	a, fd := newTestApplier(t)
	table := func(mark uint32) *nft.Table {
		tb := nft.NewTable("netpol")
		r := nft.NewRule().MarkSetConst(mark).Done()
		r.Text = "meta mark set 0x00000001" // the same text, whatever the expressions do
		tb.AddChain(&nft.Chain{Name: "c", Rules: []*nft.Rule{r}})
		return tb
	}
	mustApply(t, a, fd, table(1))
	restart := func() *Applier {
		b, err := NewApplier(fd, "netpol")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	if st := mustApply(t, restart(), fd, table(2)); st.RulesWritten != 1 {
		t.Fatalf("after the restart the changed rule was not rewritten: %+v", st)
	}
	kt := &nftables.Table{Name: "netpol", Family: nftables.TableFamilyINet}
	rules, err := inspectConn(t, fd).GetRules(kt, &nftables.Chain{Name: "c", Table: kt})
	if err != nil {
		t.Fatal(err)
	}
	want := nft.DescribeExprs(table(2).Chains["c"].Rules[0].Exprs)
	if len(rules) != 1 || nft.DescribeExprs(rules[0].Exprs) != want {
		t.Fatalf("the kernel runs %d rules, want one that is %q", len(rules), want)
	}
	if st := mustApply(t, restart(), fd, table(2)); st != (Stats{}) {
		t.Fatalf("adopting the same expressions sent %+v", st)
	}
}
