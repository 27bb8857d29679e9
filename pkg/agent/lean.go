package agent

import (
	"cmp"
	"encoding/json"
	"fmt"
	"hash/maphash"
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
	"github.com/netpol/netpol/pkg/proxy"
)

// Lean watches: every node's agent holds every pod, node, Service and
// EndpointSlice of the cluster, so the informers keep only what netpol
// reads (informer transforms, applied before an object is stored). A pod
// becomes a leanPod: its name, namespace, labels (interned), node, host
// networking, container ports, phase and addresses; an EndpointSlice a
// leanSlice, parsed as the NAT table reads it; a node keeps its labels,
// pod CIDRs and addresses; the rest lose managedFields and annotations (but netpol.io/ ones). An update that changes
// nothing of what is kept (a pod's conditions, a node's heartbeat) then
// is no event at all (sameLean).

// leanMeta keeps what identifies an object and what selectors read, and
// the UID, which an Event about the object names (stores key objects by
// namespace and name).
func leanMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Generation: m.Generation, Labels: m.Labels, Annotations: cluster.OwnAnnotations(m.Annotations), DeletionTimestamp: m.DeletionTimestamp}
}

// leanPod is what the pod informer stores. Every node's agent holds every
// pod of the cluster, and a corev1.Pod is 1,240 bytes before any field is
// set (its spec and status are inline), so the store keeps this record
// instead; a full sync reads a thin corev1.Pod made from it (pod), which
// is garbage once the evaluator has indexed it.
type leanPod struct {
	recordMeta  // Labels is the interned map (labels)
	NodeName    string
	HostNetwork bool
	phase       unique.Handle[corev1.PodPhase]
	// ips is status.podIP, then the rest of status.podIPs, joined by
	// commas: one string and no list for a pod's usual one address.
	ips string
	// labels and ports are the interned label map and container ports
	// (every container's, in order), shared and read only; a record
	// holding them keeps them interned. 128 bytes in all, where a
	// record with lists of addresses and ports took 176 and a list.
	labels *labelSet
	ports  *portList
}

func newLeanPod(p *corev1.Pod) *leanPod {
	// Strings that many pods repeat are shared, not one decoded copy each.
	out := &leanPod{recordMeta: recordMeta{Name: p.Name, ResourceVersion: p.ResourceVersion,
		DeletionTimestamp: p.DeletionTimestamp}, NodeName: unique.Make(p.Spec.NodeName).Value(),
		HostNetwork: p.Spec.HostNetwork, phase: unique.Make(p.Status.Phase)}
	out.Namespace = unique.Make(p.Namespace).Value()
	out.labels = internLabels(p.Labels)
	out.Labels = out.labels.m
	out.ports = internPorts(cluster.ContainerPorts(p))
	var ips []string
	for _, ip := range append([]corev1.PodIP{{IP: p.Status.PodIP}}, p.Status.PodIPs...) {
		if ip.IP != "" && !slices.Contains(ips, ip.IP) {
			ips = append(ips, ip.IP)
		}
	}
	out.ips = strings.Join(ips, ",") // the string itself when there is one
	return out
}

// Phase is status.phase.
func (p *leanPod) Phase() corev1.PodPhase { return p.phase.Value() }

