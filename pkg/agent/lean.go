package agent

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unique"
	"weak"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/netpol/netpol/pkg/cluster"
)

// Lean watches: every node's agent holds every pod, node, Service and
// EndpointSlice of the cluster, so the informers keep only what netpol
// reads (informer transforms, applied before an object is stored). A pod
// becomes a leanPod: its name, namespace, labels (interned), node, host
// networking, container ports, phase and addresses; a node keeps its
// labels, pod CIDRs and addresses;
// the rest lose managedFields and annotations. An update that changes
// nothing of what is kept (a pod's conditions, a node's heartbeat) then
// is no event at all (sameLean).

// leanMeta keeps what identifies an object and what selectors read. Not
// the UID: nothing reads it (stores key objects by namespace and name; a
// replaced object is a delete and an add, or an update of what is kept).
func leanMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, Labels: m.Labels, DeletionTimestamp: m.DeletionTimestamp}
}

// leanPod is what the pod informer stores. Every node's agent holds every
// pod of the cluster, and a corev1.Pod is 1,240 bytes before any field is
// set (its spec and status are inline), so the store keeps this record
// instead; a full sync reads a thin corev1.Pod made from it (pod), which
// is garbage once the evaluator has indexed it.
type leanPod struct {
	podMeta
	NodeName    string
	HostNetwork bool
	Phase       corev1.PodPhase
	IPs         []string               // status.podIP, then the rest of status.podIPs
	Ports       []corev1.ContainerPort // every container's, in order (shared, read only)
	// labels and ports keep the interned label map and port list alive.
	labels *labelSet
	ports  *portList
}

func newLeanPod(p *corev1.Pod) *leanPod {
	// Strings that many pods repeat are shared, not one decoded copy each.
	out := &leanPod{podMeta: podMeta{Name: p.Name, ResourceVersion: p.ResourceVersion,
		DeletionTimestamp: p.DeletionTimestamp}, NodeName: unique.Make(p.Spec.NodeName).Value(),
		HostNetwork: p.Spec.HostNetwork, Phase: unique.Make(p.Status.Phase).Value()}
	out.Namespace = unique.Make(p.Namespace).Value()
	out.labels = internLabels(p.Labels)
	out.Labels = out.labels.m
	out.ports = internPorts(cluster.ContainerPorts(p))
	out.Ports = out.ports.p
	for _, ip := range append([]corev1.PodIP{{IP: p.Status.PodIP}}, p.Status.PodIPs...) {
		if ip.IP != "" && !slices.Contains(out.IPs, ip.IP) {
			out.IPs = append(out.IPs, ip.IP)
		}
	}
	return out
}

// pod is the thin corev1.Pod the incremental path reads: what netpol
// reads of a pod, nothing else (one container holds the ports;
// status.podIPs is set only for more than one address).
func (p *leanPod) pod() *corev1.Pod {
	o := &corev1.Pod{}
	p.fill(o, make([]corev1.Container, 1))
	return o
}

// fill makes o (zero) the thin pod of p, with container (one, zero) as
// its container when it has ports.
func (p *leanPod) fill(o *corev1.Pod, container []corev1.Container) {
	o.ObjectMeta = metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion,
		Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp}
	o.Spec.NodeName, o.Spec.HostNetwork, o.Status.Phase = p.NodeName, p.HostNetwork, p.Phase
	if len(p.Ports) > 0 {
		container[0].Ports = p.Ports
		o.Spec.Containers = container
	}
	if len(p.IPs) > 0 {
		o.Status.PodIP = p.IPs[0]
	}
	if len(p.IPs) > 1 {
		for _, ip := range p.IPs {
			o.Status.PodIPs = append(o.Status.PodIPs, corev1.PodIP{IP: ip})
		}
	}
}

