package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// StatusDir is where the process running a lab describes it (WriteStatus),
// one JSON file per lab: the namespaces alone say which labs exist, not
// which pod is where (netpol lab status reads both).
var StatusDir = "/run/netpol/labs"

// Status describes a running lab for scripts: each node and pod with its
// network namespace and addresses, so that they can open connections from
// a given pod (`ip netns exec NETNS ...`).
type Status struct {
	Prefix string `json:"prefix"`
	// PID is the process that runs the lab (netpol lab up), Files the
	// state files it was made from, Synced when its nodes were last
	// programmed.
	PID     int           `json:"pid,omitempty"`
	Files   []string      `json:"files,omitempty"`
	Synced  time.Time     `json:"synced,omitzero"`
	Nodes   []NodeStatus  `json:"nodes"`
	Pods    []PodStatus   `json:"pods"`
	Outside OutsideStatus `json:"outside"`
}

// NodeStatus is a node of a Status.
type NodeStatus struct {
	Name  string       `json:"name"`
	NetNS string       `json:"netns"`
	Addrs []netip.Addr `json:"addresses"`
}

// PodStatus is a pod of a Status; a host-network pod's netns is its
// node's.
type PodStatus struct {
	Name        string       `json:"name"` // namespace/name
	Node        string       `json:"node"`
	HostNetwork bool         `json:"hostNetwork,omitempty"`
	NetNS       string       `json:"netns"`
	Addrs       []netip.Addr `json:"addresses"`
	Serves      []string     `json:"serves"` // protocol/port, as `netpol table --ports` takes them
}

// OutsideStatus is the lab's outside (the underlay, ExternalSource).
type OutsideStatus struct {
	NetNS string       `json:"netns"`
	Addrs []netip.Addr `json:"addresses"`
}

// Status is what l is now.
func (l *Lab) Status() Status {
	s := Status{Prefix: l.Prefix(), Nodes: []NodeStatus{}, Pods: []PodStatus{}}
	for _, n := range l.Nodes() {
		s.Nodes = append(s.Nodes, NodeStatus{Name: n.Name, NetNS: n.NetNS, Addrs: n.Addrs})
	}
	for _, p := range l.Pods() {
		ps := PodStatus{Name: p.Name, Node: p.Node, HostNetwork: p.HostNetwork, NetNS: p.NetNS, Addrs: p.Addrs, Serves: []string{}}
		for _, port := range p.Serves {
			ps.Serves = append(ps.Serves, strings.ToLower(string(port.Protocol))+"/"+fmt.Sprint(port.Port))
		}
		s.Pods = append(s.Pods, ps)
	}
	ext := l.External()
	s.Outside = OutsideStatus{NetNS: ext.NetNS, Addrs: ext.Addrs}
	return s
}

// WriteStatus writes s to StatusDir (replacing the lab's last one at
// once: a reader sees the old file or the new, whole).
func WriteStatus(s Status) error {
	if err := checkPrefix(s.Prefix); err != nil {
		return err
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(StatusDir, 0o755); err != nil {
		return fmt.Errorf("lab status: %w", err)
	}
	tmp, err := os.CreateTemp(StatusDir, "."+s.Prefix+"-*")
	if err != nil {
		return fmt.Errorf("lab status: %w", err)
	}
	_, werr := tmp.Write(append(data, '\n'))
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("lab status: %w", err)
	}
	if err := os.Rename(tmp.Name(), statusPath(s.Prefix)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("lab status: %w", err)
	}
	return nil
}

func statusPath(prefix string) string { return filepath.Join(StatusDir, prefix+".json") }

// ReadStatus is lab prefix's status as its process last wrote it; false
// when there is none (the lab was made without one, or its process is
// gone and removed it).
func ReadStatus(prefix string) (Status, bool, error) {
	data, err := os.ReadFile(statusPath(prefix))
	if errors.Is(err, fs.ErrNotExist) {
		return Status{}, false, nil
	}
	if err != nil {
		return Status{}, false, fmt.Errorf("lab status: %w", err)
	}
	var s Status
	if err := json.Unmarshal(data, &s); err != nil {
		return Status{}, false, fmt.Errorf("lab status %s: %w", statusPath(prefix), err)
	}
	return s, true, nil
}

// RemoveStatus removes lab prefix's status file, if any.
func RemoveStatus(prefix string) error {
	if err := os.Remove(statusPath(prefix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("lab status: %w", err)
	}
	return nil
}

// Running says whether the process a status names still runs.
func (s Status) Running() bool {
	if s.PID <= 0 {
		return false
	}
	err := syscall.Kill(s.PID, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
