package generator

import (
	"errors"
	"fmt"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// ApplyStep changes snap as st says, as the corpus does: the deletes (each
// object must be there), then the documents, replacing objects already
// there (kubectl apply).
func ApplyStep(snap *cluster.Snapshot, st Step, label string) error {
	for _, ref := range st.Delete {
		if !snap.Delete(cluster.ObjectKey{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}) {
			return fmt.Errorf("%s: delete %s %s/%s: not there", label, ref.Kind, ref.Namespace, ref.Name)
		}
	}
	if st.Apply != "" {
		report := snap.AddDocuments([]byte(st.Apply), label, true)
		if len(report.Errors) > 0 {
			return fmt.Errorf("%s: %w", label, errors.Join(report.Errors...))
		}
		if len(report.Skipped) > 0 {
			return fmt.Errorf("%s: %s", label, report.SkippedNote())
		}
	}
	return nil
}

// Check applies every step of c to the base and returns the first problem:
// a document that does not load, a delete of a missing object, or a policy
// that does not build cleanly.
func Check(c Case) error {
	if len(c.Steps) == 0 {
		return fmt.Errorf("%s: no steps", c.Name)
	}
	snap := Base()
	for i, st := range c.Steps {
		label := fmt.Sprintf("%s step %d", c.Name, i)
		if err := ApplyStep(snap, st, label); err != nil {
			return err
		}
		if m := policy.Build(snap); len(m.Errors) > 0 {
			return fmt.Errorf("%s: %w", label, errors.Join(m.Errors...))
		}
	}
	return nil
}
