package conformance

import (
	"fmt"

	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
)

// Difference is a cell where the kernel and the evaluator disagree.
type Difference struct {
	From, To string
	Probe    l4.Port
	// Expected is the evaluator's verdict; the kernel did the opposite.
	Expected bool
}

func (d Difference) String() string {
	word := func(b bool) string {
		if b {
			return "allowed"
		}
		return "denied"
	}
	return fmt.Sprintf("%s -> %s %s: evaluator says %s, kernel %s", d.From, d.To, d.Probe, word(d.Expected), word(!d.Expected))
}

// Compare lists the cells where observed differs from expected. Both
// tables must cover the same pods and ports; a cell missing from observed
// is an error.
func Compare(expected, observed *eval.TruthTable) ([]Difference, error) {
	type key struct {
		from, to string
		probe    l4.Port
	}
	seen := make(map[key]bool, len(observed.Results))
	for _, r := range observed.Results {
		seen[key{r.From, r.To, l4.Port{Protocol: r.Protocol, Port: r.Port}}] = r.Allowed
	}
	var diffs []Difference
	for _, r := range expected.Results {
		k := key{r.From, r.To, l4.Port{Protocol: r.Protocol, Port: r.Port}}
		got, ok := seen[k]
		if !ok {
			return nil, fmt.Errorf("the observed table has no cell %s -> %s %s", r.From, r.To, k.probe)
		}
		if got != r.Allowed {
			diffs = append(diffs, Difference{From: r.From, To: r.To, Probe: k.probe, Expected: r.Allowed})
		}
	}
	if len(observed.Results) != len(expected.Results) {
		return diffs, fmt.Errorf("the observed table has %d cells, the evaluator's %d", len(observed.Results), len(expected.Results))
	}
	return diffs, nil
}
