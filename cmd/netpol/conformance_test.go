package main

import (
	"encoding/json"
	"strings"
	"testing"
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
	if _, _, err := run(t, "", "conformance", "run", "--runner", "cluster"); err == nil || !strings.Contains(err.Error(), "only the lab runner") {
		t.Errorf("--runner cluster: %v", err)
	}
}
