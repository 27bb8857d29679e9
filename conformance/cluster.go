package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/remotecommand"
	"sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/netpol/netpol/conformance/generator"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/dataplane"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/l4"
	"github.com/netpol/netpol/pkg/policy"
	"github.com/netpol/netpol/pkg/probe"
)

// DefaultImage is the probe pods' image: netpol's own (deploy/'s), whose
// `netpol probe serve|dial` are the servers and the client.
const DefaultImage = "netpol.local/netpol:dev"

// ClusterOptions configure a conformance run on a live cluster.
type ClusterOptions struct {
	// Config reaches the cluster (required).
	Config *rest.Config
	// Image runs `netpol probe serve` and `netpol probe dial`
	// (default DefaultImage); PullPolicy is its pull policy (default
	// IfNotPresent).
	Image      string
	PullPolicy corev1.PullPolicy
	// Prefix starts the run's namespaces: PREFIX-RUN-x, -y, -z
	// (default "netpol-conf").
	Prefix string
	// Settle bounds how long a step's cells may take to agree with the
	// evaluator after its objects are written (default 10s): the data
	// plane is re-probed until they do; what still differs then is a
	// mismatch. Each step reports how long it took.
	Settle time.Duration
	// Timeout bounds one probe attempt (default 500ms); a failed probe is
	// tried once more with RetryTimeout (default 2 x Timeout).
	Timeout, RetryTimeout time.Duration
	// Ready bounds the wait for the probe pods (default 3m).
	Ready time.Duration
	// Probes are the ports (default generator.Probes(); SCTP is dropped,
	// with a note, where the pods cannot make SCTP sockets).
	Probes []l4.Port
	// NoHostNetwork: make no host-network pod h/h (it serves the probe
	// ports on node-1's own addresses); the cases involving it are left
	// out.
	NoHostNetwork bool
	// CaseDone is called after each case (progress).
	CaseDone func(CaseResult)
	// Logf, when set, is told what the runner is doing.
	Logf func(format string, args ...any)
}

