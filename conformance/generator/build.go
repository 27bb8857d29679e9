package generator

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/netpol/netpol/internal/corpus"
)

// M is one YAML mapping; documents are built from these and marshalled
// with sorted keys, so the output is byte for byte deterministic.
type M = map[string]any

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---- label selectors ----

// sel is a matchLabels selector of key/value pairs; sel() is {} (everything).
func sel(kv ...string) M {
	if len(kv) == 0 {
		return M{}
	}
	ml := M{}
	for i := 0; i+1 < len(kv); i += 2 {
		ml[kv[i]] = kv[i+1]
	}
	return M{"matchLabels": ml}
}

// expr is a matchExpressions selector with one requirement.
func expr(key, op string, values ...string) M {
	req := M{"key": key, "operator": op}
	if len(values) > 0 {
		vs := make([]any, len(values))
		for i, v := range values {
			vs[i] = v
		}
		req["values"] = vs
	}
	return M{"matchExpressions": []any{req}}
}

func podSel(name string) M { return sel("pod", name) }
func nsSel(name string) M  { return sel("ns", name) }

// ---- NetworkPolicy ----

// NP is a networking.k8s.io/v1 NetworkPolicy.
type NP struct {
	NS, Name string
	Pods     M        // spec.podSelector
	Types    []string // spec.policyTypes; nil leaves it out (API defaulting)
	Ingress  []NPRule // nil leaves spec.ingress out
	Egress   []NPRule
}

// NPRule is one ingress or egress rule; nil Peers or Ports leave the field
// out (every peer, every port).
type NPRule struct {
	Peers []M
	Ports []M
}

func npPods(s M) M       { return M{"podSelector": s} }
func npNS(s M) M         { return M{"namespaceSelector": s} }
func npBoth(ns, pod M) M { return M{"namespaceSelector": ns, "podSelector": pod} }
func npIP(cidr string, except ...string) M {
	b := M{"cidr": cidr}
	if len(except) > 0 {
		ex := make([]any, len(except))
		for i, e := range except {
			ex[i] = e
		}
		b["except"] = ex
	}
	return M{"ipBlock": b}
}

// npPort is a port entry: proto "" leaves the protocol out (TCP); port is
// an int, a name, or nil (every port of the protocol).
func npPort(proto string, port any) M {
	m := M{}
	if proto != "" {
		m["protocol"] = proto
	}
	if port != nil {
		m["port"] = port
	}
	return m
}

func npRange(proto string, port, end int) M {
	m := npPort(proto, port)
	m["endPort"] = end
	return m
}

func (r NPRule) obj(peerKey string) M {
	m := M{}
	if r.Peers != nil {
		l := make([]any, len(r.Peers))
		for i, p := range r.Peers {
			l[i] = p
		}
		m[peerKey] = l
	}
	if r.Ports != nil {
		l := make([]any, len(r.Ports))
		for i, p := range r.Ports {
			l[i] = p
		}
		m["ports"] = l
	}
	return m
}

func (p NP) obj() M {
	spec := M{"podSelector": p.Pods}
	if p.Pods == nil {
		spec["podSelector"] = M{}
	}
	if p.Types != nil {
		l := make([]any, len(p.Types))
		for i, t := range p.Types {
			l[i] = t
		}
		spec["policyTypes"] = l
	}
	if p.Ingress != nil {
		l := make([]any, len(p.Ingress))
		for i, r := range p.Ingress {
			l[i] = r.obj("from")
		}
		spec["ingress"] = l
	}
	if p.Egress != nil {
		l := make([]any, len(p.Egress))
		for i, r := range p.Egress {
			l[i] = r.obj("to")
		}
		spec["egress"] = l
	}
	return M{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
		"metadata": M{"name": p.Name, "namespace": p.NS}, "spec": spec}
}

// ---- the admin tiers ----

// Admin policy API generations.
const (
	apiANP  = "anp"          // AdminNetworkPolicy v1alpha1
	apiBANP = "banp"         // BaselineAdminNetworkPolicy v1alpha1
	apiCNP2 = "cnp-v1alpha2" // ClusterNetworkPolicy v1alpha2
	apiCNP1 = "cnp-v1beta1"  // ClusterNetworkPolicy v1beta1
	tierA   = "Admin"        // CNP tiers
	tierB   = "Baseline"     //
	actAllw = "Allow"        // abstract actions: Allow is CNP's Accept
	actDeny = "Deny"         //
	actPass = "Pass"         //
	kindANP = "AdminNetworkPolicy"
)

