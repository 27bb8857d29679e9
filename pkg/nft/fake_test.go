package nft

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFakeElements: the fake kernel finds elements by key across the
// messages of one transaction (an add after a delete in the same
// transaction, a key added twice replaces), rejects deleting an absent
// element, and a failed transaction changes nothing.
func TestFakeElements(t *testing.T) {
	set := &Set{Name: "peers", Fields: []FieldType{FieldIPv4}}
	el := func(b byte) Element { return Element{Key: []byte{10, 0, 0, b}} }
	keys := func(s *Set) []byte {
		var out []byte
		for _, e := range s.Elements {
			out = append(out, e.Key[3])
		}
		slices.Sort(out)
		return out
	}
	tests := []struct {
		name    string
		ops     []Op
		want    []byte // last byte of each key, sorted
		wantErr error
	}{
		{"add in two messages", []Op{{Kind: OpAddElements, Set: set, Elements: []Element{el(1), el(2)}},
			{Kind: OpAddElements, Set: set, Elements: []Element{el(3)}}}, []byte{1, 2, 3}, nil},
		{"add twice is one element", []Op{{Kind: OpAddElements, Set: set, Elements: []Element{el(1)}},
			{Kind: OpAddElements, Set: set, Elements: []Element{el(1), el(2)}}}, []byte{1, 2}, nil},
		{"delete then add back", []Op{{Kind: OpAddElements, Set: set, Elements: []Element{el(1), el(2), el(3)}},
			{Kind: OpDeleteElements, Set: set, Elements: []Element{el(1), el(2)}},
			{Kind: OpAddElements, Set: set, Elements: []Element{el(2), el(4)}}}, []byte{2, 3, 4}, nil},
		{"delete a survivor of an earlier delete", []Op{{Kind: OpAddElements, Set: set, Elements: []Element{el(1), el(2), el(3)}},
			{Kind: OpDeleteElements, Set: set, Elements: []Element{el(1)}},
			{Kind: OpDeleteElements, Set: set, Elements: []Element{el(3)}}}, []byte{2}, nil},
		{"delete an absent element", []Op{{Kind: OpAddElements, Set: set, Elements: []Element{el(1)}},
			{Kind: OpDeleteElements, Set: set, Elements: []Element{el(1)}},
			{Kind: OpDeleteElements, Set: set, Elements: []Element{el(1)}}}, nil, unix.ENOENT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake("netpol")
			create := &Plan{Ops: []Op{{Kind: OpAddTable}, {Kind: OpAddSet, Set: set}}}
			if err := f.mem.exec(create); err != nil {
				t.Fatal(err)
			}
			err := f.mem.exec(&Plan{Ops: tt.ops})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("transaction: got error %v, want %v", err, tt.wantErr)
			}
			got := keys(f.Kernel().Sets["peers"])
			if tt.wantErr != nil && len(got) != 0 {
				t.Fatalf("a failed transaction left elements %v", got)
			}
			if tt.wantErr == nil && !slices.Equal(got, tt.want) {
				t.Fatalf("elements %v, want %v", got, tt.want)
			}
		})
	}
}
