package eval

import (
	"iter"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/policy"
)

// Resolved exposes the evaluator's resolution of the snapshot (every
// selector matched against pods and nodes) to the kernel compiler, so the
// kernel rules are built from exactly the matches the evaluator decides
// with. It is read-only.
type Resolved struct{ ix *index }

// Resolved returns the evaluator's resolved view of its snapshot.
func (e *Evaluator) Resolved() *Resolved { return &Resolved{ix: e.ix} }

// PodView is one pod as the evaluator sees it.
type PodView struct {
	Key       string // namespace/name
	Namespace string
	Labels    labels.Set
	// NamespaceLabels are the labels of the pod's namespace.
	NamespaceLabels labels.Set
	HostNetwork     bool
	Node            int // index of its node, -1 when unknown
	// Addrs are the pod's addresses, primary first; a host-network pod's
	// are its node's.
	Addrs []netip.Addr
	Ports []corev1.ContainerPort
}

// NumPods is the number of pods (finished pods are left out).
func (r *Resolved) NumPods() int { return len(r.ix.pods) }

// Pod returns pod i.
func (r *Resolved) Pod(i int) PodView {
	p := &r.ix.pods[i]
	return PodView{Key: p.key, Namespace: p.namespace, Labels: p.labels, NamespaceLabels: p.nsLabels,
		HostNetwork: p.hostNetwork, Node: p.node, Addrs: p.addrs, Ports: p.ports}
}

// NumNodes is the number of nodes.
func (r *Resolved) NumNodes() int { return len(r.ix.nodes) }

// NodeName returns the name of node i.
func (r *Resolved) NodeName(i int) string { return r.ix.nodes[i].node.Name }

// NodeAddrs returns the addresses (InternalIP, ExternalIP) of node i.
func (r *Resolved) NodeAddrs(i int) []netip.Addr { return r.ix.nodes[i].addrs }

// EndpointOf is the endpoint that has address a: a pod-network pod, else a
// node (Node set), else an outside address (Pod and Node -1).
func (r *Resolved) EndpointOf(a netip.Addr) Endpoint { return r.ix.addrEndpoint(a) }

// NodeIndex returns the index of the named node, or -1.
func (r *Resolved) NodeIndex(name string) int {
	for i, n := range r.ix.nodes {
		if n.node.Name == name {
			return i
		}
	}
	return -1
}

// Policies are the model's policies in evaluation order; indexes into it
// are policy indexes below.
func (r *Resolved) Policies() []*policy.Policy {
	out := make([]*policy.Policy, len(r.ix.policies))
	for i, cp := range r.ix.policies {
		out[i] = cp.Policy
	}
	return out
}

// Selecting lists, in evaluation order, the policies of a tier that apply
// to pod for direction d (NetworkPolicy tier: those that isolate it).
func (r *Resolved) Selecting(tier policy.Tier, d policy.Direction, pod int) []int32 {
	return r.ix.selecting(tier, d, pod)
}

// PeerPods reports whether rule ri of policy pi (direction d) matches pod
// as a pod peer (pods/namespaces peers; host-network pods never match).
func (r *Resolved) PeerPods(pi int, d policy.Direction, ri int, pod int) bool {
	return r.ix.policies[pi].rules(d)[ri].pods.has(pod)
}

// PeerNodes reports whether rule ri of policy pi (direction d) matches node
// as a nodes peer.
func (r *Resolved) PeerNodes(pi int, d policy.Direction, ri int, node int) bool {
	return r.ix.policies[pi].rules(d)[ri].nodes.has(node)
}

// EachPeerPod yields the pods rule ri of policy pi (direction d) matches
// as pod peers, in pod order.
func (r *Resolved) EachPeerPod(pi int, d policy.Direction, ri int) iter.Seq[int] {
	return r.ix.policies[pi].rules(d)[ri].pods.members()
}

// WithPolicies is the resolution of the same pods and nodes under other
// policies (in evaluation order): the compiler's shadow evaluation of the
// enforced and the staged policies together (compiler.Options.Staged).
// The pods are shared, read-only; the policies' selections are made
// afresh.
func (r *Resolved) WithPolicies(pols []*policy.Policy) *Resolved {
	old := r.ix
	ix := &index{pods: old.pods, podsSorted: old.podsSorted, idents: old.idents, identOf: old.identOf,
		identsByNamespace: old.identsByNamespace, nodes: old.nodes, nodeByIP: old.nodeByIP, selected: map[string]*selection{}}
	ix.setPolicies(pols)
	return &Resolved{ix: ix}
}
