package kernel

import (
	"errors"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// TestFakeElements: the fake kernel finds elements by key across the
// messages of one transaction (an add after a delete in the same
// transaction, a key added twice replaces), rejects deleting an absent
// element, and a failed transaction changes nothing.
func TestFakeElements(t *testing.T) {
	set := &nft.Set{Name: "peers", Fields: []nft.FieldType{nft.FieldIPv4}}
	el := func(b byte) nft.Element { return nft.Element{Key: []byte{10, 0, 0, b}} }
	keys := func(s *nft.Set) []byte {
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
		{"add in two messages", []Op{{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(1), el(2)}},
			{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(3)}}}, []byte{1, 2, 3}, nil},
		{"add twice is one element", []Op{{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(1)}},
			{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(1), el(2)}}}, []byte{1, 2}, nil},
		{"delete then add back", []Op{{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(1), el(2), el(3)}},
			{Kind: OpDeleteElements, Set: set, Elements: []nft.Element{el(1), el(2)}},
			{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(2), el(4)}}}, []byte{2, 3, 4}, nil},
		{"delete a survivor of an earlier delete", []Op{{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(1), el(2), el(3)}},
			{Kind: OpDeleteElements, Set: set, Elements: []nft.Element{el(1)}},
			{Kind: OpDeleteElements, Set: set, Elements: []nft.Element{el(3)}}}, []byte{2}, nil},
		{"delete an absent element", []Op{{Kind: OpAddElements, Set: set, Elements: []nft.Element{el(1)}},
			{Kind: OpDeleteElements, Set: set, Elements: []nft.Element{el(1)}},
			{Kind: OpDeleteElements, Set: set, Elements: []nft.Element{el(1)}}}, nil, unix.ENOENT},
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

// TestFakeUndoesFailedTransaction: a transaction that fails at its last
// message leaves the table as it was, whatever came before in it
// (elements replaced and deleted, chains flushed and rewritten, sets added
// and deleted), and later transactions still find every element.
func TestFakeUndoesFailedTransaction(t *testing.T) {
	peers := &nft.Set{Name: "peers", Fields: []nft.FieldType{nft.FieldIPv4}}
	gone := &nft.Set{Name: "gone", Fields: []nft.FieldType{nft.FieldIPv4}}
	el := func(b byte) nft.Element { return nft.Element{Key: []byte{10, 0, 0, b}} }
	chain := &nft.Chain{Name: "c"}
	rule := func(kind nft.VerdictKind) *nft.Rule { return nft.NewRule().Verdict(nft.Verdict{Kind: kind}) }
	f := NewFake("netpol")
	setup := &Plan{Ops: []Op{{Kind: OpAddTable}, {Kind: OpAddSet, Set: peers}, {Kind: OpAddSet, Set: gone},
		{Kind: OpAddElements, Set: peers, Elements: []nft.Element{el(1), el(2), el(3)}},
		{Kind: OpAddChain, Chain: chain}, {Kind: OpAddRule, Chain: chain, Rule: rule(nft.Accept)}}}
	if err := f.mem.exec(setup); err != nil {
		t.Fatal(err)
	}
	before := f.Kernel()
	failing := &Plan{Ops: []Op{
		{Kind: OpDeleteElements, Set: peers, Elements: []nft.Element{el(1)}},
		{Kind: OpAddElements, Set: peers, Elements: []nft.Element{el(2), el(9)}},
		{Kind: OpFlushChain, Chain: chain},
		{Kind: OpAddRule, Chain: chain, Rule: rule(nft.Drop)},
		{Kind: OpDeleteSet, Set: gone},
		{Kind: OpAddSet, Set: &nft.Set{Name: "new", Fields: []nft.FieldType{nft.FieldIPv4}}},
		{Kind: OpAddChain, Chain: &nft.Chain{Name: "d"}},
		{Kind: OpDeleteElements, Set: peers, Elements: []nft.Element{el(7)}}, // absent: fails
	}}
	if err := f.mem.exec(failing); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("got %v, want ENOENT", err)
	}
	if d := Diff(f.Kernel(), before); !d.Empty() {
		t.Fatalf("the failed transaction left %d differences", len(d.Ops))
	}
	if got := f.Kernel().Chains["c"].Rules; len(got) != 1 || got[0].ID() != rule(nft.Accept).ID() {
		t.Fatalf("chain c holds %d rules after the rollback, want the one it had", len(got))
	}
	ok := &Plan{Ops: []Op{{Kind: OpDeleteElements, Set: peers, Elements: []nft.Element{el(1), el(3)}}}}
	if err := f.mem.exec(ok); err != nil {
		t.Fatalf("after the rollback: %v", err)
	}
	if got := f.Kernel().Sets["peers"].Elements; len(got) != 1 || got[0].Key[3] != 2 {
		t.Fatalf("peers holds %v, want 10.0.0.2 only", got)
	}
}
