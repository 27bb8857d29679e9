package nft

import (
	"testing"
)

// BenchmarkApplyIncremental measures one Apply that adds an element and one
// that removes it again (one op = both), against a 10k-element set: the pod
// add/remove path. It includes the diff of the whole table.
func BenchmarkApplyIncremental(b *testing.B) {
	sets := []struct {
		name string
		set  func() *Set
		elem func(i int) Element
	}{
		{
			name: "hash10k",
			set:  func() *Set { return &Set{Name: "pods4", Fields: []FieldType{FieldIPv4}} },
			elem: func(i int) Element { return Element{Key: []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}} },
		},
		{
			name: "concat10k",
			set: func() *Set {
				return &Set{Name: "allow4", Fields: []FieldType{FieldIPv4, FieldProto, FieldPort}, Interval: true}
			},
			elem: func(i int) Element {
				a := []byte{10, byte(i >> 16), byte(i >> 8), byte(i)}
				return Element{Key: Key(a, ProtoBytes(tcp), PortBytes(8000)), KeyEnd: Key(a, ProtoBytes(tcp), PortBytes(8100))}
			},
		},
	}
	for _, bs := range sets {
		b.Run(bs.name, func(b *testing.B) {
			a, _ := newTestApplier(b)
			s := bs.set()
			for i := 0; i < 10000; i++ {
				s.Elements = append(s.Elements, bs.elem(i))
			}
			d := NewTable("netpol")
			d.AddSet(s)
			if _, err := a.Apply(d); err != nil {
				b.Fatal(err)
			}
			base := s.Elements
			with := append(base[:len(base):len(base)], bs.elem(1<<20))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				s.Elements = with
				if st, err := a.Apply(d); err != nil || st.ElementsAdded != 1 {
					b.Fatalf("add: %+v, %v", st, err)
				}
				s.Elements = base
				if st, err := a.Apply(d); err != nil || st.ElementsDeleted != 1 {
					b.Fatalf("remove: %+v, %v", st, err)
				}
			}
		})
	}
}
