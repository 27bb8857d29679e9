package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/proxy"
)

// gvrCRD is watched to notice policy CRDs appearing or going.
var gvrCRD = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// sources watches everything the snapshot is made of: typed informers for
// the core kinds, dynamic informers for the policy CRDs (their objects go
// through the same strict decoder as files, so unknown fields fail closed),
// and the CRDs themselves, to start or stop policy informers when a policy
// CRD appears or goes.
type sources struct {
	kube kubernetes.Interface
	dyn  dynamic.Interface
	disc discovery.DiscoveryInterface
	log  *slog.Logger
	// onChange gets every event with the objects it carries (old and
	// new for an update; none for a change of the served policy APIs).
	onChange   func(resource string, objs ...any)
	core       informers.SharedInformerFactory
	crds       dynamicinformer.DynamicSharedInformerFactory
	listers    coreListers
	policyMu   sync.RWMutex
	policies   *policyInformers
	rediscover chan struct{}
	// watchServiceCIDRs adds the ServiceCIDR informer (start, before the
	// factory starts, when the agent may list them).
	watchServiceCIDRs func() cache.GenericLister
}

type coreListers struct {
	pods, namespaces, nodes, services, endpointSlices, networkPolicies cache.GenericLister
	// serviceCIDRs is nil when they are not watched.
	serviceCIDRs cache.GenericLister
}

// policyInformers are the dynamic informers of one set of served policy
// resources.
type policyInformers struct {
	gvrs    []schema.GroupVersionResource
	factory dynamicinformer.DynamicSharedInformerFactory
	stop    chan struct{}
}

func newSources(kube kubernetes.Interface, dyn dynamic.Interface, node string, log *slog.Logger, onChange func(string, ...any)) *sources {
	s := &sources{kube: kube, dyn: dyn, disc: kube.Discovery(), log: log, onChange: onChange,
		core: informers.NewSharedInformerFactory(kube, 0), rediscover: make(chan struct{}, 1)}
	watch := func(resource string, inf cache.SharedIndexInformer) cache.GenericLister {
		if err := inf.SetTransform(leanTransform(node)); err != nil {
			panic(err) // only after the informer started: never here
		}
		inf.AddEventHandler(s.handler(resource))
		return cache.NewGenericLister(inf.GetIndexer(), schema.GroupResource{Resource: resource})
	}
	// The stores are read by key only (Get, never a namespace's List):
	// informers without the factory's namespace index, which holds every
	// key a second time (35 bytes per object: BenchmarkLeanPods).
	informer := func(obj runtime.Object, newInformer func(kubernetes.Interface, time.Duration, cache.Indexers) cache.SharedIndexInformer) cache.SharedIndexInformer {
		return s.core.InformerFor(obj, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
			return newInformer(c, resync, cache.Indexers{})
		})
	}
	allNamespaces := func(newInformer func(kubernetes.Interface, string, time.Duration, cache.Indexers) cache.SharedIndexInformer) func(kubernetes.Interface, time.Duration, cache.Indexers) cache.SharedIndexInformer {
		return func(c kubernetes.Interface, resync time.Duration, ix cache.Indexers) cache.SharedIndexInformer {
			return newInformer(c, metav1.NamespaceAll, resync, ix)
		}
	}
	s.listers = coreListers{
		pods:            watch("pods", informer(&corev1.Pod{}, allNamespaces(coreinformers.NewPodInformer))),
		namespaces:      watch("namespaces", informer(&corev1.Namespace{}, coreinformers.NewNamespaceInformer)),
		nodes:           watch("nodes", informer(&corev1.Node{}, coreinformers.NewNodeInformer)),
		services:        watch("services", informer(&corev1.Service{}, allNamespaces(coreinformers.NewServiceInformer))),
		endpointSlices:  watch("endpointslices", informer(&discoveryv1.EndpointSlice{}, allNamespaces(discoveryinformers.NewEndpointSliceInformer))),
		networkPolicies: watch("networkpolicies", informer(&networkingv1.NetworkPolicy{}, allNamespaces(networkinginformers.NewNetworkPolicyInformer))),
	}
	s.watchServiceCIDRs = func() cache.GenericLister {
		return watch("servicecidrs", informer(&networkingv1.ServiceCIDR{}, networkinginformers.NewServiceCIDRInformer))
	}
	s.crds = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, metav1.NamespaceAll, nil)
	s.crds.ForResource(gvrCRD).Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.crdChanged(obj) },
		UpdateFunc: func(_, obj any) { s.crdChanged(obj) },
		DeleteFunc: func(obj any) { s.crdChanged(obj) },
	})
	return s
}

