package lab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/internal/nsexec"
)

// netnsDir is where named network namespaces are bind-mounted (as `ip
// netns` does), so that `ip netns list` shows the lab's. Tests of the
// cleanup point it elsewhere; netns.NewNamed always uses /run/netns.
var netnsDir = "/run/netns"

// prepareNetnsDir makes netnsDir a shared mount of itself, as iproute2
// does before its first mount. Otherwise the first `ip netns add` of some
// other tool does it while the lab is up: its recursive self-bind covers
// the lab's namespace mounts with copies, the originals stay hidden under
// it, and teardown fails with EBUSY, leaving every namespace behind.
func prepareNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", netnsDir, err)
	}
	made := false
	for {
		err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		// EINVAL: not a mount point yet; make it one, once.
		if !errors.Is(err, unix.EINVAL) || made {
			return fmt.Errorf("making %s a shared mount: %w", netnsDir, err)
		}
		if err := unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mounting %s on itself: %w", netnsDir, err)
		}
		made = true
	}
}

// DefaultPrefix starts the name of every network namespace a lab makes
// unless Options.Prefix says otherwise.
const DefaultPrefix = "netpol-"

// inNetNS runs fn inside the network namespace h (see nsexec.In).
func inNetNS(h netns.NsHandle, fn func() error) error { return nsexec.In(h, fn) }

// sysctl is one /proc/sys/net setting written in a new namespace.
type sysctl struct{ path, value string }

// Settings every lab namespace gets before any interface exists, so that
// interfaces created later inherit them from "default".
var (
	commonSysctls = []sysctl{
		// New namespaces copy IPv4 settings from the host's: undo any
		// that would break /32 addresses and asymmetric paths.
		{"ipv4/conf/all/rp_filter", "0"},
		{"ipv4/conf/default/rp_filter", "0"},
		{"ipv4/conf/all/arp_ignore", "0"},
		{"ipv4/conf/default/arp_ignore", "0"},
		{"ipv4/conf/all/arp_filter", "0"},
		{"ipv4/conf/default/arp_filter", "0"},
		{"ipv6/conf/all/disable_ipv6", "0"},
		{"ipv6/conf/default/disable_ipv6", "0"},
		// No duplicate address detection: tentative addresses make the
		// first probes fail.
		{"ipv6/conf/all/accept_dad", "0"},
		{"ipv6/conf/default/accept_dad", "0"},
	}
	nodeSysctls = append(append([]sysctl(nil), commonSysctls...),
		sysctl{"ipv4/ip_forward", "1"},
		sysctl{"ipv6/conf/all/forwarding", "1"},
	)
)

// namespace is one network namespace the lab made, with a netlink handle
// whose socket lives in it.
type namespace struct {
	name   string
	handle netns.NsHandle
	nl     *netlink.Handle
}

// createNamespace makes the named namespace, applies the sysctls inside it
// and brings its loopback up. On error nothing is left behind.
func createNamespace(name string, sysctls []sysctl) (*namespace, error) {
	if err := prepareNetnsDir(); err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", name, err)
	}
	if _, err := os.Lstat(filepath.Join(netnsDir, name)); err == nil {
		return nil, fmt.Errorf("network namespace %s already exists (left over from an earlier lab? see DownAll)", name)
	}
	ns := &namespace{name: name, handle: netns.None()}
	ours := true // whether a failure may have left our file in /run/netns
	err := nsexec.OnFreshThread(func() error {
		// NewNamed unshares this thread into the new namespace.
		h, err := netns.NewNamed(name)
		if err != nil {
			ours = !errors.Is(err, os.ErrExist) // made by someone else meanwhile
			return fmt.Errorf("creating network namespace %s: %w", name, err)
		}
		ns.handle = h
		for _, s := range sysctls {
			if err := os.WriteFile("/proc/sys/net/"+s.path, []byte(s.value), 0o644); err != nil {
				return fmt.Errorf("network namespace %s: setting net.%s=%s: %w",
					name, strings.ReplaceAll(s.path, "/", "."), s.value, err)
			}
		}
		return nil
	})
	if err == nil {
		ns.nl, err = netlink.NewHandleAt(ns.handle)
		if err != nil {
			err = fmt.Errorf("network namespace %s: opening netlink: %w", name, err)
		}
	}
	if err == nil {
		err = ns.linkUp("lo")
	}
	if err != nil && ours {
		return nil, errors.Join(err, ns.delete())
	}
	if err != nil {
		return nil, err
	}
	return ns, nil
}

func (ns *namespace) linkUp(name string) error {
	link, err := ns.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("network namespace %s: finding %s: %w", ns.name, name, err)
	}
	if err := ns.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("network namespace %s: bringing %s up: %w", ns.name, name, err)
	}
	return nil
}

// delete closes the namespace's handles and removes its name. The kernel
// frees the namespace, and the interfaces in it, once no socket holds it.
func (ns *namespace) delete() error {
	if ns.nl != nil {
		ns.nl.Close()
		ns.nl = nil
	}
	if ns.handle.IsOpen() {
		ns.handle.Close()
	}
	ns.handle = netns.None()
	_, err := deleteNames([]string{ns.name})
	return err
}

// deleteNamed unmounts and removes /run/netns/name; a missing name or a
// file that is not mounted (half-made by a crash) is not an error.
func deleteNamed(name string) error {
	path := filepath.Join(netnsDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting network namespace %s: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing network namespace %s: %w", name, err)
	}
	return nil
}

