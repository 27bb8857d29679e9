package nft

import (
	"bytes"
	"fmt"
	"slices"
)

// validate checks the desired table's shape and everything the plan adds,
// for what the kernel would reject with a bare EINVAL (or, worse, accept
// with another meaning), so that the error names the set or chain. Only
// added elements are checked: the others are already in the kernel, and
// checking them would cost time on every small update. Things only the
// kernel knows (does a referenced set or chain exist, do ranges overlap)
// are left to the kernel, which rejects the whole batch.
func validate(t *Table, p *Plan) error {
	for name, s := range t.Sets {
		if s.Name != name {
			return fmt.Errorf("set %q is stored under the name %q", s.Name, name)
		}
	}
	for name, c := range t.Chains {
		if c.Name != name {
			return fmt.Errorf("chain %q is stored under the name %q", c.Name, name)
		}
	}
	keys := map[*Set]map[string]Verdict{} // map keys added, per map
	var buf []byte
	for _, op := range p.Ops {
		switch op.Kind {
		case OpAddChain:
			if op.Chain.Base != nil {
				if err := validateHook(normalHook(op.Chain.Base)); err != nil {
					return fmt.Errorf("chain %s: %w", op.Chain.Name, err)
				}
			}
		case OpAddSet:
			if err := validateSpec(op.Set); err != nil {
				return fmt.Errorf("set %s: %w", op.Set.Name, err)
			}
		case OpAddElements:
			s := op.Set
			kl := s.keyLen()
			for _, e := range op.Elements {
				if err := validateElement(s, kl, e); err != nil {
					return fmt.Errorf("set %s: element %s: %w", s.Name, s.ElementText(e), err)
				}
				if !s.Verdict {
					continue
				}
				// A map key has one verdict.
				if keys[s] == nil {
					keys[s] = map[string]Verdict{}
				}
				buf = appendElementID(buf[:0], Element{Key: e.Key, KeyEnd: e.KeyEnd})
				if v, ok := keys[s][string(buf)]; ok && v != *e.Verdict {
					return fmt.Errorf("set %s: element %s: key already maps to %s", s.Name, s.ElementText(e), v)
				}
				keys[s][string(buf)] = *e.Verdict
			}
		}
	}
	return nil
}

func validateSpec(s *Set) error {
	if len(s.Fields) == 0 {
		return fmt.Errorf("no key fields")
	}
	for _, f := range append(slices.Clone(s.Fields), s.Data...) {
		if f < FieldIPv4 || f > FieldInteger {
			return fmt.Errorf("unknown field type %d", f)
		}
	}
	if s.Verdict && s.Data != nil {
		return fmt.Errorf("both a verdict map and a data map")
	}
	return nil
}

func validateElement(s *Set, keyLen int, e Element) error {
	if len(e.Key) != keyLen {
		return fmt.Errorf("key is %d bytes, want %d", len(e.Key), keyLen)
	}
	if e.KeyEnd != nil {
		if !s.Interval {
			return fmt.Errorf("range in a set without intervals")
		}
		if len(e.KeyEnd) != keyLen {
			return fmt.Errorf("key end is %d bytes, want %d", len(e.KeyEnd), keyLen)
		}
		lo, hi := s.fields(e.Key), s.fields(e.KeyEnd)
		for i := range lo {
			if bytes.Compare(lo[i], hi[i]) > 0 {
				return fmt.Errorf("range end below its start in field %d", i)
			}
		}
	}
	switch {
	case s.Verdict && e.Verdict == nil:
		return fmt.Errorf("map element without a verdict")
	case !s.Verdict && e.Verdict != nil:
		return fmt.Errorf("verdict in a set that is not a map")
	case s.Data != nil && len(e.Data) != valueLen(s.Data):
		return fmt.Errorf("value is %d bytes, want %d", len(e.Data), valueLen(s.Data))
	case s.Data == nil && e.Data != nil:
		return fmt.Errorf("value in a set that is not a data map")
	case e.Verdict != nil && (e.Verdict.Kind == Jump || e.Verdict.Kind == Goto) && e.Verdict.Chain == "":
		return fmt.Errorf("%s without a chain", e.Verdict)
	case e.Verdict != nil && (e.Verdict.Kind < Accept || e.Verdict.Kind > Goto):
		return fmt.Errorf("unknown verdict kind %d", e.Verdict.Kind)
	}
	return nil
}

func validateHook(h Hook) error {
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