// Ports are every container's ports, in order (shared, read only).
func (p *leanPod) Ports() []corev1.ContainerPort { return p.ports.p }

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
	o.Spec.NodeName, o.Spec.HostNetwork, o.Status.Phase = p.NodeName, p.HostNetwork, p.Phase()
	if ports := p.Ports(); len(ports) > 0 {
		container[0].Ports = ports
		o.Spec.Containers = container
	}
	first, rest, more := strings.Cut(p.ips, ",")
	o.Status.PodIP = first
	if more {
		o.Status.PodIPs = append(o.Status.PodIPs, corev1.PodIP{IP: first})
		for ip := range strings.SplitSeq(rest, ",") {
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
	c.labels, c.ports = &labelSet{m: c.Labels}, &portList{p: slices.Clone(p.Ports())}
	return &c
}

func (p *leanPod) sameAs(c *leanPod) bool {
	return p.Name == c.Name && p.Namespace == c.Namespace && maps.Equal(p.Labels, c.Labels) &&
		(p.DeletionTimestamp == nil) == (c.DeletionTimestamp == nil) && p.NodeName == c.NodeName && p.HostNetwork == c.HostNetwork &&
		p.phase == c.phase && p.ips == c.ips && slices.Equal(p.Ports(), c.Ports())
}

// leanSlice is what the EndpointSlice informer stores: the slice as the
// NAT table reads it, parsed once for this node (proxy.ParseSlice), with
// the metadata an informer store needs (no labels: the Service's name is
// in the parsed slice). The lean API object's endpoints (their address
// strings and target references, about 270 bytes each) were held beside
// the NAT model's (104 bytes), which now shares the parsed lists.
type leanSlice struct {
	recordMeta
	slice *proxy.Slice // read only
}

func newLeanSlice(es *discoveryv1.EndpointSlice, node string) *leanSlice {
	return &leanSlice{recordMeta: recordMeta{Name: es.Name, Namespace: unique.Make(es.Namespace).Value(),
		ResourceVersion: es.ResourceVersion, DeletionTimestamp: es.DeletionTimestamp}, slice: proxy.ParseSlice(es, node)}
}

func (s *leanSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject shares the parsed slice, which nothing changes.
func (s *leanSlice) DeepCopyObject() k8sruntime.Object {
	c := *s
	c.DeletionTimestamp = s.DeletionTimestamp.DeepCopy()
	return &c
}

// recordMeta is a pod's or EndpointSlice's record's metadata: what
// identifies the object, its labels and whether it is being deleted, in
// 64 bytes (an embedded ObjectMeta takes 256, once per pod of the
// cluster). It
// is a metav1.Object, as informer stores expect; the setters of what it
// does not keep (the UID among them, as leanMeta) do nothing, and their
// getters return zero values.
type recordMeta struct {
	Name, Namespace   string
	ResourceVersion   string
	Labels            map[string]string
	DeletionTimestamp *metav1.Time
}

var _ metav1.Object = (*recordMeta)(nil)

func (m *recordMeta) GetNamespace() string                          { return m.Namespace }
func (m *recordMeta) SetNamespace(namespace string)                 { m.Namespace = namespace }
func (m *recordMeta) GetName() string                               { return m.Name }
func (m *recordMeta) SetName(name string)                           { m.Name = name }
func (m *recordMeta) GetGenerateName() string                       { return "" }
func (m *recordMeta) SetGenerateName(string)                        {}
func (m *recordMeta) GetUID() types.UID                             { return "" }
func (m *recordMeta) SetUID(types.UID)                              {}
func (m *recordMeta) GetResourceVersion() string                    { return m.ResourceVersion }
func (m *recordMeta) SetResourceVersion(version string)             { m.ResourceVersion = version }
func (m *recordMeta) GetGeneration() int64                          { return 0 }
func (m *recordMeta) SetGeneration(int64)                           {}
func (m *recordMeta) GetSelfLink() string                           { return "" }
func (m *recordMeta) SetSelfLink(string)                            {}
func (m *recordMeta) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (m *recordMeta) SetCreationTimestamp(metav1.Time)              {}
func (m *recordMeta) GetDeletionTimestamp() *metav1.Time            { return m.DeletionTimestamp }
func (m *recordMeta) SetDeletionTimestamp(t *metav1.Time)           { m.DeletionTimestamp = t }
func (m *recordMeta) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (m *recordMeta) SetDeletionGracePeriodSeconds(*int64)          {}
func (m *recordMeta) GetLabels() map[string]string                  { return m.Labels }
func (m *recordMeta) SetLabels(labels map[string]string)            { m.Labels = labels }
func (m *recordMeta) GetAnnotations() map[string]string             { return nil }
func (m *recordMeta) SetAnnotations(map[string]string)              {}
func (m *recordMeta) GetFinalizers() []string                       { return nil }
func (m *recordMeta) SetFinalizers([]string)                        {}
func (m *recordMeta) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (m *recordMeta) SetOwnerReferences([]metav1.OwnerReference)    {}
func (m *recordMeta) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (m *recordMeta) SetManagedFields([]metav1.ManagedFieldsEntry)  {}

// interner holds one shared value per distinct content, for the
// informers' records: a ReplicaSet's pods carry equal labels and ports, so
// 100,000 pods share a few thousand of each. Values are found by a hash of
// their content (a key string of the content cost as much as the values
// it shared, at 100,000 pods of the realistic shape); on a collision the
// newer value is simply not shared. Entries are weak: a value no record
// holds any more is collected, and its entry goes with it.
type interner[T any] struct {
	mu    sync.Mutex
	m     map[uint64]weak.Pointer[T]
	equal func(a, b *T) bool
}

// intern returns the shared value with the content of v (hash h), v when
// there is none yet.
func (in *interner[T]) intern(h uint64, v *T) *T {
	in.mu.Lock()
	defer in.mu.Unlock()
	if shared := in.m[h].Value(); shared != nil {
		if in.equal(shared, v) {
			return shared
		}
		return v
	}
	if in.m == nil {
		in.m = map[uint64]weak.Pointer[T]{}
	}
	wp := weak.Make(v)
	in.m[h] = wp
	runtime.AddCleanup(v, func(h uint64) {
		in.mu.Lock()
		if in.m[h] == wp {
			delete(in.m, h)
		}
		in.mu.Unlock()
	}, h)
	return v
}

// internSeed seeds the interners' hashes.
var internSeed = maphash.MakeSeed()

// labelSet is one interned label map.
type labelSet struct{ m map[string]string }

var internedLabels = interner[labelSet]{equal: func(a, b *labelSet) bool { return maps.Equal(a.m, b.m) }}

// internLabels returns the shared map with the content of m (read only).
// A new one holds its keys as unique strings: the keys of 100,000 pods'
// label sets are a few dozen strings.
func internLabels(m map[string]string) *labelSet {
	keys := slices.Sorted(maps.Keys(m))
	var h maphash.Hash
	h.SetSeed(internSeed)
	for _, k := range keys {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(m[k])
		h.WriteByte(0)
	}
	set := &labelSet{m: m}
	if len(m) > 0 {
		set.m = make(map[string]string, len(m))
		for k, v := range m {
			set.m[unique.Make(k).Value()] = v
		}
	}
	return internedLabels.intern(h.Sum64(), set)
}

// portList is one interned list of container ports.
type portList struct{ p []corev1.ContainerPort }

var (
	internedPorts = interner[portList]{equal: func(a, b *portList) bool { return slices.Equal(a.p, b.p) }}
	noPorts       = &portList{}
)

// internPorts returns the shared list with the content of ports (read
// only); an empty one for none.
func internPorts(ports []corev1.ContainerPort) *portList {
	if len(ports) == 0 {
		return noPorts
	}
	var h maphash.Hash
	h.SetSeed(internSeed)
	for _, p := range ports {
		h.WriteString(p.Name)
		h.WriteByte(0)
		h.WriteString(strconv.Itoa(int(p.ContainerPort)))
		h.WriteByte(0)
		h.WriteString(string(p.Protocol))
		h.WriteByte(0)
		h.WriteString(strconv.Itoa(int(p.HostPort)))
		h.WriteByte(0)
		h.WriteString(p.HostIP)
		h.WriteByte(0)
	}
	return internedPorts.intern(h.Sum64(), &portList{p: slices.Clip(ports)})
}

func leanNode(n *corev1.Node) *corev1.Node {
	out := &corev1.Node{TypeMeta: n.TypeMeta, ObjectMeta: leanMeta(n.ObjectMeta)}
	out.Spec.PodCIDR, out.Spec.PodCIDRs = n.Spec.PodCIDR, n.Spec.PodCIDRs
	out.Status.Addresses = n.Status.Addresses
	return out
}

// leanTransform is the informers' transform for node (the node's agent:
// an EndpointSlice's endpoints on it are local). Objects it does not know
// (a cache.DeletedFinalStateUnknown tombstone wraps its last known state,
// which was transformed when stored) pass unchanged.
func leanTransform(node string) cache.TransformFunc {
	return func(obj any) (any, error) { return leanObject(obj, node), nil }
}

func leanObject(obj any, node string) any {
	switch o := obj.(type) {
	case *corev1.Pod:
		return newLeanPod(o)
	case *corev1.Node:
		return leanNode(o)
	case *corev1.Namespace:
		return &corev1.Namespace{TypeMeta: o.TypeMeta, ObjectMeta: leanMeta(o.ObjectMeta)}
	case *corev1.Service:
		return leanService(o)
	case *discoveryv1.EndpointSlice:
		return newLeanSlice(o, node)
	case *networkingv1.NetworkPolicy:
		out := *o
		out.ObjectMeta = leanMeta(o.ObjectMeta)
		return &out
	case *networkingv1.ServiceCIDR:
		// Its spec (immutable); its status conditions change alone.
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: o.Name, ResourceVersion: o.ResourceVersion}, Spec: o.Spec}
	}
	return obj
}

