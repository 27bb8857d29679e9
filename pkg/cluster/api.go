package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

// APIOptions choose the cluster LoadFromAPI reads.
type APIOptions struct {
	// Kubeconfig is an explicit kubeconfig file; empty follows the usual
	// rules (KUBECONFIG, ~/.kube/config, in-cluster).
	Kubeconfig string
	// Context overrides the kubeconfig's current context.
	Context string
}

// Group and versions of the policy APIs read from the API server.
const (
	policyGroup      = "policy.networking.k8s.io"
	gvPolicyV1beta1  = policyGroup + "/v1beta1"
	gvPolicyV1alpha2 = policyGroup + "/v1alpha2"
	gvPolicyV1alpha1 = policyGroup + "/v1alpha1"

	resourceCNP  = "clusternetworkpolicies"
	resourceANP  = "adminnetworkpolicies"
	resourceBANP = "baselineadminnetworkpolicies"
)

// The policy API resources netpol reads, for dynamic clients and
// informers: ClusterNetworkPolicy v1beta1 (else v1alpha2),
// AdminNetworkPolicy and BaselineAdminNetworkPolicy v1alpha1.
var (
	GVRClusterPolicyV1beta1  = schema.GroupVersionResource{Group: policyGroup, Version: "v1beta1", Resource: resourceCNP}
	GVRClusterPolicyV1alpha2 = schema.GroupVersionResource{Group: policyGroup, Version: "v1alpha2", Resource: resourceCNP}
	GVRAdminPolicy           = schema.GroupVersionResource{Group: policyGroup, Version: "v1alpha1", Resource: resourceANP}
	GVRBaselinePolicy        = schema.GroupVersionResource{Group: policyGroup, Version: "v1alpha1", Resource: resourceBANP}
)

// LoadFromAPI reads a snapshot from the API server that opts (and the usual
// kubeconfig rules) name.
func LoadFromAPI(ctx context.Context, opts APIOptions) (*Snapshot, *Report, error) {
	cfg, err := RESTConfig(opts)
	if err != nil {
		return nil, nil, err
	}
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " netpol"
	// A handful of list calls: no need to throttle them as a controller.
	cfg.QPS, cfg.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}
	policies, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("network-policy-api client for %s: %w", cfg.Host, err)
	}
	snap, report, err := LoadFromClients(ctx, kube, policies, kube.Discovery())
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", cfg.Host, err)
	}
	return snap, report, nil
}

// RESTConfig is the client configuration opts (and the usual kubeconfig
// rules) name.
func RESTConfig(opts APIOptions) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = opts.Kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: opts.Context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return rest.CopyConfig(cfg), nil
}

