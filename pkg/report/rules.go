package report

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// Rules lets Explain say what a rule that did not match wanted: its peers
// and ports, named ports resolved on the destination pod.
type Rules struct {
	model *policy.Model
	snap  *cluster.Snapshot
}

// NewRules describes the rules of model; snap resolves named ports.
func NewRules(model *policy.Model, snap *cluster.Snapshot) *Rules {
	return &Rules{model: model, snap: snap}
}

// rule finds a rule by its policy's Ref and its own Ref.
func (r *Rules) rule(policyRef, ruleRef string) (*policy.Rule, bool) {
	if r == nil || r.model == nil {
		return nil, false
	}
	for _, p := range r.model.Policies {
		if p.Ref() != policyRef {
			continue
		}
		for _, d := range policy.Directions {
			for i := range p.Rules[d] {
				if p.Rules[d][i].Ref(d) == ruleRef {
					return &p.Rules[d][i], true
				}
			}
		}
	}
	return nil, false
}

// Wanted says what the rule's peers or ports are, for a step that did not
// match for why, with named ports resolved on dst (namespace/pod); "" when
// the rule is unknown or why is about neither.
func (r *Rules) Wanted(policyRef, ruleRef, why, dst string) string {
	rule, ok := r.rule(policyRef, ruleRef)
	if !ok {
		return ""
	}
	switch {
	case strings.HasPrefix(why, "port did not match"):
		if rule.AllPorts {
			return ""
		}
		ports := make([]string, len(rule.Ports))
		for i, p := range rule.Ports {
			ports[i] = r.port(p, dst)
		}
		return "wanted " + strings.Join(ports, ", ")
	case strings.HasPrefix(why, "peer did not match"):
		if rule.AllPeers {
			return ""
		}
		peers := make([]string, len(rule.Peers))
		for i, p := range rule.Peers {
			peers[i] = Peer(p)
		}
		return "wanted " + strings.Join(peers, " or ")
	}
	return ""
}

// port describes a rule port; a named port says what it is on dst.
func (r *Rules) port(p policy.Port, dst string) string {
	if p.Name == "" {
		return p.String()
	}
	s := "named port " + p.Name
	if p.Protocol != "" {
		s = fmt.Sprintf("named port %s/%s", p.Protocol, p.Name)
	}
	ns, name, _ := strings.Cut(dst, "/")
	var pod *corev1.Pod
	if r.snap != nil {
		pod = r.snap.Pod(ns, name)
	}
	if pod == nil {
		return s + " (resolved only on a destination pod)"
	}
	var found []string
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			proto := policy.ContainerPortProtocol(cp)
			if p.Resolves(cp) {
				found = append(found, fmt.Sprintf("%s/%d", proto, cp.ContainerPort))
			}
		}
	}
	if len(found) == 0 {
		return fmt.Sprintf("%s (not declared on %s: matches nothing)", s, dst)
	}
	return fmt.Sprintf("%s = %s on %s", s, strings.Join(found, ", "), dst)
}

// Peer describes one rule peer as people write it.
func Peer(p policy.Peer) string {
	switch p.Kind {
	case policy.PeerIPBlock:
		s := "ipBlock " + joinPrefixes(p.CIDRs)
		if len(p.Except) > 0 {
			s += " except " + joinPrefixes(p.Except)
		}
		return s
	case policy.PeerNodes:
		return "nodes " + selector(p.Nodes)
	case policy.PeerDomainNames:
		return "domainNames " + strings.Join(p.DomainNames, ", ")
	}
	pods := "pods " + selector(p.Pods)
	if p.Pods != nil && p.Pods.Empty() {
		pods = "every pod"
	}
	if p.Namespace != "" {
		return pods + " in namespace " + p.Namespace
	}
	return pods + " in namespaces " + selector(p.Namespaces)
}

func selector(s labels.Selector) string {
	if s == nil {
		return "(none)"
	}
	if s.Empty() {
		return "(all)"
	}
	if s.String() == "" {
		return "(none)"
	}
	return "{" + s.String() + "}"
}

func joinPrefixes[T fmt.Stringer](ps []T) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}
