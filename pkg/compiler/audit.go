package compiler

import (
	"errors"
	"fmt"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// The verdict log (Options.Audit): the rules of the identity layout that
// decide a connection (an Admin or Baseline rule's Accept or Deny, a
// NetworkPolicy tier's allow or isolation, the default allow of a class)
// carry a log statement to one NFLOG group, before their verdict. Only a
// connection's first packet reaches them (each base chain accepts
// established traffic first), so a line is a decision. The log prefix
// names an nft.Attribution kept on the rule: the tier, policy, rule and
// action `netpol explain -o json` gives the deciding side. A NetworkPolicy
// tier whose allows are logged is laid out a rule at a time, in the
// evaluator's order, so that the first rule that matches is the one
// logged, as explain names it.

// Audit turns the verdict log on.
type Audit struct {
	// Mode is what is logged of a policy without the netpol.io/audit
	// annotation, and of the default allow: policy.AuditOff, AuditDeny or
	// AuditAll.
	Mode string
	// Group is the NFLOG group.
	Group uint16
	// Rate is the most copies a second each logging rule makes, twice
	// that at once (default DefaultAuditRate): past it a decision is
	// counted, not copied, so that a flood costs the kernel and the reader
	// a bounded amount, whatever the traffic.
	Rate uint64
}

// DefaultAuditRate is a logging rule's copies a second unless told.
const DefaultAuditRate = 1000

// DefaultAuditGroup is the verdict log's NFLOG group unless told.
const DefaultAuditGroup = 100

// errAuditLayout: the address layout has no verdict log.
var errAuditLayout = errors.New("the verdict log (--audit) needs the identity layout (--layout identities, the default)")

// modeOf is what is logged of p's decisions (p nil: the default allow's).
func (a *Audit) modeOf(p *policy.Policy) string {
	if p != nil && p.Audit != "" {
		return p.Audit
	}
	return a.Mode
}

// logs says whether mode logs a decision that allows or denies.
func logs(mode string, allow bool) bool {
	return mode == policy.AuditAll || mode == policy.AuditDeny && !allow
}

// auditLog is the log statement and attribution of one deciding rule; nil
// when the verdict log does not write it.
type auditLog struct {
	group uint16
	rate  uint64
	at    nft.Attribution
}

// logFor is the log of a decision of mode's (nil: not logged).
func (a *Audit) logFor(mode string, at nft.Attribution) *auditLog {
	if a == nil || !logs(mode, at.Verdict == "allow") {
		return nil
	}
	rate := a.Rate
	if rate == 0 {
		rate = DefaultAuditRate
	}
	return &auditLog{group: a.Group, rate: rate, at: at}
}

// prefix names the attribution: a reader finds it among the table's
// rules (AuditAttributions).
func (l *auditLog) prefix() string {
	at := l.at
	key := fmt.Sprintf("%s|%s|%s|%s|%s|%s", at.Verdict, at.Direction, at.Tier, at.Policy, at.Rule, at.Action)
	if at.Staged {
		key += "|staged|" + at.Enforced
	}
	return nft.AuditPrefix + contentID(key)
}

func verdictWord(a policy.Action) string {
	if a == policy.Deny {
		return "deny"
	}
	return "allow"
}

// AuditAttributions are the attributions of a table's logging rules by
// their log prefix: what the verdict log's reader names a line with.
func AuditAttributions(t *nft.Table) map[string]nft.Attribution {
	out := map[string]nft.Attribution{}
	for _, ch := range t.Chains {
		for _, r := range ch.Rules {
			if prefix := r.LogPrefix(); r.Attribution != nil && prefix != "" {
				out[prefix] = *r.Attribution
			}
		}
	}
	return out
}

// logOf is the log of a decision of policy p's (nil: not logged).
func (a *Audit) logOf(p *policy.Policy, at nft.Attribution) *auditLog {
	if a == nil {
		return nil
	}
	return a.logFor(a.modeOf(p), at)
}

// npModeOf is what is logged of a NetworkPolicy tier's decisions: the most
// any of its isolating policies asks.
func (a *Audit) npModeOf(pols []*policy.Policy) string {
	mode := policy.AuditOff
	for _, p := range pols {
		switch m := a.modeOf(p); {
		case m == policy.AuditAll:
			return m
		case m == policy.AuditDeny:
			mode = m
		}
	}
	return mode
}

// defaultAllow is the verdict of a connection no policy decided in
// direction d: allowed(d), through a chain that logs it when the verdict
// log writes allows.
func (c *idCompiler) defaultAllow(d policy.Direction) nft.Verdict {
	log := c.audit.logOf(nil, nft.Attribution{Verdict: "allow", Direction: d.String(), Tier: policy.TierDefault.String(), Action: policy.Accept.String()})
	if log == nil {
		return c.allowed(d)
	}
	name := "audit-default-" + directionPrefix(d)
	if c.t.Chains[name] == nil {
		rules := c.decider(log).decide(nft.NewRule, c.allowed(d))
		for _, r := range rules {
			r.Comment = "no policy decided: the default allows (the verdict log)"
		}
		c.t.AddChain(&nft.Chain{Name: name, Rules: rules})
	}
	return nft.Verdict{Kind: nft.Goto, Chain: name}
}
