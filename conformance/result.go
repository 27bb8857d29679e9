package conformance

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/eval"
)

// Report is one run of the conformance suite; its JSON is report.json (a
// stable contract).
type Report struct {
	Summary Summary      `json:"summary"`
	Cases   []CaseResult `json:"cases"`
	// Runner is "lab" or "cluster"; Notes say what was left out and why
	// (e.g. SCTP on a kernel without it).
	Runner string   `json:"runner"`
	Notes  []string `json:"notes,omitempty"`
}

// Summary counts a run.
type Summary struct {
	Cases           int     `json:"cases"`
	Steps           int     `json:"steps"`
	Probes          int     `json:"probes"`
	Mismatches      int     `json:"mismatches"`
	Skipped         int     `json:"skipped"` // probes not run (unsupported protocol)
	DurationSeconds float64 `json:"durationSeconds"`
}

// CaseResult is one case: passed iff no step has a mismatch or an error.
type CaseResult struct {
	Name   string       `json:"name"`
	Tags   []string     `json:"tags"`
	Passed bool         `json:"passed"`
	Steps  []StepResult `json:"steps"`
	// Error says why the case could not be run to the end.
	Error           string  `json:"error,omitempty"`
	DurationSeconds float64 `json:"durationSeconds"`
}

// StepResult is one probed step.
type StepResult struct {
	Step       int        `json:"step"`
	Name       string     `json:"name,omitempty"`
	Probes     int        `json:"probes"`
	Mismatches []Mismatch `json:"mismatches"`
	// SettleSeconds (cluster runner) is how long after the step's objects
	// were written every cell agreed, or the settle bound when some never
	// did.
	SettleSeconds float64 `json:"settleSeconds,omitempty"`
	// Expected is the evaluator's table, Observed the data plane's (for
	// the report's matrices; not in report.json).
	Expected *eval.TruthTable `json:"-"`
	Observed *eval.TruthTable `json:"-"`
	// Apply is the step's YAML (for the report; not in report.json).
	Apply string `json:"-"`
}

// Mismatch is one cell where the data plane and the evaluator differ.
type Mismatch struct {
	From     string          `json:"from"`
	To       string          `json:"to"`
	Protocol corev1.Protocol `json:"protocol"`
	Port     int32           `json:"port"`
	Expected bool            `json:"expected"`
	Observed bool            `json:"observed"`
	// Result is what the probe saw: ok, timeout, refused, ...
	Result string `json:"result"`
	// Explain is explain's text for the cell and Trace the path through
	// the compiled tables (netpol trace), for the report.
	Explain string `json:"-"`
	Trace   string `json:"-"`
}
