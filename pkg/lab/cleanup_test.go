package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
)

func noNamespaces(t *testing.T, prefix string) {
	t.Helper()
	left, err := namespacesWithPrefix(prefix + "-")
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// Up failing with nodes and pods half made removes all of it.
func TestUpFailsHalfWay(t *testing.T) {
	requireRoot(t)
	prefix := testPrefix(t)
	testHookAddPod = func(key string) error {
		if key == "y/b" { // the 5th of 9 pods, after its veth and addresses
			return errors.New("injected failure")
		}
		return nil
	}
	defer func() { testHookAddPod = nil }()
	_, err := Up(context.Background(), loadBase(t, "e2e.yaml"), Options{Prefix: prefix})
	if err == nil || !strings.Contains(err.Error(), "injected failure") || !strings.Contains(err.Error(), "pod y/b") {
		t.Fatalf("Up: %v, want the injected failure naming pod y/b", err)
	}
	noNamespaces(t, prefix)
}

// A failed Update leaves a consistent lab: the next Update completes it.
func TestUpdateFailsThenRecovers(t *testing.T) {
	snap := loadBase(t, "hostnet.yaml")
	l := upLab(t, snap, Options{})
	next := loadBase(t, "hostnet.yaml")
	addYAML(t, next, podYAML("x", "late", "node-2", false, "80", "81", "10.244.2.50"))
	testHookAddPod = func(string) error { return errors.New("injected failure") }
	err := l.Update(t.Context(), next)
	testHookAddPod = nil
	if err == nil || !strings.Contains(err.Error(), "pod x/late") {
		t.Fatalf("Update: %v, want the injected failure naming pod x/late", err)
	}
	if err := l.Update(t.Context(), next); err != nil {
		t.Fatalf("second Update: %v", err)
	}
	probes := mustProbes(t, "tcp/80", "udp/81") // what x/late serves
	got, _ := probeLab(t, l, ProbeOptions{Probes: probes})
	sameTable(t, evalTable(next, eval.TruthTableOptions{Probes: probes}), got)
	pods := len(l.Pods())
	if left, _ := namespacesWithPrefix(l.Prefix() + "-"); len(left) != 1+2+5 || pods != 7 {
		t.Errorf("namespaces %v for %d pods: the failed attempt left one behind", left, pods)
	}
}

// Snapshots the lab cannot build are refused before anything is made.
func TestUpRejectsConflicts(t *testing.T) {
	requireRoot(t)
	cases := map[string]struct{ yaml, want string }{
		"two pods, one address": {
			podYAML("x", "twin", "node-1", false, "80", "81", "10.244.1.10"),
			"pod x/twin: address 10.244.1.10 belongs to pod x/a too",
		},
		"pod on a node address": {
			podYAML("x", "thief", "node-1", false, "80", "81", "172.18.0.3"),
			"address 172.18.0.3 belongs to node node-2 too",
		},
		"two host-network servers on one socket": {
			podYAML("x", "h9", "node-1", true, "80", "81", "172.18.0.2"),
			"host-network pods x/h1 and x/h9 both serve tcp/80 on 172.18.0.2",
		},
		"loopback pod": {
			podYAML("x", "lo", "node-1", false, "80", "81", "127.0.0.2"),
			"loopback",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			prefix := testPrefix(t)
			snap := loadBase(t, "hostnet.yaml")
			addYAML(t, snap, c.yaml)
			l, err := Up(context.Background(), snap, Options{Prefix: prefix})
			if err == nil {
				l.Down()
				t.Fatalf("Up succeeded, want an error containing %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("Up: %v, want an error containing %q", err, c.want)
			}
			noNamespaces(t, prefix)
		})
	}
}

func TestSCTP(t *testing.T) {
	ok, why := SCTPSupported()
	t.Logf("SCTPSupported: %v, %s", ok, why)
	snap := loadBase(t, "e2e.yaml")
	l := upLab(t, snap, Options{})
	probes := mustProbes(t, "sctp/80", "tcp/80")
	if ok {
		got, _ := probeLab(t, l, ProbeOptions{Probes: probes, Family: ipfamily.IPv4})
		sameTable(t, evalTable(snap, eval.TruthTableOptions{Probes: probes, Family: ipfamily.IPv4}), got)
		return
	}
	if !strings.Contains(why, "SCTP") {
		t.Errorf("reason %q does not say SCTP", why)
	}
	_, _, err := l.Probe(t.Context(), ProbeOptions{Probes: probes})
	if err == nil || !strings.Contains(err.Error(), "cannot probe sctp/80") || !strings.Contains(err.Error(), why) {
		t.Errorf("Probe sctp/80: %v, want an error saying the kernel has no SCTP", err)
	}
	if _, err := l.ProbeOne(t.Context(), "x/a", "x/b", probes[0], ipfamily.IPv4); err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("ProbeOne sctp/80: %v, want an error saying the kernel has no SCTP", err)
	}
	got, notes, err := l.Probe(t.Context(), ProbeOptions{Probes: probes, SkipUnsupported: true})
	if err != nil {
		t.Fatalf("Probe with SkipUnsupported: %v", err)
	}
	if strings.Join(got.Ports, ",") != "tcp/80" || !strings.Contains(strings.Join(notes, "\n"), "SCTP probes dropped") {
		t.Errorf("ports %v, notes %v; want tcp/80 alone and a note", got.Ports, notes)
	}
	if !strings.Contains(strings.Join(l.Notes(), "\n"), "SCTP ports are not served") {
		t.Errorf("lab notes %v do not say SCTP is not served", l.Notes())
	}
}

