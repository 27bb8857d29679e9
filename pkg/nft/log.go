package nft

import (
	"fmt"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Log sends a copy of the packet to NFLOG group with prefix (`log prefix
// "P" group N`); the packet itself goes on to the rest of the rule. The
// kernel drops the copy, never the packet, when no reader keeps up.
func (b *Builder) Log(group uint16, prefix string) *Builder {
	b.exprs = append(b.exprs, &expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX, Group: group, Data: []byte(prefix)})
	b.words = append(b.words, fmt.Sprintf("log prefix %q group %d", prefix, group))
	return b
}

// LimitRate matches while the rule's packets stay within rate a second,
// burst at once (`limit rate R/second burst B packets`): each rule has its
// own bucket.
func (b *Builder) LimitRate(rate uint64, burst uint32) *Builder {
	b.exprs = append(b.exprs, &expr.Limit{Type: expr.LimitTypePkts, Rate: rate, Unit: expr.LimitTimeSecond, Burst: burst})
	b.words = append(b.words, fmt.Sprintf("limit rate %d/second burst %d packets", rate, burst))
	return b
}

// AuditPrefix starts the log prefix of every rule of netpol's verdict log
// (compiler.Audit): a copy with another prefix on the same NFLOG group is
// another tool's.
const AuditPrefix = "netpol "

// LogPrefix is the prefix of a rule's log statement ("" when it has
// none).
func (r *Rule) LogPrefix() string {
	for _, e := range r.Exprs {
		if l, ok := e.(*expr.Log); ok {
			return string(l.Data)
		}
	}
	return ""
}

// Attribution says what a logging rule's verdict is, in the words of
// `netpol explain -o json`'s deciding side: the verdict log's reader finds
// it by the rule's log prefix. Like a rule's Comment, it is not sent to
// the kernel and not part of the rule's identity.
type Attribution struct {
	Verdict   string `json:"verdict"` // "allow" or "deny"
	Direction string `json:"direction"`
	Tier      string `json:"tier"`
	Policy    string `json:"policy,omitempty"`
	Rule      string `json:"rule,omitempty"`
	Action    string `json:"action"`
	// Staged marks a staged policy's would-be verdict (compiler.Options.Staged):
	// Verdict is what the node would decide were the staged policies
	// enforced, Enforced what it decides, and Tier, Policy, Rule and
	// Action name the staged policy's rule that makes the difference.
	Staged   bool   `json:"staged,omitempty"`
	Enforced string `json:"enforced,omitempty"`
}