// LoadFromClients reads a snapshot through the given clients. Core kinds
// must be listable; the policy.networking.k8s.io kinds are read only where
// discovery says they are served (ClusterNetworkPolicy v1beta1, else
// v1alpha2; AdminNetworkPolicy and BaselineAdminNetworkPolicy v1alpha1), and
// a Report note says which were not found.
func LoadFromClients(ctx context.Context, kube kubernetes.Interface, policies versioned.Interface, disc discovery.DiscoveryInterface) (*Snapshot, *Report, error) {
	s := New()
	report := newReport()
	all := metav1.ListOptions{}

	nsList, err := kube.CoreV1().Namespaces().List(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("listing namespaces: %w", err)
	}
	for i := range nsList.Items {
		o := WithNamespaceNameLabel(&nsList.Items[i])
		s.Namespaces = append(s.Namespaces, o)
		s.recordLive(KindNamespace, "", o.Name, "v1")
	}

	nodes, err := kube.CoreV1().Nodes().List(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("listing nodes: %w", err)
	}
	for i := range nodes.Items {
		o := &nodes.Items[i]
		s.Nodes = append(s.Nodes, o)
		s.recordLive(KindNode, "", o.Name, "v1")
	}

	pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("listing pods: %w", err)
	}
	for i := range pods.Items {
		o := &pods.Items[i]
		s.Pods = append(s.Pods, o)
		s.recordLive(KindPod, o.Namespace, o.Name, "v1")
	}

	services, err := kube.CoreV1().Services(metav1.NamespaceAll).List(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("listing services: %w", err)
	}
	for i := range services.Items {
		o := &services.Items[i]
		s.Services = append(s.Services, o)
		s.recordLive(KindService, o.Namespace, o.Name, "v1")
	}

	slices, err := kube.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("listing endpointslices: %w", err)
	}
	for i := range slices.Items {
		o := &slices.Items[i]
		s.EndpointSlices = append(s.EndpointSlices, o)
		s.recordLive(KindEndpointSlice, o.Namespace, o.Name, "discovery.k8s.io/v1")
	}

	nps, err := kube.NetworkingV1().NetworkPolicies(metav1.NamespaceAll).List(ctx, all)
	if err != nil {
		return nil, nil, fmt.Errorf("listing networkpolicies: %w", err)
	}
	for i := range nps.Items {
		o := &nps.Items[i]
		s.NetworkPolicies = append(s.NetworkPolicies, o)
		s.recordLive(KindNetworkPolicy, o.Namespace, o.Name, "networking.k8s.io/v1")
	}

	// ServiceCIDR is GA since Kubernetes 1.33: an older API server has
	// none, and a role made for older netpol may not list them.
	cidrs, err := kube.NetworkingV1().ServiceCIDRs().List(ctx, all)
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		report.Notes = append(report.Notes, fmt.Sprintf("no ServiceCIDR read (networking.k8s.io/v1 servicecidrs: %v): connections to unallocated ClusterIPs are not dropped", err))
	case err != nil:
		return nil, nil, fmt.Errorf("listing servicecidrs: %w", err)
	default:
		for i := range cidrs.Items {
			o := &cidrs.Items[i]
			s.ServiceCIDRs = append(s.ServiceCIDRs, o)
			s.recordLive(KindServiceCIDR, "", o.Name, "networking.k8s.io/v1")
		}
	}

	if err := s.loadAdminPolicies(ctx, policies, disc, report); err != nil {
		return nil, nil, err
	}
	return s, report, nil
}

func (s *Snapshot) recordLive(kind, namespace, name, apiVersion string) {
	s.Origin[ObjectKey{Kind: kind, Namespace: namespace, Name: name}] = Source{APIVersion: apiVersion}
}

// loadAdminPolicies reads the policy.networking.k8s.io kinds that the API
// server serves. Objects go through the same decoder as files, so fields
// that a newer CRD has and netpol's API structs lack are recorded in
// UnknownFields (where pkg/policy fails them closed) instead of being
// dropped silently: with a real client the list is read as raw JSON; a
// client without a REST client (the fake clientsets) is read through its
// typed List, which cannot carry unknown fields.
func (s *Snapshot) loadAdminPolicies(ctx context.Context, policies versioned.Interface, disc discovery.DiscoveryInterface, report *Report) error {
	dc := discovery.ToDiscoveryInterfaceWithContext(disc)
	served := func(gv, resource string) (bool, error) {
		list, err := dc.ServerResourcesForGroupVersionWithContext(ctx, gv)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("discovering %s: %w", gv, err)
		}
		for _, r := range list.APIResources {
			if r.Name == resource {
				return true, nil
			}
		}
		return false, nil
	}

	// ClusterNetworkPolicy: v1beta1, else v1alpha2 (same schema).
	v1beta1, err := served(gvPolicyV1beta1, resourceCNP)
	if err != nil {
		return err
	}
	switch {
	case v1beta1:
		err = s.listPolicies(ctx, policies.PolicyV1beta1().RESTClient(), gvPolicyV1beta1, resourceCNP, KindClusterPolicy, report,
			func() (any, error) {
				return policies.PolicyV1beta1().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
			})
	default:
		v1alpha2, serr := served(gvPolicyV1alpha2, resourceCNP)
		if serr != nil {
			return serr
		}
		if !v1alpha2 {
			report.Notes = append(report.Notes, fmt.Sprintf("the API server serves no ClusterNetworkPolicy (%s %s or %s): none loaded",
				resourceCNP, gvPolicyV1beta1, gvPolicyV1alpha2))
			break
		}
		report.Notes = append(report.Notes, fmt.Sprintf("ClusterNetworkPolicy read from %s (%s is not served)", gvPolicyV1alpha2, gvPolicyV1beta1))
		err = s.listPolicies(ctx, policies.PolicyV1alpha2().RESTClient(), gvPolicyV1alpha2, resourceCNP, KindClusterPolicy, report,
			func() (any, error) {
				return policies.PolicyV1alpha2().ClusterNetworkPolicies().List(ctx, metav1.ListOptions{})
			})
	}
	if err != nil {
		return err
	}

	for _, k := range []struct {
		resource, kind string
		list           func() (any, error)
	}{
		{resourceANP, KindAdminPolicy, func() (any, error) {
			return policies.PolicyV1alpha1().AdminNetworkPolicies().List(ctx, metav1.ListOptions{})
		}},
		{resourceBANP, KindBaselinePolicy, func() (any, error) {
			return policies.PolicyV1alpha1().BaselineAdminNetworkPolicies().List(ctx, metav1.ListOptions{})
		}},
	} {
		ok, err := served(gvPolicyV1alpha1, k.resource)
		if err != nil {
			return err
		}
		if !ok {
			report.Notes = append(report.Notes, fmt.Sprintf("the API server serves no %s (%s %s): none loaded", k.kind, k.resource, gvPolicyV1alpha1))
			continue
		}
		if err := s.listPolicies(ctx, policies.PolicyV1alpha1().RESTClient(), gvPolicyV1alpha1, k.resource, k.kind, report, k.list); err != nil {
			return err
		}
	}
	return nil
}

