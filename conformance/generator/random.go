package generator

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Random draws n random cases within the families: one to four policies of
// random kinds (NetworkPolicy, ANP, BANP, ClusterNetworkPolicy v1alpha2 and
// v1beta1 in either tier) with random subjects, peers, ports and actions;
// some cases get a second step that changes a label or deletes a policy.
// The same seed gives the same cases, byte for byte.
func Random(n int, seed uint64) []Case {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]Case, 0, n)
	for i := 0; i < n; i++ {
		out = append(out, randomCase(r, fmt.Sprintf("random/seed-%d/%d", seed, i)))
	}
	return out
}

type randomGen struct {
	r    *rand.Rand
	tags []string
	refs []ObjectRef
	banp bool
	seq  int
}

func pick[T any](r *rand.Rand, items []T) T { return items[r.IntN(len(items))] }

func (g *randomGen) tag(t ...string) {
	for _, x := range t {
		if !slices.Contains(g.tags, x) {
			g.tags = append(g.tags, x)
		}
	}
}

func (g *randomGen) name(kind string) string {
	g.seq++
	return fmt.Sprintf("rnd-%s-%d", kind, g.seq)
}

var (
	randomPodSels = []M{sel(), podSel("a"), podSel("b"), expr("pod", "In", "a", "c"), expr("pod", "NotIn", "b"), expr("pod", "Exists")}
	randomNSSels  = []M{sel(), nsSel("x"), nsSel("y"), nsSel("z"), expr("ns", "In", "x", "y"), expr("ns", "NotIn", "z"), mdSel("y")}
	randomNets    = [][]string{{node1CIDR}, {node2CIDR}, {podsCIDR}, {"0.0.0.0/0"}, {nodesCIDR}, {node1IP + "/32"}, {outsideCIDR}, {cidr32("x/b"), cidr32("y/c")}}
	randomNodes   = []M{sel(), sel("kubernetes.io/hostname", "node-1"), sel("rack", "r2"), expr("rack", "In", "r1")}
	randomAPorts  = []APort{aport("TCP", 80), aport("TCP", 81), aport("UDP", 80), aport("UDP", 81), aport("SCTP", 81),
		arange("TCP", 80, 81), arange("UDP", 81, 82), anamed("serve-80-tcp"), anamed("serve-81-udp"), anamed("serve-80-sctp"), aany("UDP")}
)

func (g *randomGen) npPolicy() NP {
	g.tag("np")
	ns := pick(g.r, baseNamespaces)
	d := pick(g.r, []dirSpec{dirIngress, dirEgress, dirBoth})
	g.tag(d.name)
	nRules := g.r.IntN(3)
	rules := []NPRule{}
	peers, ports := peerSets(), portSets()
	for k := 0; k < nRules; k++ {
		var rl NPRule
		if g.r.IntN(4) > 0 {
			rl.Peers = g.pickSets("peers", peers)
		}
		if g.r.IntN(2) == 0 {
			rl.Ports = g.pickSets("ports", ports)
		}
		rules = append(rules, rl)
	}
	if nRules == 0 {
		g.tag("action")
	}
	if nRules > 1 {
		g.tag("rules")
	}
	p := policyFor(ns, g.name("np"), pick(g.r, randomPodSels), d, rules...)
	g.refs = append(g.refs, npRef(p.NS, p.Name))
	return p
}

// pickSets is the items of one or two of sets drawn at random, tagged
// with family and their tags; never nil: the rule has the list.
func (g *randomGen) pickSets(family string, sets []ruleSet) []M {
	out := []M{}
	for m := 0; m <= g.r.IntN(2); m++ {
		s := pick(g.r, sets)
		g.tag(family, s.tag)
		out = append(out, s.items...)
	}
	return out
}

