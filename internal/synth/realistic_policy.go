package synth

// The realistic shape's policies: what they say (the catalogues) and how
// they are written (the YAML of each API).

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ---- label selectors ----

type expr struct {
	key, op string
	values  []string
}

// sel is a label selector; &sel{} selects everything.
type sel struct {
	labels [][2]string
	exprs  []expr
}

// ml is a selector of matchLabels key, value, key, value...
func ml(kv ...string) *sel {
	s := &sel{}
	for i := 0; i+1 < len(kv); i += 2 {
		s.labels = append(s.labels, [2]string{kv[i], kv[i+1]})
	}
	return s
}

// with adds matchExpressions.
func (s *sel) with(e ...expr) *sel {
	s.exprs = append(s.exprs, e...)
	return s
}

func all() *sel                               { return &sel{} }
func in(key string, values ...string) expr    { return expr{key, "In", values} }
func notIn(key string, values ...string) expr { return expr{key, "NotIn", values} }
func exists(key string) expr                  { return expr{key: key, op: "Exists"} }
func doesNotExist(key string) expr            { return expr{key: key, op: "DoesNotExist"} }
func nsNamed(name string) *sel                { return ml("kubernetes.io/metadata.name", name) }
func component(values ...string) *sel {
	return all().with(in("app.kubernetes.io/component", values...))
}

