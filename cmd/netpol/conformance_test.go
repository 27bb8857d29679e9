package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/probe"
)

// `netpol conformance list`: every case with its tags, selection by tag,
// random cases by seed, and JSON that names steps.
func TestConformanceList(t *testing.T) {
	all, stderr, err := run(t, "", "conformance", "list")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if !strings.Contains(all, "upstream-e2e") || !strings.Contains(all, " cases;") {
		t.Fatalf("list lacks tags or the count:\n%s", all[len(all)-min(len(all), 400):])
	}
	tests := []struct {
		name string
		args []string
		// every listed case has tag, none has without
		tag, without string
		min          int
	}{
		{"include admin", []string{"--include", "admin"}, "admin", "", 150},
		{"include np, exclude ports", []string{"--include", "np", "--exclude", "ports"}, "np", "ports", 100},
		{"include churn", []string{"--include", "churn"}, "churn", "", 10},
		{"random", []string{"--random", "7", "--seed", "3"}, "", "", 7},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := run(t, "", append([]string{"conformance", "list", "-o", "json"}, tc.args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			var cases []struct {
				Name  string   `json:"name"`
				Tags  []string `json:"tags"`
				Steps []struct {
					Apply string `json:"apply"`
				} `json:"steps"`
			}
			if err := json.Unmarshal([]byte(out), &cases); err != nil {
				t.Fatal(err)
			}
			if len(cases) < tc.min {
				t.Fatalf("%d cases, want at least %d", len(cases), tc.min)
			}
			for _, c := range cases {
				has := func(tag string) bool {
					for _, x := range c.Tags {
						if x == tag {
							return true
						}
					}
					return false
				}
				if (tc.tag != "" && !has(tc.tag)) || (tc.without != "" && has(tc.without)) || len(c.Steps) == 0 {
					t.Errorf("case %s tags %v steps %d", c.Name, c.Tags, len(c.Steps))
				}
			}
		})
	}
	again, _, _ := run(t, "", "conformance", "list", "-o", "json", "--random", "7", "--seed", "3")
	other, _, _ := run(t, "", "conformance", "list", "-o", "json", "--random", "7", "--seed", "4")
	first, _, _ := run(t, "", "conformance", "list", "-o", "json", "--random", "7", "--seed", "3")
	if again != first || again == other {
		t.Errorf("random cases are not deterministic per seed")
	}
	// No cluster to run on: said plainly, before anything is made.
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, _, err := run(t, "", "conformance", "run", "--runner", "cluster"); err == nil || !strings.Contains(err.Error(), "no kubeconfig found") || strings.Contains(err.Error(), "KUBERNETES_MASTER") {
		t.Errorf("--runner cluster without a kubeconfig: %v", err)
	}
	if _, _, err := run(t, "", "conformance", "run", "--runner", "moon"); err == nil || !strings.Contains(err.Error(), "want lab or cluster") {
		t.Errorf("--runner moon: %v", err)
	}
}

// The run's exit status: 1 iff a cell mismatched, 2 when a case or the
// run could not be run to the end.
func TestConformanceRunStatus(t *testing.T) {
	mismatch := conformance.CaseResult{Name: "m", Steps: []conformance.StepResult{{Mismatches: []conformance.Mismatch{{From: "x/a"}}}}}
	errored := conformance.CaseResult{Name: "e", Error: "step 0: lab update: boom"}
	clean := conformance.CaseResult{Name: "c", Passed: true}
	tests := []struct {
		name  string
		cases []conformance.CaseResult
		err   error
		want  int // 0: nil
	}{
		{"clean", []conformance.CaseResult{clean}, nil, 0},
		{"a mismatch", []conformance.CaseResult{clean, mismatch}, nil, 1},
		{"a case that could not run", []conformance.CaseResult{clean, errored}, nil, 2},
		{"both", []conformance.CaseResult{mismatch, errored}, nil, 2},
		{"interrupted", []conformance.CaseResult{clean}, context.Canceled, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &conformance.Report{Cases: tt.cases}
			for _, c := range tt.cases {
				for _, st := range c.Steps {
					rep.Summary.Mismatches += len(st.Mismatches)
				}
			}
			err := runStatus(rep, tt.err)
			var st *exitError
			switch {
			case tt.want == 0 && err != nil:
				t.Fatalf("status %v, want success", err)
			case tt.want != 0 && (!errors.As(err, &st) || st.code != tt.want):
				t.Fatalf("status %v, want exit status %d", err, tt.want)
			}
		})
	}
}

// netpol probe dial: the JSON of every target, in order, against probe
// servers on loopback; bad targets are usage errors.
func TestProbeDial(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := int32(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	srv, err := probe.Serve(netns.None(), "x/a", lo, l4.Port{Protocol: corev1.ProtocolTCP, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	target := fmt.Sprintf("127.0.0.1:tcp/%d", port)
	out, stderr, err := run(t, "", "probe", "dial", "--timeout", "1s", "x/a="+target, "x/b="+target)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var got []probe.Outcome
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got) != 2 || !got[0].Allowed || got[0].Result != probe.ResultOK || got[0].To != "x/a" ||
		got[1].Allowed || got[1].Result != probe.ResultWrongReply || got[1].Reply != "x/a" {
		t.Errorf("outcomes %+v", got)
	}
	if _, stderr, err := run(t, "", "probe", "dial", "nobody"); err == nil || !strings.Contains(stderr+err.Error(), "NAME=ADDR:PROTO/PORT") {
		t.Errorf("a bad target: %v %s", err, stderr)
	}
}