func (o *ClusterOptions) defaults() {
	if o.Image == "" {
		o.Image = DefaultImage
	}
	if o.PullPolicy == "" {
		o.PullPolicy = corev1.PullIfNotPresent
	}
	if o.Prefix == "" {
		o.Prefix = "netpol-conf"
	}
	if o.Settle == 0 {
		o.Settle = 10 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 500 * time.Millisecond
	}
	if o.RetryTimeout == 0 {
		o.RetryTimeout = 2 * o.Timeout
	}
	if o.Ready == 0 {
		o.Ready = 3 * time.Minute
	}
	if o.Probes == nil {
		o.Probes = generator.Probes()
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// firstProbeAfter is how long after a step's writes its first probe round
// starts (counted in the settle time).
const firstProbeAfter = 500 * time.Millisecond

// fieldManager owns what a run writes.
const fieldManager = "netpol-conformance"

// RunCluster runs the cases on the cluster opts.Config reaches: it makes
// the base's namespaces (PREFIX-RUN-x, -y, -z and -h, labelled with
// generator.RunLabel), its nine probe pods and the host-network pod h/h
// on the cluster's nodes, labels the nodes with the base's rack (a label
// of the run's own, when node-1 and node-2 are two nodes), rewrites each
// case for them (generator.ForCluster; cases the cluster cannot express
// are left out, counted in the notes), writes each step's objects (pods
// added, moved and removed too), probes every pod pair on every port from
// inside the pods (one exec per source pod, dialing every target at
// once), and compares with the evaluator fed the live objects. Everything
// it made is deleted on every way out, a cancelled ctx (Ctrl-C) included;
// the report so far is returned with ctx's error.
func RunCluster(ctx context.Context, cases []generator.Case, opts ClusterOptions) (_ *Report, err error) {
	start := time.Now()
	opts.defaults()
	r, err := newClusterRun(opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := r.cleanup(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	rep := &Report{Runner: "cluster", Cases: []CaseResult{}}
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	rep.Notes = append(rep.Notes, r.notes...)
	r.notes = nil

	// The base, before any case: nothing of the run's own may differ.
	if res := r.runCase(ctx, generator.Case{Name: "base", Tags: []string{"base"}, Steps: []generator.Step{{Name: "the base, no policy of the run's"}}}); !res.Passed {
		return nil, fmt.Errorf("the base does not agree with the evaluator before any case: %s", caseProblem(res))
	}

	skipped := map[string]int{}
	runCases(ctx, rep, cases, r.skippedPerStep, opts.CaseDone, func(c generator.Case) (CaseResult, int, bool) {
		tc, why := r.forCluster(c)
		if why != "" {
			skipped[why]++
			return CaseResult{}, 0, false
		}
		res := r.runCase(ctx, tc)
		res.Name, res.Tags = c.Name, c.Tags
		return res, len(tc.Steps), true
	})
	for _, why := range slices.Sorted(maps.Keys(skipped)) {
		rep.Notes = append(rep.Notes, fmt.Sprintf("%d cases left out: %s", skipped[why], why))
	}
	rep.Notes = append(rep.Notes, r.notes...)
	if len(r.settles) > 0 {
		s := slices.Clone(r.settles)
		slices.Sort(s)
		rep.Notes = append(rep.Notes, fmt.Sprintf("settle time (objects written to every cell agreeing) over %d steps: p50 %v, max %v (bound %v)",
			len(s), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), opts.Settle))
	}
	return finish(ctx, rep, start)
}

// caseProblem says what went wrong in a failed case.
func caseProblem(res CaseResult) string {
	if res.Error != "" {
		return res.Error
	}
	var cells []string
	for _, st := range res.Steps {
		for _, m := range st.Mismatches {
			cells = append(cells, fmt.Sprintf("%s -> %s %s/%d expected allowed=%v, observed %s", m.From, m.To, m.Protocol, m.Port, m.Expected, m.Result))
		}
	}
	if len(cells) > 5 {
		cells = append(cells[:5], fmt.Sprintf("and %d more", len(cells)-5))
	}
	return strings.Join(cells, "; ")
}

// clusterRun is one run's state.
type clusterRun struct {
	opts     ClusterOptions
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	policies versioned.Interface
	disc     discovery.DiscoveryInterface
	mapper   meta.RESTMapper

	run        string
	namespaces map[string]string // base (x, y, z and h) -> live
	// nodeFor maps the base's nodes to the live ones; rackLabel is the
	// label standing for the base's rack on them ("" on one node).
	nodeFor   map[string]*corev1.Node
	rackLabel string
	// present are the probe pods there now (live ns/name): the base's,
	// less those a case removed, plus those it added.
	present map[string]bool
	env     generator.ClusterEnv
	probes  []l4.Port
	// skippedPerStep counts the probes of each cell not run (SCTP).
	skippedPerStep int
	// banpTaken: a BaselineAdminNetworkPolicy "default" that is not the
	// run's exists; cases that write one are left out.
	banpTaken bool
	notes     []string
	settles   []time.Duration
	// created are the cluster-scoped policies written, for the cleanup.
	created map[objectID]bool
}

type objectID struct {
	gvr       schema.GroupVersionResource
	namespace string
	name      string
}

func newClusterRun(opts ClusterOptions) (*clusterRun, error) {
	if opts.Config == nil {
		return nil, errors.New("no cluster: ClusterOptions.Config is nil")
	}
	cfg := rest.CopyConfig(opts.Config)
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " netpol-conformance"
	cfg.QPS, cfg.Burst = 50, 100
	r := &clusterRun{opts: opts, created: map[objectID]bool{}}
	var err error
	if r.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if r.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if r.policies, err = versioned.NewForConfig(cfg); err != nil {
		return nil, err
	}
	r.disc = r.kube.Discovery()
	r.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(r.disc))
	b := make([]byte, 3)
	rand.Read(b)
	r.run = hex.EncodeToString(b)
	r.namespaces = map[string]string{}
	for _, ns := range generator.BaseNamespaces() {
		r.namespaces[ns] = fmt.Sprintf("%s-%s-%s", opts.Prefix, r.run, ns)
	}
	if !opts.NoHostNetwork {
		hp := generator.BaseHostPod()
		r.namespaces[hp.Namespace] = fmt.Sprintf("%s-%s-%s", opts.Prefix, r.run, hp.Namespace)
	}
	r.present = map[string]bool{}
	r.opts.Config = cfg
	return r, nil
}

// setUp makes the namespaces and pods, waits for them, and learns where
// the cluster put them.
func (r *clusterRun) setUp(ctx context.Context) error {
	nodes, err := r.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	var ready []corev1.Node
	for _, n := range nodes.Items {
		if nodeReady(&n) && !n.Spec.Unschedulable {
			ready = append(ready, n)
		}
	}
	if len(ready) == 0 {
		return errors.New("the cluster has no Ready, schedulable node")
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].Name < ready[j].Name })
	r.nodeFor = map[string]*corev1.Node{}
	for i, base := range generator.BaseNodes() {
		r.nodeFor[base] = &ready[i%len(ready)]
	}
	if len(ready) == 1 {
		r.notes = append(r.notes, fmt.Sprintf("one node (%s): the base's two nodes are the same node, so every probe stays on it", ready[0].Name))
	} else {
		// The base's rack label, under a name of the run's own: nothing
		// else in the cluster selects it.
		r.rackLabel = "netpol.io/rack-" + r.run
		for _, base := range generator.BaseNodes() {
			if err := r.setNodeRack(ctx, r.nodeFor[base].Name, generator.BaseNodeRack(base)); err != nil {
				return err
			}
		}
	}

	if taken, err := r.banpExists(ctx); err != nil {
		return err
	} else if taken {
		r.banpTaken = true
		r.notes = append(r.notes, "a BaselineAdminNetworkPolicy \"default\" exists: cases that write one are left out")
	}

	base := r.basePods()
	r.opts.Logf("conformance: creating namespaces %s-%s-{%s} and %d probe pods (image %s)", r.opts.Prefix, r.run, strings.Join(slices.Sorted(maps.Keys(r.namespaces)), ","), len(base), r.opts.Image)
	for _, b := range slices.Sorted(maps.Keys(r.namespaces)) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.namespaces[b], Labels: r.namespaceLabels(b, generator.BaseNamespaceLabels(b))}}
		if _, err := r.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
		}
	}
	waitStart := time.Now()
	if err := r.createPods(ctx, base...); err != nil {
		return err
	}
	r.opts.Logf("conformance: probe pods ready after %v", time.Since(waitStart).Round(time.Millisecond))

	env := generator.ClusterEnv{Run: r.run, Namespaces: r.namespaces, PodIPs: map[string]netip.Addr{},
		NodeIPs: map[string]netip.Addr{}, NodePodCIDRs: map[string]netip.Prefix{},
		NodeNames: map[string]string{}, NodeHostnames: map[string]string{}, RackLabel: r.rackLabel}
	var podCIDRs, nodeIPs []netip.Prefix
	for _, base := range generator.BaseNodes() {
		n := r.nodeFor[base]
		env.NodeNames[base] = n.Name
		env.NodeHostnames[base] = n.Labels[corev1.LabelHostname]
		if env.NodeHostnames[base] == "" {
			env.NodeHostnames[base] = n.Name
		}
		ip, ok := nodeAddress(n)
		if !ok {
			return fmt.Errorf("node %s has no InternalIP", n.Name)
		}
		cidr, err := netip.ParsePrefix(n.Spec.PodCIDR)
		if err != nil {
			return fmt.Errorf("node %s: spec.podCIDR %q: %v (the runner maps the base's pod CIDRs onto the nodes')", n.Name, n.Spec.PodCIDR, err)
		}
		env.NodeIPs[base], env.NodePodCIDRs[base] = ip, cidr.Masked()
		podCIDRs = append(podCIDRs, cidr.Masked())
		nodeIPs = append(nodeIPs, netip.PrefixFrom(ip, ip.BitLen()))
	}
	env.PodsCIDR = around(podCIDRs, 0)
	env.NodesCIDR = around(nodeIPs, 24)
	r.env = env
	if err := r.learnAddresses(ctx, base); err != nil {
		return err
	}

	r.probes = r.opts.Probes
	if slices.ContainsFunc(r.probes, isSCTP) {
		if ok, why, err := r.podsHaveSCTP(ctx); err != nil {
			return err
		} else if !ok {
			r.probes = slices.DeleteFunc(slices.Clone(r.probes), isSCTP)
			r.notes = append(r.notes, "SCTP probes skipped: "+why)
		}
	}
	r.skippedPerStep = len(r.opts.Probes) - len(r.probes)
	return nil
}

