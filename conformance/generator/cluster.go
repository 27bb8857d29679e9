package generator

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/netpol/netpol/internal/corpus"
)

// RunLabel marks every namespace and cluster-scoped policy a cluster run
// makes (value: the run's ID), so that what a run leaves can be found.
const RunLabel = "netpol.io/conformance-run"

// BasePod is one pod-network pod of the base: where the lab puts it, and
// what a cluster runner must create for it.
type BasePod struct {
	Namespace, Name string
	Node            string // node-1 or node-2
	Labels          map[string]string
	// HostNetwork: h/h, on node-1's own network.
	HostNetwork bool
}

// BaseHostPod is the base's host-network pod h/h, on node-1.
func BaseHostPod() BasePod {
	return BasePod{Namespace: "h", Name: "h", Node: "node-1", Labels: map[string]string{"pod": "h"}, HostNetwork: true}
}

// BaseNodeRack is a base node's rack label: r1 for node-1, r2 for node-2.
func BaseNodeRack(node string) string {
	if node == "node-1" {
		return "r1"
	}
	return "r2"
}

// BaseNodes are the base's node names, in order.
func BaseNodes() []string { return []string{"node-1", "node-2"} }

// BaseNamespaces are the namespaces of the base's pod-network pods (the
// host-network pod h/h lives in h).
func BaseNamespaces() []string { return slices.Clone(baseNamespaces) }

// BasePods are the base's pod-network pods, in the lab's order.
func BasePods() []BasePod {
	var out []BasePod
	for _, p := range podTable() {
		out = append(out, BasePod{Namespace: p.ns, Name: p.name, Node: p.node, Labels: map[string]string{"pod": p.name}})
	}
	return out
}

// BaseNamespaceLabels are a base namespace's labels, besides
// kubernetes.io/metadata.name (which the API server sets).
func BaseNamespaceLabels(name string) map[string]string { return map[string]string{"ns": name} }

// ClusterEnv is where a live cluster put the base: its namespaces' names,
// its pods' and nodes' addresses, its pod CIDRs.
type ClusterEnv struct {
	// Run is the run's ID: the value of RunLabel, and the prefix of
	// cluster-scoped policy names (the BaselineAdminNetworkPolicy must be
	// called default).
	Run string
	// Namespaces maps x, y, z to the run's namespaces, and h to the
	// host-network pod's when the runner makes h/h (cases involving it are
	// left out otherwise).
	Namespaces map[string]string
	// PodIPs maps x/a ... to the live pods' addresses.
	PodIPs map[string]netip.Addr
	// NodeIPs and NodePodCIDRs map node-1 and node-2 to a live node's
	// address and pod CIDR (on a one-node cluster, both to the same).
	NodeIPs      map[string]netip.Addr
	NodePodCIDRs map[string]netip.Prefix
	// NodeNames map node-1 and node-2 to the live nodes' names (where
	// added pods go), NodeHostnames to their kubernetes.io/hostname
	// labels (what node selectors name).
	NodeNames, NodeHostnames map[string]string
	// RackLabel is the live nodes' label standing for the base's rack
	// label (the runner sets it: r1 on node-1's node, r2 on node-2's).
	// Empty when node-1 and node-2 are one node: cases selecting nodes by
	// their labels are then left out.
	RackLabel string
	// PodsCIDR stands for the base's 10.244.0.0/16 (every pod) and
	// NodesCIDR for 172.18.0.0/16 (every node): each must hold the
	// prefixes it stands over with room to spare (ipBlock except must be
	// a strict subset).
	PodsCIDR, NodesCIDR netip.Prefix
}

// ForCluster rewrites case c for the live cluster env describes: namespace
// names and the selectors naming them (kubernetes.io/metadata.name), the
// addresses and CIDRs of pods and nodes, cluster-scoped policy names, and
// Admin/Baseline subjects narrowed to the run's namespaces (so that a run
// never polices anyone else's pods); node selectors and Node label changes
// to the live nodes' labels (RackLabel for rack); a pod added or moved to
// a pod to create on the live node (spec.nodeName). A case the cluster
// cannot express is an error saying why: it adds or removes namespaces or
// nodes, selects nodes when node-1 and node-2 are one node, involves the
// host-network pod h/h when the runner makes none, or names a CIDR that
// has no counterpart.
func ForCluster(c Case, env ClusterEnv) (Case, error) {
	if slices.Contains(c.Tags, "nodes") && env.RackLabel == "" {
		return Case{}, fmt.Errorf("selects nodes by their labels (node-1 and node-2 are one node here)")
	}
	if slices.Contains(c.Tags, "hostnet") && env.Namespaces["h"] == "" {
		return Case{}, fmt.Errorf("involves the host-network pod h/h (the runner makes none here)")
	}
	out := c
	out.Steps = make([]Step, len(c.Steps))
	t := translator{env: env}
	for i, st := range c.Steps {
		ns, err := t.step(st)
		if err != nil {
			return Case{}, fmt.Errorf("step %d: %w", i, err)
		}
		out.Steps[i] = ns
	}
	return out, nil
}

