// Package generator makes the conformance suite's cases: families of
// policy sets in the style of cyclonus (target, peers, ports, actions,
// rules, conflicts, namespaces, upstream e2e) plus the admin tiers
// (ANP/BANP v1alpha1, ClusterNetworkPolicy v1alpha2 and v1beta1) and churn,
// all on one fixed base cluster (Base). It is pure and deterministic: the
// same call gives the same cases, byte for byte.
package generator

import (
	"github.com/netpol/netpol/internal/corpus"
	"github.com/netpol/netpol/pkg/l4"
)

// Case is one conformance case: a sequence of steps on the base cluster.
// Every step is probed in full (every pod pair of the base, every probe
// port) and compared with the evaluator.
type Case struct {
	// Name is unique in the suite, e.g. "peers/ipblock-except".
	Name string `json:"name"`
	// Tags select cases (--include/--exclude): target, peers, ports,
	// action, rules, conflict, namespaces, upstream-e2e, admin, baseline,
	// pass, priority, networks, nodes, churn, and more specific ones.
	Tags        []string `json:"tags"`
	Description string   `json:"description,omitempty"`
	// Steps change the base cluster cumulatively: the objects of step i
	// stay unless a later step deletes them. The base is restored between
	// cases.
	Steps []Step `json:"steps"`
}

// Step is one change of the cluster state, then a full probe round. Apply
// holds YAML documents (policies, or pods and namespaces with new labels,
// new pods); Delete the objects to remove first.
type Step = corpus.Step

// Probes are the ports every step is probed on: TCP and UDP 80 and 81,
// and SCTP 80 and 81 where the kernel has SCTP (the runner drops them,
// with a note, where it does not).
func Probes() []l4.Port {
	return []l4.Port{
		{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 81},
		{Protocol: "UDP", Port: 80}, {Protocol: "UDP", Port: 81},
		{Protocol: "SCTP", Port: 80}, {Protocol: "SCTP", Port: 81},
	}
}
