// Package policy turns the four policy APIs (NetworkPolicy v1,
// AdminNetworkPolicy and BaselineAdminNetworkPolicy v1alpha1,
// ClusterNetworkPolicy v1alpha2/v1beta1) into one normalized model: policies
// in tiers, with ordered rules of peers, ports and an action. Defaulting and
// validation happen here; the evaluator and the kernel compiler only read
// the model.
package policy

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
)

// Tier is a precedence level; lower tiers decide first.
type Tier int

const (
	TierAdmin Tier = iota
	TierNetworkPolicy
	TierBaseline
	// TierDefault is not a policy tier: it names the final "allow" when no
	// tier decided.
	TierDefault
)

func (t Tier) String() string {
	switch t {
	case TierAdmin:
		return "Admin"
	case TierNetworkPolicy:
		return "NetworkPolicy"
	case TierBaseline:
		return "Baseline"
	}
	return "Default"
}

// Action is what a matching rule does.
type Action int

const (
	Accept Action = iota // ANP/BANP "Allow", CNP "Accept", any NetworkPolicy rule
	Deny
	Pass
)

func (a Action) String() string {
	switch a {
	case Accept:
		return "Accept"
	case Deny:
		return "Deny"
	}
	return "Pass"
}

// Direction is the side of a connection a rule polices.
type Direction int

const (
	Ingress Direction = iota
	Egress
)

// Directions lists both, in the order traces show them.
var Directions = [...]Direction{Egress, Ingress}

func (d Direction) String() string {
	if d == Ingress {
		return "ingress"
	}
	return "egress"
}

// Policy is one API object in normalized form.
type Policy struct {
	Kind       string // cluster.Kind* of the source object
	APIVersion string
	Namespace  string // NetworkPolicy only
	Name       string
	Tier       Tier
	// Priority orders policies within the Admin and Baseline tiers (lower
	// first). The BaselineAdminNetworkPolicy sorts after every Baseline CNP.
	Priority int32
	Subject  Subject
	// Isolates says, per Direction, whether the policy isolates its
	// subjects (NetworkPolicy policyTypes). Admin and Baseline policies
	// never isolate: their rules only act when they match.
	Isolates [2]bool
	// Rules per Direction, in API order.
	Rules [2][]Rule
	// Audit is the object's AuditAnnotation (off, deny or all), "" when
	// it has none: what the verdict log writes of its decisions.
	Audit string
	// Staged is the object's StagedAnnotation: the policy is in
	// Model.Staged, not enforced.
	Staged bool
	// ref is Ref, made once by Build.
	ref string
}

// Ref names the policy as people write it: "NetworkPolicy x/deny-all".
func (p *Policy) Ref() string {
	if p.ref != "" {
		return p.ref
	}
	return p.makeRef()
}

// Renamed is a copy of p under another name (a copy staged beside it).
func (p *Policy) Renamed(name string) *Policy {
	c := *p
	c.Name = name
	c.ref = c.makeRef()
	return &c
}

func (p *Policy) makeRef() string {
	if p.Namespace != "" {
		return fmt.Sprintf("%s %s/%s", p.Kind, p.Namespace, p.Name)
	}
	return fmt.Sprintf("%s %s", p.Kind, p.Name)
}

// Subject selects the pods a policy applies to.
type Subject struct {
	// Namespace, when set, restricts the subject to one namespace
	// (NetworkPolicy). Namespaces/Pods are always set (Everything for "any").
	Namespace  string
	Namespaces labels.Selector
	Pods       labels.Selector
	// key is Key, made once by Build for a policy's subject (the
	// evaluator asks for it on every resolution).
	key string
}

// Key is a canonical form of what the subject selects: subjects with
// equal keys select the same pods.
func (s Subject) Key() string {
	if s.key != "" {
		return s.key
	}
	return s.Namespace + "\x00" + selectorKey(s.Namespaces) + "\x00" + selectorKey(s.Pods)
}

// selectorKey names what a selector selects: its canonical text, which
// labels.Nothing shares with labels.Everything ("") unless told apart.
func selectorKey(sel labels.Selector) string {
	if _, selectable := sel.Requirements(); !selectable {
		return "\x01nothing"
	}
	return sel.String()
}

// Selects reports whether the subject selects a pod-network pod of
// namespace ns (whose labels are nsLabels) with podLabels. It is the one
// statement of selection: the evaluator matches identities with it, the
// incremental compiler single pods.
func (s Subject) Selects(ns string, nsLabels, podLabels labels.Set) bool {
	return s.SelectsNamespace(ns, nsLabels) && (s.Pods.Empty() || s.Pods.Matches(podLabels))
}

// SelectsNamespace reports whether the subject may select pods of
// namespace ns (whose labels are nsLabels): Selects' namespace half, for
// walking a namespace's pods only when it holds.
func (s Subject) SelectsNamespace(ns string, nsLabels labels.Set) bool {
	return (s.Namespace == "" || s.Namespace == ns) && s.Namespaces.Matches(nsLabels)
}

// PodSubject is what a pods peer selects, as a Subject (zero for other
// kinds of peer).
func (p Peer) PodSubject() Subject {
	return Subject{Namespace: p.Namespace, Namespaces: p.Namespaces, Pods: p.Pods}
}