func TestListAndDownAll(t *testing.T) {
	l := upLab(t, loadBase(t, "hostnet.yaml"), Options{})
	labs, err := List(l.Prefix())
	if err != nil {
		t.Fatal(err)
	}
	if names := labs[l.Prefix()]; len(labs) != 1 || len(names) != 1+2+4 {
		t.Fatalf("List(%s) = %v, want this lab's underlay, 2 nodes and 4 pods", l.Prefix(), labs)
	}
	if _, err := Up(t.Context(), loadBase(t, "hostnet.yaml"), Options{Prefix: l.Prefix()}); err == nil {
		t.Errorf("a second Up with prefix %s succeeded", l.Prefix())
	}
	removed, err := DownAll(l.Prefix())
	if err != nil || len(removed) != 7 {
		t.Errorf("DownAll: %v, %v; want 7 namespaces", removed, err)
	}
	if err := l.Down(); err != nil {
		t.Errorf("Down after DownAll: %v", err)
	}
	if err := l.Down(); err != nil {
		t.Errorf("second Down: %v", err)
	}
	if labs, _ := List(l.Prefix()); len(labs) != 0 {
		t.Errorf("List after DownAll: %v", labs)
	}
	if _, err := DownAll("../etc"); err == nil {
		t.Errorf("DownAll accepted a prefix with a slash")
	}
}

// mountsUnder lists the mount points at or below dir/prefix.
func mountsUnder(t *testing.T, dir, prefix string) []string {
	t.Helper()
	table, err := mountTable()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range table {
		if strings.HasPrefix(e.point, filepath.Join(dir, prefix)) {
			out = append(out, e.point)
		}
	}
	return out
}

// withNetnsDir points the lab's namespace directory at a fresh directory
// (not a mount point) for one test, and unmounts whatever the test left.
func withNetnsDir(t *testing.T) string {
	t.Helper()
	requireRoot(t)
	base, err := os.MkdirTemp("", "netpol-netnsdir-")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "netns")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := netnsDir
	netnsDir = dir
	t.Cleanup(func() {
		netnsDir = old
		for i := 0; i < 10 && len(mountsUnder(t, base, "")) > 0; i++ {
			for _, p := range mountsUnder(t, base, "") {
				unix.Unmount(p, unix.MNT_DETACH)
			}
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("removing %s: %v", base, err)
		}
	})
	return dir
}

// bindNetNS names the test's own network namespace at path, as `ip netns
// add` names a new one (the mechanics are the same: an nsfs bind mount).
func bindNetNS(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
}