// leanPolicy is the transform of the admin, baseline and cluster policy
// informers, whose objects are unstructured. It keeps a policyRecord: the
// object as JSON, without managedFields (a decoded map of every field the
// policy sets, per manager), annotations but netpol's own and status, which is what the
// model is built from, and what the status writer reads. A decoded
// unstructured object is a tree of maps and interfaces several times the
// size of its JSON. The input is not changed.
func leanPolicy(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	rec := &policyRecord{TypeMeta: metav1.TypeMeta{APIVersion: u.GetAPIVersion(), Kind: u.GetKind()},
		recordMeta: recordMeta{Name: u.GetName(), Namespace: u.GetNamespace(), ResourceVersion: u.GetResourceVersion(),
			DeletionTimestamp: u.GetDeletionTimestamp()},
		uid: u.GetUID(), generation: u.GetGeneration(), accepted: acceptedCondition(u)}
	out := maps.Clone(u.Object)
	delete(out, "status")
	if meta, ok := u.Object["metadata"].(map[string]any); ok {
		lean := make(map[string]any, len(meta))
		for k, v := range meta {
			if k != "managedFields" && k != "annotations" {
				lean[k] = v
			}
		}
		if own := cluster.OwnAnnotations(u.GetAnnotations()); own != nil {
			lean["annotations"] = own // netpol's own (policy.AuditAnnotation)
		}
		out["metadata"] = lean
	}
	rec.json, rec.err = json.Marshal(out)
	return rec, nil
}

