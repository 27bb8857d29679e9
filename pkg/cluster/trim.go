package cluster

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trim drops, from an object just decoded, what no part of netpol reads,
// so that a snapshot of a large cluster (a `kubectl get -o yaml` dump is
// mostly managedFields, statuses and pod specs) keeps no copy of it:
//
//   - of every object's metadata, all but its name, namespace, labels,
//     netpol's own annotations (netpol.io/...), resourceVersion, generation
//     and deletionTimestamp: managedFields, other annotations,
//     ownerReferences, uid...;
//   - of a pod, all but its node, host networking, containers' (and init
//     containers') names, images, ports and restart policies, phase and
//     addresses;
//   - of a node's status, all but its addresses; a Service's status
//     conditions.
//
// Unknown fields and decoding errors are found before: strictness does
// not depend on what is kept.
func trim(obj any) {
	if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
		if m, ok := a.GetObjectMeta().(*metav1.ObjectMeta); ok {
			*m = metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: OwnAnnotations(m.Annotations),
				ResourceVersion: m.ResourceVersion, Generation: m.Generation, DeletionTimestamp: m.DeletionTimestamp}
		}
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		sp, st := &o.Spec, &o.Status
		o.Spec = corev1.PodSpec{NodeName: sp.NodeName, HostNetwork: sp.HostNetwork,
			Containers: trimContainers(sp.Containers), InitContainers: trimContainers(sp.InitContainers)}
		o.Status = corev1.PodStatus{Phase: st.Phase, PodIP: st.PodIP, PodIPs: st.PodIPs, HostIP: st.HostIP, HostIPs: st.HostIPs}
	case *corev1.Node:
		o.Status = corev1.NodeStatus{Addresses: o.Status.Addresses}
	case *corev1.Service:
		o.Status.Conditions = nil
	}
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	for i := range cs {
		c := &cs[i]
		cs[i] = corev1.Container{Name: c.Name, Image: c.Image, Ports: c.Ports, RestartPolicy: c.RestartPolicy}
	}
	return cs
}

// OwnAnnotations are the annotations under netpol.io/ (nil when none):
// the ones netpol may read (policy.AuditAnnotation).
func OwnAnnotations(all map[string]string) map[string]string {
	var out map[string]string
	for k, v := range all {
		if strings.HasPrefix(k, "netpol.io/") {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}