func (s *sources) handler(resource string) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.onChange(resource, obj) },
		UpdateFunc: func(old, cur any) {
			if !sameLean(old, cur) {
				s.onChange(resource, old, cur)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			s.onChange(resource, obj)
		},
	}
}

// crdChanged asks for a new discovery when a policy CRD changes.
func (s *sources) crdChanged(obj any) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		if group, _, _ := unstructured.NestedString(u.Object, "spec", "group"); group != cluster.GVRAdminPolicy.Group {
			return
		}
	}
	select {
	case s.rediscover <- struct{}{}:
	default:
	}
}

// start runs the informers and waits for their caches; the CRD watch may
// be forbidden or absent, in which case discovery is re-checked
// periodically instead.
func (s *sources) start(ctx context.Context) error {
	switch err := s.serviceCIDRsListable(ctx); {
	case err == nil:
		s.listers.serviceCIDRs = s.watchServiceCIDRs()
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		s.log.Warn("not watching ServiceCIDRs: connections to unallocated ClusterIPs are dropped only inside --service-cidr", "err", err)
	default:
		return err // ctx ended
	}
	s.core.Start(ctx.Done())
	for typ, ok := range s.core.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("the %v cache did not sync", typ)
		}
	}
	s.crds.Start(ctx.Done())
	if err := s.discoverPolicies(ctx); err != nil {
		return err
	}
	go s.rediscoverLoop(ctx)
	return nil
}

// serviceCIDRsListable checks that the agent may list ServiceCIDRs before
// it watches them: an API server older than Kubernetes 1.33 does not serve
// them (NotFound), and a role written for an older netpol does not grant
// them (Forbidden); an informer that cannot list would hold the agent's
// start forever. Other errors (the API server not reachable yet) are
// retried, as the informers retry, until ctx ends.
func (s *sources) serviceCIDRsListable(ctx context.Context) error {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		_, err := s.kube.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return err
		}
		s.log.Debug("listing ServiceCIDRs (retried)", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// rediscoverLoop re-discovers the policy APIs on every CRD event, and
// again 1, 2 and 4 s after the last one: the API server serves a new
// CRD's resources in discovery only some time after the CRD's events (it
// registers the group version once the CRD is established), so the
// discovery an event triggers may not show them yet. A minute's ticker
// covers anything else.
func (s *sources) rediscoverLoop(ctx context.Context) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	var again <-chan time.Time
	var delay time.Duration
	for {
		select {
		case <-ctx.Done():
			s.stopPolicies()
			return
		case <-s.rediscover:
			delay = time.Second
			again = time.After(delay)
		case <-again:
			again = nil
			if delay *= 2; delay <= 4*time.Second {
				again = time.After(delay)
			}
		case <-tick.C:
		}
		if err := s.discoverPolicies(ctx); err != nil {
			s.log.Warn("re-discovering the policy APIs", "err", err)
		}
	}
}

