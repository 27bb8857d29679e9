package synth

// The realistic shape: a cluster whose policies are written the way
// platform teams write them, so that the compiled table grows as
// pods x policies.
//
//   - Namespaces: the platform's (kube-system, monitoring, ingress-nginx)
//     and the teams' (<team>-<env>, <team>-<area>-<env>), labelled with
//     kubernetes.io/metadata.name, team (about one team per ten
//     namespaces), env (prod, staging, dev) and sometimes tier, pci and
//     istio-injection.
//   - Pods: replicas of Deployments (1-10, one pod-template-hash) and
//     StatefulSets (1-3, one identity per pod) with the
//     app.kubernetes.io labels and named container ports, spread over the
//     nodes; a host-network node-exporter DaemonSet when there are enough
//     pods.
//   - NetworkPolicies: per namespace, a default deny, same-namespace,
//     DNS, Prometheus and ingress-controller allowances, then peers that
//     select whole namespaces by team and environment (matchLabels and
//     matchExpressions), egress to the internet but the private ranges,
//     port ranges, component selectors, then one policy per workload.
//   - ClusterNetworkPolicies: 80% Admin tier (cluster-wide DNS, metadata
//     service, monitoring, environment isolation, node access, PCI; then
//     per team: Pass within the team, database protection, environment
//     isolation, matrices of partner teams of up to 25 rules), a few of
//     them v1alpha1 AdminNetworkPolicies; 20% Baseline tier (per team, then
//     per namespace); the BaselineAdminNetworkPolicy "default".
//   - Services: one workload's pods each, target ports by name, with an
//     EndpointSlice of its Running pods.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Platform namespaces, counted in Spec.Namespaces.
const (
	nsKubeSystem = "kube-system"
	nsMonitoring = "monitoring"
	nsIngress    = "ingress-nginx"
)

var (
	envs      = []string{"prod", "staging", "dev"}
	teamWords = []string{"payments", "checkout", "search", "identity", "catalog", "orders", "shipping", "billing",
		"ledger", "fraud", "ads", "recommendations", "media", "messaging", "notifications", "growth", "analytics",
		"mobile", "web", "partners", "loyalty", "pricing", "inventory", "reviews", "support", "maps", "booking",
		"travel", "risk", "compliance", "data", "ml"}
	areaWords = []string{"core", "edge", "jobs", "data", "internal", "public", "batch", "stream"}
	nsTiers   = []string{"web", "services", "data"}
	// components are the app.kubernetes.io/component values of the
	// teams' workloads, with their weights (percent).
	components = []struct {
		name   string
		weight int
		names  []string
	}{
		{"frontend", 15, []string{"web", "storefront", "portal", "dashboard", "ui"}},
		{"backend", 25, []string{"orders", "billing", "catalog", "inventory", "accounts", "ledger", "pricing", "search", "profiles", "quotes"}},
		{"api", 20, []string{"api", "gateway", "graphql", "public-api", "edge-api"}},
		{"worker", 15, []string{"worker", "consumer", "scheduler", "indexer", "exporter", "reconciler"}},
		{"database", 12, []string{"postgres", "mysql", "mongodb"}},
		{"cache", 13, []string{"redis", "memcached"}},
	}
	// metadataCIDR is the cloud metadata service.
	metadataCIDR = "169.254.169.254/32"
	privateCIDRs = []string{"10.0.0.0/8", "172.16.0.0/12", metadataCIDR}
)

// hashAlphabet is the alphabet of Kubernetes' generated name suffixes.
const hashAlphabet = "bcdfghjklmnpqrstvwxz2456789"

type cport struct {
	name  string
	port  int
	proto string // TCP or UDP
}

type rNamespace struct {
	name, team, env string
	teamIdx         int // -1 for the platform namespaces
	labels          [][2]string
	workloads       []*workload
	policies        int // NetworkPolicies made so far
}

type workload struct {
	ns                     *rNamespace
	kind                   string // Deployment, StatefulSet, DaemonSet
	name, instance, partOf string
	hash                   string // pod-template-hash or controller-revision-hash
	replicas               int
	ports                  []cport
	labels                 [][2]string // shared by every replica
	hostNetwork            bool
	pods                   []*rPod
	selector               [][2]string // a Service's selector for it
}

type rPod struct {
	w      *workload
	name   string
	node   int
	ip     string
	labels [][2]string // the workload's plus the pod's own
}

type realistic struct {
	s     Spec
	r     *rand.Rand
	nodes []string // InternalIP by node index
	teams []string
	ns    []*rNamespace
	app   []*rNamespace // the teams' namespaces
	pods  []*rPod
	docs  []string
	// nodeBlock is the size of each node's share of the pod network.
	nodeBlock int
}

