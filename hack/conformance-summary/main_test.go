package main

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// A Netpol spec skipped by its own run's SCTP filter is counted under
// that reason, not under sig-network's kpng list, whose "Netpol" matches
// its name too (the two suites ran in one make conformance-upstream).
func TestSkipReasonsPerSuite(t *testing.T) {
	const report = `<testsuites><testsuite>
<testcase name="[sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]" status="passed"></testcase>
<testcase name="[sig-network] Netpol [Feature:SCTPConnectivity] should enforce policy based on Ports [Feature:NetworkPolicy]" status="skipped"><skipped message="skipped"></skipped></testcase>
<testcase name="[sig-network] Netpol should fail in its own way" status="skipped"><skipped message="skipped - Requires &gt;= 3 zones&#xA;details"></skipped></testcase>
<testcase name="[sig-storage] not in the focus" status="skipped"><skipped message="skipped"></skipped></testcase>
</testsuite></testsuites>`
	path := filepath.Join(t.TempDir(), "junit_01.xml")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	why, err := parseSkips([]string{
		"sig-network=Feature|Netpol|NetworkPolicy=kpng's list",
		"sig-network=SCTP=no SCTP",
		"netpol=SCTP=no SCTP",
	})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := summarize(path, regexp.MustCompile(`\[sig-network\] Netpol`), why["netpol"])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"no SCTP": 1, "Requires >= 3 zones": 1}
	if sum.Passed != 1 || sum.Skipped != 2 || !maps.Equal(sum.SkippedWhy, want) {
		t.Errorf("passed %d skipped %d, why %v; want 1, 2, %v", sum.Passed, sum.Skipped, sum.SkippedWhy, want)
	}
	for _, bad := range [][]string{{"netpol=SCTP"}, {"netpol=(=x"}} {
		if _, err := parseSkips(bad); err == nil {
			t.Errorf("parseSkips(%q): no error", bad)
		}
	}
}