// String is the selector in YAML flow style.
func (s *sel) String() string {
	var parts []string
	if len(s.labels) > 0 {
		parts = append(parts, "matchLabels: "+flowMap(s.labels))
	}
	if len(s.exprs) > 0 {
		var es []string
		for _, e := range s.exprs {
			x := fmt.Sprintf("{key: %s, operator: %s", e.key, e.op)
			if len(e.values) > 0 {
				vs := make([]string, len(e.values))
				for i, v := range e.values {
					vs[i] = q(v)
				}
				x += ", values: [" + strings.Join(vs, ", ") + "]"
			}
			es = append(es, x+"}")
		}
		parts = append(parts, "matchExpressions: ["+strings.Join(es, ", ")+"]")
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func flowMap(kv [][2]string) string {
	parts := make([]string, len(kv))
	for i, l := range kv {
		parts[i] = l[0] + ": " + q(l[1])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

var plainScalar = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._/-]*$`)

// q writes a string value so that YAML reads it as a string.
func q(v string) string {
	switch strings.ToLower(v) {
	case "true", "false", "yes", "no", "on", "off", "y", "n", "null":
		return strconv.Quote(v)
	}
	if plainScalar.MatchString(v) {
		return v
	}
	return strconv.Quote(v)
}

// ---- NetworkPolicy ----

type npPort struct {
	proto string // "" for TCP
	port  string // number or name; "" for every port
	end   int
}

type npPeer struct {
	ns, pods *sel // either or both
	cidr     string
	except   []string
}

type npRule struct {
	peers []npPeer
	ports []npPort
}

type netpol struct {
	name    string
	pods    *sel
	types   []string
	ingress []npRule
	egress  []npRule
}

func tcp(ports ...string) []npPort {
	out := make([]npPort, len(ports))
	for i, p := range ports {
		out[i] = npPort{proto: "TCP", port: p}
	}
	return out
}

func (p *netpol) yaml(namespace string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  podSelector: %s",
		p.name, namespace, p.pods)
	if len(p.types) > 0 {
		fmt.Fprintf(&b, "\n  policyTypes: [%s]", strings.Join(p.types, ", "))
	}
	for _, dir := range []struct {
		name, peers string
		rules       []npRule
	}{{"ingress", "from", p.ingress}, {"egress", "to", p.egress}} {
		if len(dir.rules) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n  %s:", dir.name)
		for _, r := range dir.rules {
			if len(r.peers) == 0 && len(r.ports) == 0 {
				b.WriteString("\n  - {}")
				continue
			}
			lead := "\n  - "
			if len(r.peers) > 0 {
				fmt.Fprintf(&b, "%s%s:", lead, dir.peers)
				lead = "\n    "
				for _, pe := range r.peers {
					b.WriteString(pe.yaml())
				}
			}
			if len(r.ports) > 0 {
				fmt.Fprintf(&b, "%sports:", lead)
				for _, pt := range r.ports {
					b.WriteString("\n    - {")
					var f []string
					if pt.proto != "" {
						f = append(f, "protocol: "+pt.proto)
					}
					if pt.port != "" {
						f = append(f, "port: "+pt.port)
					}
					if pt.end != 0 {
						f = append(f, "endPort: "+strconv.Itoa(pt.end))
					}
					b.WriteString(strings.Join(f, ", ") + "}")
				}
			}
		}
	}
	return b.String()
}

func (pe npPeer) yaml() string {
	if pe.cidr != "" {
		s := "\n    - ipBlock:\n        cidr: " + pe.cidr
		if len(pe.except) > 0 {
			s += "\n        except: [" + strings.Join(pe.except, ", ") + "]"
		}
		return s
	}
	var lines []string
	if pe.ns != nil {
		lines = append(lines, "namespaceSelector: "+pe.ns.String())
	}
	if pe.pods != nil {
		lines = append(lines, "podSelector: "+pe.pods.String())
	}
	return "\n    - " + strings.Join(lines, "\n      ")
}

// notTeams is "team NotIn [t and n other teams]".
func (c *realistic) notTeams(t, n int) expr {
	return notIn("team", append([]string{c.teams[t]}, c.otherTeams(t, n)...)...)
}

// otherTeams picks n distinct teams other than t.
func (c *realistic) otherTeams(t, n int) []string {
	n = min(n, len(c.teams)-1)
	var out []string
	for len(out) < n {
		o := c.teams[c.r.IntN(len(c.teams))]
		if o != c.teams[t] && !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}

// teamPolicies is the number of NetworkPolicies of a team's namespace
// before the per-workload ones.
const teamPolicies = 13

// networkPolicy is the j-th NetworkPolicy of namespace ns.
func (c *realistic) networkPolicy(ns *rNamespace, j int) *netpol {
	if ns.teamIdx < 0 {
		return c.platformPolicy(ns, j)
	}
	t := ns.teamIdx
	dns := npRule{peers: []npPeer{{ns: nsNamed(nsKubeSystem), pods: ml("k8s-app", "kube-dns")}},
		ports: []npPort{{proto: "UDP", port: "53"}, {proto: "TCP", port: "53"}}}
	switch j {
	case 0:
		p := &netpol{name: "default-deny", pods: all(), types: []string{"Ingress", "Egress"}}
		if c.r.IntN(10) < 3 {
			p.name, p.types = "default-deny-ingress", []string{"Ingress"}
		}
		return p
	case 1:
		return &netpol{name: "allow-same-namespace", pods: all(), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{pods: all()}}}}}
	case 2:
		return &netpol{name: "allow-dns", pods: all(), types: []string{"Egress"}, egress: []npRule{dns}}
	case 3:
		return &netpol{name: "allow-prometheus-scrape", pods: all(), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{ns: nsNamed(nsMonitoring), pods: ml("app.kubernetes.io/name", "prometheus")}},
				ports: []npPort{{port: "metrics"}}}}}
	case 4:
		return &netpol{name: "allow-ingress-controller", pods: component("frontend", "api"), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{ns: nsNamed(nsIngress), pods: ml("app.kubernetes.io/name", "ingress-nginx")}},
				ports: []npPort{{proto: "TCP", port: "http"}}}}}
	case 5:
		return &netpol{name: "allow-from-team", pods: component("api", "backend", "frontend"), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{ns: ml("team", ns.team)}}, ports: tcp("http", "grpc")}}}
	case 6:
		from := map[string][]string{"prod": {"prod", "staging"}, "staging": {"staging", "dev"}, "dev": {"dev"}}[ns.env]
		nsSel := all().with(in("env", from...))
		if others := c.otherTeams(t, 2); len(others) > 0 {
			nsSel.with(notIn("team", others...))
		}
		return &netpol{name: "allow-from-" + ns.env, pods: component("api", "backend"), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{ns: nsSel}},
				ports: []npPort{{proto: "TCP", port: "8080", end: 8089}, {proto: "TCP", port: "9090"}}}}}
	case 7:
		return &netpol{name: "allow-egress-internet", pods: component("backend", "worker", "api"), types: []string{"Egress"},
			egress: []npRule{{peers: []npPeer{{cidr: "0.0.0.0/0", except: privateCIDRs}}, ports: tcp("443", "80")}}}
	case 8:
		return &netpol{name: "allow-egress-team", pods: all(), types: []string{"Egress"},
			egress: []npRule{{peers: []npPeer{{ns: ml("team", ns.team)}}}, dns}}
	case 9:
		return &netpol{name: "allow-egress-shared-services", pods: all(), types: []string{"Egress"},
			egress: []npRule{{peers: []npPeer{{ns: ml("env", ns.env).with(exists("tier"))}}, ports: tcp("8080", "9090")}}}
	case 10:
		return &netpol{name: "allow-database-clients", pods: ml("app.kubernetes.io/component", "database"), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{pods: component("backend", "api", "worker")},
				{ns: ml("team", ns.team, "env", ns.env), pods: component("backend", "worker")}},
				ports: tcp("5432", "3306", "27017")}}}
	case 11:
		partner := c.teams[(t+1)%len(c.teams)]
		return &netpol{name: "allow-from-" + partner, pods: ml("app.kubernetes.io/component", "api"), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{ns: ml("team", partner)}}, ports: []npPort{{proto: "TCP", port: "grpc"}, {proto: "TCP", port: "8443"}}}}}
	case 12:
		return &netpol{name: "allow-cache-clients", pods: ml("app.kubernetes.io/component", "cache"), types: []string{"Ingress"},
			ingress: []npRule{{peers: []npPeer{{pods: all()}}, ports: tcp("6379", "11211")}}}
	}
	return c.workloadPolicy(ns, j-teamPolicies)
}

// workloadPolicy is a policy for one workload of ns (the k-th in turn):
// who may call it, from the team and its partners.
func (c *realistic) workloadPolicy(ns *rNamespace, k int) *netpol {
	name, port := "unknown", "http"
	if len(ns.workloads) > 0 {
		w := ns.workloads[k%len(ns.workloads)]
		name, port = w.name, w.ports[0].name
	}
	teams := []string{orDefault(ns.team, "platform")}
	if ns.teamIdx >= 0 {
		teams = append(teams, c.otherTeams(ns.teamIdx, 1+c.r.IntN(3))...)
	}
	peer := npPeer{ns: all().with(in("team", teams...))}
	if c.r.IntN(3) == 0 {
		peer.pods = component("frontend", "api", "backend")
	}
	return &netpol{name: fmt.Sprintf("allow-%s-clients-%d", name, k), pods: ml("app.kubernetes.io/name", name), types: []string{"Ingress"},
		ingress: []npRule{{peers: []npPeer{peer}, ports: []npPort{{proto: "TCP", port: port}}}}}
}

// platformPolicy is the j-th NetworkPolicy of a platform namespace.
func (c *realistic) platformPolicy(ns *rNamespace, j int) *netpol {
	dns := npRule{peers: []npPeer{{ns: nsNamed(nsKubeSystem), pods: ml("k8s-app", "kube-dns")}},
		ports: []npPort{{proto: "UDP", port: "53"}, {proto: "TCP", port: "53"}}}
	var list []*netpol
	switch ns.name {
	case nsKubeSystem:
		list = []*netpol{
			{name: "default-deny-ingress", pods: all(), types: []string{"Ingress"}},
			{name: "allow-dns", pods: ml("k8s-app", "kube-dns"), types: []string{"Ingress"},
				ingress: []npRule{{peers: []npPeer{{ns: all()}}, ports: []npPort{{proto: "UDP", port: "dns"}, {proto: "TCP", port: "dns-tcp"}}}}},
			{name: "allow-metrics-server", pods: ml("k8s-app", "metrics-server"), types: []string{"Ingress"},
				ingress: []npRule{{peers: []npPeer{{cidr: "10.0.0.0/16"}}, ports: tcp("https")}}},
			{name: "allow-prometheus-scrape", pods: all(), types: []string{"Ingress"},
				ingress: []npRule{{peers: []npPeer{{ns: nsNamed(nsMonitoring)}}, ports: tcp("metrics")}}},
		}
	case nsMonitoring:
		list = []*netpol{
			{name: "default-deny", pods: all(), types: []string{"Ingress", "Egress"}},
			{name: "allow-scrape", pods: ml("app.kubernetes.io/name", "prometheus"), types: []string{"Egress"},
				egress: []npRule{{peers: []npPeer{{ns: all()}, {cidr: "10.0.0.0/16"}},
					ports: []npPort{{proto: "TCP", port: "9100", end: 9199}, {proto: "TCP", port: "8080"}, {proto: "TCP", port: "10250"}, {proto: "TCP", port: "10254"}}}}},
			{name: "allow-dns", pods: all(), types: []string{"Egress"}, egress: []npRule{dns}},
			{name: "allow-grafana", pods: ml("app.kubernetes.io/name", "prometheus"), types: []string{"Ingress"},
				ingress: []npRule{{peers: []npPeer{{pods: ml("app.kubernetes.io/name", "grafana")}}, ports: tcp("web")}}},
			{name: "allow-grafana-ui", pods: ml("app.kubernetes.io/name", "grafana"), types: []string{"Ingress"},
				ingress: []npRule{{peers: []npPeer{{ns: nsNamed(nsIngress)}}, ports: tcp("http")}}},
		}
	case nsIngress:
		list = []*netpol{
			{name: "allow-web", pods: ml("app.kubernetes.io/name", "ingress-nginx"), types: []string{"Ingress"},
				ingress: []npRule{{peers: []npPeer{{cidr: "0.0.0.0/0"}}, ports: tcp("http", "https")}}},
			{name: "allow-to-backends", pods: ml("app.kubernetes.io/name", "ingress-nginx"), types: []string{"Egress"},
				egress: []npRule{{peers: []npPeer{{ns: all().with(exists("env"))}}, ports: tcp("8080", "3000")}, dns}},
			{name: "default-deny", pods: all(), types: []string{"Ingress", "Egress"}},
		}
	}
	if j < len(list) {
		return list[j]
	}
	return c.workloadPolicy(ns, j-len(list))
}

// ---- Admin and Baseline policies ----

type aProto struct {
	proto     string // tcp or udp
	num       int
	start, to int // a range when start != 0
	named     string
}

type aPeer struct {
	namespaces *sel
	pods       *[2]*sel // namespaceSelector, podSelector
	nodes      *sel
	networks   []string
}

type aRule struct {
	name, action string // Accept, Deny, Pass
	peers        []aPeer
	protos       []aProto // nil: every protocol
}

type adminPol struct {
	kind            string // ClusterNetworkPolicy, AdminNetworkPolicy, BaselineAdminNetworkPolicy
	name, tier      string
	priority        int
	subjectNS       *sel
	subjectPods     *[2]*sel
	ingress, egress []aRule
}

func nsPeer(s *sel) aPeer         { return aPeer{namespaces: s} }
func podPeer(ns, pods *sel) aPeer { return aPeer{pods: &[2]*sel{ns, pods}} }
func tcpNums(ports ...int) []aProto {
	out := make([]aProto, len(ports))
	for i, p := range ports {
		out[i] = aProto{proto: "tcp", num: p}
	}
	return out
}

var kubeDNS = podPeer(nsNamed(nsKubeSystem), ml("k8s-app", "kube-dns"))

// adminPolicies are Spec.AdminPolicies policies: 80% Admin tier, 20%
// Baseline tier, the last the BaselineAdminNetworkPolicy.
func (c *realistic) adminPolicies() []*adminPol {
	n := c.s.AdminPolicies
	if n <= 0 {
		return nil
	}
	if len(c.teams) == 0 { // no namespace: the policies still name a team
		c.teams = teamWords[:1]
	}
	baseline := (2*(n-1) + 5) / 10
	admin := n - 1 - baseline
	var out []*adminPol
	for s := 0; s < admin; s++ {
		p := c.adminTier(s)
		if s%11 == 10 { // a few, in several families
			p.kind = "AdminNetworkPolicy"
		}
		out = append(out, p)
	}
	for s := 0; s < baseline; s++ {
		out = append(out, c.baselineTier(s))
	}
	return append(out, &adminPol{kind: "BaselineAdminNetworkPolicy", name: "default",
		subjectNS: all().with(notIn("kubernetes.io/metadata.name", nsKubeSystem)),
		ingress: []aRule{
			{name: "allow-monitoring", action: "Accept", peers: []aPeer{nsPeer(nsNamed(nsMonitoring))}},
			{name: "deny-from-dev", action: "Deny", peers: []aPeer{nsPeer(ml("env", "dev"))}},
			{name: "deny-other-namespaces", action: "Deny", peers: []aPeer{nsPeer(all())}},
		},
		egress: []aRule{
			{name: "allow-dns", action: "Accept", peers: []aPeer{kubeDNS}, protos: []aProto{{proto: "udp", num: 53}, {proto: "tcp", num: 53}}},
			{name: "deny-metadata", action: "Deny", peers: []aPeer{{networks: []string{metadataCIDR}}}},
		}})
}

// globalAdmin are the platform's cluster-wide Admin policies.
const globalAdmin = 6

// teamFamilies is the number of per-team Admin policies.
const teamFamilies = 8

// adminTier is the s-th Admin tier policy: the cluster-wide ones, then
// the team families, each for every team in turn (then again, with new
// choices, in later rounds).
func (c *realistic) adminTier(s int) *adminPol {
	p := &adminPol{kind: "ClusterNetworkPolicy", tier: "Admin"}
	if s < globalAdmin {
		c.globalPolicy(s, p)
		return p
	}
	u := s - globalAdmin
	t, f := u%len(c.teams), u/len(c.teams)
	fam, round := f%teamFamilies, f/teamFamilies
	p.priority = min(1000, 100+100*fam+round*10+t%10)
	team := c.teams[t]
	c.teamPolicy(fam, t, p)
	p.name = "team-" + team + "-" + p.name
	if round > 0 {
		p.name += "-" + strconv.Itoa(round+1)
	}
	return p
}

func (c *realistic) globalPolicy(s int, p *adminPol) {
	switch s {
	case 0:
		p.name, p.priority = "deny-metadata-service", 1
		p.subjectNS = all().with(notIn("kubernetes.io/metadata.name", nsKubeSystem))
		p.egress = []aRule{{name: "deny-metadata", action: "Deny", peers: []aPeer{{networks: []string{metadataCIDR}}}}}
	case 1:
		p.name, p.priority = "allow-cluster-dns", 5
		p.subjectNS = all()
		p.egress = []aRule{{name: "allow-kube-dns", action: "Accept", peers: []aPeer{kubeDNS},
			protos: []aProto{{proto: "udp", num: 53}, {proto: "tcp", num: 53}}}}
	case 2:
		p.name, p.priority = "allow-monitoring", 10
		p.subjectNS = all()
		p.ingress = []aRule{{name: "allow-prometheus", action: "Accept",
			peers:  []aPeer{podPeer(nsNamed(nsMonitoring), ml("app.kubernetes.io/name", "prometheus"))},
			protos: []aProto{{named: "metrics"}, {proto: "tcp", start: 9100, to: 9199}}}}
	case 3:
		p.name, p.priority = "isolate-environments", 20
		p.subjectNS = ml("env", "prod")
		p.ingress = []aRule{
			{name: "deny-from-dev", action: "Deny", peers: []aPeer{nsPeer(ml("env", "dev"))}},
			{name: "deny-from-staging-data", action: "Deny", peers: []aPeer{nsPeer(ml("env", "staging", "tier", "data"))}},
		}
		p.egress = []aRule{{name: "deny-to-dev", action: "Deny", peers: []aPeer{nsPeer(ml("env", "dev"))}}}
	case 4:
		p.name, p.priority = "node-access", 30
		p.subjectNS = all().with(notIn("kubernetes.io/metadata.name", nsKubeSystem, nsMonitoring))
		p.egress = []aRule{
			{name: "deny-kubelet", action: "Deny", peers: []aPeer{{nodes: all()}}, protos: tcpNums(10250, 10255)},
			{name: "deny-ssh", action: "Deny", peers: []aPeer{{nodes: ml("node-role", "worker")}}, protos: tcpNums(22)},
			{name: "allow-nodeports", action: "Accept", peers: []aPeer{{nodes: all().with(in("topology.kubernetes.io/zone", "zone-a", "zone-b", "zone-c"))}},
				protos: []aProto{{proto: "tcp", start: 30000, to: 32767}}},
		}
	case 5:
		p.name, p.priority = "pci-isolation", 40
		p.subjectNS = ml("pci", "true")
		p.ingress = []aRule{
			{name: "allow-ingress-controller", action: "Accept", peers: []aPeer{nsPeer(nsNamed(nsIngress))}, protos: tcpNums(8080)},
			{name: "deny-non-pci", action: "Deny", peers: []aPeer{nsPeer(all().with(doesNotExist("pci"), notIn("kubernetes.io/metadata.name", nsMonitoring)))}},
		}
		p.egress = []aRule{{name: "deny-non-pci", action: "Deny",
			peers: []aPeer{nsPeer(all().with(doesNotExist("pci"), notIn("kubernetes.io/metadata.name", nsKubeSystem)))}}}
	}
}

// teamPolicy fills p (but its name's team prefix) as family fam for team
// t.
func (c *realistic) teamPolicy(fam, t int, p *adminPol) {
	team := c.teams[t]
	sameTeam := ml("team", team)
	switch fam {
	case 0: // the team decides within itself
		p.name, p.subjectNS = "pass", sameTeam
		p.ingress = []aRule{
			{name: "pass-same-team", action: "Pass", peers: []aPeer{nsPeer(sameTeam)}},
			{name: "allow-ingress-controller", action: "Accept",
				peers: []aPeer{podPeer(nsNamed(nsIngress), ml("app.kubernetes.io/name", "ingress-nginx"))}, protos: []aProto{{named: "http"}}},
			{name: "allow-prod-readers", action: "Accept", peers: []aPeer{nsPeer(ml("env", "prod").with(c.notTeams(t, 2)))}, protos: tcpNums(8080)},
		}
		p.egress = []aRule{{name: "pass-same-team", action: "Pass", peers: []aPeer{nsPeer(sameTeam)}}}
		if partners := c.otherTeams(t, 3); len(partners) > 0 {
			p.egress = append(p.egress, aRule{name: "pass-partners", action: "Pass", peers: []aPeer{nsPeer(all().with(in("team", partners...)))}})
		}
	case 1: // protect the databases
		p.name, p.subjectPods = "databases", &[2]*sel{sameTeam, component("database", "cache")}
		p.ingress = []aRule{
			{name: "allow-backends", action: "Accept", peers: []aPeer{podPeer(ml("team", team), component("backend", "api", "worker"))},
				protos: tcpNums(5432, 3306, 27017, 6379, 11211)},
			{name: "allow-metrics", action: "Accept", peers: []aPeer{podPeer(nsNamed(nsMonitoring), ml("app.kubernetes.io/name", "prometheus"))},
				protos: []aProto{{named: "metrics"}}},
			{name: "deny-other-teams", action: "Deny", peers: []aPeer{nsPeer(all().with(c.notTeams(t, 0)))}},
			{name: "deny-everything-else", action: "Deny", peers: []aPeer{nsPeer(all())}},
		}
		p.egress = []aRule{
			{name: "allow-replication", action: "Accept", peers: []aPeer{podPeer(sameTeam, ml("app.kubernetes.io/component", "database"))},
				protos: tcpNums(5432, 3306, 27017)},
			{name: "deny-pods", action: "Deny", peers: []aPeer{nsPeer(all().with(notIn("kubernetes.io/metadata.name", nsKubeSystem)))}},
			{name: "deny-internet", action: "Deny", peers: []aPeer{{networks: []string{"0.0.0.0/0"}}}},
		}
	case 2: // who may call the team's production APIs
		p.name, p.subjectPods = "prod-consumers", &[2]*sel{ml("team", team, "env", "prod"), component("api", "backend")}
		for i, k := 0, 3+c.r.IntN(18); i < k; i++ {
			teams := c.otherTeams(t, 1+c.r.IntN(3))
			if len(teams) == 0 {
				break
			}
			peer := nsPeer(ml("env", "prod").with(in("team", teams...)))
			if c.r.IntN(3) == 0 { // every other prod team but a few
				peer = nsPeer(ml("env", "prod").with(c.notTeams(t, len(teams))))
			}
			p.ingress = append(p.ingress, aRule{name: "consumers-" + strconv.Itoa(i), action: []string{"Accept", "Accept", "Pass"}[c.r.IntN(3)],
				peers:  []aPeer{peer},
				protos: []aProto{{proto: "tcp", num: 8080}, {proto: "tcp", num: 9090}, {proto: "tcp", start: 8443, to: 8444}}})
		}
		p.ingress = append(p.ingress,
			aRule{name: "pass-same-team", action: "Pass", peers: []aPeer{nsPeer(sameTeam)}},
			aRule{name: "deny-other-non-prod", action: "Deny", peers: []aPeer{nsPeer(all().with(in("env", "dev", "staging"), c.notTeams(t, 0)))}})
	case 3: // what the team may call
		p.name, p.subjectNS = "egress", sameTeam
		for i, k := 0, 3+c.r.IntN(20); i < k; i++ {
			other := c.otherTeams(t, 1)
			if len(other) == 0 {
				break
			}
			peer := nsPeer(ml("team", other[0]).with(in("env", []string{"prod", "staging", "dev"}[:1+c.r.IntN(3)]...)))
			name := "to-" + other[0] + "-" + strconv.Itoa(i)
			switch c.r.IntN(4) {
			case 0:
				comps := [][]string{{"api"}, {"api", "backend"}, {"frontend", "api"}}[c.r.IntN(3)]
				peer = podPeer(ml("team", other[0]), component(comps...))
			case 1: // the public APIs of every prod team but a few
				peer, name = nsPeer(ml("env", "prod").with(c.notTeams(t, 1+c.r.IntN(2)))), "to-prod-"+strconv.Itoa(i)
			}
			p.egress = append(p.egress, aRule{name: name, action: "Accept",
				peers: []aPeer{peer}, protos: []aProto{{named: "http"}, {named: "grpc"}}})
		}
		p.egress = append(p.egress, aRule{name: "deny-dev", action: "Deny", peers: []aPeer{nsPeer(ml("env", "dev").with(c.notTeams(t, 2)))}})
	case 4: // staging stays in staging
		p.name, p.subjectNS = "staging", ml("team", team, "env", "staging")
		p.ingress = []aRule{
			{name: "deny-other-dev", action: "Deny", peers: []aPeer{nsPeer(ml("env", "dev").with(notIn("team", team)))}},
			{name: "pass-pre-prod", action: "Pass", peers: []aPeer{nsPeer(all().with(in("env", "staging", "dev")))}},
		}
		p.egress = []aRule{{name: "deny-other-prod", action: "Deny", peers: []aPeer{nsPeer(ml("env", "prod").with(notIn("team", team)))}}}
	case 5: // frontends are reached through the ingress controller
		p.name, p.subjectPods = "frontends", &[2]*sel{sameTeam, ml("app.kubernetes.io/component", "frontend")}
		p.ingress = []aRule{
			{name: "allow-ingress-controller", action: "Accept",
				peers: []aPeer{podPeer(nsNamed(nsIngress), ml("app.kubernetes.io/name", "ingress-nginx"))}, protos: tcpNums(8080)},
			{name: "pass-same-team", action: "Pass", peers: []aPeer{nsPeer(sameTeam)}},
			{name: "pass-prod", action: "Pass", peers: []aPeer{nsPeer(ml("env", "prod").with(c.notTeams(t, 1)))}},
			{name: "deny-others", action: "Deny", peers: []aPeer{nsPeer(all().with(notIn("kubernetes.io/metadata.name", nsMonitoring)))}},
		}
	case 6: // workers take no inbound traffic
		p.name, p.subjectPods = "workers", &[2]*sel{sameTeam, ml("app.kubernetes.io/component", "worker")}
		p.ingress = []aRule{{name: "deny-inbound", action: "Deny", peers: []aPeer{nsPeer(all().with(notIn("kubernetes.io/metadata.name", nsMonitoring)))}}}
		teams := append([]string{team}, c.otherTeams(t, 2)...)
		p.egress = []aRule{
			{name: "allow-team-services", action: "Accept",
				peers:  []aPeer{podPeer(all().with(in("team", teams...)), component("api", "backend", "database", "cache"))},
				protos: []aProto{{proto: "tcp", start: 1024, to: 65535}}},
			{name: "deny-other-teams", action: "Deny", peers: []aPeer{nsPeer(all().with(notIn("team", teams...)))}},
			{name: "allow-internet", action: "Accept", peers: []aPeer{{networks: []string{"0.0.0.0/1", "128.0.0.0/1"}}}, protos: tcpNums(443)},
		}
	case 7: // dev stays in dev
		p.name, p.subjectNS = "dev", ml("team", team, "env", "dev")
		p.ingress = []aRule{{name: "deny-from-other-prod", action: "Deny", peers: []aPeer{nsPeer(ml("env", "prod").with(c.notTeams(t, 0)))}}}
		p.egress = []aRule{
			{name: "deny-to-prod-staging", action: "Deny", peers: []aPeer{nsPeer(all().with(in("env", "prod", "staging")))}},
			{name: "pass-dev", action: "Pass", peers: []aPeer{nsPeer(ml("env", "dev"))}},
		}
	}
}

// baselineTier is the s-th Baseline tier policy: per team, then per
// namespace.
func (c *realistic) baselineTier(s int) *adminPol {
	p := &adminPol{kind: "ClusterNetworkPolicy", tier: "Baseline", priority: min(1000, 10+s)}
	if s < len(c.teams) || len(c.app) == 0 {
		team := c.teams[s%len(c.teams)]
		sameTeam := ml("team", team)
		p.name, p.subjectNS = "baseline-team-"+team, sameTeam
		if s >= len(c.teams) {
			p.name += "-" + strconv.Itoa(s/len(c.teams)+1)
		}
		p.ingress = []aRule{
			{name: "allow-same-team", action: "Accept", peers: []aPeer{nsPeer(sameTeam)}},
			{name: "allow-platform", action: "Accept", peers: []aPeer{nsPeer(all().with(in("kubernetes.io/metadata.name", nsMonitoring, nsIngress)))}},
			{name: "deny-cross-namespace", action: "Deny", peers: []aPeer{nsPeer(all())}},
		}
		p.egress = []aRule{
			{name: "allow-same-team", action: "Accept", peers: []aPeer{nsPeer(sameTeam)}},
			{name: "allow-dns", action: "Accept", peers: []aPeer{kubeDNS}, protos: []aProto{{proto: "udp", num: 53}, {proto: "tcp", num: 53}}},
			{name: "deny-cross-namespace", action: "Deny", peers: []aPeer{nsPeer(all())}},
		}
		return p
	}
	k := s - len(c.teams)
	ns := c.app[k%len(c.app)]
	p.name, p.subjectNS = "baseline-ns-"+ns.name, nsNamed(ns.name)
	if k >= len(c.app) {
		p.name += "-" + strconv.Itoa(k/len(c.app)+1)
	}
	p.ingress = []aRule{{name: "allow-same-namespace", action: "Accept", peers: []aPeer{nsPeer(nsNamed(ns.name))}}}
	p.egress = []aRule{{name: "allow-same-namespace", action: "Accept", peers: []aPeer{nsPeer(nsNamed(ns.name))}}}
	return p
}

func (p *adminPol) yaml() string {
	var b strings.Builder
	v1alpha1 := p.kind != "ClusterNetworkPolicy"
	apiVersion := "policy.networking.k8s.io/v1beta1"
	if v1alpha1 {
		apiVersion = "policy.networking.k8s.io/v1alpha1"
	}
	fmt.Fprintf(&b, "apiVersion: %s\nkind: %s\nmetadata:\n  name: %s\nspec:", apiVersion, p.kind, p.name)
	if p.tier != "" && !v1alpha1 {
		fmt.Fprintf(&b, "\n  tier: %s", p.tier)
	}
	if p.kind != "BaselineAdminNetworkPolicy" {
		fmt.Fprintf(&b, "\n  priority: %d", p.priority)
	}
	b.WriteString("\n  subject:")
	if p.subjectPods != nil {
		fmt.Fprintf(&b, "\n    pods:\n      namespaceSelector: %s\n      podSelector: %s", p.subjectPods[0], p.subjectPods[1])
	} else {
		fmt.Fprintf(&b, "\n    namespaces: %s", p.subjectNS)
	}
	for _, dir := range []struct {
		name, peers string
		rules       []aRule
	}{{"ingress", "from", p.ingress}, {"egress", "to", p.egress}} {
		if len(dir.rules) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n  %s:", dir.name)
		for _, r := range dir.rules {
			action := r.action
			if v1alpha1 && action == "Accept" {
				action = "Allow"
			}
			fmt.Fprintf(&b, "\n  - name: %s\n    action: %s\n    %s:", r.name, action, dir.peers)
			for _, pe := range r.peers {
				switch {
				case pe.namespaces != nil:
					fmt.Fprintf(&b, "\n    - namespaces: %s", pe.namespaces)
				case pe.pods != nil:
					fmt.Fprintf(&b, "\n    - pods:\n        namespaceSelector: %s\n        podSelector: %s", pe.pods[0], pe.pods[1])
				case pe.nodes != nil:
					fmt.Fprintf(&b, "\n    - nodes: %s", pe.nodes)
				default:
					fmt.Fprintf(&b, "\n    - networks: [%s]", strings.Join(pe.networks, ", "))
				}
			}
			if len(r.protos) == 0 {
				continue
			}
			if v1alpha1 {
				b.WriteString("\n    ports:")
				for _, pt := range r.protos {
					switch {
					case pt.named != "":
						fmt.Fprintf(&b, "\n    - namedPort: %s", pt.named)
					case pt.start != 0:
						fmt.Fprintf(&b, "\n    - portRange: {protocol: %s, start: %d, end: %d}", strings.ToUpper(pt.proto), pt.start, pt.to)
					default:
						fmt.Fprintf(&b, "\n    - portNumber: {protocol: %s, port: %d}", strings.ToUpper(pt.proto), pt.num)
					}
				}
				continue
			}
			b.WriteString("\n    protocols:")
			for _, pt := range r.protos {
				switch {
				case pt.named != "":
					fmt.Fprintf(&b, "\n    - destinationNamedPort: %s", pt.named)
				case pt.start != 0:
					fmt.Fprintf(&b, "\n    - %s: {destinationPort: {range: {start: %d, end: %d}}}", pt.proto, pt.start, pt.to)
				default:
					fmt.Fprintf(&b, "\n    - %s: {destinationPort: {number: %d}}", pt.proto, pt.num)
				}
			}
		}
	}
	return b.String()
}