func (r *clusterRun) namespaceLabels(base string, labels map[string]string) map[string]string {
	out := map[string]string{generator.RunLabel: r.run}
	for k, v := range labels {
		out[k] = v
	}
	out["kubernetes.io/metadata.name"] = r.namespaces[base]
	return out
}

// basePods are the probe pods of the base: the nine, and h/h unless
// NoHostNetwork.
func (r *clusterRun) basePods() []generator.BasePod {
	pods := generator.BasePods()
	if hp := generator.BaseHostPod(); r.namespaces[hp.Namespace] != "" {
		pods = append(pods, hp)
	}
	return pods
}

// basePod is the base's pod that live pod ns/name stands for.
func (r *clusterRun) basePod(ns, name string) (generator.BasePod, bool) {
	for _, bp := range r.basePods() {
		if r.namespaces[bp.Namespace] == ns && bp.Name == name {
			return bp, true
		}
	}
	return generator.BasePod{}, false
}

// probePod is a probe pod: ns and name live, on live node, with labels;
// host-network for the base's h/h.
func (r *clusterRun) probePod(ns, name, node string, labels map[string]string) *corev1.Pod {
	bp, _ := r.basePod(ns, name)
	hostNetwork := bp.HostNetwork
	var ports []corev1.ContainerPort
	var serve []string
	for _, p := range generator.Probes() {
		port := corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", p.Port, strings.ToLower(string(p.Protocol))), ContainerPort: p.Port, Protocol: p.Protocol}
		if hostNetwork {
			port.HostPort = p.Port
		}
		ports = append(ports, port)
		serve = append(serve, fmt.Sprintf("%s/%d", strings.ToLower(string(p.Protocol)), p.Port))
	}
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			HostNetwork:                   hostNetwork,
			TerminationGracePeriodSeconds: &grace,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:            "probe",
				Image:           r.opts.Image,
				ImagePullPolicy: r.opts.PullPolicy,
				Args:            []string{"probe", "serve", "--owner", ns + "/" + name, "--ports", strings.Join(serve, ",")},
				Ports:           ports,
			}},
		},
	}
}