// policyRecord is an admin, baseline or cluster policy as its informer
// keeps it (leanPolicy).
type policyRecord struct {
	metav1.TypeMeta
	recordMeta
	uid        types.UID // an Event about the policy names it
	generation int64
	// accepted is the object's Accepted condition, nil if it has none.
	accepted *condition
	json     []byte // read only
	err      error  // of the encoding to JSON
}

// condition is what the status writer compares of a condition.
type condition struct {
	status, reason, message string
	observedGeneration      int64
}

// acceptedCondition reads u's Accepted condition.
func acceptedCondition(u *unstructured.Unstructured) *condition {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != ConditionAccepted {
			continue
		}
		out := &condition{}
		out.status, _ = m["status"].(string)
		out.reason, _ = m["reason"].(string)
		out.message, _ = m["message"].(string)
		out.observedGeneration, _ = m["observedGeneration"].(int64)
		return out
	}
	return nil
}

func (r *policyRecord) GetGeneration() int64 { return r.generation }

// GetUID is the object's UID.
func (r *policyRecord) GetUID() types.UID { return r.uid }

// DeepCopyObject shares the JSON, which nothing changes.
func (r *policyRecord) DeepCopyObject() k8sruntime.Object {
	c := *r
	c.DeletionTimestamp = r.DeletionTimestamp.DeepCopy()
	return &c
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
	case *networkingv1.ServiceCIDR:
		c, ok := cur.(*networkingv1.ServiceCIDR)
		return ok && slices.Equal(o.Spec.CIDRs, c.Spec.CIDRs)
	}
	return false
}

func equalIgnoringVersion(a, b metav1.ObjectMeta) bool {
	a.ResourceVersion, b.ResourceVersion = "", ""
	a.Generation, b.Generation = 0, 0
	return a.Name == b.Name && a.Namespace == b.Namespace &&
		equality.Semantic.DeepEqual(a.Labels, b.Labels) && (a.DeletionTimestamp == nil) == (b.DeletionTimestamp == nil)
}