// realisticYAML renders the realistic shape.
func realisticYAML(s Spec) string {
	c := &realistic{s: s, r: rand.New(rand.NewPCG(s.Seed, 42))}
	c.makeNodes()
	if s.Namespaces > 0 {
		c.makeNamespaces()
		c.makeWorkloads()
		c.placePods()
	}
	for i := range c.nodes {
		c.docs = append(c.docs, c.nodeYAML(i))
	}
	for _, ns := range c.ns {
		c.docs = append(c.docs, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels: %s", ns.name, flowMap(ns.labels)))
	}
	for _, p := range c.pods {
		c.docs = append(c.docs, c.podYAML(p))
	}
	if s.Namespaces > 0 {
		for i := 0; i < s.NetworkPolicies; i++ {
			ns := c.ns[i%len(c.ns)]
			c.docs = append(c.docs, c.networkPolicy(ns, ns.policies).yaml(ns.name))
			ns.policies++
		}
	}
	for _, p := range c.adminPolicies() {
		c.docs = append(c.docs, p.yaml())
	}
	if s.Namespaces > 0 {
		for i := 0; i < s.Services; i++ {
			c.docs = append(c.docs, c.service(i)...)
		}
	}
	if len(c.docs) == 0 {
		return ""
	}
	return strings.Join(c.docs, "\n---\n") + "\n"
}

// ---- nodes, namespaces, workloads, pods ----

// nodeName is node i's name: node-001 first.
func nodeName(i int) string { return fmt.Sprintf("node-%03d", i+1) }

func (c *realistic) makeNodes() {
	for i := 0; i < c.s.Nodes; i++ {
		c.nodes = append(c.nodes, ipv4(10<<24|uint32(i+10)))
	}
}

func (c *realistic) makeNamespaces() {
	n := c.s.Namespaces
	platform := []string{nsKubeSystem, nsMonitoring, nsIngress}
	platform = platform[:min(len(platform), max(n-1, 0))]
	for _, name := range platform {
		ns := &rNamespace{name: name, teamIdx: -1, labels: [][2]string{{"kubernetes.io/metadata.name", name}}}
		if name != nsKubeSystem {
			ns.team = "platform"
			ns.labels = append(ns.labels, [2]string{"team", "platform"}, [2]string{"purpose", name})
		}
		c.ns = append(c.ns, ns)
	}
	apps := n - len(platform)
	teams := max(1, (apps+5)/10)
	for t := 0; t < teams; t++ {
		name := teamWords[t%len(teamWords)]
		if t >= len(teamWords) {
			name += strconv.Itoa(t/len(teamWords) + 1)
		}
		c.teams = append(c.teams, name)
	}
	for i := 0; i < apps; i++ {
		t, round := i%teams, i/teams
		env := envs[round%3]
		name := c.teams[t] + "-" + env
		if k := round / 3; k > 0 {
			area := areaWords[(k-1)%len(areaWords)]
			if k > len(areaWords) {
				area += strconv.Itoa((k-1)/len(areaWords) + 1)
			}
			name = c.teams[t] + "-" + area + "-" + env
		}
		ns := &rNamespace{name: name, team: c.teams[t], env: env, teamIdx: t, labels: [][2]string{
			{"kubernetes.io/metadata.name", name}, {"team", c.teams[t]}, {"env", env}}}
		if c.r.IntN(2) == 0 {
			ns.labels = append(ns.labels, [2]string{"tier", nsTiers[c.r.IntN(len(nsTiers))]})
		}
		if env == "prod" && c.r.IntN(5) == 0 {
			ns.labels = append(ns.labels, [2]string{"pci", "true"})
		}
		if c.r.IntN(10) < 3 {
			ns.labels = append(ns.labels, [2]string{"istio-injection", "enabled"})
		}
		c.ns = append(c.ns, ns)
		c.app = append(c.app, ns)
	}
}

func (c *realistic) namespace(name string) *rNamespace {
	for _, ns := range c.ns {
		if ns.name == name {
			return ns
		}
	}
	return nil
}

// makeWorkloads fills the namespaces with workloads up to Spec.Pods:
// the platform's first, then the rest spread evenly over the teams'
// namespaces (all of it over the platform's when there are none).
func (c *realistic) makeWorkloads() {
	budget := c.s.Pods
	add := func(ns *rNamespace, w *workload) {
		if ns == nil || budget == 0 {
			return
		}
		w.ns = ns
		w.replicas = min(w.replicas, budget)
		budget -= w.replicas
		c.finishWorkload(w)
		ns.workloads = append(ns.workloads, w)
	}
	add(c.namespace(nsKubeSystem), &workload{kind: "Deployment", name: "coredns", replicas: 2,
		labels: [][2]string{{"k8s-app", "kube-dns"}}, selector: [][2]string{{"k8s-app", "kube-dns"}},
		ports: []cport{{"dns", 53, "UDP"}, {"dns-tcp", 53, "TCP"}, {"metrics", 9153, "TCP"}}})
	add(c.namespace(nsMonitoring), platformWorkload("StatefulSet", "prometheus", "k8s", "prometheus", 2, cport{"web", 9090, "TCP"}))
	add(c.namespace(nsIngress), platformWorkload("Deployment", "ingress-nginx", "ingress-nginx", "controller", 3,
		cport{"http", 80, "TCP"}, cport{"https", 443, "TCP"}, cport{"metrics", 10254, "TCP"}))
	add(c.namespace(nsKubeSystem), &workload{kind: "Deployment", name: "metrics-server", replicas: 1,
		labels: [][2]string{{"k8s-app", "metrics-server"}}, selector: [][2]string{{"k8s-app", "metrics-server"}},
		ports: []cport{{"https", 10250, "TCP"}}})
	add(c.namespace(nsMonitoring), platformWorkload("Deployment", "grafana", "grafana", "dashboard", 1, cport{"http", 3000, "TCP"}))
	if len(c.app) > 0 && c.s.Pods >= 20*len(c.nodes) {
		add(c.namespace(nsMonitoring), func() *workload {
			w := platformWorkload("DaemonSet", "node-exporter", "node-exporter", "exporter", len(c.nodes), cport{"metrics", 9100, "TCP"})
			w.hostNetwork = true
			return w
		}())
	}
	spread := c.app
	if len(spread) == 0 {
		spread = c.ns
	}
	total := budget
	for i, ns := range spread {
		nsBudget := total / len(spread)
		if i < total%len(spread) {
			nsBudget++
		}
		for nsBudget > 0 {
			w := c.teamWorkload(ns)
			w.replicas = min(w.replicas, nsBudget)
			nsBudget -= w.replicas
			add(ns, w)
		}
	}
}

func platformWorkload(kind, name, instance, component string, replicas int, ports ...cport) *workload {
	w := &workload{kind: kind, name: name, instance: instance, partOf: "platform", replicas: replicas, ports: ports}
	w.labels = [][2]string{{"app.kubernetes.io/name", name}, {"app.kubernetes.io/instance", instance},
		{"app.kubernetes.io/component", component}, {"app.kubernetes.io/part-of", "platform"}}
	w.selector = w.labels[:2]
	return w
}

// teamWorkload is a new workload of a team's namespace.
func (c *realistic) teamWorkload(ns *rNamespace) *workload {
	k, comp := c.r.IntN(100), components[0]
	for _, cp := range components {
		if k < cp.weight {
			comp = cp
			break
		}
		k -= cp.weight
	}
	base := comp.names[c.r.IntN(len(comp.names))]
	name := base
	for n := 2; slices.ContainsFunc(ns.workloads, func(w *workload) bool { return w.name == name }); n++ {
		name = fmt.Sprintf("%s-%d", base, n)
	}
	w := &workload{kind: "Deployment", name: name, instance: name, partOf: orDefault(ns.team, "platform"),
		replicas: 1 + c.r.IntN(10)}
	if ns.env != "" {
		w.instance += "-" + ns.env
	}
	metrics := cport{"metrics", 9100, "TCP"}
	switch comp.name {
	case "frontend":
		w.ports = []cport{{"http", 8080, "TCP"}, metrics}
	case "backend", "api":
		w.ports = []cport{{"http", 8080, "TCP"}, {"grpc", 9090, "TCP"}, metrics}
	case "worker":
		w.ports = []cport{metrics}
	case "database":
		w.kind, w.replicas = "StatefulSet", 1+c.r.IntN(3)
		port := map[string]cport{"postgres": {"postgres", 5432, "TCP"}, "mysql": {"mysql", 3306, "TCP"}, "mongodb": {"mongodb", 27017, "TCP"}}[base]
		w.ports = []cport{port, {"metrics", 9187, "TCP"}}
	case "cache":
		w.kind, w.replicas = "StatefulSet", 1+c.r.IntN(3)
		port := cport{"redis", 6379, "TCP"}
		if base == "memcached" {
			port = cport{"memcache", 11211, "TCP"}
		}
		w.ports = []cport{port, {"metrics", 9121, "TCP"}}
	}
	w.labels = [][2]string{{"app.kubernetes.io/name", name}, {"app.kubernetes.io/instance", w.instance},
		{"app.kubernetes.io/component", comp.name}, {"app.kubernetes.io/part-of", w.partOf}}
	w.selector = w.labels[:2]
	return w
}

// finishWorkload makes the pods of w (not yet placed).
func (c *realistic) finishWorkload(w *workload) {
	switch w.kind {
	case "Deployment":
		w.hash = c.suffix(10)
		w.labels = append(w.labels, [2]string{"pod-template-hash", w.hash})
	case "StatefulSet":
		w.hash = w.name + "-" + c.suffix(10)
		w.labels = append(w.labels, [2]string{"controller-revision-hash", w.hash})
	case "DaemonSet":
		w.hash = c.suffix(10)
		w.labels = append(w.labels, [2]string{"controller-revision-hash", w.hash}, [2]string{"pod-template-generation", "1"})
	}
	taken := map[string]bool{}
	for j := 0; j < w.replicas; j++ {
		p := &rPod{w: w, labels: w.labels}
		switch w.kind {
		case "StatefulSet":
			p.name = fmt.Sprintf("%s-%d", w.name, j)
			p.labels = append(slices.Clip(w.labels), [2]string{"statefulset.kubernetes.io/pod-name", p.name},
				[2]string{"apps.kubernetes.io/pod-index", strconv.Itoa(j)})
		case "DaemonSet":
			p.name = w.name + "-" + c.suffix(5)
		default:
			p.name = w.name + "-" + w.hash + "-" + c.suffix(5)
		}
		for taken[p.name] {
			p.name = p.name[:len(p.name)-5] + c.suffix(5)
		}
		taken[p.name] = true
		w.pods = append(w.pods, p)
		c.pods = append(c.pods, p)
	}
}

func (c *realistic) suffix(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = hashAlphabet[c.r.IntN(len(hashAlphabet))]
	}
	return string(b)
}