// Admin is an admin-tier or baseline-tier policy of any API generation.
type Admin struct {
	API      string
	Tier     string // CNP only: Admin or Baseline
	Name     string // BANP: always "default"
	Priority int
	Subject  ASubject
	Ingress  []ARule
	Egress   []ARule
}

// ASubject selects namespaces (Namespaces set) or pods (PodNS and Pods).
type ASubject struct {
	Namespaces M
	PodNS      M
	Pods       M
}

// ARule is an admin rule; Ports nil matches every port and protocol.
type ARule struct {
	Name   string
	Action string // Allow, Deny or Pass
	Peers  []APeer
	Ports  []APort
}

// APeer sets exactly one of: Namespaces; PodNS+Pods; Nodes; Networks.
type APeer struct {
	Namespaces M
	PodNS      M
	Pods       M
	Nodes      M
	Networks   []string
}

// APort is one port entry: a number (End 0) or a range, a named port, or
// (Any) every port of Proto.
type APort struct {
	Proto string
	Port  int
	End   int
	Named string
	Any   bool
}

func subjNS(s M) ASubject          { return ASubject{Namespaces: s} }
func subjPods(ns, pods M) ASubject { return ASubject{PodNS: ns, Pods: pods} }
func peerNS(s M) APeer             { return APeer{Namespaces: s} }
func peerPods(ns, pods M) APeer    { return APeer{PodNS: ns, Pods: pods} }
func peerNodes(s M) APeer          { return APeer{Nodes: s} }
func peerNets(cidrs ...string) APeer {
	return APeer{Networks: cidrs}
}
func aport(proto string, port int) APort       { return APort{Proto: proto, Port: port} }
func arange(proto string, port, end int) APort { return APort{Proto: proto, Port: port, End: end} }
func anamed(name string) APort                 { return APort{Named: name} }
func aany(proto string) APort                  { return APort{Proto: proto, Any: true} }

func (s ASubject) obj() M {
	if s.Namespaces != nil {
		return M{"namespaces": s.Namespaces}
	}
	return M{"pods": M{"namespaceSelector": orEmpty(s.PodNS), "podSelector": orEmpty(s.Pods)}}
}

func orEmpty(m M) M {
	if m == nil {
		return M{}
	}
	return m
}

func (p APeer) obj() M {
	switch {
	case p.Namespaces != nil:
		return M{"namespaces": p.Namespaces}
	case p.Nodes != nil:
		return M{"nodes": p.Nodes}
	case p.Networks != nil:
		l := make([]any, len(p.Networks))
		for i, n := range p.Networks {
			l[i] = n
		}
		return M{"networks": l}
	}
	return M{"pods": M{"namespaceSelector": orEmpty(p.PodNS), "podSelector": orEmpty(p.Pods)}}
}

func (pt APort) v1alpha1() M {
	switch {
	case pt.Named != "":
		return M{"namedPort": pt.Named}
	case pt.Any:
		return M{"portRange": M{"protocol": pt.Proto, "start": 1, "end": 65535}}
	case pt.End != 0:
		return M{"portRange": M{"protocol": pt.Proto, "start": pt.Port, "end": pt.End}}
	}
	return M{"portNumber": M{"protocol": pt.Proto, "port": pt.Port}}
}

func (pt APort) cnp() M {
	proto := strings.ToLower(pt.Proto)
	switch {
	case pt.Named != "":
		return M{"destinationNamedPort": pt.Named}
	case pt.Any:
		// The API has no empty protocol match (tcp: minProperties 1, the
		// API server rejects tcp: {}): every port is the whole range.
		return M{proto: M{"destinationPort": M{"range": M{"start": 1, "end": 65535}}}}
	case pt.End != 0:
		return M{proto: M{"destinationPort": M{"range": M{"start": pt.Port, "end": pt.End}}}}
	}
	return M{proto: M{"destinationPort": M{"number": pt.Port}}}
}

func (p Admin) isCNP() bool { return p.API == apiCNP1 || p.API == apiCNP2 }

