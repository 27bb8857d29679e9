// Package labtest brings up labs (pkg/lab) for tests outside pkg/lab: each
// is taken down when its test ends, and a lab that will not come down
// fails the test, so no test leaves network namespaces behind unnoticed.
// A test binary that dies runs no cleanup (go test's -timeout panics), so
// a lab's name carries its test process, and the next Up removes the labs
// of test processes that are gone.
package labtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/lab"
)

// ownerPrefix starts the name of a lab Up makes without a prefix of the
// caller's: then the test process's pid, a dash and 6 random hex digits.
const ownerPrefix = lab.DefaultPrefix + "test"

var ownedLab = regexp.MustCompile(`^` + regexp.QuoteMeta(ownerPrefix) + `([0-9]+)-[0-9a-f]+$`)

// Up brings up a lab of snap, or ends tb; the lab is taken down when tb
// ends. The caller checks for root first (kerneltest.Require).
func Up(tb testing.TB, snap *cluster.Snapshot, opts lab.Options) *lab.Lab {
	tb.Helper()
	if removed, err := removeOrphans(); err != nil {
		tb.Logf("removing the labs of test processes that are gone: %v", err)
	} else if len(removed) > 0 {
		tb.Logf("removed %d network namespaces of labs whose test process is gone", len(removed))
	}
	if opts.Prefix == "" {
		b := make([]byte, 3)
		rand.Read(b)
		opts.Prefix = fmt.Sprintf("%s%d-%s", ownerPrefix, os.Getpid(), hex.EncodeToString(b))
	}
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

// removeOrphans takes down the labs Up named for a test process that no
// longer runs, and returns the namespaces removed.
func removeOrphans() ([]string, error) {
	labs, err := lab.List(ownerPrefix)
	if err != nil {
		return nil, err
	}
	var removed []string
	for prefix := range labs {
		m := ownedLab.FindStringSubmatch(prefix)
		if m == nil {
			continue
		}
		if pid, err := strconv.Atoi(m[1]); err != nil || running(pid) {
			continue
		}
		names, err := lab.DownAll(prefix + "-")
		removed = append(removed, names...)
		if err != nil {
			return removed, err
		}
	}
	return removed, nil
}

// running reports whether process pid exists (one that took a dead test
// binary's pid keeps its labs until it ends too: never a running test's).
func running(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}