type translator struct{ env ClusterEnv }

func (t translator) step(st Step) (Step, error) {
	out := Step{Name: st.Name}
	for _, ref := range st.Delete {
		switch ref.Kind {
		case "NetworkPolicy", "Pod":
			ns, err := t.namespace(ref.Namespace)
			if err != nil {
				return Step{}, err
			}
			out.Delete = append(out.Delete, corpus.ObjectRef{Kind: ref.Kind, Namespace: ns, Name: ref.Name})
		case "AdminNetworkPolicy", "BaselineAdminNetworkPolicy", "ClusterNetworkPolicy":
			out.Delete = append(out.Delete, corpus.ObjectRef{Kind: ref.Kind, Name: t.clusterName(ref.Kind, ref.Name)})
		default:
			return Step{}, fmt.Errorf("deletes a %s (the runner keeps the base's namespaces and nodes)", ref.Kind)
		}
	}
	docs, err := SplitDocs(st.Apply)
	if err != nil {
		return Step{}, err
	}
	for i, d := range docs {
		nd, err := t.doc(d)
		if err != nil {
			return Step{}, fmt.Errorf("document %d (%s): %w", i, docKey(d), err)
		}
		docs[i] = nd
	}
	out.Apply = joinDocs(docs)
	return out, nil
}

func (t translator) doc(d M) (M, error) {
	kind, _ := d["kind"].(string)
	meta, _ := d["metadata"].(M)
	if meta == nil {
		return nil, fmt.Errorf("no metadata")
	}
	name, _ := meta["name"].(string)
	switch kind {
	case "Namespace":
		live, err := t.namespace(name)
		if err != nil {
			return nil, fmt.Errorf("a namespace the base does not have: %w", err)
		}
		meta["name"] = live
		labels, _ := meta["labels"].(M)
		if labels == nil {
			labels = M{}
		}
		labels["kubernetes.io/metadata.name"] = live
		labels[RunLabel] = t.env.Run
		meta["labels"] = labels
		return M{"apiVersion": "v1", "kind": "Namespace", "metadata": meta}, nil
	case "Pod":
		ns, _ := meta["namespace"].(string)
		spec, _ := d["spec"].(M)
		node, _ := spec["nodeName"].(string)
		live, err := t.namespace(ns)
		if err != nil {
			return nil, err
		}
		out := M{"apiVersion": "v1", "kind": "Pod", "metadata": M{"name": name, "namespace": live, "labels": meta["labels"]}}
		i := slices.IndexFunc(BasePods(), func(p BasePod) bool { return p.Namespace == ns && p.Name == name })
		if (i >= 0 && BasePods()[i].Node == node) || (ns == "h" && name == "h") {
			return out, nil // a pod of the base: only its labels change
		}
		// Added, or moved to another node: a pod to create there.
		liveNode := t.env.NodeNames[node]
		if liveNode == "" {
			return nil, fmt.Errorf("a pod on node %q, which the base does not have", node)
		}
		out["spec"] = M{"nodeName": liveNode}
		return out, nil
	case "Node":
		live := t.env.NodeNames[name]
		if live == "" || t.env.RackLabel == "" {
			return nil, fmt.Errorf("changes node %q's labels (node-1 and node-2 are one node here)", name)
		}
		labels, _ := meta["labels"].(M)
		// Only the rack label changes: that is all the runner patches.
		return M{"apiVersion": "v1", "kind": "Node", "metadata": M{"name": live, "labels": M{t.env.RackLabel: labels["rack"]}}}, nil
	case "NetworkPolicy":
		ns, _ := meta["namespace"].(string)
		live, err := t.namespace(ns)
		if err != nil {
			return nil, err
		}
		meta["namespace"] = live
	case "AdminNetworkPolicy", "BaselineAdminNetworkPolicy", "ClusterNetworkPolicy":
		meta["name"] = t.clusterName(kind, name)
		labels, _ := meta["labels"].(M)
		if labels == nil {
			labels = M{}
		}
		labels[RunLabel] = t.env.Run
		meta["labels"] = labels
		spec, _ := d["spec"].(M)
		subject, _ := spec["subject"].(M)
		if subject == nil {
			return nil, fmt.Errorf("no spec.subject")
		}
		// Narrowed to the run's namespaces: the pods this run probes
		// are all there, so the verdicts it compares are the same.
		if s, ok := subject["namespaces"].(M); ok {
			subject["namespaces"] = t.withRunLabel(s)
		}
		if p, ok := subject["pods"].(M); ok {
			s, _ := p["namespaceSelector"].(M)
			p["namespaceSelector"] = t.withRunLabel(s)
		}
	default:
		return nil, fmt.Errorf("a %s (the runner applies policies and relabels the base)", kind)
	}
	if err := t.rewrite(d["spec"]); err != nil {
		return nil, err
	}
	return d, nil
}

