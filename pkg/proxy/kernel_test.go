package proxy_test

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/kerneltest"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/proxy"
)

// newNetNS creates a named network namespace for one test and returns its
// handle; cleanup deletes it.
func newNetNS(t *testing.T) (netns.NsHandle, string) {
	t.Helper()
	kerneltest.Require(t, "it creates a network namespace and programs nftables")
	var rnd [6]byte
	rand.Read(rnd[:])
	name := "netpol-proxytest-" + hex.EncodeToString(rnd[:])
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		t.Fatal(serr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Close()
		netns.DeleteNamed(name)
	})
	return h, name
}

// TestKernelRoundTrip applies the compiled table to a real kernel, then
// checks that a fresh Applier (no cache: it reads the kernel table back)
// plans nothing, so data maps, integer keys, dynamic sets with timeouts and
// the NAT statements all read back as written; and that `nft list` accepts
// what the kernel holds.
func TestKernelRoundTrip(t *testing.T) {
	h, name := newNetNS(t)
	snap, report := cluster.LoadPaths([]string{"testdata/services.yaml"}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	table, err := proxy.Compile(proxy.Build(snap, "n1", proxy.Options{}), proxy.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := kernel.NewApplier(int(h), proxy.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Apply(table); err != nil {
		t.Fatal(err)
	}
	fresh, err := kernel.NewApplier(int(h), proxy.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	plan, err := fresh.Plan(table)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Ops) != 0 {
		t.Errorf("re-planning the applied table from the kernel gives %d operations, want 0:\n%s", len(plan.Ops), plan)
	}
	if _, err := exec.LookPath("nft"); err == nil {
		out, err := exec.Command("ip", "netns", "exec", name, "nft", "list", "table", "inet", proxy.DefaultTable).CombinedOutput()
		if err != nil {
			t.Errorf("nft list: %v\n%s", err, out)
		}
	}
}

// TestSyncerInKernel applies the Syncer's table after every step through
// one Applier (so set changes go as deltas) and checks that the kernel,
// read back by a fresh reader, holds exactly the desired table each time.
func TestSyncerInKernel(t *testing.T) {
	h, _ := newNetNS(t)
	a, err := kernel.NewApplier(int(h), proxy.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s := proxy.NewSyncer("n1", proxy.Options{}, proxy.CompileOptions{})
	for i, snap := range syncSteps(t) {
		_, table := s.Sync(snap)
		stats, err := a.Apply(table)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got, err := kernel.Read(int(h), proxy.DefaultTable)
		if err != nil {
			t.Fatal(err)
		}
		if p := kernel.Diff(got, table); !p.Empty() {
			t.Fatalf("step %d: the kernel differs from the desired table:\n%s", i, p)
		}
		t.Logf("step %d: %d messages, +%d -%d elements", i, stats.Messages, stats.ElementsAdded, stats.ElementsDeleted)
	}
}
