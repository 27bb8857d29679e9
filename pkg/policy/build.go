package policy

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/domain"
)

// Limits of the admin APIs (their CRD validation).
const (
	maxPriority      = 1000
	bannedBANPName   = "default"
	baselineLastPrio = math.MaxInt32
)

// Build normalizes every policy of the snapshot. Invalid objects are left
// out (or, for a bad rule, the rule fails closed) with an error naming the
// object and field; the rest still builds.
func Build(snap *cluster.Snapshot) *Model {
	b := &builder{snap: snap, model: &Model{ObjectWarnings: map[cluster.ObjectKey][]string{}}}
	for _, np := range snap.NetworkPolicies {
		b.add(b.networkPolicy(np))
	}
	for _, anp := range snap.AdminPolicies {
		b.add(b.adminPolicy(anp))
	}
	for _, banp := range snap.BaselinePolicies {
		b.add(b.baselinePolicy(banp))
	}
	for _, cnp := range snap.ClusterPolicies {
		b.add(b.clusterPolicy(cnp))
	}
	slices.SortStableFunc(b.model.Policies, compare)
	slices.SortStableFunc(b.model.Staged, compare)
	return b.model
}

// Promoted is m with its staged policies enforced: what `netpol explain
// --staged` evaluates beside m.
func Promoted(m *Model) *Model {
	out := *m
	out.Policies = slices.SortedStableFunc(slices.Values(slices.Concat(m.Policies, m.Staged)), compare)
	out.Staged = nil
	return &out
}