// withRunLabel is selector s that also requires the run's label.
func (t translator) withRunLabel(s M) M {
	out := M{}
	for k, v := range s {
		out[k] = v
	}
	ml := M{}
	if old, ok := out["matchLabels"].(M); ok {
		for k, v := range old {
			ml[k] = v
		}
	}
	ml[RunLabel] = t.env.Run
	out["matchLabels"] = ml
	return out
}

func (t translator) namespace(base string) (string, error) {
	if live, ok := t.env.Namespaces[base]; ok {
		return live, nil
	}
	return "", fmt.Errorf("namespace %q is not one of the run's (the base's %v, h when the runner makes h/h)", base, baseNamespaces)
}

// clusterName is a cluster-scoped policy's name in the cluster: the run's
// ID in front, but for the singleton BaselineAdminNetworkPolicy "default".
func (t translator) clusterName(kind, name string) string {
	if kind == "BaselineAdminNetworkPolicy" {
		return name
	}
	return t.env.Run + "-" + name
}

// rewrite walks a policy's spec: selectors naming namespaces by
// kubernetes.io/metadata.name, node selectors, and CIDRs.
func (t translator) rewrite(v any) error {
	switch v := v.(type) {
	case M:
		if nodes, ok := v["nodes"].(M); ok {
			if err := t.nodeSelector(nodes); err != nil {
				return err
			}
		}
		if ml, ok := v["matchLabels"].(M); ok {
			if name, ok := ml["kubernetes.io/metadata.name"].(string); ok {
				live, err := t.selectedNamespace(name)
				if err != nil {
					return err
				}
				ml["kubernetes.io/metadata.name"] = live
			}
		}
		if exprs, ok := v["matchExpressions"].([]any); ok {
			for _, e := range exprs {
				req, _ := e.(M)
				if req["key"] != "kubernetes.io/metadata.name" {
					continue
				}
				values, _ := req["values"].([]any)
				for i, val := range values {
					s, _ := val.(string)
					live, err := t.selectedNamespace(s)
					if err != nil {
						return err
					}
					values[i] = live
				}
			}
		}
		for k, child := range v {
			mapped, err := t.rewriteChild(child)
			if err != nil {
				return err
			}
			v[k] = mapped
		}
	case []any:
		for i, child := range v {
			mapped, err := t.rewriteChild(child)
			if err != nil {
				return err
			}
			v[i] = mapped
		}
	}
	return nil
}

// rewriteChild is a value inside a spec as the cluster needs it: a CIDR
// mapped, anything else rewritten inside.
func (t translator) rewriteChild(child any) (any, error) {
	if s, ok := child.(string); ok && strings.Contains(s, "/") {
		if p, err := netip.ParsePrefix(s); err == nil {
			return t.prefix(p)
		}
		return s, nil
	}
	return child, t.rewrite(child)
}