// listPolicies lists one policy resource and adds every item through the
// file decoder (addObject). rc, when it is a usable REST client, reads the
// raw JSON; otherwise typedList's result is marshalled back to JSON.
func (s *Snapshot) listPolicies(ctx context.Context, rc rest.Interface, apiVersion, resource, kind string, report *Report, typedList func() (any, error)) error {
	var data []byte
	var err error
	if usableREST(rc) {
		data, err = rc.Get().Resource(resource).DoRaw(ctx)
	} else {
		var list any
		if list, err = typedList(); err == nil {
			data, err = json.Marshal(list)
		}
	}
	if err != nil {
		return fmt.Errorf("listing %s.%s: %w", resource, apiVersion, err)
	}
	var items struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &items); err != nil {
		return fmt.Errorf("listing %s.%s: decoding the list: %w", resource, apiVersion, err)
	}
	for _, item := range items.Items {
		item, err := withTypeMeta(item, apiVersion, kind)
		if err != nil {
			report.Errors = append(report.Errors, fmt.Errorf("api server: %s %s: %w", apiVersion, kind, err))
			continue
		}
		s.addObject(item, Source{}, false, report)
	}
	return nil
}

// withTypeMeta sets apiVersion and kind on a list item that lacks them
// (typed lists drop them; the API server's CRD lists carry them).
func withTypeMeta(item []byte, apiVersion, kind string) ([]byte, error) {
	var head metav1.TypeMeta
	if err := json.Unmarshal(item, &head); err != nil {
		return nil, err
	}
	if head.APIVersion == apiVersion && head.Kind == kind {
		return item, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(item, &obj); err != nil {
		return nil, err
	}
	obj["apiVersion"], _ = json.Marshal(apiVersion)
	obj["kind"], _ = json.Marshal(kind)
	return json.Marshal(obj)
}

// usableREST tells a real REST client from the typed nil that the fake
// clientsets return.
func usableREST(rc rest.Interface) bool {
	if rc == nil {
		return false
	}
	if c, ok := rc.(*rest.RESTClient); ok && c == nil {
		return false
	}
	return true
}

// AddAPIObject adds one object read from the API server as JSON (e.g. a
// policy from an informer's cache) through the same strict decoder as
// files, so unknown fields are recorded and fail closed in pkg/policy.
func (s *Snapshot) AddAPIObject(data []byte) *Report {
	report := newReport()
	s.addObject(data, Source{}, false, report)
	return report
}

// WithNamespaceNameLabel returns ns with the kubernetes.io/metadata.name
// label the API server sets on every namespace (a copy when it lacks it;
// some fakes and old servers do not set it).
func WithNamespaceNameLabel(ns *corev1.Namespace) *corev1.Namespace {
	if ns.Labels[namespaceNameLabel] == ns.Name {
		return ns
	}
	ns = ns.DeepCopy()
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[namespaceNameLabel] = ns.Name
	return ns
}
