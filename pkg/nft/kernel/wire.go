package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/netpol/netpol/pkg/nft"
)

// Transactions of element operations only (the element stages of a staged
// first sync, and any update that changes only elements) are encoded here
// into one reused buffer instead of by google/nftables. The library builds
// each element as
// attribute structs and byte slices, marshals them, copies the result into
// the message and netlink's SendMessages copies it again into the batch:
// all garbage once sent, allocated while the collector marks the agent's
// largest heap, so it raises the peak. The bytes are the library's
// (TestElementWireMatchesLibrary); only where they are built differs.

// elementsOnly reports whether every operation of the plan is an element
// operation, so that elementWire can encode it.
func (p *Plan) elementsOnly() bool {
	for _, op := range p.Ops {
		if !isElementOp(op) {
			return false
		}
	}
	return len(p.Ops) > 0
}

func isElementOp(op Op) bool {
	return op.Kind == OpAddElements || op.Kind == OpDeleteElements
}

// elementWire is one nfnetlink batch of element messages, as bytes.
type elementWire struct {
	buf []byte
	enc elementEncoder
	seq uint32
	// acks is how many messages asked for an acknowledgement.
	acks int
}

// reserve makes the buffer hold size bytes without growing. A buffer grown
// by append to a first sync's stage (2 MiB) leaves several times that in
// earlier copies behind, when the agent's heap is at its largest.
func (w *elementWire) reserve(size int) {
	if cap(w.buf) < size {
		w.buf = make([]byte, 0, size)
	}
}

// encode makes the buffer the batch that carries the plan's element
// operations on the inet table.
func (w *elementWire) encode(table string, p *Plan) error {
	w.buf, w.acks = w.buf[:0], 0
	w.batchMarker(unix.NFNL_MSG_BATCH_BEGIN)
	for _, op := range p.Ops {
		msg, del := uint16(unix.NFT_MSG_NEWSETELEM), false
		switch op.Kind {
		case OpAddElements:
		case OpDeleteElements:
			msg, del = unix.NFT_MSG_DELSETELEM, true
		default:
			return fmt.Errorf("operation %d is not an element operation", op.Kind)
		}
		if err := w.elements(msg, table, op.Set, w.enc.encode(op.Set, op.Elements, del)); err != nil {
			return fmt.Errorf("elements of set %s: %w", op.Set.Name, err)
		}
	}
	w.batchMarker(unix.NFNL_MSG_BATCH_END)
	return nil
}

// batchMarker appends a batch's begin or end message.
func (w *elementWire) batchMarker(typ uint16) {
	at := w.header(typ, netlink.Request)
	w.buf = append(w.buf, 0, unix.NFNETLINK_V0)
	w.buf = binary.BigEndian.AppendUint16(w.buf, unix.NFNL_SUBSYS_NFTABLES)
	w.endMessage(at)
}

// elements appends one NEWSETELEM or DELSETELEM message, laid out as
// google/nftables' makeElemList lays it out (its attribute types, its
// nesting flags, its order).
func (w *elementWire) elements(msg uint16, table string, s *nft.Set, elems []nftables.SetElement) error {
	at := w.header(unix.NFNL_SUBSYS_NFTABLES<<8|msg, netlink.Request|netlink.Acknowledge|netlink.Create)
	w.acks++
	w.buf = append(w.buf, unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0)
	w.stringAttr(unix.NFTA_SET_NAME, s.Name)
	w.uint32Attr(unix.NFTA_LOOKUP_SET_ID, 0) // by name: the set is not new in this batch
	w.stringAttr(unix.NFTA_SET_TABLE, table)
	list := w.open(unix.NFTA_SET_ELEM_LIST_ELEMENTS | unix.NLA_F_NESTED)
	for i, e := range elems {
		item := w.open(uint16(i+1) | unix.NLA_F_NESTED)
		if e.IntervalEnd {
			w.uint32Attr(unix.NFTA_SET_ELEM_FLAGS|unix.NLA_F_NESTED, unix.NFT_SET_ELEM_INTERVAL_END)
		}
		w.valueAttr(unix.NFTA_SET_ELEM_KEY, e.Key)
		if len(e.KeyEnd) > 0 {
			w.valueAttr(nftables.NFTA_SET_ELEM_KEY_END, e.KeyEnd)
		}
		if e.Timeout != 0 || len(e.Comment) > 0 {
			return errors.New("element timeouts and comments are not encoded here")
		}
		switch {
		case e.VerdictData != nil:
			data := w.open(unix.NFTA_SET_ELEM_DATA | unix.NLA_F_NESTED)
			verdict := w.open(unix.NFTA_DATA_VERDICT | unix.NLA_F_NESTED)
			w.uint32Attr(unix.NFTA_VERDICT_CODE, uint32(e.VerdictData.Kind))
			if e.VerdictData.Chain != "" {
				w.stringAttr(unix.NFTA_VERDICT_CHAIN, e.VerdictData.Chain)
			}
			if err := w.close(verdict); err != nil {
				return err
			}
			if err := w.close(data); err != nil {
				return err
			}
		case len(e.Val) > 0:
			w.valueAttr(unix.NFTA_SET_ELEM_DATA, e.Val)
		}
		if err := w.close(item); err != nil {
			return err
		}
	}
	if err := w.close(list); err != nil {
		return err
	}
	w.endMessage(at)
	return nil
}

