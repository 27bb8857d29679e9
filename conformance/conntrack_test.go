package conformance_test

import (
	"context"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/internal/labtest"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/lab"
)

// TestFlushConntrack: probes through a programmed node leave tracked
// connections; FlushConntrack removes them all, so the next matrix is made
// of new connections only (see corpus_test.go).
func TestFlushConntrack(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	snap := baseSnapshot(t, "e2e")
	l := labtest.Up(t, snap, lab.Options{})
	enf := conformance.NewEnforcer(l)
	defer enf.Close()
	if _, err := enf.Sync(snap); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Probe(ctx, lab.ProbeOptions{Probes: []l4.Port{{Protocol: "UDP", Port: 81}}}); err != nil {
		t.Fatal(err)
	}
	tracked := func() int {
		n := 0
		for _, node := range l.Nodes() {
			h, err := netlink.NewHandleAt(node.Handle)
			if err != nil {
				t.Fatal(err)
			}
			flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
			h.Close()
			if err != nil {
				t.Fatal(err)
			}
			n += len(flows)
		}
		return n
	}
	if n := tracked(); n == 0 {
		t.Fatal("the probes left no tracked connections on the nodes; the test proves nothing")
	}
	if err := l.FlushConntrack(); err != nil {
		t.Fatal(err)
	}
	if n := tracked(); n != 0 {
		t.Errorf("%d tracked connections left after FlushConntrack", n)
	}
}
