// Package nfttest holds what the tests of pkg/nft and the packages below
// it share: a network namespace of one test's own, and a table of the
// identity statements with the verdicts packets get from it.
package nfttest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/kerneltest"
)

// NewNetNS creates a network namespace named netpol-test-<random> for one
// test and returns its fd; cleanup deletes it even if the test fails. The
// test runs as root only (kerneltest.Require).
func NewNetNS(tb testing.TB) int {
	tb.Helper()
	kerneltest.Require(tb, "these tests create network namespaces and program nftables")
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		tb.Fatal(err)
	}
	name := "netpol-test-" + hex.EncodeToString(rnd[:])
	tb.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			tb.Errorf("delete netns %s: %v", name, err)
		}
		os.Remove(filepath.Join("/run/netns", name)) // if the mount never happened
	})

	// Namespaces belong to OS threads: create on this locked thread, then
	// switch it back before it runs anything else.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("current netns: %v", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		tb.Fatalf("switch back to the original netns: %v", serr)
	}
	if err != nil {
		tb.Fatalf("create netns %s: %v", name, err)
	}
	tb.Cleanup(func() { h.Close() })
	return int(h)
}