// prepareNetnsDir makes the directory a shared mount of itself once, as
// iproute2 does, and leaves it alone after.
func TestPrepareNetnsDir(t *testing.T) {
	dir := withNetnsDir(t)
	for i := range 2 {
		if err := prepareNetnsDir(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		table, err := mountTable()
		if err != nil {
			t.Fatal(err)
		}
		var at []mountEntry
		for _, e := range table {
			if e.point == dir {
				at = append(at, e)
			}
		}
		if len(at) != 1 || !at[0].shared {
			t.Errorf("call %d: mounts on %s: %+v, want one, shared", i, dir, at)
		}
	}
}

// DownAll removes namespaces whose mounts another tool's `ip netns add`
// shadowed (a recursive self-bind of the directory made after them), and
// keeps that tool's own namespace and mount.
func TestDownAllShadowed(t *testing.T) {
	dir := withNetnsDir(t)
	prefix := testPrefix(t)
	names := []string{prefix + "-n-1", prefix + "-p-1"}
	for _, n := range names {
		bindNetNS(t, filepath.Join(dir, n)) // the lab, before the fix: dir is no mount point
	}
	// `ip netns add other` on a directory that is no mount point:
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	bindNetNS(t, other)
	for _, n := range names {
		if err := deleteNamed(n); !errors.Is(err, unix.EBUSY) {
			t.Fatalf("plain delete of shadowed %s: %v, want EBUSY (the leak)", n, err)
		}
	}
	removed, err := DownAll(prefix)
	if err != nil || strings.Join(removed, ",") != strings.Join(names, ",") {
		t.Errorf("DownAll = %v, %v; want %v", removed, err, names)
	}
	if left := mountsUnder(t, dir, prefix); len(left) > 0 {
		t.Errorf("mounts left: %v", left)
	}
	if left, _ := namespacesWithPrefix(prefix); len(left) > 0 {
		t.Errorf("names left: %v", left)
	}
	if m := mountsUnder(t, dir, "other"); len(m) != 1 {
		t.Errorf("the other tool's namespace: mounts %v, want it kept", m)
	}
}

// The leak that `make e2e` left: while a lab is up, another tool's `ip
// netns add` (a throwaway namespace of its own) must not make teardown
// fail or leave anything behind.
//
// The bug shows only while /run/netns is not yet a mount point, which
// holds once per boot at most: the test runs itself again in a mount
// namespace of its own where /run/netns is a plain directory again.
func TestIPNetnsAddWhileUp(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command")
	}
	const child = "NETPOL_TEST_PLAIN_NETNS_DIR" // the child's lab prefix
	prefix := os.Getenv(child)
	if prefix == "" {
		// The prefix is the parent's: its cleanup also removes what a
		// failing child leaves in /run/netns.
		cmd := exec.Command(os.Args[0], "-test.run=^TestIPNetnsAddWhileUp$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), child+"="+testPrefix(t))
		// Go makes the new mount namespace's mounts private (MS_REC):
		// nothing done in it reaches the host's mount table.
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		out, err := cmd.CombinedOutput()
		t.Logf("in a mount namespace of its own:\n%s", out)
		if err != nil || !strings.Contains(string(out), "--- PASS: TestIPNetnsAddWhileUp") {
			t.Fatalf("the test failed in its own mount namespace: %v", err)
		}
		return
	}
	// Take away every mount on /run/netns (the host's self-bind and the
	// nsfs mounts under it): what iproute2 finds on a fresh boot.
	for unix.Unmount(netnsDir, unix.MNT_DETACH) == nil {
	}
	if isMountPoint(t, netnsDir) {
		t.Fatalf("%s is still a mount point", netnsDir)
	}
	l, err := Up(context.Background(), loadBase(t, "hostnet.yaml"), Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	other := "netpol-test-other-" + filepath.Base(prefix)
	if out, err := exec.Command("ip", "netns", "add", other).CombinedOutput(); err != nil {
		l.Down()
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	removeOther := func() error {
		out, err := exec.Command("ip", "netns", "delete", other).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip netns delete %s: %v: %s", other, err, out)
		}
		return nil
	}
	if err := l.Down(); err != nil {
		t.Errorf("Down: %v", err)
	}
	if err := removeOther(); err != nil {
		t.Error(err)
	}
	noNamespaces(t, prefix)
	if left := mountsUnder(t, netnsDir, prefix+"-"); len(left) > 0 {
		t.Errorf("mounts left (hidden namespaces): %v", left)
	}
}

// isMountPoint tells whether dir is a mount point in this process's mount
// namespace.
func isMountPoint(t *testing.T, dir string) bool {
	t.Helper()
	table, err := mountTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range table {
		if e.point == dir {
			return true
		}
	}
	return false
}
