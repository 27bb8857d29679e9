// Package cluster holds a snapshot of the cluster objects that policy and
// service decisions depend on, loaded from files or from a live API server.
package cluster

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	anpv1alpha1 "sigs.k8s.io/network-policy-api/apis/v1alpha1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Snapshot is the cluster state at one moment. ClusterNetworkPolicies of
// v1alpha2 are stored converted to v1beta1 (the two shapes are identical);
// Origin remembers which apiVersion each object came from.
type Snapshot struct {
	Namespaces       []*corev1.Namespace
	Nodes            []*corev1.Node
	Pods             []*corev1.Pod
	Services         []*corev1.Service
	EndpointSlices   []*discoveryv1.EndpointSlice
	NetworkPolicies  []*networkingv1.NetworkPolicy
	AdminPolicies    []*anpv1alpha1.AdminNetworkPolicy
	BaselinePolicies []*anpv1alpha1.BaselineAdminNetworkPolicy
	ClusterPolicies  []*cnpv1beta1.ClusterNetworkPolicy
	// ConfigMaps are kept for the lab (its DNS zone, see pkg/lab); policy
	// and Service decisions never read them.
	ConfigMaps []*corev1.ConfigMap
	// ServiceCIDRs are the ranges ClusterIPs are allocated from
	// (networking.k8s.io/v1): the proxy drops connections to an address of
	// them that no Service holds.
	ServiceCIDRs []*networkingv1.ServiceCIDR

	// Origin maps an object's key to where it was read from.
	Origin map[ObjectKey]Source
	// UnknownFields lists, per object, fields that the typed API structs do
	// not have (a newer API version, or a typo). What they mean for policy
	// is decided in pkg/policy: inside a peer or protocol entry the entry
	// fails closed, elsewhere the policy is rejected.
	UnknownFields map[ObjectKey][]string
}

// ObjectKey names one object: its kind, namespace (empty when
// cluster-scoped) and name.
type ObjectKey struct {
	Kind      string
	Namespace string
	Name      string
}

func (k ObjectKey) String() string {
	if k.Namespace == "" {
		return fmt.Sprintf("%s %s", k.Kind, k.Name)
	}
	return fmt.Sprintf("%s %s/%s", k.Kind, k.Namespace, k.Name)
}

// Source says where an object was read from.
type Source struct {
	APIVersion string
	File       string // empty for objects read from the API server
	Document   int    // 1-based document number within File
}

func (s Source) String() string {
	if s.File == "" {
		return "api server"
	}
	return fmt.Sprintf("%s (document %d)", s.File, s.Document)
}

// Supported kinds, as they appear in ObjectKey.Kind.
const (
	KindNamespace      = "Namespace"
	KindNode           = "Node"
	KindPod            = "Pod"
	KindService        = "Service"
	KindEndpointSlice  = "EndpointSlice"
	KindNetworkPolicy  = "NetworkPolicy"
	KindAdminPolicy    = "AdminNetworkPolicy"
	KindBaselinePolicy = "BaselineAdminNetworkPolicy"
	KindClusterPolicy  = "ClusterNetworkPolicy"
	KindConfigMap      = "ConfigMap"
	KindServiceCIDR    = "ServiceCIDR"
	namespaceNameLabel = "kubernetes.io/metadata.name"
)

// New returns an empty snapshot.
func New() *Snapshot {
	return &Snapshot{Origin: map[ObjectKey]Source{}, UnknownFields: map[ObjectKey][]string{}}
}

// Copy is a copy of the snapshot that can be changed (objects added,
// replaced, deleted) without changing s; the objects themselves are
// shared, and neither may change them in place.
func (s *Snapshot) Copy() *Snapshot {
	c := *s
	c.Namespaces, c.Nodes, c.Pods = slices.Clone(s.Namespaces), slices.Clone(s.Nodes), slices.Clone(s.Pods)
	c.Services, c.EndpointSlices = slices.Clone(s.Services), slices.Clone(s.EndpointSlices)
	c.NetworkPolicies, c.AdminPolicies = slices.Clone(s.NetworkPolicies), slices.Clone(s.AdminPolicies)
	c.BaselinePolicies, c.ClusterPolicies = slices.Clone(s.BaselinePolicies), slices.Clone(s.ClusterPolicies)
	c.ConfigMaps, c.ServiceCIDRs = slices.Clone(s.ConfigMaps), slices.Clone(s.ServiceCIDRs)
	c.Origin, c.UnknownFields = maps.Clone(s.Origin), maps.Clone(s.UnknownFields)
	return &c
}