func (p Admin) rules(rules []ARule, peerKey string) []any {
	out := make([]any, len(rules))
	for i, r := range rules {
		action := r.Action
		if action == actAllw && p.isCNP() {
			action = "Accept"
		}
		name := r.Name
		if name == "" {
			name = fmt.Sprintf("%s-%d", strings.ToLower(r.Action), i)
		}
		m := M{"name": name, "action": action}
		peers := make([]any, len(r.Peers))
		for j, pe := range r.Peers {
			peers[j] = pe.obj()
		}
		m[peerKey] = peers
		if r.Ports != nil {
			ports := make([]any, len(r.Ports))
			for j, pt := range r.Ports {
				if p.isCNP() {
					ports[j] = pt.cnp()
				} else {
					ports[j] = pt.v1alpha1()
				}
			}
			if p.isCNP() {
				m["protocols"] = ports
			} else {
				m["ports"] = ports
			}
		}
		out[i] = m
	}
	return out
}

func (p Admin) obj() M {
	spec := M{"subject": p.Subject.obj()}
	if len(p.Ingress) > 0 {
		spec["ingress"] = p.rules(p.Ingress, "from")
	}
	if len(p.Egress) > 0 {
		spec["egress"] = p.rules(p.Egress, "to")
	}
	name := p.Name
	var apiVersion, kind string
	switch p.API {
	case apiANP:
		apiVersion, kind = "policy.networking.k8s.io/v1alpha1", kindANP
		spec["priority"] = p.Priority
	case apiBANP:
		apiVersion, kind, name = "policy.networking.k8s.io/v1alpha1", "BaselineAdminNetworkPolicy", "default"
	case apiCNP2, apiCNP1:
		apiVersion, kind = "policy.networking.k8s.io/v1beta1", "ClusterNetworkPolicy"
		if p.API == apiCNP2 {
			apiVersion = "policy.networking.k8s.io/v1alpha2"
		}
		spec["priority"] = p.Priority
		spec["tier"] = p.Tier
		if p.Tier == "" {
			spec["tier"] = tierA
		}
	default:
		panic("generator: unknown admin API " + p.API)
	}
	return M{"apiVersion": apiVersion, "kind": kind, "metadata": M{"name": name}, "spec": spec}
}

// ---- documents, steps and cases ----

type object interface{ obj() M }

// docYAML renders one document: an object, a mapping, or YAML text.
func docYAML(d any) string {
	switch v := d.(type) {
	case string:
		return strings.TrimRight(v, "\n") + "\n"
	case M:
		return marshal(v)
	case object:
		return marshal(v.obj())
	}
	panic(fmt.Sprintf("generator: cannot render %T", d))
}

func marshal(m M) string {
	out, err := yaml.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(out)
}

// docsYAML joins documents into one stream.
func docsYAML(docs ...any) string {
	parts := make([]string, len(docs))
	for i, d := range docs {
		parts[i] = docYAML(d)
	}
	return strings.Join(parts, "---\n")
}

// step applies docs.
func step(name string, docs ...any) Step {
	s := Step{Name: name}
	if len(docs) > 0 {
		s.Apply = docsYAML(docs...)
	}
	return s
}

// del removes objects before applying docs.
func del(s Step, refs ...ObjectRef) Step {
	s.Delete = append(s.Delete, refs...)
	return s
}

// ObjectRef names an object to delete.
type ObjectRef = corpusRef

func npRef(ns, name string) ObjectRef {
	return ObjectRef{Kind: "NetworkPolicy", Namespace: ns, Name: name}
}
func podRef(ns, name string) ObjectRef {
	return ObjectRef{Kind: "Pod", Namespace: ns, Name: name}
}
func adminRef(p Admin) ObjectRef {
	o := p.obj()
	return ObjectRef{Kind: o["kind"].(string), Name: o["metadata"].(M)["name"].(string)}
}

// newCase is a case of one or more steps.
func newCase(name, desc string, tags []string, steps ...Step) Case {
	var uniq []string
	for _, t := range tags {
		if !slices.Contains(uniq, t) {
			uniq = append(uniq, t)
		}
	}
	return Case{Name: name, Tags: uniq, Description: desc, Steps: steps}
}

// one is a case of one step applying docs.
func one(name, desc string, tags []string, docs ...any) Case {
	return newCase(name, desc, tags, step(desc, docs...))
}

func tags(t ...string) []string { return t }

type corpusRef = corpus.ObjectRef