// createPods creates probe pods (ns/name live) and waits for them; each is
// then present.
func (r *clusterRun) createPods(ctx context.Context, pods ...generator.BasePod) error {
	for _, p := range pods {
		pod := r.probePod(r.namespaces[p.Namespace], p.Name, r.nodeFor[p.Node].Name, p.Labels)
		if err := r.createPod(ctx, pod); err != nil {
			return err
		}
	}
	return r.waitForPods(ctx, pods)
}

func (r *clusterRun) createPod(ctx context.Context, pod *corev1.Pod) error {
	if _, err := r.kube.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
		hint := ""
		if pod.Spec.HostNetwork {
			hint = " (--no-host-network leaves the host-network pod out)"
		}
		return fmt.Errorf("creating pod %s/%s: %w%s", pod.Namespace, pod.Name, err, hint)
	}
	r.present[pod.Namespace+"/"+pod.Name] = true
	return nil
}

// waitForPods waits until probe pods (base ns/name) run, are ready and
// have an address.
func (r *clusterRun) waitForPods(ctx context.Context, pods []generator.BasePod) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Ready)
	defer cancel()
	for {
		last := ""
		for _, bp := range pods {
			pod, err := r.kube.CoreV1().Pods(r.namespaces[bp.Namespace]).Get(ctx, bp.Name, metav1.GetOptions{})
			if err != nil {
				last = err.Error()
				break
			}
			if _, err := netip.ParseAddr(pod.Status.PodIP); pod.Status.Phase != corev1.PodRunning || !podReady(pod) || err != nil {
				last = fmt.Sprintf("pod %s/%s is %s (ready %v, address %q)", pod.Namespace, pod.Name, pod.Status.Phase, podReady(pod), pod.Status.PodIP)
				if bp.HostNetwork {
					last += " (the host-network pod serves ports 80 and 81 on the node's own addresses: --no-host-network leaves it out)"
				}
				break
			}
		}
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("probe pods not ready after %v: %s", r.opts.Ready, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// learnAddresses puts the base pods' live addresses in the environment
// the cases are rewritten for (after setUp, and after a case re-created
// pods of the base).
func (r *clusterRun) learnAddresses(ctx context.Context, pods []generator.BasePod) error {
	for _, bp := range pods {
		pod, err := r.kube.CoreV1().Pods(r.namespaces[bp.Namespace]).Get(ctx, bp.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil {
			return fmt.Errorf("pod %s/%s: address %q: %v", pod.Namespace, pod.Name, pod.Status.PodIP, err)
		}
		r.env.PodIPs[bp.Namespace+"/"+bp.Name] = ip
	}
	return nil
}

// deletePod deletes a probe pod and waits for it to be gone (a pod of the
// same name may follow on another node); it is then no longer present.
func (r *clusterRun) deletePod(ctx context.Context, ns, name string) error {
	if err := r.kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting pod %s/%s: %w", ns, name, err)
	}
	delete(r.present, ns+"/"+name)
	ctx, cancel := context.WithTimeout(ctx, r.opts.Ready)
	defer cancel()
	for {
		_, err := r.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s/%s still there after %v", ns, name, r.opts.Ready)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setNodeRack sets (rack != "") or removes the run's rack label on a node.
func (r *clusterRun) setNodeRack(ctx context.Context, node, rack string) error {
	var value any
	if rack != "" {
		value = rack
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{r.rackLabel: value}}})
	if err != nil {
		return err
	}
	if _, err := r.kube.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, data, metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("labelling node %s %s=%s: %w", node, r.rackLabel, rack, err)
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeAddress(n *corev1.Node) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
				return ip, true
			}
		}
	}
	return netip.Addr{}, false
}

// around is the smallest prefix holding every prefix of ps and strictly
// more than any of them (ipBlock except must be a strict subset), no
// longer than maxBits when that is set.
func around(ps []netip.Prefix, maxBits int) netip.Prefix {
	bits := ps[0].Bits()
	for _, p := range ps {
		bits = min(bits, p.Bits())
	}
	bits--
	if maxBits > 0 {
		bits = min(bits, maxBits)
	}
	for ; bits > 0; bits-- {
		cover, _ := ps[0].Addr().Prefix(bits)
		if !slices.ContainsFunc(ps, func(p netip.Prefix) bool { return !cover.Contains(p.Addr()) }) {
			return cover
		}
	}
	cover, _ := ps[0].Addr().Prefix(0)
	return cover
}