// PolicyObjects lists the snapshot's policy objects: NetworkPolicies,
// then admin, baseline and cluster policies (the pointers it holds).
func (s *Snapshot) PolicyObjects() []any {
	out := make([]any, 0, len(s.NetworkPolicies)+len(s.AdminPolicies)+len(s.BaselinePolicies)+len(s.ClusterPolicies))
	for _, p := range s.NetworkPolicies {
		out = append(out, p)
	}
	for _, p := range s.AdminPolicies {
		out = append(out, p)
	}
	for _, p := range s.BaselinePolicies {
		out = append(out, p)
	}
	for _, p := range s.ClusterPolicies {
		out = append(out, p)
	}
	return out
}

// PolicyKey is the key of obj, one of PolicyObjects.
func PolicyKey(obj any) (ObjectKey, bool) {
	switch o := obj.(type) {
	case *networkingv1.NetworkPolicy:
		return ObjectKey{Kind: KindNetworkPolicy, Namespace: o.Namespace, Name: o.Name}, true
	case *anpv1alpha1.AdminNetworkPolicy:
		return ObjectKey{Kind: KindAdminPolicy, Name: o.Name}, true
	case *anpv1alpha1.BaselineAdminNetworkPolicy:
		return ObjectKey{Kind: KindBaselinePolicy, Name: o.Name}, true
	case *cnpv1beta1.ClusterNetworkPolicy:
		return ObjectKey{Kind: KindClusterPolicy, Name: o.Name}, true
	}
	return ObjectKey{}, false
}

// PolicyObject is the policy object of key, or nil.
func (s *Snapshot) PolicyObject(key ObjectKey) any {
	for _, obj := range s.PolicyObjects() {
		if k, _ := PolicyKey(obj); k == key {
			return obj
		}
	}
	return nil
}

// ReplacePolicy puts obj, a policy object, in the place of the object of
// its key (or adds it), keeping that object's origin.
func (s *Snapshot) ReplacePolicy(obj any) {
	key, ok := PolicyKey(obj)
	if !ok {
		return
	}
	origin, had := s.Origin[key]
	s.Delete(key)
	switch o := obj.(type) {
	case *networkingv1.NetworkPolicy:
		s.NetworkPolicies = append(s.NetworkPolicies, o)
	case *anpv1alpha1.AdminNetworkPolicy:
		s.AdminPolicies = append(s.AdminPolicies, o)
	case *anpv1alpha1.BaselineAdminNetworkPolicy:
		s.BaselinePolicies = append(s.BaselinePolicies, o)
	case *cnpv1beta1.ClusterNetworkPolicy:
		s.ClusterPolicies = append(s.ClusterPolicies, o)
	}
	if had {
		s.Origin[key] = origin
	}
}

// PolicyAlone is a snapshot of obj, one of PolicyObjects, alone, with the
// unknown fields s records (what building one object's model reads).
func (s *Snapshot) PolicyAlone(obj any) *Snapshot {
	one := &Snapshot{Origin: map[ObjectKey]Source{}, UnknownFields: s.UnknownFields}
	switch o := obj.(type) {
	case *networkingv1.NetworkPolicy:
		one.NetworkPolicies = []*networkingv1.NetworkPolicy{o}
	case *anpv1alpha1.AdminNetworkPolicy:
		one.AdminPolicies = []*anpv1alpha1.AdminNetworkPolicy{o}
	case *anpv1alpha1.BaselineAdminNetworkPolicy:
		one.BaselinePolicies = []*anpv1alpha1.BaselineAdminNetworkPolicy{o}
	case *cnpv1beta1.ClusterNetworkPolicy:
		one.ClusterPolicies = []*cnpv1beta1.ClusterNetworkPolicy{o}
	}
	return one
}