// discoverPolicies finds the served policy resources and, when they
// differ from those watched, starts informers for the new set (and waits
// for their caches) before retiring the old ones.
func (s *sources) discoverPolicies(ctx context.Context) error {
	var gvrs []schema.GroupVersionResource
	servedBy := map[string]map[string]bool{}
	served := func(gvr schema.GroupVersionResource) (bool, error) {
		gv := gvr.GroupVersion().String()
		if servedBy[gv] == nil {
			servedBy[gv] = map[string]bool{}
			list, err := s.disc.ServerResourcesForGroupVersion(gv)
			if err != nil && !isNotFound(err) {
				return false, fmt.Errorf("discovering %s: %w", gv, err)
			}
			if list != nil {
				for _, r := range list.APIResources {
					servedBy[gv][r.Name] = true
				}
			}
		}
		return servedBy[gv][gvr.Resource], nil
	}
	for _, choice := range [][]schema.GroupVersionResource{{cluster.GVRClusterPolicyV1beta1, cluster.GVRClusterPolicyV1alpha2}, {cluster.GVRAdminPolicy}, {cluster.GVRBaselinePolicy}} {
		for _, gvr := range choice {
			ok, err := served(gvr)
			if err != nil {
				return err
			}
			if ok {
				gvrs = append(gvrs, gvr)
				break
			}
		}
	}
	s.policyMu.RLock()
	same := s.policies != nil && fmt.Sprint(s.policies.gvrs) == fmt.Sprint(gvrs)
	s.policyMu.RUnlock()
	if same {
		return nil
	}
	p := &policyInformers{gvrs: gvrs, stop: make(chan struct{}),
		factory: dynamicinformer.NewFilteredDynamicSharedInformerFactory(s.dyn, 0, metav1.NamespaceAll, nil)}
	for _, gvr := range gvrs {
		inf := p.factory.ForResource(gvr).Informer()
		if err := inf.SetTransform(leanPolicy); err != nil {
			return err // only after the informer started: never here
		}
		inf.AddEventHandler(s.handler(gvr.Resource))
	}
	p.factory.Start(p.stop)
	for gvr, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			close(p.stop)
			return fmt.Errorf("the %s cache did not sync", gvr)
		}
	}
	s.log.Info("watching policy APIs", "resources", fmt.Sprint(gvrs))
	s.policyMu.Lock()
	old := s.policies
	s.policies = p
	s.policyMu.Unlock()
	if old != nil {
		close(old.stop)
	}
	s.onChange("policy-apis")
	return nil
}

func (s *sources) stopPolicies() {
	s.policyMu.Lock()
	defer s.policyMu.Unlock()
	if s.policies != nil {
		close(s.policies.stop)
		s.policies = nil
	}
}

func isNotFound(err error) bool {
	return err != nil && (meta.IsNoMatchError(err) || apierrors.IsNotFound(err))
}

// policyKinds maps the policy resources to their snapshot kinds.
var policyKinds = map[string]string{
	cluster.GVRClusterPolicyV1beta1.Resource: cluster.KindClusterPolicy,
	cluster.GVRAdminPolicy.Resource:          cluster.KindAdminPolicy,
	cluster.GVRBaselinePolicy.Resource:       cluster.KindBaselinePolicy,
}

// snapshot is a sync's input from the caches: the cluster snapshot
// without the policies (policySources gives them), without pods and
// without EndpointSlices. With withPods, Input.Pods yields the pods' thin
// copies in (namespace, name) order, each made as it is read, PodCount of
// them; the NAT table reads none. Input.EndpointSlices are the parsed
// slices the cache holds. Objects are shared with the caches and must not
// be changed.
func (s *sources) snapshot(withPods bool) (*node.Input, error) {
	in := &node.Input{Snapshot: cluster.New(), EndpointSlices: []*proxy.Slice{}}
	snap := in.Snapshot
	each := func(l cache.GenericLister, add func(any)) error {
		objs, err := l.List(labels.Everything())
		if err != nil {
			return err
		}
		for _, o := range objs {
			add(o)
		}
		return nil
	}
	err := errors.Join(
		each(s.listers.namespaces, func(o any) {
			snap.Namespaces = append(snap.Namespaces, cluster.WithNamespaceNameLabel(o.(*corev1.Namespace)))
		}),
		each(s.listers.nodes, func(o any) { snap.Nodes = append(snap.Nodes, o.(*corev1.Node)) }),
		func() error {
			if !withPods {
				return nil
			}
			var recs []*leanPod
			err := each(s.listers.pods, func(o any) { recs = append(recs, o.(*leanPod)) })
			in.Pods, in.PodCount = thinPodsInOrder(recs), len(recs)
			return err
		}(),
		each(s.listers.services, func(o any) { snap.Services = append(snap.Services, o.(*corev1.Service)) }),
		each(s.listers.endpointSlices, func(o any) { in.EndpointSlices = append(in.EndpointSlices, o.(*leanSlice).slice) }),
		func() error {
			if s.listers.serviceCIDRs == nil {
				return nil
			}
			return each(s.listers.serviceCIDRs, func(o any) { snap.ServiceCIDRs = append(snap.ServiceCIDRs, o.(*networkingv1.ServiceCIDR)) })
		}(),
	)
	if err != nil {
		return nil, err
	}
	return in, nil
}

