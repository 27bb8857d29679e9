package node

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/nft"
)

// TestSyncTablesOnTheirOwn: one table's failure leaves the other synced,
// and only the tables asked for are touched.
func TestSyncTablesOnTheirOwn(t *testing.T) {
	snap, report := cluster.LoadPaths([]string{filepath.Join("..", "..", "testdata", "base", "e2e.yaml")}, nil)
	if len(report.Errors) > 0 {
		t.Fatal(report.Errors)
	}
	in := Prepare(snap)
	fail := func(*nft.Plan) error { return errors.New("injected") }
	tests := []struct {
		name                     string
		tables                   Tables
		failPolicy, failServices bool
		wantFailed               Tables
		wantPolicy, wantServices bool // table in the kernel afterwards
	}{
		{"both", All, false, false, 0, true, true},
		{"policy only", Policy, false, false, 0, true, false},
		{"services only", Services, false, false, 0, false, true},
		{"policy fails", All, true, false, Policy, false, true},
		{"services fail", All, false, true, Services, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol, nat := nft.NewFake("netpol"), nft.NewFake("netpol-proxy")
			if tt.failPolicy {
				pol.FailWith(fail)
			}
			if tt.failServices {
				nat.FailWith(fail)
			}
			p, err := NewWith(Options{Node: "node-1"}, pol, nat)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			res := p.Sync(in, tt.tables)
			if got := res.Failed(); got != tt.wantFailed {
				t.Errorf("failed tables %v, want %v (%v)", got, tt.wantFailed, res.Err())
			}
			if got := pol.Kernel() != nil; got != tt.wantPolicy {
				t.Errorf("policy table in the kernel: %v, want %v", got, tt.wantPolicy)
			}
			if got := nat.Kernel() != nil; got != tt.wantServices {
				t.Errorf("NAT table in the kernel: %v, want %v", got, tt.wantServices)
			}
		})
	}
}

// TestVerify reports the table changed behind the programmer's back.
func TestVerify(t *testing.T) {
	snap, _ := cluster.LoadPaths([]string{filepath.Join("..", "..", "testdata", "base", "e2e.yaml")}, nil)
	pol, nat := nft.NewFake("netpol"), nft.NewFake("netpol-proxy")
	p, err := NewWith(Options{Node: "node-1"}, pol, nat)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Sync(Prepare(snap), All).Err(); err != nil {
		t.Fatal(err)
	}
	if d, err := p.Verify(All); d != 0 || err != nil {
		t.Fatalf("Verify after a sync: %v, %v; want nothing", d, err)
	}
	nat.Tamper(func(*nft.Table) *nft.Table { return nil })
	if d, err := p.Verify(All); d != Services || err != nil {
		t.Fatalf("Verify after deleting the NAT table: %v, %v; want services", d, err)
	}
	if err := p.Sync(Prepare(snap), All).Err(); err != nil || nat.Kernel() == nil {
		t.Fatalf("the next sync did not restore the NAT table: %v", err)
	}
}
