package lab

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/eval"
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
	got, _ := probe(t, l, ProbeOptions{Probes: probes})
	sameTable(t, evalTable(next, eval.TableOptions{Probes: probes}), got)
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
		got, _ := probe(t, l, ProbeOptions{Probes: probes, Family: eval.FamilyIPv4})
		sameTable(t, evalTable(snap, eval.TableOptions{Probes: probes, Family: eval.FamilyIPv4}), got)
		return
	}
	if !strings.Contains(why, "SCTP") {
		t.Errorf("reason %q does not say SCTP", why)
	}
	_, _, err := l.Probe(t.Context(), ProbeOptions{Probes: probes})
	if err == nil || !strings.Contains(err.Error(), "cannot probe sctp/80") || !strings.Contains(err.Error(), why) {
		t.Errorf("Probe sctp/80: %v, want an error saying the kernel has no SCTP", err)
	}
	if _, err := l.ProbeOne(t.Context(), "x/a", "x/b", probes[0], eval.FamilyIPv4); err == nil || !strings.Contains(err.Error(), why) {
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