// placePods spreads the pods over the nodes (a workload's replicas on
// consecutive nodes from a random one, a DaemonSet's one per node) and
// gives each its address: node i owns a block of 10.64.0.0/10 (a /24 while
// its pods fit), its pods take .2 on.
func (c *realistic) placePods() {
	if len(c.nodes) == 0 {
		for i, p := range c.pods {
			p.node, p.ip = -1, ipv4(10<<24|64<<16|uint32(i+2))
		}
		return
	}
	perNode := make([]int, len(c.nodes))
	for _, ns := range c.ns {
		for _, w := range ns.workloads {
			start := c.r.IntN(len(c.nodes))
			if w.kind == "DaemonSet" {
				start = 0
			}
			for j, p := range w.pods {
				p.node = (start + j) % len(c.nodes)
				if !w.hostNetwork {
					perNode[p.node]++
				}
			}
		}
	}
	block := 256
	for block < slices.Max(perNode)+2 {
		block *= 2
	}
	used := make([]int, len(c.nodes))
	for _, p := range c.pods {
		if p.w.hostNetwork {
			p.ip = c.nodes[p.node]
			continue
		}
		p.ip = ipv4(10<<24 | 64<<16 + uint32(p.node*block+2+used[p.node]))
		used[p.node]++
	}
	c.nodeBlock = block
}

