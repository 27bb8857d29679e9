package lab

import (
	"errors"
	"fmt"
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
// netns` does), so that `ip netns list` shows the lab's.
const netnsDir = "/run/netns"

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
	return deleteNamed(ns.name)
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
// whose process died before Down.
func DownAll(prefix string) ([]string, error) {
	names, err := labNamespaces(prefix)
	if err != nil {
		return nil, err
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
