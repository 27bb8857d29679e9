package dataplane_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/policy"
)

// TestCorpusCountedTracedEqualsEvaluator: the per-rule counters, and the
// NetworkPolicy tier laid out a rule at a time for them, change no
// verdict: every cell of every corpus step traced through the agent's
// counting tables equals the evaluator's.
func TestCorpusCountedTracedEqualsEvaluator(t *testing.T) {
	corpusTraced(t, dataplane.Options{Layout: compiler.LayoutIdentities, RuleCounters: true})
}

// TestCorpusCounterAttribution: for every cell of every corpus step, the
// counters of the rules the first packet matches as it crosses the
// nodes' tables are exactly the policy rules explain says decided, in
// order: each side a policy polices (egress, then ingress if egress let
// the packet on), its Pass rules that matched, then the rule that decided,
// or each isolating policy's isolation; nothing for the default allow or a
// pod's own node.
func TestCorpusCounterAttribution(t *testing.T) {
	counted := 0
	cells := corpusCells(t, dataplane.Options{Layout: compiler.LayoutIdentities, RuleCounters: true}, func(t *testing.T, c cell) {
		of := map[string]nft.CounterOf{}
		for _, n := range c.dp.Nodes() {
			for name, k := range n.Policy.Counters {
				of[name] = k.Of
			}
		}
		want := expectedCounters(c.v, c.egress, c.ingress)
		for _, p := range c.paths {
			got := countedRules(p, of)
			counted += len(got)
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("%s: counted\n  %s\nexplain\n  %s", c, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		}
	})
	t.Logf("%d cells, %d counts: each as explain names the rule", cells, counted)
}

// expectedCounters are the counters explain's verdict says the tables
// count into, as counterText writes them.
func expectedCounters(v *eval.Verdict, egress, ingress bool) []string {
	var out []string
	for d, dv := range decidingSides(v, egress, ingress) {
		for _, s := range dv.Skipped {
			if strings.HasPrefix(s.Why, "matched: Pass") {
				out = append(out, fmt.Sprintf("%s %s %s %s", d, s.Policy, s.Rule, s.Action))
			}
		}
		switch {
		case dv.Tier == policy.TierNetworkPolicy.String() && dv.Action == policy.Deny.String():
			for ref := range strings.SplitSeq(dv.Policy, ", ") {
				out = append(out, fmt.Sprintf("%s %s %s %s", d, ref, compiler.IsolationRule, dv.Action))
			}
		case dv.Policy != "":
			out = append(out, fmt.Sprintf("%s %s %s %s", d, dv.Policy, dv.Rule, dv.Action))
		}
	}
	return out
}

var counterName = regexp.MustCompile(`counter name "([^"]+)"`)

// countedRules are the policy rules of the counters the rules a path's
// packet matched count into, in the order it met them.
func countedRules(p dataplane.Path, of map[string]nft.CounterOf) []string {
	var out []string
	for _, h := range p.Hops {
		for _, s := range h.Result.Steps {
			if !s.Matched {
				continue
			}
			for _, m := range counterName.FindAllStringSubmatch(s.Text, -1) {
				k, ok := of[m[1]]
				if !ok {
					out = append(out, "unknown counter "+m[1])
					continue
				}
				out = append(out, fmt.Sprintf("%s %s %s %s", k.Direction, k.Policy(), k.Rule, k.Action))
			}
		}
	}
	return out
}
