package nft

import (
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Counter is a named counter object of the table (`counter NAME`): the
// rules that name it (CountInto) add their packets and bytes to it. It
// lives apart from the rules, so a rule rewritten or moved to another
// chain goes on counting where it left off; only deleting the object
// starts it again.
type Counter struct {
	Name string
	// Of says what the counter counts (not sent to the kernel).
	Of CounterOf
}

// CounterOf names the policy rule a counter counts: the labels of
// netpol_policy_rule_packets_total and _bytes_total.
type CounterOf struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Rule      string `json:"rule"`
	Action    string `json:"action"`
	Direction string `json:"direction"`
	// Staged marks a counter of a staged policy's would-be verdicts
	// (compiler.Options.Staged): the connections the policy would decide
	// otherwise (Verdict: would allow or deny) were it enforced.
	Staged  bool   `json:"staged,omitempty"`
	Verdict string `json:"verdict,omitempty"`
}

// Policy is the counted policy as explain names it: "KIND NAMESPACE/NAME",
// or "KIND NAME" for a cluster-scoped one.
func (o CounterOf) Policy() string {
	if o.Namespace != "" {
		return o.Kind + " " + o.Namespace + "/" + o.Name
	}
	return o.Kind + " " + o.Name
}

// CounterValue is what a counter holds.
type CounterValue struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

// AddCounter adds (or returns the existing) counter with that name.
func (t *Table) AddCounter(c *Counter) *Counter {
	if old, ok := t.Counters[c.Name]; ok {
		return old
	}
	if t.Counters == nil {
		t.Counters = map[string]*Counter{}
	}
	t.Counters[c.Name] = c
	return c
}

// CounterNames returns the counter names in order.
func (t *Table) CounterNames() []string {
	names := make([]string, 0, len(t.Counters))
	for n := range t.Counters {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// CountInto adds the packet to the named counter object (`counter name
// "NAME"`).
func (b *Builder) CountInto(name string) *Builder {
	b.exprs = append(b.exprs, &expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: name})
	b.words = append(b.words, fmt.Sprintf("counter name %q", name))
	return b
}

// CounterNames are the counter objects the rule counts into, in order.
func (r *Rule) CounterNames() []string {
	var out []string
	for _, e := range r.Exprs {
		if o, ok := e.(*expr.Objref); ok && o.Type == unix.NFT_OBJECT_COUNTER {
			out = append(out, o.Name)
		}
	}
	return out
}

// ValidateCounterRefs reports a counter the rule counts into that the
// table does not hold (the kernel's refusal names neither).
func (t *Table) ValidateCounterRefs(r *Rule) error {
	for _, c := range r.CounterNames() {
		if t.Counters[c] == nil {
			return fmt.Errorf("a rule counts into counter %q, which the table does not hold", c)
		}
	}
	return nil
}

func renderCounters(b *strings.Builder, t *Table) {
	for _, name := range t.CounterNames() {
		fmt.Fprintf(b, "\tcounter %s {\n\t}\n", name)
	}
}
