package policy_test

import (
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// companions are valid policies added to every case: whatever is wrong with
// the case's own object, these must still build.
const companions = `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: companion-np, namespace: x}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: companion-anp}
spec:
  priority: 500
  subject: {namespaces: {}}
  ingress: [{action: Allow, from: [{namespaces: {}}]}]
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: companion-cnp}
spec:
  tier: Baseline
  priority: 500
  subject: {namespaces: {}}
  egress: [{action: Deny, to: [{networks: [192.0.2.0/24]}]}]
`

var companionRefs = []string{
	"NetworkPolicy x/companion-np",
	"AdminNetworkPolicy companion-anp",
	"ClusterNetworkPolicy companion-cnp",
}

// load builds a snapshot from YAML; unknownFields, when set, are recorded as
// the loader would record them (so TestBuild tests Build alone).
func load(t *testing.T, docs string, unknownFields map[cluster.ObjectKey][]string) *cluster.Snapshot {
	t.Helper()
	snap := cluster.New()
	r := snap.AddDocuments([]byte(docs), "test.yaml", false)
	if len(r.Errors) > 0 {
		t.Fatalf("loading: %v", r.Errors)
	}
	for k, v := range unknownFields {
		snap.UnknownFields[k] = v
	}
	return snap
}

func find(m *policy.Model, ref string) *policy.Policy {
	for _, p := range m.Policies {
		if p.Ref() == ref {
			return p
		}
	}
	return nil
}

func refs(m *policy.Model) []string {
	var out []string
	for _, p := range m.Policies {
		out = append(out, p.Ref())
	}
	return out
}

func TestBuild(t *testing.T) {
	type want struct {
		// errs: each model error, in order, must contain all its parts.
		errs     [][]string
		warnings [][]string
		// rejected: the case's policy must be absent.
		rejected bool
	}
	cases := []struct {
		name    string
		ref     string // the case's policy
		yaml    string
		unknown map[cluster.ObjectKey][]string
		want    want
		check   func(t *testing.T, p *policy.Policy)
	}{
		{
			name: "NetworkPolicy without egress rules isolates ingress only",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec: {podSelector: {}}`,
			check: func(t *testing.T, p *policy.Policy) {
				if p.Isolates != [2]bool{policy.Ingress: true, policy.Egress: false} {
					t.Errorf("Isolates = %v", p.Isolates)
				}
				if p.Tier != policy.TierNetworkPolicy || p.Subject.Namespace != "x" || !p.Subject.Pods.Empty() {
					t.Errorf("policy = %+v", p)
				}
			},
		},
		{
			name: "NetworkPolicy with egress rules isolates both",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  egress: [{}]`,
			check: func(t *testing.T, p *policy.Policy) {
				if p.Isolates != [2]bool{true, true} {
					t.Errorf("Isolates = %v", p.Isolates)
				}
				r := p.Rules[policy.Egress]
				if len(r) != 1 || !r[0].AllPeers || !r[0].AllPorts || r[0].Action != policy.Accept {
					t.Errorf("egress rules = %+v", r)
				}
			},
		},
		{
			name: "explicit policyTypes Egress only",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Egress]
  ingress: [{}]`,
			check: func(t *testing.T, p *policy.Policy) {
				if p.Isolates != [2]bool{policy.Ingress: false, policy.Egress: true} {
					t.Errorf("Isolates = %v", p.Isolates)
				}
			},
		},
		{
			name: "unsupported policyType rejects",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Sideways]}`,
			want: want{rejected: true, errs: [][]string{{"NetworkPolicy x/np", "spec.policyTypes[1]", `"Sideways"`, "policy not loaded"}}},
		},
		{
			name: "protocol defaults to TCP; endPort range; named port",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports:
    - port: 80
    - {protocol: UDP, port: 5000, endPort: 5010}
    - {protocol: SCTP}
    - {port: web}`,
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Ingress][0]
				want := []policy.Port{
					{Protocol: corev1.ProtocolTCP, Start: 80, End: 80},
					{Protocol: corev1.ProtocolUDP, Start: 5000, End: 5010},
					{Protocol: corev1.ProtocolSCTP},
					{Protocol: corev1.ProtocolTCP, Name: "web"},
				}
				if !slices.Equal(r.Ports, want) || r.AllPorts || !r.AllPeers || r.FailClosed != "" {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "invalid CIDR fails the rule closed",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{ipBlock: {cidr: 10.0.0.0/33}}, {podSelector: {}}]
  - from: [{ipBlock: {cidr: 10.1.0.0/16}}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].from[0].ipBlock.cidr", "10.0.0.0/33"}}},
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Ingress]
				if len(r) != 2 || r[0].FailClosed == "" || !strings.Contains(r[0].FailClosed, "ipBlock.cidr") {
					t.Fatalf("rules = %+v", r)
				}
				if r[1].FailClosed != "" || len(r[1].Peers) != 1 || r[1].Peers[0].CIDRs[0] != netip.MustParsePrefix("10.1.0.0/16") {
					t.Errorf("the valid rule = %+v", r[1])
				}
			},
		},
		{
			name: "ANP rule with an empty ports list fails closed",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec:
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - {action: Deny, from: [{namespaces: {}}], ports: []}`,
			want: want{errs: [][]string{{"AdminNetworkPolicy anp", "spec.ingress[0].ports", "empty list"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" || r.Action != policy.Deny {
					t.Errorf("rule = %+v, want a Deny that fails closed", r)
				}
			},
		},
		{
			name: "CNP rule with an empty protocols list fails closed",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - {action: Accept, from: [{namespaces: {}}], protocols: []}`,
			want: want{errs: [][]string{{"ClusterNetworkPolicy cnp", "spec.ingress[0].protocols", "empty list"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" || r.AllPorts {
					t.Errorf("rule = %+v, want an Accept that fails closed", r)
				}
			},
		},
		{
			name: "except outside cidr",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.0/24, 10.1.0.0/24]}}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.egress[0].to[0].ipBlock.except[1]", "10.1.0.0/24", "cidr 10.0.0.0/16"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Egress][0]; r.FailClosed == "" || len(r.Peers) != 0 {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "ipBlock with except and host bits",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.5/16, except: [10.0.1.0/24]}}, {ipBlock: {cidr: "fd00::/64", except: ["fd00::/80"]}}]`,
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Egress][0]
				if r.FailClosed != "" || len(r.Peers) != 2 || r.Peers[0].Kind != policy.PeerIPBlock ||
					r.Peers[0].CIDRs[0] != netip.MustParsePrefix("10.0.0.0/16") || r.Peers[0].Except[0] != netip.MustParsePrefix("10.0.1.0/24") {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "ipBlock with a selector",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].from[0]", "ipBlock cannot be combined"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "endPort < port",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: 90, endPort: 80}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].ports[0]", "start port 90 is greater than end port 80"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" || len(r.Ports) != 0 || r.AllPorts {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "endPort with named port",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: web, endPort: 80}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].ports[0].endPort", `named port "web"`}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "unsupported protocol",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - ports: [{protocol: ICMP}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].ports[0].protocol", `"ICMP"`}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "invalid label selector in a peer",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{namespaceSelector: {matchExpressions: [{key: a, operator: Near}]}}]`,
			want: want{errs: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].from[0].namespaceSelector", "invalid label selector"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" || len(r.Peers) != 0 {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "peers: podSelector alone is the policy's namespace; both selectors AND",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - podSelector: {matchLabels: {app: a}}
    - namespaceSelector: {matchLabels: {team: t}}
      podSelector: {matchLabels: {app: b}}`,
			check: func(t *testing.T, p *policy.Policy) {
				peers := p.Rules[policy.Ingress][0].Peers
				if len(peers) != 2 || peers[0].Namespace != "x" || !peers[0].Namespaces.Empty() ||
					!peers[0].Pods.Matches(labels.Set{"app": "a"}) {
					t.Fatalf("peer 0 = %+v", peers)
				}
				if peers[1].Namespace != "" || !peers[1].Namespaces.Matches(labels.Set{"team": "t"}) || peers[1].Namespaces.Matches(labels.Set{}) ||
					!peers[1].Pods.Matches(labels.Set{"app": "b"}) {
					t.Errorf("peer 1 = %+v", peers[1])
				}
			},
		},
		{
			name: "BANP not named default",
			ref:  "BaselineAdminNetworkPolicy other",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: other}
spec:
  subject: {namespaces: {}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]`,
			want: want{rejected: true, errs: [][]string{{"BaselineAdminNetworkPolicy other", "metadata.name", `"default"`, "policy not loaded"}}},
		},
		{
			name: "BANP default, with a Pass rule that fails closed as Deny",
			ref:  "BaselineAdminNetworkPolicy default",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec:
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: db}}}}
  ingress:
  - {action: Allow, from: [{pods: {namespaceSelector: {}, podSelector: {}}}], ports: [{portNumber: {port: 5432}}]}
  - {action: Pass, from: [{namespaces: {}}]}`,
			want: want{errs: [][]string{{"BaselineAdminNetworkPolicy default", "spec.ingress[1].action", "Pass"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if p.Tier != policy.TierBaseline || p.Priority != math.MaxInt32 || !p.Subject.Pods.Matches(labels.Set{"app": "db"}) {
					t.Errorf("policy = %+v", p)
				}
				r := p.Rules[policy.Ingress]
				if r[0].Action != policy.Accept || r[0].FailClosed != "" || !slices.Equal(r[0].Ports, []policy.Port{{Protocol: corev1.ProtocolTCP, Start: 5432, End: 5432}}) {
					t.Errorf("rule 0 = %+v", r[0])
				}
				if r[1].Action != policy.Deny || r[1].FailClosed == "" {
					t.Errorf("rule 1 = %+v", r[1])
				}
			},
		},
		{
			name: "ANP priority above range",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec: {priority: 1001, subject: {namespaces: {}}}`,
			want: want{rejected: true, errs: [][]string{{"AdminNetworkPolicy anp", "spec.priority", "1001", "policy not loaded"}}},
		},
		{
			name: "ANP negative priority",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec: {priority: -1, subject: {namespaces: {}}}`,
			want: want{rejected: true, errs: [][]string{{"AdminNetworkPolicy anp", "spec.priority", "-1"}}},
		},
		{
			name: "ANP named port, port range, peers",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec:
  priority: 1000
  subject: {namespaces: {matchLabels: {team: t}}}
  egress:
  - name: web
    action: Allow
    to: [{nodes: {matchLabels: {role: infra}}}, {networks: [10.0.0.0/8, "fd00::/8"]}, {domainNames: [example.com]}]
    ports: [{namedPort: web}, {portRange: {protocol: UDP, start: 1000, end: 2000}}]`,
			check: func(t *testing.T, p *policy.Policy) {
				if p.Tier != policy.TierAdmin || p.Priority != 1000 || !p.Subject.Namespaces.Matches(labels.Set{"team": "t"}) || !p.Subject.Pods.Empty() {
					t.Errorf("policy = %+v", p)
				}
				r := p.Rules[policy.Egress][0]
				if r.Name != "web" || r.Action != policy.Accept || r.FailClosed != "" || r.AllPorts {
					t.Errorf("rule = %+v", r)
				}
				if want := []policy.Port{{Name: "web"}, {Protocol: corev1.ProtocolUDP, Start: 1000, End: 2000}}; !slices.Equal(r.Ports, want) {
					t.Errorf("ports = %+v, want %+v", r.Ports, want)
				}
				kinds := []policy.PeerKind{}
				for _, pe := range r.Peers {
					kinds = append(kinds, pe.Kind)
				}
				if !slices.Equal(kinds, []policy.PeerKind{policy.PeerNodes, policy.PeerIPBlock, policy.PeerDomainNames}) || len(r.Peers[1].CIDRs) != 2 {
					t.Errorf("peers = %+v", r.Peers)
				}
			},
		},
		{
			name: "ANP peer with two fields and a deny to domainNames",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec:
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Deny, to: [{namespaces: {}, networks: [10.0.0.0/8]}]}
  - {action: Deny, to: [{domainNames: [example.com]}]}
  - {action: Allow, to: []}`,
			want: want{errs: [][]string{
				{"AdminNetworkPolicy anp", "spec.egress[0].to[0]", "set exactly one"},
				{"AdminNetworkPolicy anp", "spec.egress[1].to[0].domainNames", "only allowed in Accept rules"},
				{"AdminNetworkPolicy anp", "spec.egress[2].to", "at least one peer"},
			}},
			check: func(t *testing.T, p *policy.Policy) {
				for i, r := range p.Rules[policy.Egress] {
					if r.FailClosed == "" {
						t.Errorf("rule %d does not fail closed: %+v", i, r)
					}
				}
			},
		},
		{
			name: "ANP domainNames: canonical, and an invalid one fails its rule closed",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec:
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Allow, to: [{domainNames: [Example.COM., "*.Example.org"]}]}
  - {action: Allow, to: [{domainNames: [ok.example.com, "a.*.example.com"]}]}`,
			want: want{errs: [][]string{
				{"AdminNetworkPolicy anp", "spec.egress[1].to[0].domainNames[1]", "a.*.example.com", "only as the whole first label"},
			}},
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Egress]
				if r[0].FailClosed != "" || !slices.Equal(r[0].Peers[0].DomainNames, []string{"example.com", "*.example.org"}) {
					t.Errorf("rule 0 = %+v", r[0])
				}
				if r[1].FailClosed == "" {
					t.Errorf("rule 1 does not fail closed: %+v", r[1])
				}
			},
		},
		{
			name: "ANP with CNP's Accept spelling",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec:
  priority: 1
  subject: {namespaces: {}}
  ingress: [{action: Accept, from: [{namespaces: {}}]}]`,
			want: want{errs: [][]string{{"AdminNetworkPolicy anp", "spec.ingress[0].action", `"Accept"`}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.Action != policy.Accept || r.FailClosed == "" {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "CNP unknown tier",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec: {tier: Middle, priority: 1, subject: {namespaces: {}}}`,
			want: want{rejected: true, errs: [][]string{{"ClusterNetworkPolicy cnp", "spec.tier", `"Middle"`, "policy not loaded"}}},
		},
		{
			name: "subject with both namespaces and pods",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}, pods: {namespaceSelector: {}, podSelector: {}}}`,
			want: want{rejected: true, errs: [][]string{{"ClusterNetworkPolicy cnp", "spec.subject", "exactly one", "policy not loaded"}}},
		},
		{
			name: "subject with neither",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec: {priority: 1, subject: {}}`,
			want: want{rejected: true, errs: [][]string{{"AdminNetworkPolicy anp", "spec.subject", "policy not loaded"}}},
		},
		{
			name: "CNP protocol entry with two protocols",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 80}}, udp: {destinationPort: {number: 53}}}]
  - action: Accept
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {range: {start: 8000, end: 8080}}}}, {sctp: {}}, {destinationNamedPort: web}]`,
			want: want{errs: [][]string{{"ClusterNetworkPolicy cnp", "spec.ingress[0].protocols[0]", "set exactly one"}}},
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Ingress]
				if r[0].FailClosed == "" || r[0].Action != policy.Deny {
					t.Errorf("rule 0 = %+v", r[0])
				}
				want := []policy.Port{{Protocol: corev1.ProtocolTCP, Start: 8000, End: 8080}, {Protocol: corev1.ProtocolSCTP}, {Name: "web"}}
				if r[1].FailClosed != "" || !slices.Equal(r[1].Ports, want) || r[1].AllPorts {
					t.Errorf("rule 1 = %+v", r[1])
				}
			},
		},
		{
			name: "CNP without protocols matches every protocol",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Baseline
  priority: 3
  subject: {pods: {namespaceSelector: {}, podSelector: {}}}
  egress: [{action: Pass, to: [{pods: {namespaceSelector: {}, podSelector: {}}}]}]`,
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Egress][0]
				if p.Tier != policy.TierBaseline || p.Priority != 3 || p.APIVersion != "policy.networking.k8s.io/v1beta1" ||
					r.Action != policy.Pass || !r.AllPorts || r.FailClosed != "" {
					t.Errorf("policy = %+v, rule = %+v", p, r)
				}
			},
		},
		{
			name: "CNP Allow action (ANP spelling) fails closed",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress: [{action: Allow, from: [{namespaces: {}}]}, {action: Drop, from: [{namespaces: {}}]}]`,
			want: want{errs: [][]string{
				{"ClusterNetworkPolicy cnp", "spec.ingress[0].action", `unknown action "Allow"`},
				{"ClusterNetworkPolicy cnp", "spec.ingress[1].action", `unknown action "Drop"`},
			}},
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Ingress]
				if r[0].Action != policy.Accept || r[0].FailClosed == "" {
					t.Errorf("Allow rule = %+v (want an Accept that fails closed)", r[0])
				}
				if r[1].Action != policy.Deny || r[1].FailClosed == "" {
					t.Errorf("Drop rule = %+v (want a Deny that fails closed)", r[1])
				}
				if p.APIVersion != "policy.networking.k8s.io/v1alpha2" {
					t.Errorf("APIVersion = %q", p.APIVersion)
				}
			},
		},
		{
			name: "CNP priority out of range",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec: {tier: Admin, priority: 5000, subject: {namespaces: {}}}`,
			want: want{rejected: true, errs: [][]string{{"ClusterNetworkPolicy cnp", "spec.priority", "5000"}}},
		},
		{
			name: "unknown field inside a peer fails the rule closed",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Accept, to: [{networks: [10.0.0.0/8]}]}
  - {action: Accept, to: [{networks: [10.0.0.0/8]}]}`,
			unknown: map[cluster.ObjectKey][]string{
				{Kind: cluster.KindClusterPolicy, Name: "cnp"}: {"spec.egress[1].to[0].serviceAccounts", "status.observed", "metadata.extra"},
			},
			want: want{warnings: [][]string{{"ClusterNetworkPolicy cnp", "spec.egress[1].to[0].serviceAccounts", "fails closed"}}},
			check: func(t *testing.T, p *policy.Policy) {
				r := p.Rules[policy.Egress]
				if r[0].FailClosed != "" || !strings.Contains(r[1].FailClosed, "spec.egress[1].to[0].serviceAccounts") {
					t.Errorf("rules = %+v", r)
				}
			},
		},
		{
			name: "unknown field inside a NetworkPolicy port",
			ref:  "NetworkPolicy x/np",
			yaml: `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress: [{ports: [{port: 80}]}]`,
			unknown: map[cluster.ObjectKey][]string{
				{Kind: cluster.KindNetworkPolicy, Namespace: "x", Name: "np"}: {"spec.ingress[0].ports[0].portName"},
			},
			want: want{warnings: [][]string{{"NetworkPolicy x/np", "spec.ingress[0].ports[0].portName"}}},
			check: func(t *testing.T, p *policy.Policy) {
				if r := p.Rules[policy.Ingress][0]; r.FailClosed == "" {
					t.Errorf("rule = %+v", r)
				}
			},
		},
		{
			name: "unknown field elsewhere in spec rejects the policy",
			ref:  "AdminNetworkPolicy anp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec: {priority: 1, subject: {namespaces: {}}}`,
			unknown: map[cluster.ObjectKey][]string{
				{Kind: cluster.KindAdminPolicy, Name: "anp"}: {"spec.enforcement"},
			},
			want: want{rejected: true, errs: [][]string{{"AdminNetworkPolicy anp", "spec.enforcement", "unknown field", "policy not loaded"}}},
		},
		{
			name: "unknown field in a rule outside any entry rejects the policy",
			ref:  "ClusterNetworkPolicy cnp",
			yaml: `
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: cnp}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]`,
			unknown: map[cluster.ObjectKey][]string{
				{Kind: cluster.KindClusterPolicy, Name: "cnp"}: {"spec.ingress[0].schedule"},
			},
			want: want{rejected: true, errs: [][]string{{"ClusterNetworkPolicy cnp", "spec.ingress[0].schedule", "policy not loaded"}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			snap := load(t, tc.yaml+"\n---\n"+companions, tc.unknown)
			m := policy.Build(snap)
			for _, ref := range companionRefs {
				if find(m, ref) == nil {
					t.Errorf("companion %s did not build; model has %v", ref, refs(m))
				}
			}
			if len(m.Errors) != len(tc.want.errs) {
				t.Errorf("%d errors, want %d: %v", len(m.Errors), len(tc.want.errs), m.Errors)
			}
			for i, parts := range tc.want.errs {
				if i >= len(m.Errors) {
					break
				}
				for _, part := range parts {
					if !strings.Contains(m.Errors[i].Error(), part) {
						t.Errorf("error %q does not contain %q", m.Errors[i], part)
					}
				}
			}
			if len(m.Warnings) != len(tc.want.warnings) {
				t.Errorf("%d warnings, want %d: %q", len(m.Warnings), len(tc.want.warnings), m.Warnings)
			}
			for i, parts := range tc.want.warnings {
				if i >= len(m.Warnings) {
					break
				}
				for _, part := range parts {
					if !strings.Contains(m.Warnings[i], part) {
						t.Errorf("warning %q does not contain %q", m.Warnings[i], part)
					}
				}
			}
			p := find(m, tc.ref)
			if tc.want.rejected {
				if p != nil {
					t.Errorf("%s was not rejected", tc.ref)
				}
				if len(m.Policies) != len(companionRefs) {
					t.Errorf("policies = %v", refs(m))
				}
				return
			}
			if p == nil {
				t.Fatalf("%s missing; model has %v", tc.ref, refs(m))
			}
			if len(m.Policies) != len(companionRefs)+1 {
				t.Errorf("policies = %v", refs(m))
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
}

// TestBuildUnknownFieldsFromLoader goes through the loader: an unknown field
// in a peer, written in YAML, must make the rule fail closed.
func TestBuildUnknownFieldsFromLoader(t *testing.T) {
	snap := load(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{podSelector: {}, serviceAccountSelector: {}}]
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp}
spec: {priority: 1, subject: {namespaces: {}}, futureMode: strict}
`, nil)
	m := policy.Build(snap)
	np := find(m, "NetworkPolicy x/np")
	if np == nil || np.Rules[policy.Ingress][0].FailClosed == "" {
		t.Errorf("NetworkPolicy = %+v", np)
	}
	if len(m.Warnings) != 1 || !strings.Contains(m.Warnings[0], "spec.ingress[0].from[0].serviceAccountSelector") {
		t.Errorf("warnings = %q", m.Warnings)
	}
	if find(m, "AdminNetworkPolicy anp") != nil || len(m.Errors) != 1 || !strings.Contains(m.Errors[0].Error(), "spec.futureMode") {
		t.Errorf("policies %v, errors %v", refs(m), m.Errors)
	}
}

func TestBuildOrder(t *testing.T) {
	snap := load(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b, namespace: "y"}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: z, namespace: x}
spec: {podSelector: {}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a, namespace: "y"}
spec: {podSelector: {}}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata: {name: default}
spec: {subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: base-1000}
spec: {tier: Baseline, priority: 1000, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: base-0}
spec: {tier: Baseline, priority: 0, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: admin-10-a}
spec: {tier: Admin, priority: 10, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp-10-b}
spec: {priority: 10, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp-10-a}
spec: {priority: 10, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: admin-5}
spec: {tier: Admin, priority: 5, subject: {namespaces: {}}}
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: anp-1000}
spec: {priority: 1000, subject: {namespaces: {}}}
`, nil)
	m := policy.Build(snap)
	if len(m.Errors) > 0 {
		t.Fatal(m.Errors)
	}
	want := []string{
		"ClusterNetworkPolicy admin-5",
		"AdminNetworkPolicy anp-10-a", // same priority: kind, then name
		"AdminNetworkPolicy anp-10-b",
		"ClusterNetworkPolicy admin-10-a",
		"AdminNetworkPolicy anp-1000",
		"NetworkPolicy x/z", // namespace, then name
		"NetworkPolicy y/a",
		"NetworkPolicy y/b",
		"ClusterNetworkPolicy base-0",
		"ClusterNetworkPolicy base-1000",
		"BaselineAdminNetworkPolicy default", // after every Baseline CNP
	}
	if got := refs(m); !slices.Equal(got, want) {
		t.Errorf("order:\n got %q\nwant %q", got, want)
	}
	for i := 1; i < len(m.Policies); i++ {
		if policy.Less(m.Policies[i], m.Policies[i-1]) {
			t.Errorf("Less(%s, %s) is true", m.Policies[i].Ref(), m.Policies[i-1].Ref())
		}
	}
	// The order does not depend on the order of the input.
	rev := cluster.New()
	rev.AdminPolicies = append(rev.AdminPolicies, snap.AdminPolicies...)
	slices.Reverse(rev.AdminPolicies)
	rev.ClusterPolicies = append(rev.ClusterPolicies, snap.ClusterPolicies...)
	slices.Reverse(rev.ClusterPolicies)
	rev.NetworkPolicies = append(rev.NetworkPolicies, snap.NetworkPolicies...)
	slices.Reverse(rev.NetworkPolicies)
	rev.BaselinePolicies = snap.BaselinePolicies
	if got := refs(policy.Build(rev)); !slices.Equal(got, want) {
		t.Errorf("reversed input order:\n got %q\nwant %q", got, want)
	}
}

func TestPortMatches(t *testing.T) {
	dst := []corev1.ContainerPort{
		{Name: "web", ContainerPort: 8080},
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
	}
	cases := []struct {
		port  policy.Port
		proto corev1.Protocol
		n     int32
		want  bool
	}{
		{policy.Port{Protocol: corev1.ProtocolTCP, Start: 80, End: 80}, corev1.ProtocolTCP, 80, true},
		{policy.Port{Protocol: corev1.ProtocolTCP, Start: 80, End: 80}, corev1.ProtocolUDP, 80, false},
		{policy.Port{Protocol: corev1.ProtocolSCTP}, corev1.ProtocolSCTP, 9, true},
		{policy.Port{Protocol: corev1.ProtocolSCTP}, corev1.ProtocolTCP, 9, false}, // SCTP is never TCP
		{policy.Port{Protocol: corev1.ProtocolTCP, Start: 80, End: 90}, corev1.ProtocolTCP, 91, false},
		{policy.Port{Name: "web"}, corev1.ProtocolTCP, 8080, true},
		{policy.Port{Name: "web"}, corev1.ProtocolUDP, 8080, false},
		{policy.Port{Name: "web", Protocol: corev1.ProtocolTCP}, corev1.ProtocolTCP, 80, false},
		{policy.Port{Name: "dns", Protocol: corev1.ProtocolTCP}, corev1.ProtocolUDP, 53, false}, // name AND protocol
		{policy.Port{Name: "dns"}, corev1.ProtocolUDP, 53, true},
		{policy.Port{Name: "missing"}, corev1.ProtocolTCP, 8080, false},
	}
	for _, tc := range cases {
		if got := tc.port.Matches(tc.proto, tc.n, dst); got != tc.want {
			t.Errorf("%s.Matches(%s, %d) = %v, want %v", tc.port, tc.proto, tc.n, got, tc.want)
		}
	}
}

// TestBuildMixedFile builds testdata/mixed.yaml: every valid policy builds,
// each invalid one is named with its field, bad rules fail closed.
func TestBuildMixedFile(t *testing.T) {
	snap, r := cluster.LoadPaths([]string{"testdata/mixed.yaml"}, nil)
	if len(r.Errors) > 0 {
		t.Fatal(r.Errors)
	}
	m := policy.Build(snap)
	want := []string{
		"AdminNetworkPolicy pass-z", // priority 20 both: kind order
		"ClusterNetworkPolicy wrong-action",
		"NetworkPolicy x/allow-web",
		"NetworkPolicy y/bad-cidr",
		"ClusterNetworkPolicy baseline-udp",
		"BaselineAdminNetworkPolicy default",
	}
	if got := refs(m); !slices.Equal(got, want) {
		t.Errorf("policies:\n got %q\nwant %q", got, want)
	}
	wantErrs := [][]string{
		{"NetworkPolicy y/bad-cidr", "spec.ingress[0].from[0].ipBlock.cidr"},
		{"AdminNetworkPolicy bad-priority", "spec.priority", "policy not loaded"},
		{"ClusterNetworkPolicy wrong-action", "spec.egress[0].action", `"Allow"`},
		{"ClusterNetworkPolicy bad-tier", "spec.tier", "policy not loaded"},
	}
	if len(m.Errors) != len(wantErrs) {
		t.Fatalf("errors = %v", m.Errors)
	}
	for i, parts := range wantErrs {
		for _, p := range parts {
			if !strings.Contains(m.Errors[i].Error(), p) {
				t.Errorf("error %q does not contain %q", m.Errors[i], p)
			}
		}
	}
	failClosed := map[string]bool{}
	for _, p := range m.Policies {
		for _, d := range policy.Directions {
			for _, r := range p.Rules[d] {
				if r.FailClosed != "" {
					failClosed[p.Ref()+" "+r.Ref(d)] = true
				}
			}
		}
	}
	if len(failClosed) != 2 || !failClosed["NetworkPolicy y/bad-cidr ingress[0]"] || !failClosed["ClusterNetworkPolicy wrong-action egress[0]"] {
		t.Errorf("fail-closed rules = %v", failClosed)
	}
	if pz := find(m, "AdminNetworkPolicy pass-z"); pz == nil || pz.Rules[policy.Ingress][1].Ref(policy.Ingress) != `ingress[1] "deny-rest"` {
		t.Errorf("pass-z = %+v", pz)
	}
}
