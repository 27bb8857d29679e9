package kernel

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/netpol/netpol/pkg/nft"
)

// elementPlan adds and deletes the elements of every set of fullTable, and
// of a data map and a set with a timeout.
func elementPlan() *Plan {
	t := fullTable()
	t.AddSet(&nft.Set{Name: "backends", Fields: []nft.FieldType{nft.FieldIPv4, nft.FieldProto, nft.FieldPort}, Data: []nft.FieldType{nft.FieldIPv4, nft.FieldPort}, Elements: []nft.Element{
		{Key: exact("10.96.0.1", tcp, 80).Key, Data: []byte{10, 1, 0, 7, 0x1f, 0x90, 0, 0}},
	}})
	t.AddSet(&nft.Set{Name: "recent", Fields: []nft.FieldType{nft.FieldIPv4}, Timeout: 30e9, Elements: []nft.Element{single("10.5.0.1")}})
	p := &Plan{Table: t.Name}
	for _, name := range t.SetNames() {
		s := t.Sets[name]
		p.Ops = append(p.Ops, Op{Kind: OpAddElements, Set: s, Elements: s.Elements})
		p.Ops = append(p.Ops, Op{Kind: OpDeleteElements, Set: s, Elements: s.Elements[:1]})
	}
	return p
}

// The batch elementWire encodes is the one google/nftables would send for
// the same plan, message by message (type, flags and payload; sequence
// numbers and port ids are the sender's).
func TestElementWireMatchesLibrary(t *testing.T) {
	p := elementPlan()
	conn, captured := capturingConn(t)
	if err := queue(conn, "netpol", p); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	sent := *captured

	var w elementWire
	if err := w.encode("netpol", p); err != nil {
		t.Fatal(err)
	}
	ours := splitMessages(t, w.buf)
	if len(ours) != len(sent) || len(ours) != len(p.Ops)+2 {
		t.Fatalf("%d messages, the library sent %d, for %d operations", len(ours), len(sent), len(p.Ops))
	}
	if w.acks != len(p.Ops) {
		t.Errorf("%d acknowledgements asked for, want %d", w.acks, len(p.Ops))
	}
	for i := range ours {
		got, want := ours[i], sent[i]
		if got.Header.Type != want.Header.Type || got.Header.Flags != want.Header.Flags || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("message %d:\n got type %#x flags %v data %x\nwant type %#x flags %v data %x",
				i, got.Header.Type, got.Header.Flags, got.Data, want.Header.Type, want.Header.Flags, want.Data)
		}
	}
	// The buffer is reused: a second encoding is the same bytes.
	first := bytes.Clone(w.buf)
	w.seq = 0
	if err := w.encode("netpol", p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.buf, first) {
		t.Error("a second encoding of the plan differs")
	}
}

// splitMessages parses a batch as the kernel reads it: each message's
// length from its header.
func splitMessages(t *testing.T, b []byte) []netlink.Message {
	t.Helper()
	var out []netlink.Message
	for len(b) > 0 {
		if len(b) < 4 {
			t.Fatalf("message %d: %d bytes left", len(out), len(b))
		}
		n := int(binary.NativeEndian.Uint32(b))
		if n > len(b) || n%4 != 0 {
			t.Fatalf("message %d: length %d, %d bytes left", len(out), n, len(b))
		}
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:n]); err != nil {
			t.Fatalf("message %d: %v", len(out), err)
		}
		out = append(out, m)
		b = b[n:]
	}
	return out
}

// Only element operations are encoded; a nest over 16 bits is refused, not
// wrapped.
func TestElementWireRefuses(t *testing.T) {
	var w elementWire
	if err := w.encode("netpol", &Plan{Ops: []Op{{Kind: OpAddSet, Set: &nft.Set{Name: "s"}}}}); err == nil {
		t.Error("a set operation was encoded")
	}
	s := &nft.Set{Name: "hosts", Fields: []nft.FieldType{nft.FieldIPv4}}
	var many []nft.Element
	for i := range 8000 {
		many = append(many, nft.Element{Key: []byte{10, byte(i >> 8), byte(i), 1}})
	}
	if err := w.encode("netpol", &Plan{Ops: []Op{{Kind: OpAddElements, Set: s, Elements: many}}}); err == nil {
		t.Error("an element list of 8,000 elements (over 64 KiB) was encoded")
	}
}

func TestPlanElementsOnly(t *testing.T) {
	s := &nft.Set{Name: "s", Fields: []nft.FieldType{nft.FieldIPv4}}
	tests := []struct {
		name string
		ops  []Op
		want bool
	}{
		{"empty", nil, false},
		{"adds and deletes", []Op{{Kind: OpDeleteElements, Set: s}, {Kind: OpAddElements, Set: s}}, true},
		{"with a set", []Op{{Kind: OpAddSet, Set: s}, {Kind: OpAddElements, Set: s}}, false},
		{"with a rule", []Op{{Kind: OpAddElements, Set: s}, {Kind: OpFlushChain, Chain: &nft.Chain{Name: "c"}}}, false},
	}
	for _, tt := range tests {
		if got := (&Plan{Ops: tt.ops}).elementsOnly(); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
