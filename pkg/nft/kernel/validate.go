package kernel

import (
	"fmt"

	"github.com/netpol/netpol/pkg/nft"
)

// validate checks the desired table's shape and everything the plan adds,
// for what the kernel would reject with a bare EINVAL (or, worse, accept
// with another meaning), so that the error names the set or chain. Only
// added elements are checked: the others are already in the kernel, and
// checking them would cost time on every small update. Things only the
// kernel knows (does a referenced set or chain exist, do ranges overlap)
// are left to the kernel, which rejects the whole batch.
func validate(t *nft.Table, p *Plan) error {
	if err := t.ValidateNames(); err != nil {
		return err
	}
	keys := map[*nft.Set]map[string]nft.Verdict{} // map keys added, per map
	var buf []byte
	for _, op := range p.Ops {
		switch op.Kind {
		case OpAddChain:
			if op.Chain.Base != nil {
				if err := validateHook(normalHook(op.Chain.Base)); err != nil {
					return fmt.Errorf("chain %s: %w", op.Chain.Name, err)
				}
			}
		case OpAddRule:
			if err := t.ValidateCounterRefs(op.Rule); err != nil {
				return fmt.Errorf("chain %s: %w", op.Chain.Name, err)
			}
		case OpAddSet:
			if err := op.Set.ValidateSpec(); err != nil {
				return fmt.Errorf("set %s: %w", op.Set.Name, err)
			}
		case OpAddElements:
			s := op.Set
			for _, e := range op.Elements {
				if err := s.ValidateElement(e); err != nil {
					return fmt.Errorf("set %s: element %s: %w", s.Name, s.ElementText(e), err)
				}
				if !s.Verdict {
					continue
				}
				// A map key has one verdict.
				if keys[s] == nil {
					keys[s] = map[string]nft.Verdict{}
				}
				buf = appendElementID(buf[:0], nft.Element{Key: e.Key, KeyEnd: e.KeyEnd})
				if v, ok := keys[s][string(buf)]; ok && v != *e.Verdict {
					return fmt.Errorf("set %s: element %s: key already maps to %s", s.Name, s.ElementText(e), v)
				}
				keys[s][string(buf)] = *e.Verdict
			}
		}
	}
	return nil
}

// validateHook reports a chain type, hook or policy the kernel has no
// value for (kernel.go).
func validateHook(h nft.Hook) error {
	if _, ok := chainTypes[h.Type]; !ok {
		return fmt.Errorf("unknown chain type %q", h.Type)
	}
	if _, ok := hookNums[h.Hook]; !ok {
		return fmt.Errorf("unknown hook %q", h.Hook)
	}
	if _, ok := policies[h.Policy]; !ok {
		return fmt.Errorf("unknown policy %q", h.Policy)
	}
	return nil
}