// Rule is one ingress or egress rule.
type Rule struct {
	Index  int
	Name   string
	Action Action
	// AllPeers: the rule matches every peer (NetworkPolicy rule without
	// from/to). Otherwise Peers are ORed.
	AllPeers bool
	Peers    []Peer
	// AllPorts: the rule matches every protocol and port (ports/protocols
	// absent). Otherwise Ports are ORed.
	AllPorts bool
	Ports    []Port
	// FailClosed, when set, says why the rule contains an entry that could
	// not be understood or is invalid. Such a rule fails closed: an Accept
	// rule matches nothing, a Deny or Pass rule matches every connection.
	FailClosed string
}

// Ref names the rule within its policy: `ingress[2] "allow-dns"`.
func (r *Rule) Ref(d Direction) string {
	if r.Name != "" {
		return fmt.Sprintf("%s[%d] %q", d, r.Index, r.Name)
	}
	return fmt.Sprintf("%s[%d]", d, r.Index)
}

// PeerKind says what a Peer matches.
type PeerKind int

const (
	// PeerPods: pod-network pods in namespaces matching Namespaces (or in
	// Namespace when set) whose labels match Pods.
	PeerPods PeerKind = iota
	// PeerIPBlock: addresses inside one of CIDRs and outside every Except.
	PeerIPBlock
	// PeerNodes: the addresses of nodes whose labels match Nodes.
	PeerNodes
	// PeerDomainNames: addresses learned from DNS answers for DomainNames.
	PeerDomainNames
)

// Peer is one entry of a rule's from/to list.
type Peer struct {
	Kind PeerKind

	Namespace  string
	Namespaces labels.Selector
	Pods       labels.Selector

	CIDRs  []netip.Prefix
	Except []netip.Prefix

	Nodes labels.Selector

	DomainNames []string
}

// Port is one entry of a rule's ports/protocols list.
type Port struct {
	// Protocol is TCP, UDP or SCTP; empty with a Name means "the protocol
	// the named container port declares".
	Protocol corev1.Protocol
	// Start..End is the destination port range; Start 0 means every port.
	Start, End int32
	// Name is a named port, resolved on the destination pod.
	Name string
}

// Matches reports whether a connection with protocol and destination port
// matches p, given the destination pod's container ports (nil when the
// destination is not a pod).
func (p Port) Matches(protocol corev1.Protocol, port int32, dstPorts []corev1.ContainerPort) bool {
	if p.Name != "" {
		for _, cp := range dstPorts {
			if p.Resolves(cp) && ContainerPortProtocol(cp) == protocol && cp.ContainerPort == port {
				return true
			}
		}
		return false
	}
	if p.Protocol != protocol {
		return false
	}
	return p.Start == 0 || (port >= p.Start && port <= p.End)
}

// Resolves reports whether named port p resolves to the destination's
// container port cp: the same name, and the same protocol when p names
// one (a name declared only for another protocol matches nothing).
func (p Port) Resolves(cp corev1.ContainerPort) bool {
	return p.Name != "" && p.Name == cp.Name && (p.Protocol == "" || p.Protocol == ContainerPortProtocol(cp))
}

// DefaultProtocol is the protocol of a port that names none: TCP, as the
// API server defaults it (NetworkPolicy ports, container ports, Service
// ports alike).
func DefaultProtocol(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

// IPProtocol is the IP protocol number of a Kubernetes protocol (the
// default, TCP, for ""); ok is false for a protocol netpol does not know.
func IPProtocol(p corev1.Protocol) (n uint8, ok bool) {
	switch DefaultProtocol(p) {
	case corev1.ProtocolTCP:
		return 6, true
	case corev1.ProtocolUDP:
		return 17, true
	case corev1.ProtocolSCTP:
		return 132, true
	}
	return 0, false
}

// ContainerPortProtocol is a container port's protocol, defaulted.
func ContainerPortProtocol(cp corev1.ContainerPort) corev1.Protocol {
	return DefaultProtocol(cp.Protocol)
}

func (p Port) String() string {
	switch {
	case p.Name != "" && p.Protocol != "":
		return fmt.Sprintf("%s/%s", p.Protocol, p.Name)
	case p.Name != "":
		return "named port " + p.Name
	case p.Start == 0:
		return fmt.Sprintf("%s/any", p.Protocol)
	case p.Start == p.End:
		return fmt.Sprintf("%s/%d", p.Protocol, p.Start)
	}
	return fmt.Sprintf("%s/%d-%d", p.Protocol, p.Start, p.End)
}

// Model is every policy of a snapshot, in evaluation order, with the
// problems found while building it.
type Model struct {
	// Policies sorted by tier, then priority, then kind and name (the
	// deterministic order for equal priorities).
	Policies []*Policy
	// Staged are the policies staged (StagedAnnotation), in the same
	// order: not enforced, and not in Policies.
	Staged []*Policy
	// Errors name the object and field; the object was rejected, or the
	// rule named fails closed, as each error says.
	Errors []error
	// ObjectWarnings are the Warnings by object.
	ObjectWarnings map[cluster.ObjectKey][]string
	// Warnings are entries that fail closed by design (e.g. fields from a
	// newer API version).
	Warnings []string
}

// ObjectError is a problem in one object's field. Rejected says the object
// was not loaded; otherwise the rule named by Field fails closed.
type ObjectError struct {
	Object   cluster.ObjectKey
	Field    string
	Message  string
	Rejected bool
}

func (e *ObjectError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Object, e.Field, e.Message)
}
