package agent

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Lean watches: every node's agent holds every pod, node, Service and
// EndpointSlice of the cluster, so the informers keep only what netpol
// reads (informer transforms, applied before an object is stored). A pod
// keeps its name, namespace, labels, node, host networking, container
// ports, phase and addresses; a node its labels, pod CIDRs and addresses;
// the rest lose managedFields and annotations. An update that changes
// nothing of what is kept (a pod's conditions, a node's heartbeat) then
// is no event at all (sameLean).

// leanMeta keeps what identifies an object and what selectors read.
func leanMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, Labels: m.Labels, DeletionTimestamp: m.DeletionTimestamp}
}

func leanPod(p *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: leanMeta(p.ObjectMeta)}
	out.Spec.NodeName, out.Spec.HostNetwork = p.Spec.NodeName, p.Spec.HostNetwork
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			out.Spec.Containers = append(out.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	out.Status = corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs, HostIP: p.Status.HostIP}
	return out
}

func leanNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: leanMeta(n.ObjectMeta)}
	out.Spec.PodCIDR, out.Spec.PodCIDRs = n.Spec.PodCIDR, n.Spec.PodCIDRs
	out.Status.Addresses = n.Status.Addresses
	return out
}

// leanTransform is the informers' transform: objects it does not know (a
// cache.DeletedFinalStateUnknown tombstone wraps its last known state,
// which was transformed when stored) pass unchanged.
func leanTransform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return leanPod(o), nil
	case *corev1.Node:
		return leanNode(o), nil
	case *corev1.Namespace:
		return &corev1.Namespace{TypeMeta: o.TypeMeta, ObjectMeta: leanMeta(o.ObjectMeta)}, nil
	case *corev1.Service:
		out := *o
		out.ObjectMeta = leanMeta(o.ObjectMeta)
		return &out, nil
	case *discoveryv1.EndpointSlice:
		out := *o
		out.ObjectMeta = leanMeta(o.ObjectMeta)
		return &out, nil
	case *networkingv1.NetworkPolicy:
		out := *o
		out.ObjectMeta = leanMeta(o.ObjectMeta)
		return &out, nil
	}
	return obj, nil
}

var _ cache.TransformFunc = leanTransform

// sameLean reports whether an update changed nothing netpol reads: the
// two objects (both already lean) are equal but for their resource
// version. The Service and EndpointSlice keys follow object identity
// (proxy.Syncer), so only pods, nodes and namespaces are compared.
func sameLean(old, cur any) bool {
	switch o := old.(type) {
	case *corev1.Pod:
		c, ok := cur.(*corev1.Pod)
		return ok && equalIgnoringVersion(o.ObjectMeta, c.ObjectMeta) && equality.Semantic.DeepEqual(o.Spec, c.Spec) &&
			equality.Semantic.DeepEqual(o.Status, c.Status)
	case *corev1.Node:
		c, ok := cur.(*corev1.Node)
		return ok && equalIgnoringVersion(o.ObjectMeta, c.ObjectMeta) && equality.Semantic.DeepEqual(o.Spec, c.Spec) &&
			equality.Semantic.DeepEqual(o.Status, c.Status)
	case *corev1.Namespace:
		c, ok := cur.(*corev1.Namespace)
		return ok && equalIgnoringVersion(o.ObjectMeta, c.ObjectMeta)
	}
	return false
}

func equalIgnoringVersion(a, b metav1.ObjectMeta) bool {
	a.ResourceVersion, b.ResourceVersion = "", ""
	a.Generation, b.Generation = 0, 0
	return a.Name == b.Name && a.Namespace == b.Namespace && a.UID == b.UID &&
		equality.Semantic.DeepEqual(a.Labels, b.Labels) && (a.DeletionTimestamp == nil) == (b.DeletionTimestamp == nil)
}