// header appends a netlink message header whose length endMessage fills
// in, and returns where it starts.
func (w *elementWire) header(typ uint16, flags netlink.HeaderFlags) int {
	at := len(w.buf)
	w.seq++
	w.buf = binary.NativeEndian.AppendUint32(w.buf, 0)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, typ)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, uint16(flags))
	w.buf = binary.NativeEndian.AppendUint32(w.buf, w.seq)
	w.buf = binary.NativeEndian.AppendUint32(w.buf, 0) // the port id: the kernel's business
	return at
}

func (w *elementWire) endMessage(at int) {
	binary.NativeEndian.PutUint32(w.buf[at:], uint32(len(w.buf)-at))
}

// open appends a nested attribute's header whose length close fills in.
func (w *elementWire) open(typ uint16) int {
	at := len(w.buf)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, 0)
	w.buf = binary.NativeEndian.AppendUint16(w.buf, typ)
	return at
}

// close fills in a nested attribute's length; unlike the library, which
// wraps it silently, it refuses one over the 16 bits it has.
func (w *elementWire) close(at int) error {
	n := len(w.buf) - at
	if n > 0xffff {
		return fmt.Errorf("a netlink attribute of %d bytes (at most 65535)", n)
	}
	binary.NativeEndian.PutUint16(w.buf[at:], uint16(n))
	return nil
}

// attr appends an attribute with its payload, padded to 4 bytes.
func (w *elementWire) attr(typ uint16, data []byte) {
	w.buf = binary.NativeEndian.AppendUint16(w.buf, uint16(4+len(data)))
	w.buf = binary.NativeEndian.AppendUint16(w.buf, typ)
	w.buf = append(w.buf, data...)
	w.pad()
}

// pad aligns the buffer to 4 bytes, as netlink attributes are.
func (w *elementWire) pad() {
	for len(w.buf)%4 != 0 {
		w.buf = append(w.buf, 0)
	}
}

func (w *elementWire) uint32Attr(typ uint16, v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	w.attr(typ, b[:])
}

// stringAttr appends a NUL-terminated string attribute.
func (w *elementWire) stringAttr(typ uint16, s string) {
	w.buf = binary.NativeEndian.AppendUint16(w.buf, uint16(4+len(s)+1))
	w.buf = binary.NativeEndian.AppendUint16(w.buf, typ)
	w.buf = append(w.buf, s...)
	w.buf = append(w.buf, 0)
	w.pad()
}

// valueAttr appends typ{NFTA_DATA_VALUE: v}, nested.
func (w *elementWire) valueAttr(typ uint16, v []byte) {
	at := w.open(typ | unix.NLA_F_NESTED)
	w.attr(unix.NFTA_DATA_VALUE, v)
	// A key or value is at most 64 bytes: the nest cannot overflow.
	binary.NativeEndian.PutUint16(w.buf[at:], uint16(len(w.buf)-at))
}

// send writes the batch to the socket and reads one acknowledgement (or
// error) per message that asked for one, as the library's Flush does. The
// kernel takes a batch whole or not at all.
func (w *elementWire) send(nl *netlink.Conn) error {
	rc, err := nl.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	to := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	if err := rc.Write(func(fd uintptr) bool {
		sendErr = unix.Sendto(int(fd), w.buf, 0, to)
		return sendErr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if sendErr != nil {
		return fmt.Errorf("send: %w", sendErr)
	}
	var errs error
	for got := 0; got < w.acks; {
		msgs, err := nl.Receive()
		if err != nil {
			if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.ENOBUFS) {
				// The kernel sends one error for the batch, or its
				// answers overran the socket: nothing more to count.
				return err
			}
			errs = errors.Join(errs, err)
			got++
			continue
		}
		got += len(msgs)
	}
	return errs
}
