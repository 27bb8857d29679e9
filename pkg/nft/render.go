package nft

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"
)

// Render writes the table in nft syntax (`nft -f` reads it back).
func (t *Table) Render(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", t.Name)
	for _, name := range t.SetNames() {
		renderSet(&b, t.Sets[name])
	}
	renderCounters(&b, t)
	for _, name := range t.ChainNames() {
		c := t.Chains[name]
		fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
		if h := c.Base; h != nil {
			fmt.Fprintf(&b, "\t\t%s\n", h)
		}
		for i, r := range c.Rules {
			// Consecutive rules of one origin share one comment line.
			if r.Comment != "" && (i == 0 || c.Rules[i-1].Comment != r.Comment) {
				fmt.Fprintf(&b, "\t\t# %s\n", strings.ReplaceAll(r.Comment, "\n", " "))
			}
			fmt.Fprintf(&b, "\t\t%s\n", r.Text)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// String is the hook as a base chain declares it in nft syntax: `type
// filter hook input priority filter; policy accept;`.
func (h Hook) String() string {
	prio := "filter"
	switch {
	case h.Priority > 0:
		prio = fmt.Sprintf("filter + %d", h.Priority)
	case h.Priority < 0:
		prio = fmt.Sprintf("filter - %d", -h.Priority)
	}
	return fmt.Sprintf("type %s hook %s priority %s; policy %s;", h.Type, h.Hook, prio, h.Policy)
}

func renderSet(b *strings.Builder, s *Set) {
	kind := "set"
	if s.IsMap() {
		kind = "map"
	}
	fmt.Fprintf(b, "\t%s %s {\n\t\t%s\n", kind, s.Name, s.TypeText())
	if flags := s.FlagNames(); len(flags) > 0 {
		fmt.Fprintf(b, "\t\tflags %s\n", strings.Join(flags, ","))
	}
	if s.Timeout > 0 {
		fmt.Fprintf(b, "\t\ttimeout %ds\n", int64(s.Timeout/time.Second))
	}
	if s.Size > 0 {
		fmt.Fprintf(b, "\t\tsize %d\n", s.Size)
	}
	if len(s.Elements) > 0 {
		b.WriteString("\t\telements = {")
		for i, e := range s.Elements {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("\n\t\t\t")
			b.WriteString(s.ElementText(e))
		}
		b.WriteString(" }\n")
	}
	b.WriteString("\t}\n")
}

// TypeText is the set's type line: `type K [: D]` or its Typeof.
func (s *Set) TypeText() string {
	if s.Typeof != "" {
		return "typeof " + s.Typeof
	}
	text := "type " + fieldNames(s.Fields)
	switch {
	case s.Verdict:
		text += " : verdict"
	case s.Data != nil:
		text += " : " + fieldNames(s.Data)
	}
	return text
}

// FlagNames are the set's flags as nft names them (dynamic, interval,
// timeout).
func (s *Set) FlagNames() []string {
	var flags []string
	if s.Dynamic {
		flags = append(flags, "dynamic")
	}
	if s.Interval {
		flags = append(flags, "interval")
	}
	if s.Timeout > 0 {
		flags = append(flags, "timeout")
	}
	return flags
}

func fieldNames(fields []FieldType) string {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.String()
	}
	return strings.Join(names, " . ")
}

func (f FieldType) String() string {
	switch f {
	case FieldIPv4:
		return "ipv4_addr"
	case FieldIPv6:
		return "ipv6_addr"
	case FieldProto:
		return "inet_proto"
	case FieldInteger:
		return "integer"
	}
	return "inet_service"
}

// Len is the width of the field's value in bytes (unpadded).
func (f FieldType) Len() int {
	switch f {
	case FieldIPv4:
		return 4
	case FieldIPv6:
		return 16
	case FieldProto:
		return 1
	case FieldInteger:
		return 4
	}
	return 2
}

// fields splits a key into its field values.
func (s *Set) fields(key []byte) [][]byte { return splitFields(s.Fields, key) }

// splitFields splits a key or map value into its field values; more than
// one field is a concatenation, each field padded to 4 bytes.
func splitFields(types []FieldType, key []byte) [][]byte {
	out := make([][]byte, 0, len(types))
	off := 0
	for _, f := range types {
		n := f.Len()
		if off+n > len(key) {
			return nil
		}
		out = append(out, key[off:off+n])
		off += n
		if len(types) > 1 {
			off = (off + 3) &^ 3
		}
	}
	return out
}

// ElementText renders one element as nft writes it: ranges as lo-hi (or
// a CIDR when the range is one), concatenations joined by " . ".
func (s *Set) ElementText(e Element) string {
	lo := s.fields(e.Key)
	hi := lo
	if e.KeyEnd != nil {
		hi = s.fields(e.KeyEnd)
	}
	parts := make([]string, len(s.Fields))
	for i, f := range s.Fields {
		if lo == nil || hi == nil {
			parts[i] = fmt.Sprintf("<bad key %x>", e.Key)
			continue
		}
		l, h := lo[i], hi[i]
		if f == FieldInteger && s.Interval {
			// The kernel keeps an interval set's integer keys in
			// network order (MarkKey); the text is the number.
			l, h = IntegerBytes(binary.BigEndian.Uint32(l)), IntegerBytes(binary.BigEndian.Uint32(h))
		}
		parts[i] = fieldRangeText(f, l, h)
	}
	text := strings.Join(parts, " . ")
	if e.Verdict != nil {
		text += " : " + e.Verdict.String()
	}
	if e.Data != nil {
		text += " : " + valueText(s.Data, e.Data)
	}
	return text
}

// valueText renders a map value.
func valueText(types []FieldType, data []byte) string {
	vals := splitFields(types, data)
	if vals == nil {
		return fmt.Sprintf("<bad value %x>", data)
	}
	parts := make([]string, len(types))
	for i, f := range types {
		parts[i] = fieldRangeText(f, vals[i], vals[i])
	}
	return strings.Join(parts, " . ")
}

func fieldRangeText(f FieldType, lo, hi []byte) string {
	switch f {
	case FieldIPv4, FieldIPv6:
		a, _ := netip.AddrFromSlice(lo)
		z, _ := netip.AddrFromSlice(hi)
		if a == z {
			return a.String()
		}
		if p, ok := RangePrefix(a, z); ok {
			return p.String()
		}
		return a.String() + "-" + z.String()
	case FieldInteger:
		// Host byte order, as numgen and hash write their results.
		l, h := binary.NativeEndian.Uint32(lo), binary.NativeEndian.Uint32(hi)
		if l == h {
			return fmt.Sprint(l)
		}
		return fmt.Sprintf("%d-%d", l, h)
	case FieldProto:
		if lo[0] == hi[0] {
			return ProtoName(lo[0])
		}
		return fmt.Sprintf("%d-%d", lo[0], hi[0])
	}
	l, h := int(lo[0])<<8|int(lo[1]), int(hi[0])<<8|int(hi[1])
	if l == h {
		return fmt.Sprint(l)
	}
	return fmt.Sprintf("%d-%d", l, h)
}

// ProtoName is an IP protocol as nft names it: tcp, udp, ... or the
// number.
func ProtoName(p byte) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 132:
		return "sctp"
	case 1:
		return "icmp"
	case 58:
		return "ipv6-icmp"
	}
	return fmt.Sprint(p)
}

// RangePrefix returns the prefix that covers exactly lo..hi, if there is one.
func RangePrefix(lo, hi netip.Addr) (netip.Prefix, bool) {
	for bits := 0; bits <= lo.BitLen(); bits++ {
		p := netip.PrefixFrom(lo, bits).Masked()
		if p.Addr() != lo {
			continue
		}
		if LastAddr(p) == hi {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// LastAddr is the highest address of a prefix.
func LastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