// thinPodsInOrder yields the thin pod of each record in (namespace,
// name) order, made in one reused Pod: a full sync's evaluator keeps
// nothing of a pod but the record's own strings, label map and ports
// (eval.NewFromPods), and 100,000 thin pods made at once (1,240 bytes
// each) were the largest part of the agent's first sync's memory.
func thinPodsInOrder(recs []*leanPod) iter.Seq[*corev1.Pod] {
	// The names are copied next to each other, so that the sort's
	// comparisons do not visit the records.
	type named struct {
		ns, name string
		rec      *leanPod
	}
	sorted := make([]named, len(recs))
	for i, p := range recs {
		sorted[i] = named{p.Namespace, p.Name, p}
	}
	slices.SortFunc(sorted, func(a, b named) int {
		return cmp.Or(strings.Compare(a.ns, b.ns), strings.Compare(a.name, b.name))
	})
	return func(yield func(*corev1.Pod) bool) {
		var pod corev1.Pod
		container := make([]corev1.Container, 1)
		for _, n := range sorted {
			pod, container[0] = corev1.Pod{}, corev1.Container{}
			n.rec.fill(&pod, container)
			if !yield(&pod) {
				return
			}
		}
	}
}

// GetObjectKind and DeepCopyObject make a leanPod a runtime.Object, as
// informer stores and listers expect.
func (p *leanPod) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (p *leanPod) DeepCopyObject() k8sruntime.Object {
	c := *p
	c.Labels, c.DeletionTimestamp = maps.Clone(p.Labels), p.DeletionTimestamp.DeepCopy()
	c.IPs, c.Ports, c.labels, c.ports = slices.Clone(p.IPs), slices.Clone(p.Ports), nil, nil
	return &c
}

func (p *leanPod) sameAs(c *leanPod) bool {
	return p.Name == c.Name && p.Namespace == c.Namespace && maps.Equal(p.Labels, c.Labels) &&
		(p.DeletionTimestamp == nil) == (c.DeletionTimestamp == nil) && p.NodeName == c.NodeName && p.HostNetwork == c.HostNetwork &&
		p.Phase == c.Phase && slices.Equal(p.IPs, c.IPs) && slices.Equal(p.Ports, c.Ports)
}

// podMeta is a pod record's metadata: what identifies the pod, its
// labels and whether it is being deleted, in 72 bytes (an embedded
// ObjectMeta took 256: 17 MB at 100,000 pods). It is a metav1.Object, as
// informer stores expect; the setters of what it does not keep (the UID
// among them, as leanMeta) do nothing, and their getters return zero
// values.
type podMeta struct {
	Name, Namespace   string
	ResourceVersion   string
	Labels            map[string]string
	DeletionTimestamp *metav1.Time
}

var _ metav1.Object = (*podMeta)(nil)

