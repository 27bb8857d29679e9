package agent

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/netpol/netpol/pkg/nft"
	"github.com/netpol/netpol/pkg/node"
)

// ModelView is the node's compiled model as /debug/model serves it: every
// chain's rules and every set's elements as nft text.
type ModelView struct {
	Node string `json:"node"`
	// Generation counts the agent's successful syncs.
	Generation int64               `json:"generation"`
	Table      string              `json:"table"`
	Chains     map[string][]string `json:"chains"`
	Sets       map[string][]string `json:"sets"`
	// Counters, in a watch stream's counters line (Chains and Sets
	// empty), are the per-rule counters whose values changed since the
	// stream's last such line (every one, in its first).
	Counters []node.RuleCount `json:"counters,omitempty"`
}

// IsCounters says the line is a counters line.
func (m *ModelView) IsCounters() bool { return m.Chains == nil && m.Sets == nil && m.Counters != nil }

// sharedRuleCounts is one read of the per-rule counters from the kernel
// for every watch stream: at most one per half watchCounters, however
// many watch (each read is a dump of thousands of counter objects).
type sharedRuleCounts struct {
	mu     sync.Mutex
	at     time.Time
	counts []node.RuleCount // read-only once read
	err    error
}

// read is the last read if recent, else a new one with read.
func (s *sharedRuleCounts) read(read func() ([]node.RuleCount, error)) ([]node.RuleCount, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.at) >= watchCounters/2 {
		s.counts, s.err = read()
		s.at = time.Now()
	}
	return s.counts, s.err
}

// countersLine is a watch stream's counters line: the counters of now
// that differ from sent (nil: none, then every one), which it updates;
// nil when none changed.
func countersLine(nodeName string, gen int64, now []node.RuleCount, sent map[string]nft.CounterValue) []byte {
	var changed []node.RuleCount
	for _, c := range now {
		if v, ok := sent[c.Counter]; !ok || v != c.CounterValue {
			changed = append(changed, c)
			sent[c.Counter] = c.CounterValue
		}
	}
	if len(changed) == 0 {
		return nil
	}
	b, _ := json.Marshal(&ModelView{Node: nodeName, Generation: gen, Counters: changed})
	return append(b, '\n')
}

func newModelView(node string, gen int64, t *nft.Table) *ModelView {
	m := &ModelView{Node: node, Generation: gen, Table: t.Name, Chains: map[string][]string{}, Sets: map[string][]string{}}
	for name, c := range t.Chains {
		rules := make([]string, len(c.Rules))
		for i, r := range c.Rules {
			rules[i] = r.Text
		}
		m.Chains[name] = rules
	}
	for name, s := range t.Sets {
		elems := make([]string, len(s.Elements))
		for i, e := range s.Elements {
			elems[i] = s.ElementText(e)
		}
		m.Sets[name] = elems
	}
	return m
}

// Lines flattens the model into sorted lines, one per rule and element,
// for a line diff ("netpol model watch").
func (m *ModelView) Lines() []string {
	var out []string
	for name, rules := range m.Chains {
		for i, r := range rules {
			out = append(out, fmt.Sprintf("chain %s [%d] %s", name, i, r))
		}
	}
	for name, elems := range m.Sets {
		for _, e := range elems {
			out = append(out, fmt.Sprintf("set %s %s", name, e))
		}
	}
	sort.Strings(out)
	return out
}

// DiffLines returns the lines of next missing from prev ("+ ...") and the
// lines of prev missing from next ("- ..."), in order.
func DiffLines(prev, next []string) []string {
	in := func(lines []string) map[string]bool {
		m := make(map[string]bool, len(lines))
		for _, l := range lines {
			m[l] = true
		}
		return m
	}
	p, n := in(prev), in(next)
	var out []string
	for _, l := range prev {
		if !n[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range next {
		if !p[l] {
			out = append(out, "+ "+l)
		}
	}
	return out
}