// nodeSelector maps a node selector's labels to the live nodes': rack to
// RackLabel, kubernetes.io/hostname's values to the live nodes'
// hostnames; other keys (kubernetes.io/os) are the same everywhere.
func (t translator) nodeSelector(sel M) error {
	key := func(k string) (string, error) {
		if k != "rack" {
			return k, nil
		}
		if t.env.RackLabel == "" {
			return "", fmt.Errorf("selects nodes by rack (node-1 and node-2 are one node here)")
		}
		return t.env.RackLabel, nil
	}
	value := func(k string, v any) any {
		if s, ok := v.(string); ok && k == "kubernetes.io/hostname" && t.env.NodeHostnames[s] != "" {
			return t.env.NodeHostnames[s]
		}
		return v
	}
	if ml, ok := sel["matchLabels"].(M); ok {
		out := M{}
		for k, v := range ml {
			lk, err := key(k)
			if err != nil {
				return err
			}
			out[lk] = value(k, v)
		}
		sel["matchLabels"] = out
	}
	exprs, _ := sel["matchExpressions"].([]any)
	for _, e := range exprs {
		req, _ := e.(M)
		k, _ := req["key"].(string)
		lk, err := key(k)
		if err != nil {
			return err
		}
		req["key"] = lk
		values, _ := req["values"].([]any)
		for i, v := range values {
			values[i] = value(k, v)
		}
	}
	return nil
}

// selectedNamespace maps a namespace a selector names: the base's (and h,
// when the runner makes h/h) to the run's; any other name selects nothing
// in the lab and is kept.
func (t translator) selectedNamespace(name string) (string, error) {
	if name == "h" && t.env.Namespaces["h"] == "" {
		return "", fmt.Errorf("selects namespace h of the host-network pod (the runner makes none here)")
	}
	if live, ok := t.env.Namespaces[name]; ok {
		return live, nil
	}
	return name, nil
}

// prefix maps a CIDR of the base to the cluster's.
func (t translator) prefix(p netip.Prefix) (string, error) {
	switch p.String() {
	case "0.0.0.0/0", "::/0", outsideCIDR:
		return p.String(), nil // the same everywhere
	case podsCIDR:
		return t.env.PodsCIDR.String(), nil
	case nodesCIDR:
		return t.env.NodesCIDR.String(), nil
	}
	for _, node := range BaseNodes() {
		if p.String() == nodeCIDR(node) {
			return t.env.NodePodCIDRs[node].String(), nil
		}
		if p.Bits() == 32 && p.Addr().String() == nodeIP(node) {
			return netip.PrefixFrom(t.env.NodeIPs[node], t.env.NodeIPs[node].BitLen()).String(), nil
		}
	}
	if p.Bits() == 32 {
		for _, bp := range podTable() {
			if p.Addr().String() == bp.ip {
				a := t.env.PodIPs[bp.ns+"/"+bp.name]
				return netip.PrefixFrom(a, a.BitLen()).String(), nil
			}
		}
	}
	if t.meansTheSame(p) {
		return p.String(), nil
	}
	return "", fmt.Errorf("CIDR %s has no counterpart in the cluster (only pod, node and pod-CIDR prefixes, and prefixes holding all or none of each, do)", p)
}

// meansTheSame reports whether CIDR p of the base can stay as it is in the
// cluster: of every pod CIDR and node address it holds all or none, the
// same on both sides (0.0.0.0/4 holds every pod of the base and of a
// cluster on 10.0.0.0/8, and no node of either). A prefix holding part of
// a node's pod CIDR says which pods by their addresses, which the
// cluster's IPAM chooses.
func (t translator) meansTheSame(p netip.Prefix) bool {
	type pair struct{ base, live netip.Prefix }
	host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
	pairs := []pair{
		{netip.MustParsePrefix(podsCIDR), t.env.PodsCIDR},
		{netip.MustParsePrefix(nodesCIDR), t.env.NodesCIDR},
	}
	for _, n := range BaseNodes() {
		pairs = append(pairs,
			pair{netip.MustParsePrefix(nodeCIDR(n)), t.env.NodePodCIDRs[n]},
			pair{host(netip.MustParseAddr(nodeIP(n))), host(t.env.NodeIPs[n])})
	}
	for _, pr := range pairs {
		b, l := holds(p, pr.base), holds(p, pr.live)
		if b != l || b == holdsPart {
			return false
		}
	}
	return true
}

type holding int

const (
	holdsNone holding = iota
	holdsAll
	holdsPart
)

// holds says how much of prefix q prefix p holds.
func holds(p, q netip.Prefix) holding {
	switch {
	case !q.IsValid() || !p.Overlaps(q):
		return holdsNone
	case p.Bits() <= q.Bits():
		return holdsAll
	}
	return holdsPart
}

func nodeCIDR(node string) string {
	if node == "node-1" {
		return node1CIDR
	}
	return node2CIDR
}