func (m *podMeta) GetNamespace() string                          { return m.Namespace }
func (m *podMeta) SetNamespace(namespace string)                 { m.Namespace = namespace }
func (m *podMeta) GetName() string                               { return m.Name }
func (m *podMeta) SetName(name string)                           { m.Name = name }
func (m *podMeta) GetGenerateName() string                       { return "" }
func (m *podMeta) SetGenerateName(string)                        {}
func (m *podMeta) GetUID() types.UID                             { return "" }
func (m *podMeta) SetUID(types.UID)                              {}
func (m *podMeta) GetResourceVersion() string                    { return m.ResourceVersion }
func (m *podMeta) SetResourceVersion(version string)             { m.ResourceVersion = version }
func (m *podMeta) GetGeneration() int64                          { return 0 }
func (m *podMeta) SetGeneration(int64)                           {}
func (m *podMeta) GetSelfLink() string                           { return "" }
func (m *podMeta) SetSelfLink(string)                            {}
func (m *podMeta) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (m *podMeta) SetCreationTimestamp(metav1.Time)              {}
func (m *podMeta) GetDeletionTimestamp() *metav1.Time            { return m.DeletionTimestamp }
func (m *podMeta) SetDeletionTimestamp(t *metav1.Time)           { m.DeletionTimestamp = t }
func (m *podMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (m *podMeta) SetDeletionGracePeriodSeconds(*int64)          {}
func (m *podMeta) GetLabels() map[string]string                  { return m.Labels }
func (m *podMeta) SetLabels(labels map[string]string)            { m.Labels = labels }
func (m *podMeta) GetAnnotations() map[string]string             { return nil }
func (m *podMeta) SetAnnotations(map[string]string)              {}
func (m *podMeta) GetFinalizers() []string                       { return nil }
func (m *podMeta) SetFinalizers([]string)                        {}
func (m *podMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (m *podMeta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (m *podMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (m *podMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

// interner holds one shared value per distinct content (its id), for the
// informers' records: a ReplicaSet's pods carry equal labels and ports, so
// 100,000 pods share a few thousand of each. Entries are weak: a value no
// record holds any more is collected, and its entry goes with it.
type interner[T any] struct {
	mu sync.Mutex
	m  map[string]weak.Pointer[T]
}

// intern returns the shared value with this id, v when there is none yet.
func (in *interner[T]) intern(id string, v *T) *T {
	in.mu.Lock()
	defer in.mu.Unlock()
	if shared := in.m[id].Value(); shared != nil {
		return shared
	}
	if in.m == nil {
		in.m = map[string]weak.Pointer[T]{}
	}
	wp := weak.Make(v)
	in.m[id] = wp
	runtime.AddCleanup(v, func(id string) {
		in.mu.Lock()
		if in.m[id] == wp {
			delete(in.m, id)
		}
		in.mu.Unlock()
	}, id)
	return v
}

// labelSet is one interned label map.
type labelSet struct{ m map[string]string }

var internedLabels interner[labelSet]

// internLabels returns the shared map with the content of m (read only).
func internLabels(m map[string]string) *labelSet {
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(m[k])
		b.WriteByte(0)
	}
	return internedLabels.intern(b.String(), &labelSet{m: m})
}

// portList is one interned list of container ports.
type portList struct{ p []corev1.ContainerPort }

var (
	internedPorts interner[portList]
	noPorts       = &portList{}
)

// internPorts returns the shared list with the content of ports (read
// only); an empty one for none.
func internPorts(ports []corev1.ContainerPort) *portList {
	if len(ports) == 0 {
		return noPorts
	}
	var b []byte
	for _, p := range ports {
		b = append(b, p.Name...)
		b = append(b, 0)
		b = strconv.AppendInt(b, int64(p.ContainerPort), 10)
		b = append(b, 0)
		b = append(b, p.Protocol...)
		b = append(b, 0)
		b = strconv.AppendInt(b, int64(p.HostPort), 10)
		b = append(b, 0)
		b = append(b, p.HostIP...)
		b = append(b, 0)
	}
	return internedPorts.intern(string(b), &portList{p: slices.Clip(ports)})
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
		return newLeanPod(o), nil
	case *corev1.Node:
		return leanNode(o), nil
	case *corev1.Namespace:
		return &corev1.Namespace{TypeMeta: o.TypeMeta, ObjectMeta: leanMeta(o.ObjectMeta)}, nil
	case *corev1.Service:
		return leanService(o), nil
	case *discoveryv1.EndpointSlice:
		out := *o
		out.ObjectMeta = leanMeta(o.ObjectMeta)
		out.Endpoints = leanEndpoints(o.Endpoints)
		return &out, nil
	case *networkingv1.NetworkPolicy:
		out := *o
		out.ObjectMeta = leanMeta(o.ObjectMeta)
		return &out, nil
	}
	return obj, nil
}

var _ cache.TransformFunc = leanTransform

// leanPolicy is the transform of the admin, baseline and cluster policy
// informers, whose objects are unstructured: like leanMeta, it drops
// managedFields (a decoded map of every field the policy sets, per
// manager) and annotations; spec and status stay (the status writer
// compares the conditions). The input is not changed: the maps are
// shallow copies.
func leanPolicy(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	meta, ok := u.Object["metadata"].(map[string]any)
	if !ok {
		return obj, nil
	}
	lean := make(map[string]any, len(meta))
	for k, v := range meta {
		if k != "managedFields" && k != "annotations" {
			lean[k] = v
		}
	}
	out := maps.Clone(u.Object)
	out["metadata"] = lean
	return &unstructured.Unstructured{Object: out}, nil
}

var _ cache.TransformFunc = leanPolicy

// leanService keeps what the proxy reads: not the selector (endpoints
// come from EndpointSlices), and values that many Services repeat
// (type, families, policies) are shared; the ClusterIP is the first of
// ClusterIPs' strings, not a second copy.
func leanService(o *corev1.Service) *corev1.Service {
	out := &corev1.Service{TypeMeta: o.TypeMeta, ObjectMeta: leanMeta(o.ObjectMeta), Spec: o.Spec, Status: o.Status}
	sp := &out.Spec
	sp.Selector, out.Status.Conditions = nil, nil
	if len(sp.ClusterIPs) > 0 && sp.ClusterIP == sp.ClusterIPs[0] {
		sp.ClusterIP = sp.ClusterIPs[0]
	}
	sp.Type = unique.Make(sp.Type).Value()
	sp.SessionAffinity = unique.Make(sp.SessionAffinity).Value()
	sp.ExternalTrafficPolicy = unique.Make(sp.ExternalTrafficPolicy).Value()
	sp.InternalTrafficPolicy = sharedValue(sp.InternalTrafficPolicy)
	sp.IPFamilyPolicy = sharedValue(sp.IPFamilyPolicy)
	if fams, ok := sharedFamilies[fmt.Sprint(sp.IPFamilies)]; ok {
		sp.IPFamilies = fams
	}
	for i := range sp.Ports {
		sp.Ports[i].Protocol = unique.Make(sp.Ports[i].Protocol).Value()
	}
	return out
}

// sharedFamilies are the IP family lists the API server allows (read
// only).
var sharedFamilies = map[string][]corev1.IPFamily{}

func init() {
	for _, fams := range [][]corev1.IPFamily{{corev1.IPv4Protocol}, {corev1.IPv6Protocol},
		{corev1.IPv4Protocol, corev1.IPv6Protocol}, {corev1.IPv6Protocol, corev1.IPv4Protocol}} {
		sharedFamilies[fmt.Sprint(fams)] = fams
	}
}

// sharedValues holds one pointer per enumeration value (the API server
// validates them: a handful).
var sharedValues sync.Map

// sharedValue is p's value as a pointer shared by every lean object with
// that value (read only): traffic policies, family policies.
func sharedValue[T ~string](p *T) *T {
	if p == nil {
		return nil
	}
	v, _ := sharedValues.LoadOrStore(reflect.TypeFor[T]().String()+"\x00"+string(*p), p)
	return v.(*T)
}

// leanEndpoints keeps what the proxy reads of each endpoint: addresses,
// conditions, node, zone, hints and the pod it names (kind, namespace,
// name); the conditions point at shared values.
func leanEndpoints(eps []discoveryv1.Endpoint) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, len(eps))
	for i, e := range eps {
		out[i] = discoveryv1.Endpoint{Addresses: e.Addresses, NodeName: sharedString(e.NodeName), Zone: sharedString(e.Zone),
			Hints: e.Hints, Conditions: discoveryv1.EndpointConditions{Ready: sharedBool(e.Conditions.Ready),
				Serving: sharedBool(e.Conditions.Serving), Terminating: sharedBool(e.Conditions.Terminating)}}
		if r := e.TargetRef; r != nil {
			out[i].TargetRef = &corev1.ObjectReference{Kind: unique.Make(r.Kind).Value(),
				Namespace: unique.Make(r.Namespace).Value(), Name: r.Name}
		}
	}
	return out
}

var sharedTrue, sharedFalse = true, false

var internedStrings interner[string]

// sharedString is p's value as a pointer shared by every lean object that
// holds the same value (node and zone names: one per node, not one per
// endpoint), read only.
func sharedString(p *string) *string {
	if p == nil {
		return nil
	}
	v := *p
	return internedStrings.intern(v, &v)
}

// sharedBool is p's value as a pointer shared by every lean object (read
// only, as every informer object is).
func sharedBool(p *bool) *bool {
	switch {
	case p == nil:
		return nil
	case *p:
		return &sharedTrue
	}
	return &sharedFalse
}

// sameLean reports whether an update changed nothing netpol reads: the
// two objects (both already lean) are equal but for their resource
// version. The Service and EndpointSlice keys follow object identity
// (proxy.Syncer), so only pods, nodes and namespaces are compared.
func sameLean(old, cur any) bool {
	switch o := old.(type) {
	case *leanPod:
		c, ok := cur.(*leanPod)
		return ok && o.sameAs(c)
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
	return a.Name == b.Name && a.Namespace == b.Namespace &&
		equality.Semantic.DeepEqual(a.Labels, b.Labels) && (a.DeletionTimestamp == nil) == (b.DeletionTimestamp == nil)
}
