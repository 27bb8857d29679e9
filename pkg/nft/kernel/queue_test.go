package kernel

import (
	"testing"

	"github.com/google/nftables"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/pkg/nft"
)

// TestDetectQueue: the kernel takes the kind DetectQueue names (a rule of
// it loads and reads back with its queue number), the probe leaves no
// table behind, and a kind the kernel lacks is refused when tried.
func TestDetectQueue(t *testing.T) {
	fd := int(kerneltest.NetNS(t, "these tests create network namespaces and program nftables"))
	kind, err := DetectQueue(fd)
	if kind == nft.QueueUnavailable {
		t.Fatalf("this kernel takes no queue statement: %v", err)
	}
	t.Logf("queue statement: %s (%v)", kind, err)
	c := inspectConn(t, fd)
	if tables, err := c.ListTables(); err != nil || len(tables) != 0 {
		t.Fatalf("the probe left tables: %v (%v)", tables, err)
	}
	exprs, err := nft.QueueExprs(kind, 7)
	if err != nil {
		t.Fatal(err)
	}
	tab := kernelTable()
	c.AddTable(tab)
	ch := c.AddChain(&nftables.Chain{Name: "dns", Table: tab})
	c.AddRule(&nftables.Rule{Table: tab, Chain: ch, Exprs: exprs})
	if err := c.Flush(); err != nil {
		t.Fatalf("a %s rule does not load: %v", kind, err)
	}
	rules, err := c.GetRules(tab, ch)
	if err != nil || len(rules) != 1 {
		t.Fatalf("read back %d rules (%v)", len(rules), err)
	}
	if got := len(rules[0].Exprs); got != len(exprs) {
		t.Errorf("read back %d expressions, want %d", got, len(exprs))
	}
	// The other kind, when DetectQueue passed it over, fails to load:
	// detection is not a guess.
	if kind == nft.QueueXtables {
		if err := probeQueue(fd, nft.QueueNative); err == nil {
			t.Error("DetectQueue chose the xtables target, yet the native statement loads")
		}
	}
}