// podsHaveSCTP asks the first probe pod to dial its own SCTP port.
func (r *clusterRun) podsHaveSCTP(ctx context.Context) (bool, string, error) {
	bp := generator.BasePods()[0]
	self := probe.Target{Name: r.namespaces[bp.Namespace] + "/" + bp.Name, Addr: r.env.PodIPs[bp.Namespace+"/"+bp.Name], Protocol: corev1.ProtocolSCTP, Port: 80}
	out, err := r.dial(ctx, r.namespaces[bp.Namespace], bp.Name, []probe.Target{self})
	if err != nil {
		return false, "", err
	}
	if res := out[0].Result; strings.HasPrefix(res, probe.ErrorPrefix) {
		return false, strings.TrimPrefix(res, probe.ErrorPrefix) + " (in pod " + self.Name + ")", nil
	}
	return true, "", nil
}

// dial runs `netpol probe dial` in a pod and reads its outcomes.
func (r *clusterRun) dial(ctx context.Context, ns, pod string, targets []probe.Target) ([]probe.Outcome, error) {
	cmd := []string{"/bin/netpol", "probe", "dial", "--timeout", r.opts.Timeout.String(), "--retry-timeout", r.opts.RetryTimeout.String()}
	for _, t := range targets {
		cmd = append(cmd, t.String())
	}
	stdout, err := r.exec(ctx, ns, pod, cmd)
	if err != nil {
		return nil, err
	}
	var out []probe.Outcome
	if err := json.Unmarshal(stdout, &out); err != nil {
		return nil, fmt.Errorf("pod %s/%s: reading netpol probe dial's output: %v: %q", ns, pod, err, stdout)
	}
	if len(out) != len(targets) {
		return nil, fmt.Errorf("pod %s/%s: %d outcomes for %d targets", ns, pod, len(out), len(targets))
	}
	return out, nil
}

