package nft

import (
	"bytes"
	"fmt"
	"slices"
)

// ValidateNames reports a set or chain stored under a name other than its
// own.
func (t *Table) ValidateNames() error {
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
	for name, c := range t.Counters {
		if c.Name != name {
			return fmt.Errorf("counter %q is stored under the name %q", c.Name, name)
		}
	}
	return nil
}

// ValidateSpec reports what in the set's spec the kernel would refuse.
func (s *Set) ValidateSpec() error {
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

// ValidateElement reports what in e does not fit the set: its key's or
// value's length, a range in a set without intervals or ending below its
// start, a verdict where there is none or none where there is one.
func (s *Set) ValidateElement(e Element) error {
	keyLen := s.KeyLen()
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
	case s.Data != nil && len(e.Data) != ValueLen(s.Data):
		return fmt.Errorf("value is %d bytes, want %d", len(e.Data), ValueLen(s.Data))
	case s.Data == nil && e.Data != nil:
		return fmt.Errorf("value in a set that is not a data map")
	case e.Verdict != nil && (e.Verdict.Kind == Jump || e.Verdict.Kind == Goto) && e.Verdict.Chain == "":
		return fmt.Errorf("%s without a chain", e.Verdict)
	case e.Verdict != nil && (e.Verdict.Kind < Accept || e.Verdict.Kind > Goto):
		return fmt.Errorf("unknown verdict kind %d", e.Verdict.Kind)
	}
	return nil
}
