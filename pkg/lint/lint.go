// Package lint finds what in a cluster's policies does not do what it
// seems to (netpol lint): rules that never decide, Admin policies whose
// order the API leaves undefined, selectors, peers and named ports that
// match nothing in the snapshot, and domainNames where network-policy-api
// no longer allows them. Each warning names the object, the field and why,
// in the words explain uses.
package lint

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// Kind is what a warning is about.
type Kind string

const (
	// ShadowedRule: earlier rules (of the policy, or of a policy that
	// comes first) match every connection the rule matches.
	ShadowedRule Kind = "shadowed-rule"
	// AmbiguousPriority: two Admin or Baseline policies of one priority
	// have rules that match the same connections with different actions.
	AmbiguousPriority Kind = "ambiguous-priority"
	// SelectsNothing: the policy's subject (a NetworkPolicy's
	// podSelector) selects no pod.
	SelectsNothing Kind = "selects-nothing"
	// PeerMatchesNothing: a pods, namespaces or nodes peer matches none.
	PeerMatchesNothing Kind = "peer-matches-nothing"
	// NamedPortUnresolved: a named port resolves on no pod the rule
	// reaches.
	NamedPortUnresolved Kind = "named-port-unresolved"
	// DomainNames: domainNames outside the Admin tier or in a rule whose
	// action is not Accept (network-policy-api rejects both).
	DomainNames Kind = "domain-names"
)

// Object names a policy object.
type Object struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

func (o Object) String() string {
	return cluster.ObjectKey{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name}.String()
}

