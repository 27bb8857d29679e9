package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// A run of three conformance tests (one passed, one failed, one skipped by
// the suite) with two left out by -test.skip, which the suite's report
// counted as passed.
func TestSummarizeGoSuite(t *testing.T) {
	dir := t.TempDir()
	events := `{"Action":"run","Test":"TestConformanceProfiles"}
{"Action":"run","Test":"TestConformanceProfiles/CNPAdminTierEgressTCP"}
{"Action":"run","Test":"TestConformanceProfiles/CNPAdminTierEgressTCP/case"}
{"Action":"fail","Test":"TestConformanceProfiles/CNPAdminTierEgressTCP/case"}
{"Action":"pass","Test":"TestConformanceProfiles/CNPAdminTierEgressUDP"}
{"Action":"fail","Test":"TestConformanceProfiles/CNPAdminTierEgressTCP"}
{"Action":"output","Test":"TestConformanceProfiles/CNPAdminTierIngressNamedPort","Output":"    suite.go:210: Skipping CNPAdminTierIngressNamedPort: suite does not support ClusterNetworkPolicyNamedPorts\n"}
{"Action":"skip","Test":"TestConformanceProfiles/CNPAdminTierIngressNamedPort"}
{"Action":"fail","Test":"TestConformanceProfiles"}
`
	notRun := "CNPAdminTierEgressSCTP ClusterNetworkPolicy standard no SCTP here\n" +
		"CNPAdminTierEgressNodePeers ClusterNetworkPolicy experimental no SCTP here\n" +
		"AdminNetworkPolicyIntegration - standard not in this run\n"
	report := `apiVersion: policy.networking.k8s.io/v1alpha1
kind: ConformanceReport
date: "2026-12-07"
networkPolicyBundleVersion: v0.3.0
implementation: {organization: netpol, project: netpol, url: u, version: v, contact: [c], additionalInformation: a}
profiles:
- name: ClusterNetworkPolicy
  standard:
    result: failure
    summary: ""
    statistics: {Passed: 2, Failed: 1, Skipped: 0}
    failedTests: [CNPAdminTierEgressTCP]
  experimental:
    result: success
    summary: ""
    statistics: {Passed: 1, Failed: 0, Skipped: 1}
    skippedTests: [CNPAdminTierIngressNamedPort]
`
	for name, data := range map[string]string{"events.json": events, "not-run": notRun, "report.suite.yaml": report} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := summarizeGoSuite(dir, "failure")
	if err != nil {
		t.Fatal(err)
	}
	if sum.Passed != 1 || sum.Failed != 1 || sum.Skipped != 4 {
		t.Errorf("passed %d failed %d skipped %d, want 1 1 4", sum.Passed, sum.Failed, sum.Skipped)
	}
	if sum.SkippedWhy["no SCTP here"] != 2 || sum.SkippedWhy["suite does not support ClusterNetworkPolicyNamedPorts"] != 1 ||
		sum.SkippedWhy["not in this run"] != 1 {
		t.Errorf("skippedWhy %v", sum.SkippedWhy)
	}
	if strings.Join(sum.FailedSpecs, ",") != "CNPAdminTierEgressTCP" {
		t.Errorf("failed %v", sum.FailedSpecs)
	}
	data, err := os.ReadFile(filepath.Join(dir, "report.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		NetworkPolicyBundleVersion string `json:"networkPolicyBundleVersion"`
		Profiles                   []struct {
			Standard, Experimental struct {
				Result       string
				Summary      string
				Statistics   struct{ Passed, Failed, Skipped int }
				SkippedTests []string `json:"skippedTests"`
			}
		}
	}
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got.NetworkPolicyBundleVersion != "v0.3.0" || len(got.Profiles) != 1 {
		t.Fatalf("report.yaml lost fields:\n%s", data)
	}
	std, exp := got.Profiles[0].Standard, got.Profiles[0].Experimental
	if std.Statistics.Passed != 1 || std.Statistics.Skipped != 1 || std.Result != "failure" ||
		strings.Join(std.SkippedTests, ",") != "CNPAdminTierEgressSCTP" {
		t.Errorf("standard %+v", std)
	}
	if exp.Statistics.Passed != 0 || exp.Statistics.Skipped != 2 || exp.Result != "failure" ||
		strings.Join(exp.SkippedTests, ",") != "CNPAdminTierIngressNamedPort,CNPAdminTierEgressNodePeers" ||
		!strings.HasPrefix(exp.Summary, "skipped: ") {
		t.Errorf("experimental %+v", exp)
	}

	// A left-out test that ran is an error, not a count.
	if err := os.WriteFile(filepath.Join(dir, "not-run"), []byte("CNPAdminTierEgressUDP ClusterNetworkPolicy standard x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := summarizeGoSuite(dir, "failure"); err == nil {
		t.Error("a left-out test that ran: no error")
	}
}

// A run that failed in its setup, before any conformance test and before
// its report, counts as failed.
func TestSummarizeGoSuiteSetupFailed(t *testing.T) {
	dir := t.TempDir()
	events := `{"Action":"run","Test":"TestConformanceProfiles"}
{"Action":"output","Test":"TestConformanceProfiles","Output":"error creating resource\n"}
{"Action":"fail","Test":"TestConformanceProfiles"}
`
	if err := os.WriteFile(filepath.Join(dir, "events.json"), []byte(events), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := summarizeGoSuite(dir, "partial")
	if err != nil {
		t.Fatal(err)
	}
	if sum.Passed != 0 || sum.Failed != 1 || len(sum.FailedSpecs) != 1 {
		t.Errorf("passed %d failed %d %v, want 0 1", sum.Passed, sum.Failed, sum.FailedSpecs)
	}
}
