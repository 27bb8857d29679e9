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
	// Namespaces maps x, y, z to the run's namespaces.
	Namespaces map[string]string
	// PodIPs maps x/a ... to the live pods' addresses.
	PodIPs map[string]netip.Addr
	// NodeIPs and NodePodCIDRs map node-1 and node-2 to a live node's
	// address and pod CIDR (on a one-node cluster, both to the same).
	NodeIPs      map[string]netip.Addr
	NodePodCIDRs map[string]netip.Prefix
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
// never polices anyone else's pods). A case the cluster cannot express is
// an error saying why: it adds, removes or moves pods or namespaces,
// changes Nodes, selects nodes, involves the host-network pod h/h, or
// names a CIDR that has no counterpart.
func ForCluster(c Case, env ClusterEnv) (Case, error) {
	if slices.Contains(c.Tags, "nodes") {
		return Case{}, fmt.Errorf("selects nodes by their labels (the runner changes no Node)")
	}
	if slices.Contains(c.Tags, "hostnet") {
		return Case{}, fmt.Errorf("involves the host-network pod h/h (the runner makes none)")
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
		case "NetworkPolicy":
			ns, err := t.namespace(ref.Namespace)
			if err != nil {
				return Step{}, err
			}
			out.Delete = append(out.Delete, corpus.ObjectRef{Kind: ref.Kind, Namespace: ns, Name: ref.Name})
		case "AdminNetworkPolicy", "BaselineAdminNetworkPolicy", "ClusterNetworkPolicy":
			out.Delete = append(out.Delete, corpus.ObjectRef{Kind: ref.Kind, Name: t.clusterName(ref.Kind, ref.Name)})
		default:
			return Step{}, fmt.Errorf("deletes a %s (the runner keeps the base's pods, namespaces and nodes)", ref.Kind)
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
		i := slices.IndexFunc(BasePods(), func(p BasePod) bool { return p.Namespace == ns && p.Name == name })
		if i < 0 || BasePods()[i].Node != node {
			return nil, fmt.Errorf("adds or moves a pod (the runner only relabels the base's)")
		}
		live, err := t.namespace(ns)
		if err != nil {
			return nil, err
		}
		// Only the labels change: that is all the runner patches.
		return M{"apiVersion": "v1", "kind": "Pod", "metadata": M{"name": name, "namespace": live, "labels": meta["labels"]}}, nil
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
	return "", fmt.Errorf("namespace %q is not one of the base's %v", base, baseNamespaces)
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
// kubernetes.io/metadata.name, and CIDRs.
func (t translator) rewrite(v any) error {
	switch v := v.(type) {
	case M:
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

// selectedNamespace maps a namespace a selector names: the base's to the
// run's; h (the host-network pod's) has none; any other name selects
// nothing in the lab and is kept.
func (t translator) selectedNamespace(name string) (string, error) {
	if name == "h" {
		return "", fmt.Errorf("selects namespace h of the host-network pod (the runner makes none)")
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
	return "", fmt.Errorf("CIDR %s has no counterpart in the cluster (only whole pod, node and pod-CIDR prefixes do)", p)
}

func nodeCIDR(node string) string {
	if node == "node-1" {
		return node1CIDR
	}
	return node2CIDR
}