// Less is the evaluation order: tier, priority, then kind and name so that
// equal priorities still have one deterministic order.
func Less(a, b *Policy) bool {
	if a.Tier != b.Tier {
		return a.Tier < b.Tier
	}
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	if a.Kind != b.Kind {
		return a.Kind < b.Kind
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

type builder struct {
	snap  *cluster.Snapshot
	model *Model
}

func (b *builder) add(p *Policy) {
	if p == nil {
		return
	}
	p.ref = p.makeRef() // asked for on every plan and chain name
	if p.Staged {
		b.model.Staged = append(b.model.Staged, p)
		return
	}
	b.model.Policies = append(b.model.Policies, p)
}

// objectErrors collects the problems of one object.
type objectErrors struct {
	key    cluster.ObjectKey
	ref    string
	errs   []error
	reject bool
	// unknownEntries are the peer and port entries (by field path) that
	// carry fields the typed structs lack: not understood, not invalid.
	unknownEntries map[string]bool
}

func (b *builder) newObject(key cluster.ObjectKey) *objectErrors {
	o := &objectErrors{key: key, ref: key.String(), unknownEntries: map[string]bool{}}
	for _, field := range b.snap.UnknownFields[key] {
		if m := entryField.FindString(field); m != "" {
			o.unknownEntries[m] = true
		}
	}
	return o
}

func (o *objectErrors) fieldf(field, format string, args ...any) {
	o.errs = append(o.errs, &ObjectError{Object: o.key, Field: field, Message: fmt.Sprintf(format, args...)})
}

// rejectf records a problem that makes the whole object unusable.
func (o *objectErrors) rejectf(field, format string, args ...any) {
	o.reject = true
	o.errs = append(o.errs, &ObjectError{Object: o.key, Field: field, Message: fmt.Sprintf(format, args...) + " (policy not loaded)", Rejected: true})
}

func (b *builder) finish(p *Policy, o *objectErrors) *Policy {
	if o.reject {
		// Every problem of a rejected object says so.
		for _, err := range o.errs {
			if oe, ok := err.(*ObjectError); ok && !oe.Rejected {
				oe.Rejected = true
				oe.Message += " (policy not loaded)"
			}
		}
	}
	b.model.Errors = append(b.model.Errors, o.errs...)
	if o.reject {
		return nil
	}
	if p != nil {
		p.Subject.key = p.Subject.Key()
	}
	return p
}

var entryField = regexp.MustCompile(`^spec\.(ingress|egress)\[(\d+)\]\.(from|to|ports|protocols)\[\d+\]`)

// applyUnknownFields decides what fields unknown to the typed structs mean:
// inside a peer or port entry the entry is not understood and its rule fails
// closed (the API's rule for implementations that lack a newer peer type);
// status is ignored; anywhere else the object is rejected.
func (b *builder) applyUnknownFields(key cluster.ObjectKey, p *Policy, o *objectErrors) {
	for _, field := range b.snap.UnknownFields[key] {
		if strings.HasPrefix(field, "status.") || strings.HasPrefix(field, "metadata.") {
			continue
		}
		m := entryField.FindStringSubmatch(field)
		if m == nil {
			o.rejectf(field, "unknown field")
			continue
		}
		dir := Ingress
		if m[1] == "egress" {
			dir = Egress
		}
		idx, _ := strconv.Atoi(m[2])
		if idx >= len(p.Rules[dir]) {
			continue
		}
		r := &p.Rules[dir][idx]
		msg := fmt.Sprintf("%s: %s: unknown field; the rule fails closed", o.ref, field)
		b.model.Warnings = append(b.model.Warnings, msg)
		b.model.ObjectWarnings[key] = append(b.model.ObjectWarnings[key], msg)
		if r.FailClosed == "" {
			r.FailClosed = "unknown field " + field
		}
	}
}

// AuditAnnotation sets, on any policy object, how the verdict log treats
// its rules (off, deny or all); it wins over the agent's --audit.
const AuditAnnotation = "netpol.io/audit"

// Audit modes: which of a policy's decisions the verdict log writes.
const (
	AuditOff  = "off"
	AuditDeny = "deny"
	AuditAll  = "all"
)

// StagedAnnotation "true", on any policy object, stages the policy: it is
// not enforced (Model.Staged), and what it would change can be shown
// (`netpol explain --staged`, `netpol diff --promote`).
const StagedAnnotation = "netpol.io/staged"

// ownAnnotations reads the object's AuditAnnotation into p.Audit and its
// StagedAnnotation into p.Staged. A value it does not know is a warning:
// the agent's audit mode applies, and the policy is enforced (a typo
// never loosens what is enforced).
func (b *builder) ownAnnotations(key cluster.ObjectKey, p *Policy, annotations map[string]string) {
	warn := func(annotation, v, want, what string) {
		msg := fmt.Sprintf("%s: metadata.annotations[%s]: unknown value %q (%s); %s", key, annotation, v, want, what)
		b.model.Warnings = append(b.model.Warnings, msg)
		b.model.ObjectWarnings[key] = append(b.model.ObjectWarnings[key], msg)
	}
	if v, ok := annotations[AuditAnnotation]; ok {
		switch v {
		case AuditOff, AuditDeny, AuditAll:
			p.Audit = v
		default:
			warn(AuditAnnotation, v, "off, deny or all", "the verdict log's default applies")
		}
	}
	if v, ok := annotations[StagedAnnotation]; ok {
		switch v {
		case "true":
			p.Staged = true
		case "false":
		default:
			warn(StagedAnnotation, v, `"true" or "false"`, "the policy is enforced")
		}
	}
}

func selector(sel *metav1.LabelSelector, field string, o *objectErrors) labels.Selector {
	if sel == nil {
		return labels.Everything()
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		o.fieldf(field, "invalid label selector: %v", err)
		return nil
	}
	return s
}

func parseCIDR(s, field string, o *objectErrors) (netip.Prefix, bool) {
	p, err := netip.ParsePrefix(strings.TrimSpace(s))
	if err != nil {
		o.fieldf(field, "invalid CIDR %q", s)
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

func validProtocol(p corev1.Protocol) bool {
	return p == corev1.ProtocolTCP || p == corev1.ProtocolUDP || p == corev1.ProtocolSCTP
}

func validPortRange(start, end int32, field string, o *objectErrors) bool {
	switch {
	case start < 1 || start > 65535:
		o.fieldf(field, "port %d is outside 1-65535", start)
	case end < 1 || end > 65535:
		o.fieldf(field, "end port %d is outside 1-65535", end)
	case start > end:
		o.fieldf(field, "start port %d is greater than end port %d", start, end)
	default:
		return true
	}
	return false
}

// failRule marks a rule whose content is invalid: it fails closed.
func failRule(r *Rule, errsBefore int, o *objectErrors) {
	if len(o.errs) > errsBefore && r.FailClosed == "" {
		r.FailClosed = "invalid rule: " + o.errs[errsBefore].Error()
	}
}

// ---- NetworkPolicy ----

func (b *builder) networkPolicy(np *networkingv1.NetworkPolicy) *Policy {
	key := cluster.ObjectKey{Kind: cluster.KindNetworkPolicy, Namespace: np.Namespace, Name: np.Name}
	o := b.newObject(key)
	p := &Policy{
		Kind: key.Kind, APIVersion: "networking.k8s.io/v1", Namespace: np.Namespace, Name: np.Name,
		Tier: TierNetworkPolicy,
	}
	b.ownAnnotations(key, p, np.Annotations)
	p.Subject = Subject{Namespace: np.Namespace, Namespaces: labels.Everything(),
		Pods: selector(&np.Spec.PodSelector, "spec.podSelector", o)}
	if p.Subject.Pods == nil {
		o.reject = true
	}
	// policyTypes defaulting, as the API server does: Ingress always,
	// Egress when there are egress rules.
	types := np.Spec.PolicyTypes
	if len(types) == 0 {
		types = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		if len(np.Spec.Egress) > 0 {
			types = append(types, networkingv1.PolicyTypeEgress)
		}
	}
	for i, t := range types {
		switch t {
		case networkingv1.PolicyTypeIngress:
			p.Isolates[Ingress] = true
		case networkingv1.PolicyTypeEgress:
			p.Isolates[Egress] = true
		default:
			o.rejectf(fmt.Sprintf("spec.policyTypes[%d]", i), "unsupported value %q (Ingress or Egress)", t)
		}
	}
	for i, r := range np.Spec.Ingress {
		p.Rules[Ingress] = append(p.Rules[Ingress], b.npRule(np.Namespace, Ingress, i, r.From, r.Ports, o))
	}
	for i, r := range np.Spec.Egress {
		p.Rules[Egress] = append(p.Rules[Egress], b.npRule(np.Namespace, Egress, i, r.To, r.Ports, o))
	}
	b.applyUnknownFields(key, p, o)
	return b.finish(p, o)
}

func (b *builder) npRule(namespace string, dir Direction, idx int, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, o *objectErrors) Rule {
	base := fmt.Sprintf("spec.%s[%d]", dir, idx)
	peerField := "from"
	if dir == Egress {
		peerField = "to"
	}
	errsBefore := len(o.errs)
	r := Rule{Index: idx, Action: Accept, AllPeers: len(peers) == 0, AllPorts: len(ports) == 0}
	for j, peer := range peers {
		field := fmt.Sprintf("%s.%s[%d]", base, peerField, j)
		if pe, ok := npPeer(namespace, peer, field, o); ok {
			r.Peers = append(r.Peers, pe)
		}
	}
	for j, port := range ports {
		field := fmt.Sprintf("%s.ports[%d]", base, j)
		if pt, ok := npPort(port, field, o); ok {
			r.Ports = append(r.Ports, pt)
		}
	}
	failRule(&r, errsBefore, o)
	return r
}

func npPeer(namespace string, peer networkingv1.NetworkPolicyPeer, field string, o *objectErrors) (Peer, bool) {
	if peer.IPBlock != nil {
		if peer.PodSelector != nil || peer.NamespaceSelector != nil {
			o.fieldf(field, "ipBlock cannot be combined with podSelector or namespaceSelector")
			return Peer{}, false
		}
		cidr, ok := parseCIDR(peer.IPBlock.CIDR, field+".ipBlock.cidr", o)
		if !ok {
			return Peer{}, false
		}
		pe := Peer{Kind: PeerIPBlock, CIDRs: []netip.Prefix{cidr}}
		valid := true // report every invalid entry, not only the first
		for k, ex := range peer.IPBlock.Except {
			exField := fmt.Sprintf("%s.ipBlock.except[%d]", field, k)
			e, ok := parseCIDR(ex, exField, o)
			if !ok {
				valid = false
				continue
			}
			if e.Addr().Is4() != cidr.Addr().Is4() || !cidr.Contains(e.Addr()) || e.Bits() <= cidr.Bits() {
				o.fieldf(exField, "%s is not a strict subset of cidr %s", ex, peer.IPBlock.CIDR)
				valid = false
				continue
			}
			pe.Except = append(pe.Except, e)
		}
		return pe, valid
	}
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		o.fieldf(field, "must set podSelector, namespaceSelector or ipBlock")
		return Peer{}, false
	}
	pe := Peer{Kind: PeerPods, Namespaces: labels.Everything()}
	if peer.NamespaceSelector == nil {
		pe.Namespace = namespace // podSelector alone: the policy's namespace
	} else {
		pe.Namespaces = selector(peer.NamespaceSelector, field+".namespaceSelector", o)
	}
	pe.Pods = selector(peer.PodSelector, field+".podSelector", o)
	return pe, pe.Namespaces != nil && pe.Pods != nil
}

func npPort(port networkingv1.NetworkPolicyPort, field string, o *objectErrors) (Port, bool) {
	var proto corev1.Protocol
	if port.Protocol != nil {
		proto = *port.Protocol
	}
	proto = DefaultProtocol(proto)
	if !validProtocol(proto) {
		o.fieldf(field+".protocol", "unsupported protocol %q (TCP, UDP or SCTP)", proto)
		return Port{}, false
	}
	pt := Port{Protocol: proto}
	switch {
	case port.Port == nil:
		if port.EndPort != nil {
			o.fieldf(field+".endPort", "endPort requires port")
			return Port{}, false
		}
	case port.Port.Type == intstr.String:
		if port.EndPort != nil {
			o.fieldf(field+".endPort", "endPort cannot be used with named port %q", port.Port.StrVal)
			return Port{}, false
		}
		if port.Port.StrVal == "" {
			o.fieldf(field+".port", "empty port name")
			return Port{}, false
		}
		pt.Name = port.Port.StrVal
	default:
		pt.Start, pt.End = port.Port.IntVal, port.Port.IntVal
		if port.EndPort != nil {
			pt.End = *port.EndPort
		}
		if !validPortRange(pt.Start, pt.End, field, o) {
			return Port{}, false
		}
	}
	return pt, true
}

// ---- AdminNetworkPolicy / BaselineAdminNetworkPolicy (v1alpha1) ----

func (b *builder) adminPolicy(anp *anpv1alpha1.AdminNetworkPolicy) *Policy {
	key := cluster.ObjectKey{Kind: cluster.KindAdminPolicy, Name: anp.Name}
	o := b.newObject(key)
	p := &Policy{Kind: key.Kind, APIVersion: "policy.networking.k8s.io/v1alpha1", Name: anp.Name,
		Tier: TierAdmin, Priority: anp.Spec.Priority}
	b.ownAnnotations(key, p, anp.Annotations)
	checkPriority(anp.Spec.Priority, o)
	p.Subject = subject(anp.Spec.Subject.Namespaces, v1alpha1Pods(anp.Spec.Subject.Pods), o)
	for i, r := range anp.Spec.Ingress {
		peers := make([]adminPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = adminPeer{namespaces: f.Namespaces, pods: v1alpha1Pods(f.Pods)}
		}
		p.Rules[Ingress] = append(p.Rules[Ingress], v1alpha1Rule(Ingress, i, r.Name, string(r.Action), peers, r.Ports, o))
	}
	for i, r := range anp.Spec.Egress {
		peers := make([]adminPeer, len(r.To))
		for j, t := range r.To {
			peers[j] = adminPeer{namespaces: t.Namespaces, pods: v1alpha1Pods(t.Pods), nodes: t.Nodes,
				networks: strs(t.Networks), domainNames: strs(t.DomainNames)}
		}
		p.Rules[Egress] = append(p.Rules[Egress], v1alpha1Rule(Egress, i, r.Name, string(r.Action), peers, r.Ports, o))
	}
	b.applyUnknownFields(key, p, o)
	return b.finish(p, o)
}

func (b *builder) baselinePolicy(banp *anpv1alpha1.BaselineAdminNetworkPolicy) *Policy {
	key := cluster.ObjectKey{Kind: cluster.KindBaselinePolicy, Name: banp.Name}
	o := b.newObject(key)
	p := &Policy{Kind: key.Kind, APIVersion: "policy.networking.k8s.io/v1alpha1", Name: banp.Name,
		Tier: TierBaseline, Priority: baselineLastPrio}
	b.ownAnnotations(key, p, banp.Annotations)
	if banp.Name != bannedBANPName {
		o.rejectf("metadata.name", "a BaselineAdminNetworkPolicy must be named %q, not %q", bannedBANPName, banp.Name)
	}
	p.Subject = subject(banp.Spec.Subject.Namespaces, v1alpha1Pods(banp.Spec.Subject.Pods), o)
	for i, r := range banp.Spec.Ingress {
		peers := make([]adminPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = adminPeer{namespaces: f.Namespaces, pods: v1alpha1Pods(f.Pods)}
		}
		rule := v1alpha1Rule(Ingress, i, r.Name, string(r.Action), peers, r.Ports, o)
		p.Rules[Ingress] = append(p.Rules[Ingress], banpNoPass(rule, string(r.Action), Ingress, o))
	}
	for i, r := range banp.Spec.Egress {
		peers := make([]adminPeer, len(r.To))
		for j, t := range r.To {
			peers[j] = adminPeer{namespaces: t.Namespaces, pods: v1alpha1Pods(t.Pods), nodes: t.Nodes, networks: strs(t.Networks)}
		}
		rule := v1alpha1Rule(Egress, i, r.Name, string(r.Action), peers, r.Ports, o)
		p.Rules[Egress] = append(p.Rules[Egress], banpNoPass(rule, string(r.Action), Egress, o))
	}
	b.applyUnknownFields(key, p, o)
	return b.finish(p, o)
}

func checkPriority(prio int32, o *objectErrors) {
	if prio < 0 || prio > maxPriority {
		o.rejectf("spec.priority", "%d is outside 0-%d", prio, maxPriority)
	}
}

// banpNoPass: the BANP API has no Pass action.
func banpNoPass(r Rule, action string, dir Direction, o *objectErrors) Rule {
	if action == "Pass" {
		o.fieldf(fmt.Sprintf("spec.%s[%d].action", dir, r.Index), "Pass is not a BaselineAdminNetworkPolicy action (Allow or Deny); the rule fails closed")
		if r.FailClosed == "" {
			r.FailClosed = "invalid action Pass"
		}
		r.Action = Deny // a baseline Pass would skip to the default allow: fail closed
	}
	return r
}

// namespacedPod is the pods peer of either API generation.
type namespacedPod struct {
	namespaceSelector, podSelector metav1.LabelSelector
}

func v1alpha1Pods(p *anpv1alpha1.NamespacedPod) *namespacedPod {
	if p == nil {
		return nil
	}
	return &namespacedPod{p.NamespaceSelector, p.PodSelector}
}

func v1beta1Pods(p *cnpv1beta1.NamespacedPod) *namespacedPod {
	if p == nil {
		return nil
	}
	return &namespacedPod{p.NamespaceSelector, p.PodSelector}
}

func strs[T ~string](in []T) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = string(s)
	}
	return out
}

func subject(namespaces *metav1.LabelSelector, pods *namespacedPod, o *objectErrors) Subject {
	s := Subject{Namespaces: labels.Everything(), Pods: labels.Everything()}
	switch {
	case namespaces != nil && pods != nil:
		o.rejectf("spec.subject", "set exactly one of namespaces and pods")
	case namespaces != nil:
		s.Namespaces = selector(namespaces, "spec.subject.namespaces", o)
	case pods != nil:
		s.Namespaces = selector(&pods.namespaceSelector, "spec.subject.pods.namespaceSelector", o)
		s.Pods = selector(&pods.podSelector, "spec.subject.pods.podSelector", o)
	default:
		o.rejectf("spec.subject", "set exactly one of namespaces and pods")
	}
	if s.Namespaces == nil || s.Pods == nil {
		o.reject = true
	}
	return s
}

// adminPeer is a peer of either admin API generation.
type adminPeer struct {
	namespaces  *metav1.LabelSelector
	pods        *namespacedPod
	nodes       *metav1.LabelSelector
	networks    []string
	domainNames []string
}

func (ap adminPeer) fieldsSet() int {
	n := 0
	for _, set := range []bool{ap.namespaces != nil, ap.pods != nil, ap.nodes != nil, len(ap.networks) > 0, len(ap.domainNames) > 0} {
		if set {
			n++
		}
	}
	return n
}

// convert returns the peer, or ok=false when it is invalid or not
// understood (the caller fails the rule closed).
func (ap adminPeer) convert(field string, o *objectErrors) (Peer, bool) {
	switch ap.fieldsSet() {
	case 0:
		if !o.unknownEntries[field] { // else: a newer peer type, failed closed with a warning
			o.fieldf(field, "peer sets none of namespaces, pods, nodes, networks, domainNames")
		}
		return Peer{}, false
	case 1:
	default:
		o.fieldf(field, "set exactly one of namespaces, pods, nodes, networks, domainNames")
		return Peer{}, false
	}
	switch {
	case ap.namespaces != nil:
		pe := Peer{Kind: PeerPods, Namespaces: selector(ap.namespaces, field+".namespaces", o), Pods: labels.Everything()}
		return pe, pe.Namespaces != nil
	case ap.pods != nil:
		pe := Peer{Kind: PeerPods,
			Namespaces: selector(&ap.pods.namespaceSelector, field+".pods.namespaceSelector", o),
			Pods:       selector(&ap.pods.podSelector, field+".pods.podSelector", o)}
		return pe, pe.Namespaces != nil && pe.Pods != nil
	case ap.nodes != nil:
		pe := Peer{Kind: PeerNodes, Nodes: selector(ap.nodes, field+".nodes", o)}
		return pe, pe.Nodes != nil
	case len(ap.networks) > 0:
		pe := Peer{Kind: PeerIPBlock}
		valid := true // report every invalid entry, not only the first
		for k, n := range ap.networks {
			cidr, ok := parseCIDR(n, fmt.Sprintf("%s.networks[%d]", field, k), o)
			if !ok {
				valid = false
				continue
			}
			pe.CIDRs = append(pe.CIDRs, cidr)
		}
		return pe, valid
	}
	pe := Peer{Kind: PeerDomainNames}
	valid := true
	for k, n := range ap.domainNames {
		p, err := domain.ParsePattern(n)
		if err != nil {
			o.fieldf(fmt.Sprintf("%s.domainNames[%d]", field, k), "%v", err)
			valid = false
			continue
		}
		pe.DomainNames = append(pe.DomainNames, p.String())
	}
	return pe, valid
}

// parseAction reads an action; acceptWord is the API generation's spelling
// of "allow" (v1alpha1 "Allow", CNP "Accept").
func parseAction(action, acceptWord, field string, o *objectErrors) (Action, bool) {
	switch action {
	case acceptWord:
		return Accept, true
	case "Deny":
		return Deny, true
	case "Pass":
		return Pass, true
	}
	o.fieldf(field, "unknown action %q (%s, Deny or Pass); the rule fails closed", action, acceptWord)
	if action == "Allow" || action == "Accept" {
		return Accept, false // the other generation's spelling: an allow that fails closed
	}
	return Deny, false
}

// adminRule builds the parts shared by every admin API generation; ports
// are added by the caller.
func adminRule(dir Direction, idx int, name, action, acceptWord string, peers []adminPeer, o *objectErrors) Rule {
	base := fmt.Sprintf("spec.%s[%d]", dir, idx)
	peerField := "from"
	if dir == Egress {
		peerField = "to"
	}
	errsBefore := len(o.errs)
	act, _ := parseAction(action, acceptWord, base+".action", o)
	r := Rule{Index: idx, Name: name, Action: act}
	if len(peers) == 0 {
		o.fieldf(base+"."+peerField, "at least one peer is required")
	}
	for j, ap := range peers {
		if pe, ok := ap.convert(fmt.Sprintf("%s.%s[%d]", base, peerField, j), o); ok {
			if pe.Kind == PeerDomainNames && act != Accept {
				o.fieldf(fmt.Sprintf("%s.%s[%d].domainNames", base, peerField, j), "domainNames peers are only allowed in Accept rules")
			}
			r.Peers = append(r.Peers, pe)
		}
	}
	failRule(&r, errsBefore, o)
	return r
}

func v1alpha1Rule(dir Direction, idx int, name, action string, peers []adminPeer, ports *[]anpv1alpha1.AdminNetworkPolicyPort, o *objectErrors) Rule {
	r := adminRule(dir, idx, name, action, "Allow", peers, o)
	errsBefore := len(o.errs)
	r.AllPorts = ports == nil
	if ports != nil && len(*ports) == 0 {
		o.fieldf(fmt.Sprintf("spec.%s[%d].ports", dir, idx), "an empty list is invalid (omit it to match every port)")
	}
	if ports != nil {
		for j, port := range *ports {
			field := fmt.Sprintf("spec.%s[%d].ports[%d]", dir, idx, j)
			if pt, ok := v1alpha1Port(port, field, o); ok {
				r.Ports = append(r.Ports, pt)
			}
		}
	}
	failRule(&r, errsBefore, o)
	return r
}

func v1alpha1Port(port anpv1alpha1.AdminNetworkPolicyPort, field string, o *objectErrors) (Port, bool) {
	set := 0
	for _, s := range []bool{port.PortNumber != nil, port.NamedPort != nil, port.PortRange != nil} {
		if s {
			set++
		}
	}
	if set != 1 {
		if set > 0 || !o.unknownEntries[field] { // else: a newer port type, failed closed with a warning
			o.fieldf(field, "set exactly one of portNumber, namedPort, portRange")
		}
		return Port{}, false
	}
	switch {
	case port.PortNumber != nil:
		pt := Port{Protocol: DefaultProtocol(port.PortNumber.Protocol), Start: port.PortNumber.Port, End: port.PortNumber.Port}
		return pt, checkPort(pt, field+".portNumber", o)
	case port.PortRange != nil:
		pt := Port{Protocol: DefaultProtocol(port.PortRange.Protocol), Start: port.PortRange.Start, End: port.PortRange.End}
		return pt, checkPort(pt, field+".portRange", o)
	}
	if *port.NamedPort == "" {
		o.fieldf(field+".namedPort", "empty port name")
		return Port{}, false
	}
	return Port{Name: *port.NamedPort}, true
}

func checkPort(pt Port, field string, o *objectErrors) bool {
	if !validProtocol(pt.Protocol) {
		o.fieldf(field+".protocol", "unsupported protocol %q (TCP, UDP or SCTP)", pt.Protocol)
		return false
	}
	return validPortRange(pt.Start, pt.End, field, o)
}

// ---- ClusterNetworkPolicy (v1alpha2 and v1beta1) ----

func (b *builder) clusterPolicy(cnp *cnpv1beta1.ClusterNetworkPolicy) *Policy {
	key := cluster.ObjectKey{Kind: cluster.KindClusterPolicy, Name: cnp.Name}
	o := b.newObject(key)
	p := &Policy{Kind: key.Kind, APIVersion: b.snap.Origin[key].APIVersion, Name: cnp.Name, Priority: cnp.Spec.Priority}
	b.ownAnnotations(key, p, cnp.Annotations)
	switch cnp.Spec.Tier {
	case cnpv1beta1.AdminTier:
		p.Tier = TierAdmin
	case cnpv1beta1.BaselineTier:
		p.Tier = TierBaseline
	default:
		o.rejectf("spec.tier", "unknown tier %q (Admin or Baseline)", cnp.Spec.Tier)
	}
	checkPriority(cnp.Spec.Priority, o)
	p.Subject = subject(cnp.Spec.Subject.Namespaces, v1beta1Pods(cnp.Spec.Subject.Pods), o)
	for i, r := range cnp.Spec.Ingress {
		peers := make([]adminPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = adminPeer{namespaces: f.Namespaces, pods: v1beta1Pods(f.Pods)}
		}
		p.Rules[Ingress] = append(p.Rules[Ingress], cnpRule(Ingress, i, r.Name, string(r.Action), peers, r.Protocols, o))
	}
	for i, r := range cnp.Spec.Egress {
		peers := make([]adminPeer, len(r.To))
		for j, t := range r.To {
			peers[j] = adminPeer{namespaces: t.Namespaces, pods: v1beta1Pods(t.Pods), nodes: t.Nodes,
				networks: strs(t.Networks), domainNames: strs(t.DomainNames)}
		}
		p.Rules[Egress] = append(p.Rules[Egress], cnpRule(Egress, i, r.Name, string(r.Action), peers, r.Protocols, o))
	}
	b.applyUnknownFields(key, p, o)
	return b.finish(p, o)
}

func cnpRule(dir Direction, idx int, name, action string, peers []adminPeer, protocols []cnpv1beta1.ClusterNetworkPolicyProtocol, o *objectErrors) Rule {
	r := adminRule(dir, idx, name, action, "Accept", peers, o)
	errsBefore := len(o.errs)
	// protocols absent: every protocol and port, ICMP included.
	r.AllPorts = protocols == nil
	if protocols != nil && len(protocols) == 0 {
		o.fieldf(fmt.Sprintf("spec.%s[%d].protocols", dir, idx), "an empty list is invalid (omit it to match every protocol)")
	}
	for j, proto := range protocols {
		field := fmt.Sprintf("spec.%s[%d].protocols[%d]", dir, idx, j)
		if pt, ok := cnpProtocol(proto, field, o); ok {
			r.Ports = append(r.Ports, pt)
		}
	}
	failRule(&r, errsBefore, o)
	return r
}

func cnpProtocol(p cnpv1beta1.ClusterNetworkPolicyProtocol, field string, o *objectErrors) (Port, bool) {
	type entry struct {
		proto corev1.Protocol
		port  *cnpv1beta1.Port
		name  string
	}
	var set []entry
	if p.TCP != nil {
		set = append(set, entry{corev1.ProtocolTCP, p.TCP.DestinationPort, "tcp"})
	}
	if p.UDP != nil {
		set = append(set, entry{corev1.ProtocolUDP, p.UDP.DestinationPort, "udp"})
	}
	if p.SCTP != nil {
		set = append(set, entry{corev1.ProtocolSCTP, p.SCTP.DestinationPort, "sctp"})
	}
	if p.DestinationNamedPort != "" {
		if len(set) > 0 {
			o.fieldf(field, "set exactly one of tcp, udp, sctp, destinationNamedPort")
			return Port{}, false
		}
		return Port{Name: p.DestinationNamedPort}, true
	}
	switch len(set) {
	case 0:
		if !o.unknownEntries[field] { // else: a newer protocol, failed closed with a warning
			o.fieldf(field, "protocol entry sets none of tcp, udp, sctp, destinationNamedPort")
		}
		return Port{}, false
	case 1:
	default:
		o.fieldf(field, "set exactly one of tcp, udp, sctp, destinationNamedPort")
		return Port{}, false
	}
	e := set[0]
	pt := Port{Protocol: e.proto}
	if e.port == nil {
		return pt, true // every port of the protocol
	}
	switch {
	case e.port.Number != 0 && e.port.Range != nil:
		o.fieldf(field+"."+e.name+".destinationPort", "set exactly one of number and range")
		return Port{}, false
	case e.port.Range != nil:
		pt.Start, pt.End = e.port.Range.Start, e.port.Range.End
		return pt, validPortRange(pt.Start, pt.End, field+"."+e.name+".destinationPort.range", o)
	case e.port.Number != 0:
		pt.Start, pt.End = e.port.Number, e.port.Number
		return pt, validPortRange(pt.Start, pt.End, field+"."+e.name+".destinationPort.number", o)
	}
	o.fieldf(field+"."+e.name+".destinationPort", "set one of number and range")
	return Port{}, false
}