// exec runs cmd in the pod's probe container (WebSocket, else SPDY, as
// kubectl does) and returns its stdout.
func (r *clusterRun) exec(ctx context.Context, ns, pod string, cmd []string) ([]byte, error) {
	req := r.kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "probe", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(r.opts.Config, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	ws, err := remotecommand.NewWebSocketExecutor(r.opts.Config, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	if err := ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil {
		return nil, fmt.Errorf("exec in pod %s/%s: %v: %s", ns, pod, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func (r *clusterRun) banpExists(ctx context.Context) (bool, error) {
	if !r.served(cluster.GVRBaselinePolicy) {
		return false, nil
	}
	obj, err := r.dyn.Resource(cluster.GVRBaselinePolicy).Get(ctx, "default", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading the BaselineAdminNetworkPolicy: %w", err)
	}
	return obj.GetLabels()[generator.RunLabel] == "", nil
}

// served reports whether the API server serves gvr.
func (r *clusterRun) served(gvr schema.GroupVersionResource) bool {
	list, err := r.disc.ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err != nil {
		return false
	}
	return slices.ContainsFunc(list.APIResources, func(res metav1.APIResource) bool { return res.Name == gvr.Resource })
}

// forCluster rewrites c for the run, or says why it cannot run here.
func (r *clusterRun) forCluster(c generator.Case) (generator.Case, string) {
	tc, err := generator.ForCluster(c, r.env)
	if err != nil {
		return generator.Case{}, firstClause(err.Error())
	}
	for _, st := range tc.Steps {
		docs, err := splitObjects(st.Apply)
		if err != nil {
			return generator.Case{}, err.Error()
		}
		for _, d := range docs {
			if d.GetKind() == "BaselineAdminNetworkPolicy" && r.banpTaken {
				return generator.Case{}, "writes a BaselineAdminNetworkPolicy (the cluster has its own)"
			}
			if _, err := r.mapper.RESTMapping(d.GroupVersionKind().GroupKind(), d.GroupVersionKind().Version); err != nil {
				return generator.Case{}, fmt.Sprintf("%s is not served", d.GetAPIVersion()+" "+d.GetKind())
			}
		}
	}
	return tc, ""
}

// firstClause shortens a skip reason to what the cases share (no step or
// document numbers), so that reasons can be counted.
func firstClause(s string) string {
	if i := strings.LastIndex(s, "): "); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.LastIndex(s, "step "); i == 0 {
		if j := strings.Index(s, ": "); j >= 0 {
			s = s[j+2:]
		}
	}
	if strings.HasPrefix(s, "CIDR ") {
		return "names a CIDR that has no counterpart in the cluster"
	}
	return s
}

// splitObjects reads a YAML stream into objects.
func splitObjects(stream string) ([]*unstructured.Unstructured, error) {
	docs, err := generator.SplitDocs(stream)
	if err != nil {
		return nil, err
	}
	out := make([]*unstructured.Unstructured, len(docs))
	for i, d := range docs {
		out[i] = &unstructured.Unstructured{Object: d}
	}
	return out, nil
}

// changes are what a case changed in the cluster, for restore to undo.
type changes struct {
	written    map[objectID]bool // policies
	relabelled map[string]bool   // "Pod/ns/name", "Namespace//name", "Node//name"
	added      map[string]bool   // pods made (live ns/name)
	removed    map[string]bool   // pods of the base deleted (live ns/name)
}

// runCase runs the steps of a case rewritten for the cluster, then puts the
// base back (policies deleted, pods and labels restored).
func (r *clusterRun) runCase(ctx context.Context, c generator.Case) (res CaseResult) {
	start := time.Now()
	res = CaseResult{Name: c.Name, Tags: c.Tags, Passed: true, Steps: []StepResult{}}
	ch := changes{written: map[objectID]bool{}, relabelled: map[string]bool{}, added: map[string]bool{}, removed: map[string]bool{}}
	defer func() {
		if err := r.restore(ch); err != nil {
			res.Passed = false
			res.Error = strings.TrimPrefix(res.Error+"; ", "; ") + "restoring the base: " + err.Error()
		}
		res.DurationSeconds = time.Since(start).Seconds()
	}()
	for i, st := range c.Steps {
		if err := r.write(ctx, st, ch); err != nil {
			res.Passed, res.Error = false, fmt.Sprintf("step %d: %v", i, err)
			return res
		}
		sr, err := r.step(ctx, i, st)
		if err != nil {
			res.Passed, res.Error = false, fmt.Sprintf("step %d: %v", i, err)
			return res
		}
		if len(sr.Mismatches) > 0 {
			res.Passed = false
		}
		res.Steps = append(res.Steps, sr)
	}
	return res
}

// write deletes and applies a step's objects.
func (r *clusterRun) write(ctx context.Context, st generator.Step, ch changes) error {
	for _, ref := range st.Delete {
		if ref.Kind == "Pod" {
			key := ref.Namespace + "/" + ref.Name
			if _, ok := r.basePod(ref.Namespace, ref.Name); ok && !ch.added[key] {
				ch.removed[key] = true
			}
			delete(ch.added, key)
			if err := r.deletePod(ctx, ref.Namespace, ref.Name); err != nil {
				return err
			}
			continue
		}
		mapping, err := r.mapper.RESTMapping(schema.GroupKind{Group: policyGroupOf(ref.Kind), Kind: ref.Kind})
		if err != nil {
			return fmt.Errorf("delete %s %s: %w", ref.Kind, ref.Name, err)
		}
		id := objectID{mapping.Resource, ref.Namespace, ref.Name}
		if err := r.resource(id).Delete(ctx, ref.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s/%s: %w", ref.Kind, ref.Namespace, ref.Name, err)
		}
		delete(ch.written, id)
	}
	objs, err := splitObjects(st.Apply)
	if err != nil {
		return err
	}
	var made []generator.BasePod
	for _, obj := range objs {
		key := obj.GetKind() + "/" + obj.GetNamespace() + "/" + obj.GetName()
		switch obj.GetKind() {
		case "Pod":
			if node, _, _ := unstructured.NestedString(obj.Object, "spec", "nodeName"); node != "" {
				// Added or moved: made on that node (generator.ForCluster).
				if err := r.createPod(ctx, r.probePod(obj.GetNamespace(), obj.GetName(), node, obj.GetLabels())); err != nil {
					return err
				}
				ch.added[obj.GetNamespace()+"/"+obj.GetName()] = true
				made = append(made, r.liveAsBase(obj.GetNamespace(), obj.GetName()))
				continue
			}
			fallthrough
		case "Namespace":
			if err := r.setLabels(ctx, obj.GetKind(), obj.GetNamespace(), obj.GetName(), obj.GetLabels()); err != nil {
				return err
			}
			ch.relabelled[key] = true
			continue
		case "Node":
			if err := r.setNodeRack(ctx, obj.GetName(), obj.GetLabels()[r.rackLabel]); err != nil {
				return err
			}
			ch.relabelled[key] = true
			continue
		}
		gvk := obj.GroupVersionKind()
		mapping, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk, obj.GetName(), err)
		}
		id := objectID{mapping.Resource, obj.GetNamespace(), obj.GetName()}
		if _, err := r.resource(id).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true}); err != nil {
			return fmt.Errorf("applying %s %s: %w", obj.GetKind(), strings.TrimPrefix(obj.GetNamespace()+"/"+obj.GetName(), "/"), err)
		}
		ch.written[id] = true
		if id.namespace == "" {
			r.created[id] = true
		}
	}
	return r.waitForPods(ctx, made)
}

// liveAsBase names live pod ns/name as waitForPods takes it.
func (r *clusterRun) liveAsBase(ns, name string) generator.BasePod {
	for base, live := range r.namespaces {
		if live == ns {
			return generator.BasePod{Namespace: base, Name: name}
		}
	}
	return generator.BasePod{Namespace: ns, Name: name}
}

func (r *clusterRun) resource(id objectID) dynamic.ResourceInterface {
	if id.namespace == "" {
		return r.dyn.Resource(id.gvr)
	}
	return r.dyn.Resource(id.gvr).Namespace(id.namespace)
}

func policyGroupOf(kind string) string {
	if kind == "NetworkPolicy" {
		return "networking.k8s.io"
	}
	return "policy.networking.k8s.io"
}

// setLabels makes a pod's or namespace's labels exactly labels (a merge
// patch: keys it lacks are removed), keeping the run's own.
func (r *clusterRun) setLabels(ctx context.Context, kind, ns, name string, labels map[string]string) error {
	var current map[string]string
	switch kind {
	case "Pod":
		pod, err := r.kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current = pod.Labels
	default:
		n, err := r.kube.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		current = n.Labels
	}
	patch := map[string]any{}
	for k := range current {
		if _, keep := labels[k]; !keep && k != generator.RunLabel && k != "kubernetes.io/metadata.name" {
			patch[k] = nil
		}
	}
	for k, v := range labels {
		patch[k] = v
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": patch}})
	if err != nil {
		return err
	}
	if kind == "Pod" {
		_, err = r.kube.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: fieldManager})
	} else {
		_, err = r.kube.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: fieldManager})
	}
	if err != nil {
		return fmt.Errorf("relabelling %s %s: %w", kind, strings.TrimPrefix(ns+"/"+name, "/"), err)
	}
	return nil
}