// Namespace returns the namespace called name, or nil.
func (s *Snapshot) Namespace(name string) *corev1.Namespace {
	for _, ns := range s.Namespaces {
		if ns.Name == name {
			return ns
		}
	}
	return nil
}

// ConfigMap returns the ConfigMap namespace/name, or nil.
func (s *Snapshot) ConfigMap(namespace, name string) *corev1.ConfigMap {
	for _, c := range s.ConfigMaps {
		if c.Namespace == namespace && c.Name == name {
			return c
		}
	}
	return nil
}

// Pod returns the pod namespace/name, or nil.
func (s *Snapshot) Pod(namespace, name string) *corev1.Pod {
	for _, p := range s.Pods {
		if p.Namespace == namespace && p.Name == name {
			return p
		}
	}
	return nil
}

// Delete removes the object named by key; it reports whether it was there.
func (s *Snapshot) Delete(key ObjectKey) bool {
	found := false
	del := func(ns, name string) bool {
		if ns == key.Namespace && name == key.Name {
			found = true
			return true
		}
		return false
	}
	switch key.Kind {
	case KindNamespace:
		s.Namespaces = remove(s.Namespaces, func(o *corev1.Namespace) bool { return del(o.Namespace, o.Name) })
	case KindNode:
		s.Nodes = remove(s.Nodes, func(o *corev1.Node) bool { return del(o.Namespace, o.Name) })
	case KindPod:
		s.Pods = remove(s.Pods, func(o *corev1.Pod) bool { return del(o.Namespace, o.Name) })
	case KindService:
		s.Services = remove(s.Services, func(o *corev1.Service) bool { return del(o.Namespace, o.Name) })
	case KindEndpointSlice:
		s.EndpointSlices = remove(s.EndpointSlices, func(o *discoveryv1.EndpointSlice) bool { return del(o.Namespace, o.Name) })
	case KindNetworkPolicy:
		s.NetworkPolicies = remove(s.NetworkPolicies, func(o *networkingv1.NetworkPolicy) bool { return del(o.Namespace, o.Name) })
	case KindAdminPolicy:
		s.AdminPolicies = remove(s.AdminPolicies, func(o *anpv1alpha1.AdminNetworkPolicy) bool { return del(o.Namespace, o.Name) })
	case KindBaselinePolicy:
		s.BaselinePolicies = remove(s.BaselinePolicies, func(o *anpv1alpha1.BaselineAdminNetworkPolicy) bool { return del(o.Namespace, o.Name) })
	case KindClusterPolicy:
		s.ClusterPolicies = remove(s.ClusterPolicies, func(o *cnpv1beta1.ClusterNetworkPolicy) bool { return del(o.Namespace, o.Name) })
	case KindConfigMap:
		s.ConfigMaps = remove(s.ConfigMaps, func(o *corev1.ConfigMap) bool { return del(o.Namespace, o.Name) })
	case KindServiceCIDR:
		s.ServiceCIDRs = remove(s.ServiceCIDRs, func(o *networkingv1.ServiceCIDR) bool { return del(o.Namespace, o.Name) })
	}
	if found {
		delete(s.Origin, key)
		delete(s.UnknownFields, key)
	}
	return found
}

func remove[T any](items []T, match func(T) bool) []T {
	out := items[:0]
	for _, it := range items {
		if !match(it) {
			out = append(out, it)
		}
	}
	return out
}

// PodFinished reports whether a pod has finished (Succeeded or Failed): it
// holds no address and is in no policy.
func PodFinished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// ContainerPorts are the ports of all of a pod's containers, in order:
// with one container, its own slice (shared: read only).
func ContainerPorts(p *corev1.Pod) []corev1.ContainerPort {
	if len(p.Spec.Containers) == 1 {
		return p.Spec.Containers[0].Ports
	}
	var out []corev1.ContainerPort
	for _, c := range p.Spec.Containers {
		out = append(out, c.Ports...)
	}
	return out
}

// PodAddresses returns a pod's addresses: status.podIP first (the primary,
// as kubectl shows it), then the rest of status.podIPs, without repeats.
func PodAddresses(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if ip, err := netip.ParseAddr(s); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	add(p.Status.PodIP)
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	return out
}