func ipv4(a uint32) string {
	return fmt.Sprintf("%d.%d.%d.%d", a>>24, a>>16&255, a>>8&255, a&255)
}

func (c *realistic) nodeYAML(i int) string {
	zone := "zone-" + string(rune('a'+i%3))
	var cidr string
	if c.nodeBlock > 0 {
		bits := 32
		for b := c.nodeBlock; b > 1; b /= 2 {
			bits--
		}
		block := fmt.Sprintf("%s/%d", ipv4(10<<24|64<<16+uint32(i*c.nodeBlock)), bits)
		cidr = fmt.Sprintf("\n  podCIDR: %s\n  podCIDRs: [%s]", block, block)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %[1]s
  labels: {kubernetes.io/hostname: %[1]s, kubernetes.io/os: linux, topology.kubernetes.io/zone: %[2]s, node-role: worker}
spec:%[3]s
status:
  addresses:
  - {type: InternalIP, address: %[4]s}
  - {type: Hostname, address: %[1]s}`, nodeName(i), zone, cidr, c.nodes[i])
}

func (c *realistic) podYAML(p *rPod) string {
	w := p.w
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: %s\n  labels:\n", p.name, w.ns.name)
	for _, l := range p.labels {
		fmt.Fprintf(&b, "    %s: %s\n", l[0], q(l[1]))
	}
	owner, ownerKind := w.name, w.kind
	if w.kind == "Deployment" {
		owner, ownerKind = w.name+"-"+w.hash, "ReplicaSet"
	}
	fmt.Fprintf(&b, "  ownerReferences:\n  - {apiVersion: apps/v1, kind: %s, name: %s, controller: true}\nspec:\n", ownerKind, owner)
	if p.node >= 0 {
		fmt.Fprintf(&b, "  nodeName: %s\n", nodeName(p.node))
	}
	if w.hostNetwork {
		b.WriteString("  hostNetwork: true\n")
	}
	fmt.Fprintf(&b, "  containers:\n  - name: %s\n    image: registry.example.com/%s/%s:1.%d\n    ports:\n", w.name, w.partOf, w.name, len(w.name)%10)
	for _, cp := range w.ports {
		fmt.Fprintf(&b, "    - {name: %s, containerPort: %d, protocol: %s}\n", cp.name, cp.port, cp.proto)
	}
	b.WriteString("status:\n  phase: Running\n")
	if p.node >= 0 {
		fmt.Fprintf(&b, "  hostIP: %s\n", c.nodes[p.node])
	}
	fmt.Fprintf(&b, "  podIP: %s\n  podIPs:\n  - {ip: %s}", p.ip, p.ip)
	return b.String()
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ---- Services ----

// servicePort is the Service port for a container port.
func servicePort(cp cport) int {
	if cp.name == "http" && cp.port == 8080 {
		return 80
	}
	return cp.port
}

// service is Service i and its EndpointSlice: in namespace i mod
// Namespaces, for the namespace's workloads in turn (the first round for
// their ports but metrics, the next ones for metrics: <name>-metrics,
// <name>-metrics-3...).
func (c *realistic) service(i int) []string {
	ns := c.ns[i%len(c.ns)]
	k := i / len(c.ns)
	ip := ipv4(10<<24 | 96<<16 + uint32(100+i))
	var w *workload
	name := fmt.Sprintf("svc-%d", k)
	selector := [][2]string{{"app.kubernetes.io/name", "unknown"}}
	ports := []cport{{"http", 8080, "TCP"}}
	if len(ns.workloads) > 0 {
		ports = nil
		w = ns.workloads[k%len(ns.workloads)]
		round := k / len(ns.workloads)
		name, selector = w.name, w.selector
		for _, cp := range w.ports {
			if (cp.name == "metrics") == (round > 0) {
				ports = append(ports, cp)
			}
		}
		switch {
		case round == 1:
			name += "-metrics"
		case round > 1:
			name = fmt.Sprintf("%s-metrics-%d", name, round+1)
		}
		if len(ports) == 0 {
			ports = w.ports
		}
		if w.name == "coredns" && round == 0 {
			name, ip = "kube-dns", "10.96.0.10"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata:\n  name: %s\n  namespace: %s\n  labels: %s\nspec:\n  type: ClusterIP\n  clusterIP: %s\n  clusterIPs: [%s]\n  ipFamilies: [IPv4]\n  selector: %s\n  ports:",
		name, ns.name, flowMap(selector), ip, ip, flowMap(selector))
	for _, cp := range ports {
		fmt.Fprintf(&b, "\n  - {name: %s, protocol: %s, port: %d, targetPort: %s}", cp.name, cp.proto, servicePort(cp), cp.name)
	}
	svc := b.String()
	b.Reset()
	fmt.Fprintf(&b, "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-%s\n  namespace: %s\n  labels: {kubernetes.io/service-name: %s, endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io}\naddressType: IPv4\nports:",
		name, c.suffix(5), ns.name, name)
	for _, cp := range ports {
		fmt.Fprintf(&b, "\n- {name: %s, protocol: %s, port: %d}", cp.name, cp.proto, cp.port)
	}
	b.WriteString("\nendpoints:")
	n := 0
	if w != nil {
		for _, p := range w.pods { // every pod is Running
			if n == 10 {
				break
			}
			n++
			fmt.Fprintf(&b, "\n- addresses: [%s]", p.ip)
			if p.node >= 0 {
				fmt.Fprintf(&b, "\n  nodeName: %s", nodeName(p.node))
			}
			fmt.Fprintf(&b, "\n  conditions: {ready: true, serving: true, terminating: false}\n  targetRef: {kind: Pod, namespace: %s, name: %s}", ns.name, p.name)
		}
	}
	if n == 0 {
		b.WriteString(" []")
	}
	return []string{svc, b.String()}
}
