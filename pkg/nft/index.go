package nft

// setIndex finds a set's elements by identity. The Applier's cache keeps one
// per set and updates it with each applied plan, so that a diff costs one
// map lookup per desired element and no allocation for unchanged ones.
type setIndex struct {
	elems []Element        // canonical, distinct; owned (copied) bytes
	pos   map[string]int32 // elementID -> position in elems
}

// newSetIndex indexes canonical copies of the set's elements.
func newSetIndex(s *Set, copyBytes bool) *setIndex {
	idx := &setIndex{elems: make([]Element, 0, len(s.Elements)), pos: make(map[string]int32, len(s.Elements))}
	var buf []byte
	for _, e := range s.Elements {
		e = normalElement(s, e)
		buf = appendElementID(buf[:0], e)
		if _, dup := idx.pos[string(buf)]; dup {
			continue
		}
		if copyBytes {
			e = copyElement(e)
		}
		idx.pos[string(buf)] = int32(len(idx.elems))
		idx.elems = append(idx.elems, e)
	}
	return idx
}

// indexOf returns the set's persistent index (cache sets) or a temporary one.
func indexOf(s *Set) *setIndex {
	if s.index != nil {
		return s.index
	}
	return newSetIndex(s, false)
}

// remove drops an element (swap with the last).
func (idx *setIndex) remove(e Element, buf []byte) []byte {
	buf = appendElementID(buf[:0], e)
	i, ok := idx.pos[string(buf)]
	if !ok {
		return buf
	}
	delete(idx.pos, string(buf))
	last := int32(len(idx.elems) - 1)
	if i != last {
		moved := idx.elems[last]
		idx.elems[i] = moved
		buf = appendElementID(buf[:0], moved)
		idx.pos[string(buf)] = i
	}
	idx.elems[last] = Element{}
	idx.elems = idx.elems[:last]
	return buf
}

// add appends a copy of a canonical element not yet present.
func (idx *setIndex) add(e Element, buf []byte) []byte {
	buf = appendElementID(buf[:0], e)
	if _, ok := idx.pos[string(buf)]; ok {
		return buf
	}
	idx.pos[string(buf)] = int32(len(idx.elems))
	idx.elems = append(idx.elems, copyElement(e))
	return buf
}

// appendElementID appends the element's identity: key, key end, verdict.
// Keys of one set have one length, so the lengths keep the parts apart.
func appendElementID(b []byte, e Element) []byte {
	b = append(b, e.Key...)
	b = append(b, '|')
	b = append(b, e.KeyEnd...)
	if v := e.Verdict; v != nil {
		b = append(b, '|', byte(v.Kind))
		b = append(b, v.Chain...)
	}
	if e.Data != nil {
		b = append(b, '|')
		b = append(b, e.Data...)
	}
	return b
}

func copyElement(e Element) Element {
	c := Element{Key: append([]byte(nil), e.Key...)}
	if e.KeyEnd != nil {
		c.KeyEnd = append([]byte(nil), e.KeyEnd...)
	}
	if e.Verdict != nil {
		v := *e.Verdict
		c.Verdict = &v
	}
	if e.Data != nil {
		c.Data = append([]byte(nil), e.Data...)
	}
	return c
}
