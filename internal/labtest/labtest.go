// Package labtest brings up labs (pkg/lab) for tests outside pkg/lab: each
// is taken down when its test ends, and a lab that will not come down
// fails the test, so no test leaves network namespaces behind unnoticed.
package labtest

import (
	"context"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/lab"
)

// Up brings up a lab of snap, or ends tb; the lab is taken down when tb
// ends. The caller checks for root first (kerneltest.Require).
func Up(tb testing.TB, snap *cluster.Snapshot, opts lab.Options) *lab.Lab {
	tb.Helper()
	l, err := lab.Up(context.Background(), snap, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := l.Down(); err != nil {
			tb.Errorf("lab down: %v", err)
		}
	})
	return l
}