func (g *randomGen) adminPeer(egress bool) APeer {
	k := g.r.IntN(4)
	if !egress {
		k %= 2
	}
	switch k {
	case 0:
		return peerNS(pick(g.r, randomNSSels))
	case 1:
		return peerPods(pick(g.r, randomNSSels), pick(g.r, randomPodSels))
	case 2:
		g.tag("networks")
		return peerNets(pick(g.r, randomNets)...)
	}
	g.tag("nodes", "hostnet")
	return peerNodes(pick(g.r, randomNodes))
}

func (g *randomGen) adminRules(egress, pass bool) []ARule {
	actions := []string{actAllw, actDeny}
	if pass {
		actions = append(actions, actPass)
	}
	n := 1 + g.r.IntN(3)
	if n > 1 {
		g.tag("rules")
	}
	var out []ARule
	for k := 0; k < n; k++ {
		rl := ARule{Action: pick(g.r, actions)}
		if rl.Action == actPass {
			g.tag("pass")
		}
		for m := 0; m <= g.r.IntN(2); m++ {
			rl.Peers = append(rl.Peers, g.adminPeer(egress))
		}
		if g.r.IntN(2) == 0 {
			g.tag("ports")
			for m := 0; m <= g.r.IntN(2); m++ {
				rl.Ports = append(rl.Ports, pick(g.r, randomAPorts))
			}
		}
		out = append(out, rl)
	}
	return out
}

func (g *randomGen) adminPolicy() Admin {
	api := pick(g.r, []string{apiANP, apiCNP2, apiCNP1, apiBANP, apiCNP2, apiCNP1})
	if api == apiBANP && g.banp {
		api = apiCNP1
	}
	p := Admin{API: api, Tier: tierA, Priority: g.r.IntN(20)}
	if api == apiBANP {
		g.banp = true
		p.Tier = tierB
	} else if g.r.IntN(3) == 0 {
		p.Tier = tierB
	}
	p.Name = g.name(strings.ToLower(p.Tier))
	if p.Tier == tierB {
		g.tag("baseline")
	} else {
		g.tag("admin", "priority")
	}
	g.tag(apiTag(api))
	if g.r.IntN(2) == 0 {
		p.Subject = subjNS(pick(g.r, randomNSSels))
	} else {
		p.Subject = subjPods(pick(g.r, randomNSSels), pick(g.r, randomPodSels))
	}
	pass := api != apiBANP
	switch g.r.IntN(3) {
	case 0:
		g.tag("ingress")
		p.Ingress = g.adminRules(false, pass)
	case 1:
		g.tag("egress")
		p.Egress = g.adminRules(true, pass)
	default:
		g.tag("ingress", "egress")
		p.Ingress = g.adminRules(false, pass)
		p.Egress = g.adminRules(true, pass)
	}
	g.refs = append(g.refs, adminRef(p))
	return p
}

func randomCase(r *rand.Rand, name string) Case {
	g := &randomGen{r: r, tags: []string{"random"}}
	var docs []any
	for k, n := 0, 1+r.IntN(4); k < n; k++ {
		if r.IntN(5) < 2 {
			docs = append(docs, g.npPolicy())
		} else {
			docs = append(docs, g.adminPolicy())
		}
	}
	steps := []Step{step("random policies", docs...)}
	switch r.IntN(6) {
	case 0:
		g.tag("churn")
		ref := pick(r, g.refs)
		steps = append(steps, del(step("delete "+ref.Name), ref))
	case 1:
		g.tag("churn")
		ns, pod := pick(r, baseNamespaces), pick(r, basePods)
		other := pick(r, basePods)
		steps = append(steps, step(fmt.Sprintf("relabel %s/%s pod=%s", ns, pod, other), basePodYAML(ns, pod, map[string]string{"pod": other})))
	case 2:
		g.tag("churn", "namespaces")
		ns, other := pick(r, baseNamespaces), pick(r, baseNamespaces)
		steps = append(steps, step(fmt.Sprintf("relabel namespace %s ns=%s", ns, other),
			namespaceYAML(ns, map[string]string{"ns": other, "kubernetes.io/metadata.name": ns})))
	}
	return newCase(name, fmt.Sprintf("%d random policies", len(docs)), g.tags, steps...)
}
