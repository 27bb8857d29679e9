package compiler

import (
	"net/netip"
	"slices"
)

// addrIndex finds the pods that hold an address, in the order they came.
// Nearly every address is one pod's, so that pod is held by itself and
// only the rest in a list: a list per address was 3 words and an
// allocation for each of 100,000 pods.
type addrIndex struct {
	first map[netip.Addr]*PodState
	// rest holds, for an address several pods hold (a pod replaced by
	// one that took its address before it went), those after the first.
	rest map[netip.Addr][]*PodState
}

func newAddrIndex(size int) addrIndex {
	return addrIndex{first: make(map[netip.Addr]*PodState, size), rest: map[netip.Addr][]*PodState{}}
}

func (x addrIndex) add(a netip.Addr, p *PodState) {
	if _, ok := x.first[a]; !ok {
		x.first[a] = p
		return
	}
	x.rest[a] = append(x.rest[a], p)
}

func (x addrIndex) remove(a netip.Addr, p *PodState) {
	more := x.rest[a]
	if x.first[a] == p {
		if len(more) == 0 {
			delete(x.first, a)
			return
		}
		x.first[a], more = more[0], more[1:]
	} else {
		more = slices.DeleteFunc(more, func(q *PodState) bool { return q == p })
	}
	if len(more) == 0 {
		delete(x.rest, a)
	} else {
		x.rest[a] = more
	}
}

// at appends the pods that hold a to buf, in the order they came.
func (x addrIndex) at(a netip.Addr, buf []*PodState) []*PodState {
	if p, ok := x.first[a]; ok {
		buf = append(buf, p)
		buf = append(buf, x.rest[a]...)
	}
	return buf
}
