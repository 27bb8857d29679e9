package kernel

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// bigTable is fullTable with a 3,000-address set and a 1,000-address
// verdict map: some tens of KiB on the wire.
func bigTable() *nft.Table {
	t := fullTable()
	hosts := t.Sets["hosts4"]
	for i := range 3000 {
		hosts.Elements = append(hosts.Elements, single(fmt.Sprintf("10.2.%d.%d", i/250, i%250+1)))
	}
	pods := t.Sets["pods4"]
	for i := range 1000 {
		pods.Elements = append(pods.Elements, to(single(fmt.Sprintf("10.3.%d.%d", i/250, i%250+1)), jump("class-a")))
	}
	return t
}

// unhook drops a table's base chains: a table no packet reaches.
func unhook(t *nft.Table) *nft.Table {
	for name, c := range t.Chains {
		if c.Base != nil {
			delete(t.Chains, name)
		}
	}
	return t
}

func countElementOps(p *Plan) int {
	n := 0
	for _, op := range p.Ops {
		if isElementOp(op) {
			n++
		}
	}
	return n
}

func isBaseOp(op Op) bool {
	return (op.Kind == OpAddChain || op.Kind == OpAddRule) && op.Chain.Base != nil
}

func TestStages(t *testing.T) {
	const limit = 8 << 10
	tests := []struct {
		name    string
		current *nft.Table
		desired *nft.Table
		limit   int
		staged  bool
	}{
		{name: "absent table, small plan: one transaction", desired: fullTable(), limit: 1 << 20},
		{name: "absent table, large plan: staged", desired: bigTable(), limit: limit, staged: true},
		{name: "table with base chains: one transaction however large", current: fullTable(), desired: bigTable(), limit: limit},
		{name: "table without base chains (a stopped staged apply): staged", current: unhook(fullTable()), desired: bigTable(), limit: limit, staged: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Diff(tt.current, tt.desired)
			stages := p.stages(tt.limit)
			if !tt.staged {
				if len(stages) != 1 || stages[0] != p {
					t.Fatalf("%d stages, want the plan as one", len(stages))
				}
				return
			}
			if len(stages) < 3 {
				t.Fatalf("%d stages for a %d-byte plan with a %d-byte limit", len(stages), planBytes(p), tt.limit)
			}
			// The same operations: all but the base chains' in the plan's
			// order, then the base chains' in the plan's order.
			var want, base []string
			for _, op := range p.Ops {
				if isBaseOp(op) {
					base = append(base, p.opText(op))
				} else {
					want = append(want, p.opText(op))
				}
			}
			want = append(want, base...)
			var got []string
			elementStages := 0
			for i, s := range stages {
				if s.Stats.Messages != len(s.Ops) {
					t.Errorf("stage %d: %d messages counted, %d operations", i, s.Stats.Messages, len(s.Ops))
				}
				last := i == len(stages)-1
				for _, op := range s.Ops {
					if isBaseOp(op) != last {
						t.Errorf("stage %d of %d holds %q", i+1, len(stages), p.opText(op))
					}
					got = append(got, s.opText(op))
				}
				if !last && len(s.Ops) > 1 && planBytes(s) > tt.limit {
					t.Errorf("stage %d: %d bytes over the %d-byte limit", i, planBytes(s), tt.limit)
				}
				// Element operations travel alone (elementWire).
				if n := countElementOps(s); n > 0 && n < len(s.Ops) {
					t.Errorf("stage %d mixes %d element operations with %d others", i, n, len(s.Ops)-n)
				} else if n > 0 {
					elementStages++
				}
			}
			// Most of a big table is elements: most stages are element
			// operations only.
			if elementStages < len(stages)/2 {
				t.Errorf("%d of %d stages are element operations only", elementStages, len(stages))
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("stages hold other operations than the plan:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	if s := (&Plan{}).stages(limit); s != nil {
		t.Errorf("empty plan: %d stages", len(s))
	}
}

// The fake kernel runs each stage as its own transaction; a stage that
// fails leaves a table without base chains, which the next Apply
// completes (staged again).
func TestFakeStagedApply(t *testing.T) {
	f := NewFake("netpol")
	f.stageBytes = 8 << 10
	desired := bigTable()
	st, err := f.Apply(desired)
	if err != nil {
		t.Fatal(err)
	}
	if st.Transactions < 3 || f.Transactions() != st.Transactions {
		t.Errorf("%d transactions reported, %d committed; want the same, at least 3", st.Transactions, f.Transactions())
	}
	if p := Diff(f.Kernel(), desired); !p.Empty() {
		t.Fatalf("kernel differs:\n%s", p)
	}
	if changed, err := f.Verify(); changed || err != nil {
		t.Errorf("Verify after a staged apply: changed %v, %v; want the generation known", changed, err)
	}

	g := NewFake("netpol")
	g.stageBytes = 8 << 10
	n := 0
	g.FailWith(func(*Plan) error {
		if n++; n == 3 {
			return unix.ENOMEM
		}
		return nil
	})
	if _, err := g.Apply(desired); !errors.Is(err, unix.ENOMEM) || !strings.Contains(err.Error(), "stage 3 of") {
		t.Fatalf("apply with a failing third stage: %v", err)
	}
	k := g.Kernel()
	if k == nil || len(k.Sets) == 0 || hasBaseChain(k.Chains) {
		t.Fatalf("after the failed stage: want a table with sets and no base chain, have %+v", k)
	}
	g.FailWith(nil)
	st, err = g.Apply(desired)
	if err != nil || st.Transactions < 2 {
		t.Fatalf("completing apply: %+v, %v", st, err)
	}
	if p := Diff(g.Kernel(), desired); !p.Empty() {
		t.Fatalf("kernel differs after completing:\n%s", p)
	}
}

// TestStagedApplyKernel: the real kernel takes a large fresh table in
// stages, the generation moves once per stage (so Verify still knows the
// table), and a stage the kernel rejects leaves a table without base
// chains that the next Apply completes.
func TestStagedApplyKernel(t *testing.T) {
	t.Run("fresh table", func(t *testing.T) {
		a, fd := newTestApplier(t)
		a.stageBytes = 8 << 10
		gen := generation(t, fd)
		desired := bigTable()
		st := mustApply(t, a, fd, desired)
		if st.Transactions < 3 {
			t.Errorf("%d transactions, want a staged apply", st.Transactions)
		}
		if moved := generation(t, fd) - gen; moved != uint32(st.Transactions) {
			t.Errorf("generation moved by %d for %d transactions", moved, st.Transactions)
		}
		if changed, err := a.Verify(); changed || err != nil {
			t.Errorf("Verify: changed %v, %v; want the generation known", changed, err)
		}
		// With base chains in place, a change is one transaction again.
		next := clone(desired)
		next.Sets["hosts4"].Elements = append(next.Sets["hosts4"].Elements, single("10.9.0.1"))
		if st := mustApply(t, a, fd, next); st.Transactions != 1 || st.ElementsAdded != 1 {
			t.Errorf("update: %+v", st)
		}
	})
	t.Run("rejected stage", func(t *testing.T) {
		a, fd := newTestApplier(t)
		a.stageBytes = 8 << 10
		good := bigTable()
		bad := clone(good)
		// The map's last element, in a late stage, names a missing chain.
		bad.Sets["pods4"].Elements = append(bad.Sets["pods4"].Elements, to(single("10.4.0.1"), jump("nowhere")))
		_, err := a.Apply(bad)
		if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "stage ") {
			t.Fatalf("apply: %v; want a stage rejected with ENOENT", err)
		}
		k, err := Read(fd, "netpol")
		if err != nil {
			t.Fatal(err)
		}
		if k == nil || len(k.Sets) == 0 || hasBaseChain(k.Chains) {
			t.Fatalf("after the rejected stage: want a table with sets and no base chain, have %+v", k)
		}
		st := mustApply(t, a, fd, good)
		if st.Transactions < 2 {
			t.Errorf("completing apply: %+v, want staged", st)
		}
	})
}
