package proxy

import "github.com/netpol/netpol/pkg/nft"

// chunkLen is how many elements one chunk of a set being built holds
// (40 KB: large enough that the chunk list stays short, small enough that
// a set's last, partly used chunk wastes little).
const chunkLen = 512

// elemStore is a shared set's elements. While the set is first built they
// are kept in fixed chunks: a list grown by append copies itself each time
// it outgrows its capacity (1.25x at a time once large), and those copies
// are garbage, several times the lists' size, made when the agent's memory
// peaks. The table then wants
// one list per set; list makes it once, at its final length (and a little
// room, so the next Service added does not copy it at once), and later
// changes, which are small, go to that list.
type elemStore struct {
	flat   []nft.Element
	chunks [][]nft.Element // in use until flat is first made
	n      int
}

func (st *elemStore) len() int { return st.n }

// at is the element at position i (i < len).
func (st *elemStore) at(i int) *nft.Element {
	if st.chunks == nil {
		return &st.flat[i]
	}
	return &st.chunks[i/chunkLen][i%chunkLen]
}

// push adds e at position len.
func (st *elemStore) push(e nft.Element) {
	st.n++
	if st.chunks == nil && st.flat != nil {
		st.flat = append(st.flat, e)
		return
	}
	last := len(st.chunks) - 1
	if last < 0 || len(st.chunks[last]) == chunkLen {
		// The first chunk grows by append (most sets stay small); the
		// next ones are made at their full length.
		capacity := 0
		if last >= 0 {
			capacity = chunkLen
		}
		st.chunks = append(st.chunks, make([]nft.Element, 0, capacity))
		last++
	}
	st.chunks[last] = append(st.chunks[last], e)
}

// pop removes the element at position len-1, clearing it (it holds the
// element's bytes).
func (st *elemStore) pop() {
	st.n--
	if st.chunks == nil {
		st.flat[st.n] = nft.Element{}
		st.flat = st.flat[:st.n]
		return
	}
	last := len(st.chunks) - 1
	c := st.chunks[last]
	c[len(c)-1] = nft.Element{}
	if st.chunks[last] = c[:len(c)-1]; len(st.chunks[last]) == 0 {
		st.chunks[last] = nil
		st.chunks = st.chunks[:last] // not nil: still being built
	}
}

// list is the elements as one list, the set's own (valid until the next
// change). The first call copies the chunks into it.
func (st *elemStore) list() []nft.Element {
	if st.chunks == nil {
		return st.flat
	}
	flat := make([]nft.Element, st.n, st.n+st.n/16)
	i := 0
	for _, c := range st.chunks {
		i += copy(flat[i:], c)
	}
	st.flat, st.chunks = flat, nil
	return flat
}
