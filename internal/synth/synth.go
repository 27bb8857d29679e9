// Package synth generates deterministic synthetic clusters for benchmarks
// and scale harnesses: namespaces with labels, pods with labels, IPs and
// named ports, and a mix of NetworkPolicies, AdminNetworkPolicies,
// ClusterNetworkPolicies (both tiers) and the BaselineAdminNetworkPolicy.
// Two shapes: easy (this file, the benchmarks' cluster, whose policies
// keep a node's table small) and realistic (realistic.go, policies as
// platform teams write them, whose table grows as pods x policies).
package synth

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/netpol/netpol/pkg/cluster"
)

// Spec sizes the cluster.
type Spec struct {
	// Shape is how the cluster is written: "" or "easy" (ShapeEasy), or
	// "realistic" (ShapeRealistic, realistic.go: the policies platform
	// teams write, whose compiled table grows as pods x policies).
	Shape           string
	Namespaces      int
	Pods            int // spread evenly over the namespaces
	Nodes           int
	NetworkPolicies int // spread evenly over the namespaces
	// AdminPolicies: easy, half Admin tier (ANP and CNP), half Baseline
	// (CNP, plus the BANP); realistic, 80% Admin (a few of them ANPs),
	// 20% Baseline, plus the BANP (counted in).
	AdminPolicies int
	// Services are spread over the namespaces, each selecting one app
	// there, with an EndpointSlice of up to 5 of its pods (realistic: up
	// to 10).
	Services int
	Seed     uint64
}

// NodeScale is the kernel data plane's benchmark cluster: 10,000 pods on
// 99 nodes (about 100 local pods per node, spread over the namespaces),
// 1,000 NetworkPolicies, 100 Admin/Baseline policies.
var NodeScale = Spec{Namespaces: 100, Pods: 10000, Nodes: 99, NetworkPolicies: 1000, AdminPolicies: 100, Seed: 1}

// RealisticScale is NodeScale's size in the realistic shape, with
// Services: 10,000 pods on 100 nodes (node-001 ... node-100).
var RealisticScale = Spec{Shape: ShapeRealistic, Namespaces: 100, Pods: 10000, Nodes: 100, NetworkPolicies: 1000, AdminPolicies: 100, Services: 2000, Seed: 1}

// WithPods is s with pods pods and the counts that scale with them as
// RealisticScale's do (a namespace and a node per 100 pods, a
// NetworkPolicy per 10, an Admin or Baseline policy per 100), without
// Services.
func (s Spec) WithPods(pods int) Spec {
	s.Pods, s.Namespaces, s.Nodes, s.NetworkPolicies, s.AdminPolicies, s.Services = pods, pods/100, pods/100, pods/10, pods/100, 0
	return s
}

// The shapes.
const (
	ShapeEasy      = "easy"
	ShapeRealistic = "realistic"
)

// CheckShape says whether shape is one YAML knows.
func CheckShape(shape string) error {
	switch shape {
	case "", ShapeEasy, ShapeRealistic:
		return nil
	}
	return fmt.Errorf("unknown shape %q (%s or %s)", shape, ShapeEasy, ShapeRealistic)
}

// Snapshot loads the cluster as the CLI would read its YAML.
func Snapshot(s Spec) (*cluster.Snapshot, error) {
	snap := cluster.New()
	if r := snap.AddDocuments([]byte(YAML(s)), "synth", false); len(r.Errors) > 0 {
		return nil, fmt.Errorf("synthetic cluster: %v", r.Errors)
	}
	return snap, nil
}

// YAML renders the cluster as one multi-document YAML stream, as
// `kubectl get -o yaml` users would feed it. It panics on a shape
// CheckShape rejects.
func YAML(s Spec) string {
	if err := CheckShape(s.Shape); err != nil {
		panic("synth: " + err.Error())
	}
	if s.Shape == ShapeRealistic {
		return realisticYAML(s)
	}
	return easyYAML(s)
}

// easyYAML is the easy shape: the benchmarks' cluster, unchanged.
func easyYAML(s Spec) string {
	r := rand.New(rand.NewPCG(s.Seed, 42))
	var docs []string
	for n := 0; n < s.Nodes; n++ {
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: node-%d
  labels: {kubernetes.io/hostname: node-%d, zone: zone-%d}
status:
  addresses:
  - {type: InternalIP, address: 172.18.%d.%d}`, n, n, n%3, n/250, n%250+1))
	}
	tiers := []string{"frontend", "backend", "db", "cache"}
	for ns := 0; ns < s.Namespaces; ns++ {
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: ns-%d
  labels: {team: team-%d, env: %s}`, ns, ns%10, []string{"prod", "staging", "dev"}[ns%3]))
	}
	for i := 0; i < s.Pods; i++ {
		ns := i % s.Namespaces
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: pod-%d
  namespace: ns-%d
  labels: {app: app-%d, tier: %s}
spec:
  nodeName: node-%d
  containers:
  - name: main
    ports:
    - {name: http, containerPort: 80, protocol: TCP}
    - {name: metrics, containerPort: 9090, protocol: TCP}
    - {name: dns, containerPort: 53, protocol: UDP}
status:
  phase: Running
  podIP: %s`, i, ns, i%7, tiers[i%len(tiers)], i%max(s.Nodes, 1), podIP(i)))
	}
	for i := 0; i < s.NetworkPolicies; i++ {
		docs = append(docs, networkPolicy(r, i, i%s.Namespaces, s.Namespaces))
	}
	for i := 0; i < s.AdminPolicies; i++ {
		docs = append(docs, adminPolicy(r, i, s))
	}
	for i := 0; i < s.Services; i++ {
		docs = append(docs, service(i, s)...)
	}
	return strings.Join(docs, "\n---\n") + "\n"
}

// podIP is pod i's address.
func podIP(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", 64+(i>>16)&63, (i>>8)&255, i&255)
}

// service is Service i and its EndpointSlice: the pods of its namespace
// with its app label, up to 5 (pod j is in namespace j mod Namespaces,
// with app j mod 7).
func service(i int, s Spec) []string {
	ns, app := i%s.Namespaces, i%7
	ip := 10<<24 | 96<<16 | (i + 16)
	svc := fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: svc-%d
  namespace: ns-%d
spec:
  clusterIP: 10.96.%d.%d
  clusterIPs: [10.96.%d.%d]
  selector: {app: app-%d}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: http}`, i, ns, ip>>8&255, ip&255, ip>>8&255, ip&255, app)
	var eps []string
	for j := ns; j < s.Pods && len(eps) < 5; j += s.Namespaces {
		if j%7 == app {
			eps = append(eps, fmt.Sprintf(`
- addresses: [%s]
  nodeName: node-%d
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: ns-%d, name: pod-%d}`, podIP(j), j%max(s.Nodes, 1), ns, j))
		}
	}
	slice := fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-%d-1
  namespace: ns-%d
  labels: {kubernetes.io/service-name: svc-%d}