// restore deletes the case's policies and the pods it added, makes again
// the base's pods it removed (on their nodes, with new addresses), and
// puts the base's labels back. It runs on its own context: an interrupted
// case is cleaned up too.
func (r *clusterRun) restore(ch changes) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+2*r.opts.Ready)
	defer cancel()
	var errs []error
	for id := range ch.written {
		if err := r.resource(id).Delete(ctx, id.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	// Added first: a pod moved to another node has its base pod's name.
	for key := range ch.added {
		ns, name, _ := strings.Cut(key, "/")
		if err := r.deletePod(ctx, ns, name); err != nil {
			errs = append(errs, err)
		}
	}
	var again []generator.BasePod
	for key := range ch.removed {
		ns, name, _ := strings.Cut(key, "/")
		if bp, ok := r.basePod(ns, name); ok {
			again = append(again, bp)
		}
	}
	if len(again) > 0 {
		if err := r.createPods(ctx, again...); err != nil {
			errs = append(errs, err)
		} else if err := r.learnAddresses(ctx, again); err != nil {
			errs = append(errs, err)
		}
	}
	for key := range ch.relabelled {
		kind, rest, _ := strings.Cut(key, "/")
		ns, name, _ := strings.Cut(rest, "/")
		labels := map[string]string{}
		switch kind {
		case "Node":
			for base, n := range r.nodeFor {
				if n.Name == name {
					if err := r.setNodeRack(ctx, name, generator.BaseNodeRack(base)); err != nil {
						errs = append(errs, err)
					}
				}
			}
			continue
		case "Pod":
			if ch.removed[ns+"/"+name] || ch.added[ns+"/"+name] {
				continue // made again with its base labels, or gone
			}
			if bp, ok := r.basePod(ns, name); ok {
				labels = bp.Labels
			}
		default:
			for base, live := range r.namespaces {
				if live == name {
					labels = r.namespaceLabels(base, generator.BaseNamespaceLabels(base))
				}
			}
		}
		if err := r.setLabels(ctx, kind, ns, name, labels); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// step probes the cluster as it is now until every cell agrees with the
// evaluator fed the live objects, or Settle passes.
func (r *clusterRun) step(ctx context.Context, i int, st generator.Step) (StepResult, error) {
	sr := StepResult{Step: i, Name: st.Name, Apply: st.Apply, Mismatches: []Mismatch{}}
	written := time.Now()
	snap, _, err := cluster.LoadFromClients(ctx, r.kube, r.policies, r.disc)
	if err != nil {
		return sr, fmt.Errorf("reading the live objects: %w", err)
	}
	model := policy.Build(snap)
	ev := eval.New(snap, model)
	want := ev.TruthTable(eval.TruthTableOptions{Probes: r.probes, Namespaces: r.liveNamespaces()})
	if present := slices.Sorted(maps.Keys(r.present)); !slices.Equal(slices.Sorted(slices.Values(want.Pods)), present) {
		return sr, fmt.Errorf("the evaluator sees probe pods %v, want %v (skipped: %v)", want.Pods, present, want.Skipped)
	}
	var (
		got      *eval.TruthTable
		outcomes map[cellKey]probe.Outcome
		diffs    []Difference
	)
	// An agent programs a change a few hundred milliseconds after the
	// write at most; probing sooner only buys a second round.
	if d := firstProbeAfter - time.Since(written); d > 0 {
		time.Sleep(d)
	}
	for {
		got, outcomes, err = r.probeAll(ctx, snap, want)
		if err != nil {
			return sr, err
		}
		if diffs, err = Compare(want, got); err != nil {
			return sr, err
		}
		if len(diffs) == 0 || time.Since(written) >= r.opts.Settle || ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	settle := time.Since(written)
	if len(diffs) == 0 {
		r.settles = append(r.settles, settle)
	}
	sr.Expected, sr.Observed, sr.Probes = want, got, len(want.Results)
	sr.SettleSeconds = settle.Seconds()
	var dp *dataplane.Cluster
	for _, d := range diffs {
		o := outcomes[cellKey{d.From, d.To, d.Probe}]
		m := Mismatch{From: d.From, To: d.To, Protocol: d.Probe.Protocol, Port: d.Probe.Port, Expected: d.Expected, Observed: !d.Expected, Result: o.Result}
		m.Explain, m.Trace = explainCell(ev, model, snap, &dp, d)
		sr.Mismatches = append(sr.Mismatches, m)
	}
	return sr, nil
}

func (r *clusterRun) liveNamespaces() []string {
	return slices.Sorted(maps.Values(r.namespaces))
}

type cellKey struct {
	from, to string
	probe    l4.Port
}

// probeAll dials every cell of want from inside its source pod: one exec
// per source pod, all at once; the targets' addresses are snap's.
func (r *clusterRun) probeAll(ctx context.Context, snap *cluster.Snapshot, want *eval.TruthTable) (*eval.TruthTable, map[cellKey]probe.Outcome, error) {
	addr := map[string]netip.Addr{}
	for _, key := range want.Pods {
		ns, name, _ := strings.Cut(key, "/")
		if pod := snap.Pod(ns, name); pod != nil {
			addr[key], _ = netip.ParseAddr(pod.Status.PodIP)
		}
	}
	bySource := map[string][]int{}
	for i, c := range want.Results {
		bySource[c.From] = append(bySource[c.From], i)
	}
	got := &eval.TruthTable{Pods: want.Pods, Ports: want.Ports, Results: slices.Clone(want.Results), Skipped: want.Skipped}
	outcomes := make(map[cellKey]probe.Outcome, len(want.Results))
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for from, cells := range bySource {
		wg.Go(func() {
			targets := make([]probe.Target, len(cells))
			for k, i := range cells {
				c := want.Results[i]
				targets[k] = probe.Target{Name: c.To, Addr: addr[c.To], Protocol: c.Protocol, Port: c.Port}
			}
			ns, name, _ := strings.Cut(from, "/")
			out, err := r.dial(ctx, ns, name, targets)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for k, i := range cells {
				c := want.Results[i]
				got.Results[i].Allowed = out[k].Allowed
				outcomes[cellKey{c.From, c.To, l4.Port{Protocol: c.Protocol, Port: c.Port}}] = out[k]
				if strings.HasPrefix(out[k].Result, probe.ErrorPrefix) {
					errs = append(errs, fmt.Errorf("%s -> %s %s/%d: %s", c.From, c.To, c.Protocol, c.Port, out[k].Result))
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return got, outcomes, nil
}

// cleanup deletes everything the run made: its namespaces (their pods and
// NetworkPolicies with them) and its cluster-scoped policies, found by
// the run's label too. It waits for the namespaces to go, up to a minute.
func (r *clusterRun) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var errs []error
	selector := metav1.ListOptions{LabelSelector: generator.RunLabel + "=" + r.run}
	for _, gvr := range []schema.GroupVersionResource{cluster.GVRAdminPolicy, cluster.GVRBaselinePolicy, cluster.GVRClusterPolicyV1beta1, cluster.GVRClusterPolicyV1alpha2} {
		if !r.served(gvr) {
			continue
		}
		list, err := r.dyn.Resource(gvr).List(ctx, selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s: %w", gvr.Resource, err))
			continue
		}
		for _, item := range list.Items {
			r.created[objectID{gvr, "", item.GetName()}] = true
		}
	}
	for id := range r.created {
		if err := r.resource(id).Delete(ctx, id.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting %s %s: %w", id.gvr.Resource, id.name, err))
		}
	}
	if r.rackLabel != "" {
		for _, n := range r.nodeFor {
			if err := r.setNodeRack(ctx, n.Name, ""); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, ns := range r.liveNamespaces() {
		if err := r.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting namespace %s: %w", ns, err))
		}
	}
	for _, ns := range r.liveNamespaces() {
		for {
			_, err := r.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("namespace %s still there after %v (it goes on being deleted)", ns, 90*time.Second))
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	r.opts.Logf("conformance: removed namespaces %s-%s-{%s}, the run's cluster-scoped policies and node labels", r.opts.Prefix, r.run, strings.Join(slices.Sorted(maps.Keys(r.namespaces)), ","))
	return errors.Join(errs...)
}
