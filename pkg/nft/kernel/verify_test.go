package kernel

import (
	"testing"

	"github.com/google/nftables"

	"github.com/netpol/netpol/pkg/nft"
)

// tamperings change a table behind the Applier's back, as another program
// (or `nft flush ruleset`) would, in the fake kernel.
var tamperings = []struct {
	name string
	fn   func(*nft.Table) *nft.Table
}{
	{"rule deleted", func(t *nft.Table) *nft.Table {
		c := t.Chains["class-a"]
		c.Rules = c.Rules[1:]
		return t
	}},
	{"element added", func(t *nft.Table) *nft.Table {
		s := t.Sets["hosts4"]
		s.Elements = append(s.Elements, single("10.1.0.99"))
		return t
	}},
	{"chain flushed", func(t *nft.Table) *nft.Table {
		t.Chains["forward"].Rules = nil
		return t
	}},
	{"table deleted", func(*nft.Table) *nft.Table { return nil }},
}

func sameAsDesired(t *testing.T, got, desired *nft.Table) bool {
	t.Helper()
	if got == nil {
		return false
	}
	return Diff(got, desired).Empty()
}

// TestFakeVerifyRepairs: with its cache, Apply does not see a table changed
// behind its back (the defect the agent's resync had); Verify notices the
// generation moved and the next Apply repairs the table. With nothing
// changed, Verify keeps the cache.
func TestFakeVerifyRepairs(t *testing.T) {
	for _, tc := range tamperings {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake("netpol")
			desired := fullTable()
			if _, err := f.Apply(desired); err != nil {
				t.Fatal(err)
			}
			if drift, err := f.Verify(); err != nil || drift {
				t.Fatalf("Verify with nothing changed: %v, %v; want no drift", drift, err)
			}
			f.Tamper(tc.fn)
			if st, err := f.Apply(desired); err != nil || st.Messages != 0 {
				t.Fatalf("Apply from the cache: %+v, %v; want nothing sent", st, err)
			}
			if sameAsDesired(t, f.Kernel(), desired) {
				t.Fatal("the tampering did not change the table")
			}
			if drift, err := f.Verify(); err != nil || !drift {
				t.Fatalf("Verify after tampering: %v, %v; want drift", drift, err)
			}
			if _, err := f.Apply(desired); err != nil {
				t.Fatal(err)
			}
			if !sameAsDesired(t, f.Kernel(), desired) {
				t.Errorf("not repaired: %s", Diff(f.Kernel(), desired))
			}
			if drift, _ := f.Verify(); drift {
				t.Error("Verify right after the repair reports drift")
			}
		})
	}
}

// TestFakeIsAtomic: a transaction that fails part way leaves the fake
// kernel as it was, and the Applier reads it back afterwards.
func TestFakeIsAtomic(t *testing.T) {
	f := NewFake("netpol")
	desired := fullTable()
	if _, err := f.Apply(desired); err != nil {
		t.Fatal(err)
	}
	// Deleting an element that is not there fails in the kernel.
	f.Tamper(func(t *nft.Table) *nft.Table {
		t.Sets["hosts4"].Elements = t.Sets["hosts4"].Elements[1:]
		return t
	})
	next := clone(desired)
	next.Sets["hosts4"].Elements = next.Sets["hosts4"].Elements[1:]
	next.Chains["class-a"].Rules = next.Chains["class-a"].Rules[1:]
	before := f.Kernel()
	if _, err := f.Apply(next); err == nil {
		t.Fatal("Apply deleting a missing element succeeded")
	}
	if !Diff(f.Kernel(), before).Empty() {
		t.Error("a failed transaction changed the fake kernel")
	}
	if _, err := f.Apply(next); err != nil {
		t.Fatalf("Apply after the failure (reads back): %v", err)
	}
	if !sameAsDesired(t, f.Kernel(), next) {
		t.Errorf("not applied: %s", Diff(f.Kernel(), next))
	}
}

// TestVerifyInKernel: the same in a real namespace, tampering with the
// library directly; Verify is one generation read when nothing changed.
func TestVerifyInKernel(t *testing.T) {
	requireRoot(t)
	tamper := map[string]func(c *nftables.Conn){
		"rule deleted": func(c *nftables.Conn) {
			rules, err := c.GetRules(kernelTable(), &nftables.Chain{Name: "class-a", Table: kernelTable()})
			if err != nil || len(rules) == 0 {
				t.Fatalf("rules: %v", err)
			}
			if err := c.DelRule(rules[0]); err != nil {
				t.Fatal(err)
			}
		},
		"element added": func(c *nftables.Conn) {
			if err := c.SetAddElements(&nftables.Set{Table: kernelTable(), Name: "hosts4", KeyType: nftables.TypeIPAddr},
				[]nftables.SetElement{{Key: addr("10.1.0.99")}}); err != nil {
				t.Fatal(err)
			}
		},
		"chain flushed": func(c *nftables.Conn) {
			c.FlushChain(&nftables.Chain{Name: "forward", Table: kernelTable()})
		},
		"table deleted": func(c *nftables.Conn) { c.FlushRuleset() },
	}
	for _, tc := range tamperings {
		t.Run(tc.name, func(t *testing.T) {
			a, fd := newTestApplier(t)
			desired := fullTable()
			mustApply(t, a, fd, desired)
			if drift, err := a.Verify(); err != nil || drift {
				t.Fatalf("Verify with nothing changed: %v, %v; want no drift", drift, err)
			}
			c := inspectConn(t, fd)
			tamper[tc.name](c)
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			if got, _ := Read(fd, "netpol"); sameAsDesired(t, got, desired) {
				t.Fatal("the tampering did not change the table")
			}
			if st, err := a.Apply(desired); err != nil || st.Messages != 0 {
				t.Fatalf("Apply from the cache: %+v, %v; want nothing sent", st, err)
			}
			if drift, err := a.Verify(); err != nil || !drift {
				t.Fatalf("Verify after tampering: %v, %v; want drift", drift, err)
			}
			mustApply(t, a, fd, desired) // checks the kernel
			if drift, _ := a.Verify(); drift {
				t.Error("Verify right after the repair reports drift")
			}
		})
	}
}