addressType: IPv4
ports:
- {name: http, protocol: TCP, port: 80}
endpoints:%s`, i, ns, i, strings.Join(eps, ""))
	if len(eps) == 0 {
		slice += " []"
	}
	return []string{svc, slice}
}

func networkPolicy(r *rand.Rand, i, ns, namespaces int) string {
	head := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: np-%d
  namespace: ns-%d
spec:
  podSelector:
    matchLabels: {app: app-%d}
`, i, ns, r.IntN(7))
	switch i % 5 {
	case 0: // default deny ingress for the namespace
		return fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: np-%d\n  namespace: ns-%d\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]", i, ns)
	case 1: // allow from a team's namespaces on a named port
		return head + fmt.Sprintf(`  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {team: team-%d}
    ports:
    - {port: http}`, r.IntN(10))
	case 2: // allow from some tiers, any namespace of an env, port range
		return head + fmt.Sprintf(`  ingress:
  - from:
    - namespaceSelector:
        matchLabels: {env: %s}
      podSelector:
        matchExpressions:
        - {key: tier, operator: In, values: [frontend, backend]}
    ports:
    - {protocol: TCP, port: 80, endPort: %d}`, []string{"prod", "staging", "dev"}[r.IntN(3)], 80+r.IntN(100))
	case 3: // egress to same namespace and DNS
		return head + fmt.Sprintf(`  policyTypes: [Egress]
  egress:
  - to:
    - podSelector: {}
  - to:
    - namespaceSelector:
        matchLabels: {kubernetes.io/metadata.name: ns-%d}
    ports:
    - {protocol: UDP, port: 53}`, r.IntN(namespaces))
	}
	// ipBlock with except
	block := r.IntN(16)
	return head + fmt.Sprintf(`  ingress:
  - from:
    - ipBlock:
        cidr: 10.64.%d.0/24
        except: [10.64.%d.0/28]
    - podSelector:
        matchLabels: {tier: cache}`, block, block)
}

func adminPolicy(r *rand.Rand, i int, s Spec) string {
	if i == s.AdminPolicies-1 {
		return `apiVersion: policy.networking.k8s.io/v1alpha1
kind: BaselineAdminNetworkPolicy
metadata:
  name: default
spec:
  subject:
    namespaces:
      matchLabels: {env: prod}
  ingress:
  - name: deny-from-dev
    action: Deny
    from:
    - namespaces:
        matchLabels: {env: dev}`
	}
	action := []string{"Accept", "Deny", "Pass"}[r.IntN(3)]
	tier := "Admin"
	if i%2 == 1 {
		tier = "Baseline"
		if action == "Pass" {
			action = "Deny"
		}
	}
	if tier == "Admin" && i%4 == 0 {
		anpAction := map[string]string{"Accept": "Allow", "Deny": "Deny", "Pass": "Pass"}[action]
		return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata:
  name: anp-%d
spec:
  priority: %d
  subject:
    namespaces:
      matchLabels: {team: team-%d}
  ingress:
  - name: from-team
    action: %s
    from:
    - namespaces:
        matchLabels: {team: team-%d}
    ports:
    - portNumber: {protocol: TCP, port: 80}
  egress:
  - name: to-nodes
    action: Allow
    to:
    - nodes:
        matchLabels: {zone: zone-%d}`, i, r.IntN(1000), r.IntN(10), anpAction, r.IntN(10), r.IntN(3))
	}
	return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata:
  name: cnp-%d
spec:
  tier: %s
  priority: %d
  subject:
    pods:
      namespaceSelector:
        matchLabels: {env: %s}
      podSelector:
        matchLabels: {tier: %s}
  ingress:
  - name: from-tier
    action: %s
    from:
    - pods:
        namespaceSelector: {}
        podSelector:
          matchLabels: {tier: %s}
    protocols:
    - tcp:
        destinationPort:
          range: {start: 80, end: %d}
  egress:
  - name: to-network
    action: %s
    to:
    - networks: [10.64.%d.0/24]`, i, tier, r.IntN(1000), []string{"prod", "staging", "dev"}[r.IntN(3)],
		[]string{"frontend", "backend", "db", "cache"}[r.IntN(4)], action,
		[]string{"frontend", "backend", "db", "cache"}[r.IntN(4)], 80+r.IntN(9000), action, r.IntN(16))
}
