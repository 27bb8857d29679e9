package lab

import (
	"testing"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
)

// With no rules in any node the lab must observe what the evaluator says
// without policies: everything allowed.
func TestE2EAllAllowed(t *testing.T) {
	snap := loadBase(t, "e2e.yaml")
	l := upLab(t, snap, Options{})
	for _, family := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
		t.Run(string(family), func(t *testing.T) {
			opts := eval.TruthTableOptions{Probes: mustProbes(t, "tcp/80", "udp/81"), Family: family}
			want := evalTable(snap, opts)
			got, notes := probeLab(t, l, ProbeOptions{Probes: opts.Probes, Family: family})
			sameTable(t, want, got)
			if len(notes) > 0 {
				t.Errorf("notes: %v", notes)
			}
		})
	}
	// The full matrix: every declared port but SCTP (this kernel may
	// have none), 9 x 9 x 4.
	t.Run("full", func(t *testing.T) {
		got, notes := probeLab(t, l, ProbeOptions{SkipUnsupported: true})
		opts := eval.TruthTableOptions{}
		for _, s := range got.Ports {
			opts.Probes = append(opts.Probes, mustProbes(t, s)...)
		}
		sameTable(t, evalTable(snap, opts), got)
		if ok, _ := SCTPSupported(); !ok && len(got.Ports) != 4 {
			t.Errorf("ports %v, want the 4 TCP and UDP ones; notes %v", got.Ports, notes)
		}
	})
}

// Mixed families: single-stack pods of either family, dual-stack pods with
// either primary. Primary-family tables dial across families where the
// source has an address of the destination's family.
func TestDualStack(t *testing.T) {
	snap := loadBase(t, "dualstack.yaml")
	l := upLab(t, snap, Options{})
	for _, family := range []ipfamily.Family{ipfamily.Any, ipfamily.IPv4, ipfamily.IPv6} {
		t.Run("family="+string(family), func(t *testing.T) {
			opts := eval.TruthTableOptions{Probes: mustProbes(t, "tcp/80", "udp/81"), Family: family}
			got, _ := probeLab(t, l, ProbeOptions{Probes: opts.Probes, Family: family})
			sameTable(t, evalTable(snap, opts), got)
		})
	}
}

// Host-network pods serve from their node's namespace on the node's
// address and probe from there.
func TestHostNetwork(t *testing.T) {
	snap := loadBase(t, "hostnet.yaml")
	l := upLab(t, snap, Options{})
	got, _ := probeLab(t, l, ProbeOptions{})
	sameTable(t, evalTable(snap, eval.TruthTableOptions{}), got)

	h1 := l.Node("node-1")
	for _, p := range l.Pods() {
		if p.Name == "x/h1" && (p.NetNS != h1.NetNS || !p.HostNetwork) {
			t.Errorf("x/h1 lives in %s, want node-1's %s", p.NetNS, h1.NetNS)
		}
	}
	o, err := l.ProbeOne(t.Context(), "x/h1", "y/b", mustProbes(t, "udp/80")[0], ipfamily.IPv4)
	if err != nil || !o.Allowed || o.Reply != "y/b" || o.FromAddr.String() != "172.18.0.2" {
		t.Errorf("x/h1 -> y/b udp/80: %+v, %v; want a reply from y/b to 172.18.0.2", o, err)
	}
}

// The conformance model's pods serve ports they do not declare
// (ExtraPorts), and the named-port model declares different ports per pod.
func TestConformanceAndNamedPorts(t *testing.T) {
	t.Run("conformance", func(t *testing.T) {
		snap := loadBase(t, "conformance.yaml")
		probes := mustProbes(t, "tcp/80", "tcp/8080", "udp/53", "udp/5353")
		l := upLab(t, snap, Options{ExtraPorts: probes})
		got, _ := probeLab(t, l, ProbeOptions{Probes: probes, Family: ipfamily.IPv4})
		sameTable(t, evalTable(snap, eval.TruthTableOptions{Probes: probes, Family: ipfamily.IPv4}), got)
	})
	t.Run("namedports", func(t *testing.T) {
		snap := loadBase(t, "namedports.yaml")
		l := upLab(t, snap, Options{})
		got, _ := probeLab(t, l, ProbeOptions{})
		sameTable(t, evalTable(snap, eval.TruthTableOptions{}), got)
	})
}
