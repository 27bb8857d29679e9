// Package kerneltest decides whether a test that needs the kernel runs:
// network namespaces, nftables, conntrack and NFQUEUE need root.
package kerneltest

import (
	"os"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/nsexec"
)

// EnvRequire, set to 1 (make test and .ci/run set it), makes a kernel
// test fail rather than skip when the process is not root: a run that
// must prove the kernel part can never pass by skipping it.
const EnvRequire = "NETPOL_REQUIRE_KERNEL"

// Require lets tb go on as root; otherwise it skips tb, or fails it
// under NETPOL_REQUIRE_KERNEL=1. why says what the test does that needs
// root.
func Require(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(EnvRequire) == "1" {
		tb.Fatalf("needs root: %s (%s=1: kernel tests must run)", why, EnvRequire)
	}
	tb.Skipf("needs root: %s (run as root; %s=1 makes this a failure)", why, EnvRequire)
}

// Can reports whether the part of tb that needs root (why) can run: as
// root, true; otherwise false, with a note in tb's log, or an error under
// NETPOL_REQUIRE_KERNEL=1. For a test whose other checks run anyway (a
// golden file compared, then checked by nft -c).
func Can(tb testing.TB, why string) bool {
	tb.Helper()
	if os.Geteuid() == 0 {
		return true
	}
	if os.Getenv(EnvRequire) == "1" {
		tb.Errorf("needs root: %s (%s=1: kernel tests must run)", why, EnvRequire)
	} else {
		tb.Logf("not checked (needs root): %s", why)
	}
	return false
}

// NetNS is a new, unnamed network namespace with lo up, for a test that
// needs one (why, as for Require: it skips or fails tb when not root). It
// is closed when tb ends; the kernel frees it once no socket uses it.
func NetNS(tb testing.TB, why string) netns.NsHandle {
	tb.Helper()
	Require(tb, why)
	h := netns.None()
	err := nsexec.OnFreshThread(func() error {
		var err error
		h, err = netns.New() // unshares this thread into the new namespace
		return err
	})
	if err == nil {
		err = nsexec.LoopbackUp(h)
	}
	if err != nil {
		if h.IsOpen() {
			h.Close()
		}
		tb.Fatalf("network namespace: %v", err)
	}
	tb.Cleanup(func() { h.Close() })
	return h
}