// Warning is one finding.
type Warning struct {
	Kind    Kind   `json:"kind"`
	Object  Object `json:"object"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (w Warning) String() string {
	return fmt.Sprintf("%s: %s: %s (%s)", w.Object, w.Field, w.Message, w.Kind)
}

// Run lints the model's policies against the snapshot they were built
// from. Warnings come by object, then field.
func Run(snap *cluster.Snapshot, model *policy.Model) []Warning {
	l := &linter{model: model, nsLabels: map[string]labels.Set{}}
	for _, ns := range snap.Namespaces {
		set := labels.Set{}
		for k, v := range ns.Labels {
			set[k] = v
		}
		set[corev1.LabelMetadataName] = ns.Name
		l.nsLabels[ns.Name] = set
	}
	for _, p := range snap.Pods {
		if p.Spec.HostNetwork || cluster.PodFinished(p) {
			continue // policy selects pod-network pods
		}
		l.pods = append(l.pods, p)
		if l.nsLabels[p.Namespace] == nil {
			l.nsLabels[p.Namespace] = labels.Set{corev1.LabelMetadataName: p.Namespace}
		}
	}
	for _, n := range snap.Nodes {
		l.nodes = append(l.nodes, labels.Set(n.Labels))
	}
	for _, p := range model.Policies {
		l.subject(p)
		for _, d := range policy.Directions {
			for i := range p.Rules[d] {
				l.rule(p, d, &p.Rules[d][i])
			}
		}
	}
	l.shadowed()
	l.ambiguous()
	slices.SortStableFunc(l.out, func(a, b Warning) int {
		return cmp.Or(strings.Compare(a.Object.String(), b.Object.String()), strings.Compare(a.Field, b.Field))
	})
	return l.out
}

type linter struct {
	model    *policy.Model
	nsLabels map[string]labels.Set
	pods     []*corev1.Pod
	nodes    []labels.Set
	out      []Warning
}

func (l *linter) warn(kind Kind, p *policy.Policy, field, format string, args ...any) {
	l.out = append(l.out, Warning{Kind: kind, Object: Object{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name},
		Field: field, Message: fmt.Sprintf(format, args...)})
}

// selected are the pod-network pods s selects.
func (l *linter) selected(s policy.Subject) []*corev1.Pod {
	var out []*corev1.Pod
	for _, pod := range l.pods {
		if s.Selects(pod.Namespace, l.nsLabels[pod.Namespace], pod.Labels) {
			out = append(out, pod)
		}
	}
	return out
}

func (l *linter) subject(p *policy.Policy) {
	if len(l.selected(p.Subject)) > 0 {
		return
	}
	if p.Tier == policy.TierNetworkPolicy {
		l.warn(SelectsNothing, p, "spec.podSelector", "selects no pod of namespace %s: the policy applies to nothing", p.Namespace)
		return
	}
	l.warn(SelectsNothing, p, "spec.subject", "selects no pod: the policy applies to nothing")
}

func ruleField(d policy.Direction, r *policy.Rule) string {
	return fmt.Sprintf("spec.%s[%d]", d, r.Index)
}

func peerField(d policy.Direction, r *policy.Rule, j int) string {
	if d == policy.Egress {
		return fmt.Sprintf("%s.to[%d]", ruleField(d, r), j)
	}
	return fmt.Sprintf("%s.from[%d]", ruleField(d, r), j)
}

// rule checks one rule's peers, named ports and domain names. A rule
// that fails closed is the model's error already, and its entries do not
// line up with the object's.
func (l *linter) rule(p *policy.Policy, d policy.Direction, r *policy.Rule) {
	for j, peer := range r.Peers {
		if peer.Kind == policy.PeerDomainNames {
			field := peerField(d, r, j) + ".domainNames"
			if p.Tier != policy.TierAdmin {
				l.warn(DomainNames, p, field, "domainNames in the %s tier: network-policy-api allows them in Admin policies only (network-policy-api #366)", p.Tier)
			}
			if r.Action != policy.Accept {
				l.warn(DomainNames, p, field, "domainNames in a %s rule: network-policy-api allows them in Accept rules only (network-policy-api #366); netpol fails the rule closed", r.Action)
			}
		}
	}
	if r.FailClosed != "" {
		return
	}
	for j, peer := range r.Peers {
		switch peer.Kind {
		case policy.PeerPods:
			if len(l.selected(peer.PodSubject())) > 0 {
				continue
			}
			if !l.anyNamespace(peer) {
				l.warn(PeerMatchesNothing, p, peerField(d, r, j), "matches no namespace")
				continue
			}
			l.warn(PeerMatchesNothing, p, peerField(d, r, j), "matches no pod: its namespaces have no pod with those labels")
		case policy.PeerNodes:
			if !slices.ContainsFunc(l.nodes, func(n labels.Set) bool { return peer.Nodes.Matches(n) }) {
				l.warn(PeerMatchesNothing, p, peerField(d, r, j), "matches no node")
			}
		}
	}
	for j, port := range r.Ports {
		if port.Name == "" || d == policy.Ingress && len(l.selected(p.Subject)) == 0 || l.resolves(p, d, r, port) {
			continue // (a subject that selects nothing is its own warning)
		}
		where := "no pod the policy selects (the destination of its ingress)"
		if d == policy.Egress {
			where = "no pod the rule's peers reach"
		}
		l.warn(NamedPortUnresolved, p, fmt.Sprintf("%s.ports[%d]", ruleField(d, r), j), "%s resolves on %s: none declares a container port of that name", port, where)
	}
}

func (l *linter) anyNamespace(peer policy.Peer) bool {
	for ns, set := range l.nsLabels {
		if peer.PodSubject().SelectsNamespace(ns, set) {
			return true
		}
	}
	return false
}

// resolves reports whether named port resolves on a destination of the
// rule: the policy's pods for ingress, the peers' pods (every pod for a
// rule with other peers too) for egress.
func (l *linter) resolves(p *policy.Policy, d policy.Direction, r *policy.Rule, port policy.Port) bool {
	var dsts []*corev1.Pod
	switch {
	case d == policy.Ingress:
		dsts = l.selected(p.Subject)
	case r.AllPeers || slices.ContainsFunc(r.Peers, func(pe policy.Peer) bool { return pe.Kind != policy.PeerPods }):
		dsts = l.pods
	default:
		for _, pe := range r.Peers {
			dsts = append(dsts, l.selected(pe.PodSubject())...)
		}
	}
	for _, pod := range dsts {
		for _, c := range pod.Spec.Containers {
			if slices.ContainsFunc(c.Ports, port.Resolves) {
				return true
			}
		}
	}
	return false
}

// shadowed finds the rules that never decide: an earlier rule of the
// policy, or a rule of a policy evaluated before it (Admin at a lower
// priority, an Admin Accept or Deny before any Baseline, Baseline at a
// lower priority) whose subject holds the policy's, matches every
// connection the rule matches. A NetworkPolicy's rules all allow: one
// that an earlier rule of the policy covers changes nothing.
func (l *linter) shadowed() {
	pols := l.model.Policies
	for qi, q := range pols {
		for _, d := range policy.Directions {
			for j := range q.Rules[d] {
				b := &q.Rules[d][j]
				if by, a := l.shadowOf(pols[:qi], q, d, j); a != nil {
					l.warnShadowed(q, d, b, by, a)
				}
			}
		}
	}
}

// shadowOf is the first rule, of q before rule j or of earlier (a
// prefix of the model, in evaluation order), that covers q's rule j.
func (l *linter) shadowOf(earlier []*policy.Policy, q *policy.Policy, d policy.Direction, j int) (*policy.Policy, *policy.Rule) {
	b := &q.Rules[d][j]
	for i := range q.Rules[d][:j] {
		if a := &q.Rules[d][i]; policy.RuleCovers(a, b) {
			return q, a
		}
	}
	if q.Tier == policy.TierNetworkPolicy {
		return nil, nil
	}
	for _, p := range earlier {
		before := p.Tier == q.Tier && p.Priority < q.Priority || p.Tier == policy.TierAdmin && q.Tier == policy.TierBaseline
		if !before || !policy.SubjectContains(p.Subject, q.Subject) {
			continue
		}
		for i := range p.Rules[d] {
			a := &p.Rules[d][i]
			if a.Action == policy.Pass && p.Tier != q.Tier {
				continue // an Admin Pass hands on to the NetworkPolicy tier, then Baseline
			}
			if policy.RuleCovers(a, b) {
				return p, a
			}
		}
	}
	return nil, nil
}

func (l *linter) warnShadowed(q *policy.Policy, d policy.Direction, b *policy.Rule, by *policy.Policy, a *policy.Rule) {
	who := a.Ref(d)
	if by != q {
		who = by.Ref() + " " + who
	}
	switch {
	case q.Tier == policy.TierNetworkPolicy:
		l.warn(ShadowedRule, q, ruleField(d, b), "never decides: %s allows every connection it allows", who)
	case a.Action == b.Action:
		l.warn(ShadowedRule, q, ruleField(d, b), "never decides: %s (%s) matches every connection it matches first, with the same action", who, a.Action)
	default:
		l.warn(ShadowedRule, q, ruleField(d, b), "never decides: %s (%s) matches every connection it matches first, so its %s never applies", who, a.Action, b.Action)
	}
}

// ambiguous finds the Admin and Baseline policies of one priority with
// rules that can match the same connection with different actions: the
// API leaves their order undefined, so which action applies is netpol's
// choice (by kind, then name), not the author's.
func (l *linter) ambiguous() {
	for _, o := range policy.SamePriorityOverlaps(l.model) {
		p, q := o.First, o.Second
	search:
		for _, d := range policy.Directions {
			for i := range p.Rules[d] {
				for j := range q.Rules[d] {
					a, b := &p.Rules[d][i], &q.Rules[d][j]
					if a.Action == b.Action || !policy.RulesOverlap(a, b) {
						continue
					}
					l.warn(AmbiguousPriority, q, ruleField(d, b),
						"%s and %s have the same priority %d and both can match the same connections (%s %s: %s; this rule: %s): the API leaves their order undefined; netpol applies %s first",
						p.Ref(), q.Ref(), p.Priority, p.Ref(), a.Ref(d), a.Action, b.Action, p.Ref())
					break search
				}
			}
		}
	}
}