// nodes lists the cached Nodes.
func (s *sources) nodes() ([]*corev1.Node, error) {
	objs, err := s.listers.nodes.List(labels.Everything())
	out := make([]*corev1.Node, len(objs))
	for i, o := range objs {
		out[i] = o.(*corev1.Node)
	}
	return out, err
}

// policySources are the cached policy objects for a policy.Cache, each
// identified by the cache's pointer (an update replaces it), and the
// admin and cluster policies as the API server holds them (for their
// status and Events).
func (s *sources) policySources() ([]any, map[cluster.ObjectKey]policyObject, error) {
	ids, err := s.listers.networkPolicies.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	out := make([]any, len(ids))
	for i, o := range ids {
		out[i] = o
	}
	policies := map[cluster.ObjectKey]policyObject{}
	s.policyMu.RLock()
	defer s.policyMu.RUnlock()
	if s.policies == nil {
		return out, policies, nil
	}
	for _, gvr := range s.policies.gvrs {
		// The store's own list: the dynamic lister expects unstructured
		// objects, and the store holds policyRecords (leanPolicy).
		for _, o := range s.policies.factory.ForResource(gvr).Informer().GetStore().List() {
			rec, ok := o.(*policyRecord)
			if !ok {
				return nil, nil, fmt.Errorf("the %s informer holds a %T", gvr.Resource, o)
			}
			out = append(out, rec)
			policies[cluster.ObjectKey{Kind: policyKinds[gvr.Resource], Name: rec.Name}] = policyObject{gvr: gvr, obj: rec}
		}
	}
	return out, policies, nil
}

// networkPolicyRef is what an Event about NetworkPolicy namespace/name
// names, from the informer (false: the informer does not hold it).
func (s *sources) networkPolicyRef(namespace, name string) (corev1.ObjectReference, bool) {
	o, err := s.listers.networkPolicies.ByNamespace(namespace).Get(name)
	np, ok := o.(*networkingv1.NetworkPolicy)
	if err != nil || !ok {
		return corev1.ObjectReference{}, false
	}
	return corev1.ObjectReference{Kind: cluster.KindNetworkPolicy, APIVersion: "networking.k8s.io/v1", Namespace: np.Namespace, Name: np.Name, UID: np.UID}, true
}

// loadPolicy is a snapshot holding one policy object of policySources
// alone (for policy.Cache), and the problems met converting it.
func loadPolicy(obj any) (*cluster.Snapshot, []error) {
	snap := cluster.New()
	switch o := obj.(type) {
	case *networkingv1.NetworkPolicy:
		snap.NetworkPolicies = append(snap.NetworkPolicies, o)
	case *policyRecord:
		if o.err != nil {
			return snap, []error{fmt.Errorf("%s %s: %w", o.Kind, o.Name, o.err)}
		}
		return snap, snap.AddAPIObject(o.json).Errors
	default:
		return snap, []error{fmt.Errorf("unexpected policy object %T", obj)}
	}
	return snap, nil
}

// pod returns the cached pod namespace/name, nil when there is none.
func (s *sources) pod(key string) (*corev1.Pod, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil, err
	}
	obj, err := s.listers.pods.ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return obj.(*leanPod).pod(), nil
}

// namespace returns the cached namespace, nil when there is none.
func (s *sources) namespace(name string) (*corev1.Namespace, error) {
	obj, err := s.listers.namespaces.Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return obj.(*corev1.Namespace), nil
}
