// Package nsexec runs code inside another network namespace. Network
// namespaces belong to OS threads, so the code runs on a fresh goroutine
// locked to its thread; sockets it makes stay in that namespace for their
// whole life (binding, accepting and I/O then work from any thread).
package nsexec

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// In runs fn inside the network namespace h. A handle <= 0 (the zero
// value, netns.None()) means the caller's namespace: fn runs directly.
func In(h netns.NsHandle, fn func() error) error {
	if h <= 0 {
		return fn()
	}
	return OnFreshThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("entering network namespace: %w", err)
		}
		return fn()
	})
}

// OnFreshThread runs fn on a locked OS thread and puts the thread back in
// its network namespace afterwards (fn may switch it). If that fails, the
// goroutine exits with its thread still locked and Go discards the thread
// instead of letting other goroutines run in the wrong namespace.
func OnFreshThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("reading the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		fnErr := fn()
		if err := netns.Set(orig); err != nil {
			// Stay locked: the thread dies with this goroutine.
			errc <- errors.Join(fnErr, fmt.Errorf("returning to the original network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// LoopbackUp sets the loopback interface of the network namespace h up: a
// new namespace has it down, and nothing there reaches 127.0.0.1 or ::1.
func LoopbackUp(h netns.NsHandle) error {
	return In(h, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
}