var validPrefix = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`)

func checkPrefix(prefix string) error {
	if !validPrefix.MatchString(prefix) {
		return fmt.Errorf("lab prefix %q: want 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit", prefix)
	}
	return nil
}

// namespacesWithPrefix lists /run/netns names that start with prefix.
func namespacesWithPrefix(prefix string) ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", netnsDir, err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

// DownAll removes every network namespace under /run/netns whose name starts
// with prefix (DefaultPrefix when empty), whichever lab made it, and
// returns the names removed. It is `lab down --all`: for leftovers of labs
// whose process died before Down, and of labs whose mounts another tool's
// `ip netns add` shadowed (see prepareNetnsDir).
func DownAll(prefix string) ([]string, error) {
	names, err := labNamespaces(prefix)
	if err != nil {
		return nil, err
	}
	removed, err := deleteNames(names)
	sort.Strings(removed)
	// The status files of the labs whose namespaces went (WriteStatus).
	files, _ := filepath.Glob(filepath.Join(StatusDir, prefix+"*.json"))
	for _, f := range files {
		if rmErr := os.Remove(f); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("lab status: %w", rmErr))
		}
	}
	return removed, err
}

// deleteNames removes the named namespaces, shadowed ones too, and returns
// the names removed.
func deleteNames(names []string) ([]string, error) {
	var removed, busy []string
	var errs []error
	for _, name := range names {
		err := deleteNamed(name)
		switch {
		case err == nil:
			removed = append(removed, name)
		case errors.Is(err, unix.EBUSY):
			busy = append(busy, name)
		default:
			errs = append(errs, err)
		}
	}
	if len(busy) > 0 {
		freed, err := unshadow(busy)
		removed = append(removed, freed...)
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	id, parent int
	point      string
	shared     bool // in a peer group (optional field shared:N)
}

func mountTable() ([]mountEntry, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		var e mountEntry
		if _, err := fmt.Sscan(f[0], &e.id); err != nil {
			continue
		}
		fmt.Sscan(f[1], &e.parent)
		e.point = strings.ReplaceAll(f[4], "\\040", " ")
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			e.shared = e.shared || strings.HasPrefix(opt, "shared:")
		}
		out = append(out, e)
	}
	return out, nil
}

// mountedOn reports whether something is mounted on path.
func mountedOn(table []mountEntry, path string) bool {
	for _, e := range table {
		if e.point == path {
			return true
		}
	}
	return false
}

// unshadow removes namespaces whose mounts lie under a later mount of
// netnsDir on itself: it keeps that cover (and every namespace other
// tools mounted in it) at a temporary place, lifts it off netnsDir, removes
// the lab's hidden mounts and files, and puts the cover back. It returns
// the names it removed.
func unshadow(names []string) ([]string, error) {
	table, err := mountTable()
	if err != nil {
		return nil, err
	}
	if !mountedOn(table, netnsDir) {
		return nil, fmt.Errorf("%s: busy, but nothing covers them (%s)", strings.Join(names, ", "), netnsDir)
	}
	tmp, err := os.MkdirTemp("", "netpol-netns-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	if err := unix.Mount(netnsDir, tmp, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return nil, fmt.Errorf("keeping the mounts of %s at %s: %w", netnsDir, tmp, err)
	}
	// Private, so that lifting the cover does not unmount the copies.
	if err := unix.Mount("", tmp, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		unix.Unmount(tmp, unix.MNT_DETACH)
		return nil, fmt.Errorf("making %s private: %w", tmp, err)
	}
	if err := unix.Unmount(netnsDir, unix.MNT_DETACH); err != nil {
		unix.Unmount(tmp, unix.MNT_DETACH)
		return nil, fmt.Errorf("lifting the mount on %s: %w", netnsDir, err)
	}
	var removed []string
	var errs []error
	for _, name := range names {
		if err := deleteNamed(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	if err := unix.Mount(tmp, netnsDir, "", unix.MS_MOVE, ""); err != nil {
		// A move is refused under a shared parent: bind it back instead.
		if err := unix.Mount(tmp, netnsDir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			errs = append(errs, fmt.Errorf("putting the mounts of %s back (they are at %s): %w", netnsDir, tmp, err))
			return removed, errors.Join(errs...)
		}
		unix.Unmount(tmp, unix.MNT_DETACH)
	}
	if err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		errs = append(errs, fmt.Errorf("making %s shared again: %w", netnsDir, err))
	}
	return removed, errors.Join(errs...)
}

// labNamespace splits a lab namespace name into the lab's prefix and role.
var labNamespace = regexp.MustCompile(`^(.+)-(underlay|n-[0-9]+|p-[0-9]+)$`)

// List finds the labs whose namespaces start with prefix (DefaultPrefix
// when empty): lab prefix -> its namespace names, sorted. A matching name
// that is not shaped like a lab namespace is listed under itself.
func List(prefix string) (map[string][]string, error) {
	names, err := labNamespaces(prefix)
	if err != nil {
		return nil, err
	}
	labs := map[string][]string{}
	for _, name := range names {
		lab := name
		if m := labNamespace.FindStringSubmatch(name); m != nil {
			lab = m[1]
		}
		labs[lab] = append(labs[lab], name)
	}
	return labs, nil
}

// labNamespaces lists the namespaces whose names start with prefix
// (DefaultPrefix when empty), after checking the prefix.
func labNamespaces(prefix string) ([]string, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	return namespacesWithPrefix(prefix)
}
