package nft

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// QueueKind is how a rule hands packets to a userspace queue (NFQUEUE)
// on a kernel: kernels differ in which of the two they have.
type QueueKind int

const (
	// QueueUnavailable: the kernel takes neither.
	QueueUnavailable QueueKind = iota
	// QueueNative is the nftables queue statement (module nft_queue).
	QueueNative
	// QueueXtables is the xtables NFQUEUE target through nftables'
	// compatibility layer (modules nft_compat and xt_NFQUEUE), for
	// kernels built without nft_queue.
	QueueXtables
)

func (k QueueKind) String() string {
	switch k {
	case QueueNative:
		return "nftables queue statement"
	case QueueXtables:
		return "xtables NFQUEUE target (nft compat)"
	}
	return "no queue"
}

// QueueExprs are the expressions of a rule's queue statement: to queue
// num, with bypass (when no program has the queue open, packets go on
// as if the rule were not there, instead of being dropped). The
// statement ends the packet's walk through the chain: the reader's
// verdict decides what happens next (accept continues at the next hook).
func QueueExprs(k QueueKind, num uint16) ([]expr.Any, error) {
	switch k {
	case QueueNative:
		return []expr.Any{&expr.Queue{Num: num, Flag: expr.QueueFlagBypass}}, nil
	case QueueXtables:
		// struct xt_NFQ_info_v3 (host byte order): queuenum,
		// queues_total, flags (NFQ_FLAG_BYPASS = 1).
		info := make(xt.Unknown, 6)
		binary.NativeEndian.PutUint16(info[0:], num)
		binary.NativeEndian.PutUint16(info[2:], 1)
		binary.NativeEndian.PutUint16(info[4:], 1)
		return []expr.Any{&expr.Target{Name: "NFQUEUE", Rev: 3, Info: &info}}, nil
	}
	return nil, errors.New("nft: no queue statement on this kernel")
}

// Queue ends a rule with a queue statement of kind k (QueueExprs). The
// two kinds have different texts (the text is the rule's identity); the
// native one is nft syntax, the xtables one is what iptables would say.
func (b *Builder) Queue(k QueueKind, num uint16) (*Rule, error) {
	exprs, err := QueueExprs(k, num)
	if err != nil {
		return nil, err
	}
	b.exprs = append(b.exprs, exprs...)
	if k == QueueNative {
		b.words = append(b.words, fmt.Sprintf("queue flags bypass to %d", num))
	} else {
		b.words = append(b.words, fmt.Sprintf("xt target NFQUEUE --queue-num %d --queue-bypass", num))
	}
	return b.rule(), nil
}

// Counter counts the packets and bytes that reach it (`counter`):
// RuleCounters reads them.
func (b *Builder) Counter() *Builder {
	b.exprs = append(b.exprs, &expr.Counter{})
	b.words = append(b.words, "counter")
	return b
}

// QueueNum is the queue a queue statement of either kind sends to; ok is
// false for any other expression.
func QueueNum(e expr.Any) (num uint16, ok bool) {
	switch e := e.(type) {
	case *expr.Queue:
		return e.Num, true
	case *expr.Target:
		if info, isRaw := e.Info.(*xt.Unknown); e.Name == "NFQUEUE" && isRaw && len(*info) >= 2 {
			return binary.NativeEndian.Uint16((*info)[0:]), true
		}
	}
	return 0, false
}
