//go:build e2e_cluster

// Package cluster runs deploy/ on the real one-node cluster of make
// cluster-up (docs/cluster.md): kubelet and containerd run the netpol
// DaemonSet from the image make image built, real pods, no kube-proxy, and
// the test checks what the kernel does with real connections between them.
// make e2e-cluster runs it (root, under the lab lock).
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/conformance"
	"github.com/netpol/netpol/conformance/generator"
	creport "github.com/netpol/netpol/conformance/report"
	"github.com/netpol/netpol/pkg/cluster"
)

var (
	clusterDir = envOr("CLUSTER_DIR", "/tmp/netpol-cluster")
	kubeconfig = filepath.Join(clusterDir, "kubeconfig")
	kubectlBin = filepath.Join(clusterDir, "bin", "kubectl")
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// kubectl runs kubectl against the cluster and returns its stdout.
func kubectl(t testing.TB, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func mustKubectl(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := kubectl(t, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// eventually polls f every 200ms until it returns nil or d passes.
func eventually(t testing.TB, d time.Duration, what string, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	var err error
	for time.Since(start) < d {
		if err = f(); err == nil {
			return time.Since(start)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not after %s: %v", what, d, err)
	return 0
}

// probe connects from pod ns/pod to addr by exec (the probe image's client)
// and returns the answer (the serving pod's host name) or an error.
func probe(t testing.TB, ns, pod, addr string) (string, error) {
	out, err := kubectl(t, "", "-n", ns, "exec", pod, "--", "/bin/probe", "connect", addr, "1s")
	return strings.TrimSpace(out), err
}

// podPID is the host PID of a pod's (only) container, from its status's
// containerID and the node's containerd.
func podPID(t testing.TB, ns, pod string) string {
	t.Helper()
	id := strings.TrimSpace(mustKubectl(t, "", "-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].containerID}"))
	id = strings.TrimPrefix(id, "containerd://")
	ctr := filepath.Join(clusterDir, "bin", "ctr")
	sock := filepath.Join(clusterDir, "containerd", "containerd.sock")
	out, err := exec.Command(ctr, "--address", sock, "-n", "k8s.io", "tasks", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr tasks ls: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			return f[1]
		}
	}
	t.Fatalf("no containerd task %s for pod %s/%s", id, ns, pod)
	return ""
}

// probeFromHost probes from the network namespace of the process pid with
// the host's copy of the probe binary: no kubectl exec, so it works while
// the kubelet is down.
func probeFromHost(pid, addr string) error {
	return exec.Command("nsenter", "-t", pid, "-n", "../../_output/images/bin/probe", "connect", addr, "1s").Run()
}

type cell struct {
	from, to string
	allowed  bool
}

// expect polls until every cell's probe has the expected outcome.
func expect(t *testing.T, ns, what string, cells []cell) {
	t.Helper()
	took := eventually(t, 30*time.Second, what, func() error {
		var bad []string
		for _, c := range cells {
			_, err := probe(t, ns, c.from, c.to)
			if (err == nil) != c.allowed {
				bad = append(bad, fmt.Sprintf("%s -> %s: allowed=%v, want %v", c.from, c.to, err == nil, c.allowed))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%s", strings.Join(bad, "; "))
		}
		return nil
	})
	t.Logf("%s: as expected after %s", what, took.Round(time.Millisecond))
}

type podInfo struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Containers []struct {
			Image           string                      `json:"image"`
			Resources       corev1.ResourceRequirements `json:"resources"`
			SecurityContext struct {
				Privileged   *bool `json:"privileged"`
				Capabilities struct {
					Add  []string `json:"add"`
					Drop []string `json:"drop"`
				} `json:"capabilities"`
			} `json:"securityContext"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		PodIP      string `json:"podIP"`
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
		ContainerStatuses []struct {
			Image   string `json:"image"`
			ImageID string `json:"imageID"`
			Ready   bool   `json:"ready"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

func getPods(t testing.TB, ns, selector string) []podInfo {
	t.Helper()
	var list struct {
		Items []podInfo `json:"items"`
	}
	out := mustKubectl(t, "", "-n", ns, "get", "pods", "-l", selector, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// deployNetpol applies deploy/, for real, with the API server's real
// address for the agent, and waits for the DaemonSet's rollout.
func deployNetpol(t *testing.T) {
	t.Helper()
	host, port := apiServer(t)
	mustKubectl(t, "", "apply", "-k", "../../deploy/")
	cm := mustKubectl(t, "", "-n", "netpol-system", "create", "configmap", "kubernetes-services-endpoint",
		"--from-literal=KUBERNETES_SERVICE_HOST="+host, "--from-literal=KUBERNETES_SERVICE_PORT="+port,
		"--dry-run=client", "-o", "yaml")
	mustKubectl(t, cm, "apply", "-f", "-")
	mustKubectl(t, "", "-n", "netpol-system", "rollout", "status", "daemonset/netpol-agent", "--timeout=180s")
}

// serverService makes the NodePort Service name of ns over the pods
// app=server (port 8080 to their 80) and returns its ClusterIP:8080 and
// its node port.
func serverService(t *testing.T, ns, name string) (vip, nodePort string) {
	t.Helper()
	mustKubectl(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: %s}
spec:
  type: NodePort
  selector: {app: server}
  ports: [{name: http, port: 8080, targetPort: 80, protocol: TCP}]
`, name, ns), "apply", "-f", "-")
	clusterIP := strings.TrimSpace(mustKubectl(t, "", "-n", ns, "get", "service", name, "-o", "jsonpath={.spec.clusterIP}"))
	nodePort = strings.TrimSpace(mustKubectl(t, "", "-n", ns, "get", "service", name, "-o", "jsonpath={.spec.ports[0].nodePort}"))
	return clusterIP + ":8080", nodePort
}

// testNamespace makes a namespace PREFIX-N for the test, deleted at its end
// (kept when it failed and KEEP_NAMESPACE is set).
func testNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d", prefix, rand.Intn(1e6))
	mustKubectl(t, "", "create", "namespace", ns)
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("KEEP_NAMESPACE") != "" {
			return
		}
		kubectl(t, "", "delete", "namespace", ns, "--wait=false")
	})
	return ns
}

// serversFromA is the NetworkPolicy name of ns that lets the pods app=server
// accept only the pods role=a, only on TCP port 80.
func serversFromA(ns, name string) string {
	return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %s, namespace: %s}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: a}}}]
    ports: [{port: 80, protocol: TCP}]
`, name, ns)
}

// apiServer returns the kubeconfig's server host and port.
func apiServer(t testing.TB) (string, string) {
	out := mustKubectl(t, "", "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	u, err := url.Parse(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return u.Hostname(), u.Port()
}

func TestCluster(t *testing.T) {
	if _, err := os.Stat(kubeconfig); err != nil {
		t.Fatalf("no cluster (%v): run make cluster-up (make e2e-cluster does)", err)
	}
	mustKubectl(t, "", "wait", "--for=condition=Ready", "node", "--all", "--timeout=60s")
	if n := len(clusterNodes(t)); n > 1 {
		t.Skipf("%d nodes: TestCluster checks the one-node cluster of make e2e-cluster; TestMultiNode runs on this one", n)
	}
	nodeIP := strings.TrimSpace(mustKubectl(t, "", "get", "nodes", "-o", `jsonpath={.items[0].status.addresses[?(@.type=="InternalIP")].address}`))

	// No kube-proxy: netpol is the only Service proxy.
	if out, _ := exec.Command("nft", "list", "tables").Output(); strings.Contains(string(out), "kube-proxy") {
		t.Fatalf("a kube-proxy nftables table is here: %s", out)
	}
	if out, err := exec.Command("iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES").CombinedOutput(); err == nil {
		t.Fatalf("kube-proxy's iptables chain KUBE-SERVICES is here: %s", out)
	}
	if out := mustKubectl(t, "", "get", "daemonsets", "-A", "-o", "name"); strings.Contains(out, "kube-proxy") {
		t.Fatalf("a kube-proxy DaemonSet runs: %s", out)
	}

	start := time.Now()
	deployNetpol(t)
	// rollout status can answer before the DaemonSet controller has
	// counted the new pod (one run saw it 1.2 s after apply, the pod not
	// ready yet): wait for the pod itself.
	var agents []podInfo
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		agents = getPods(t, "netpol-system", "app.kubernetes.io/name=netpol")
		if len(agents) == 1 && len(agents[0].Status.ContainerStatuses) == 1 && agents[0].Status.ContainerStatuses[0].Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready agent pod 120 s after the rollout: %+v", agents)
		}
	}
	agent := agents[0]
	t.Logf("agent %s Ready %s after apply", agent.Metadata.Name, time.Since(start).Round(time.Millisecond))
	c := agent.Spec.Containers[0]
	// The container's memory limit, as the kubelet set it in the
	// container's cgroup, is where the agent's soft limit comes from.
	limit := c.Resources.Limits.Memory()
	if limit.IsZero() {
		t.Errorf("the agent container has no memory limit")
	} else {
		want := fmt.Sprintf("msg=\"soft memory limit\" bytes=%d source=cgroup", uint64(float64(limit.Value())*0.9))
		if logs := mustKubectl(t, "", "-n", "netpol-system", "logs", agent.Metadata.Name); !strings.Contains(logs, want) {
			t.Errorf("the agent's log has no %q (90%% of its container's %s limit):\n%s", want, limit, logs)
		}
	}
	if c.Image != "netpol.local/netpol:dev" {
		t.Errorf("agent image %q", c.Image)
	}
	if c.SecurityContext.Privileged == nil || *c.SecurityContext.Privileged {
		t.Errorf("agent privileged: %v", c.SecurityContext.Privileged)
	}
	caps := append([]string(nil), c.SecurityContext.Capabilities.Add...)
	sort.Strings(caps)
	if strings.Join(caps, ",") != "NET_ADMIN,NET_RAW" || strings.Join(c.SecurityContext.Capabilities.Drop, ",") != "ALL" {
		t.Errorf("agent capabilities add %v drop %v, want NET_ADMIN,NET_RAW and ALL", caps, c.SecurityContext.Capabilities.Drop)
	}
	// What the kubelet's readiness probe asks.
	resp, err := http.Get("http://" + nodeIP + ":9754/readyz")
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("readyz: %s", resp.Status)
	}
	// The agent's process really has only those capabilities (CapEff of the
	// netpol process on this host).
	checkAgentCaps(t)

	// Real pods: a Deployment of two servers and two client Pods.
	ns := testNamespace(t, "np-e2e")
	mustKubectl(t, workloads(ns), "apply", "-f", "-")
	mustKubectl(t, "", "-n", ns, "rollout", "status", "deployment/server", "--timeout=120s")
	mustKubectl(t, "", "-n", ns, "wait", "--for=condition=Ready", "pod/client-a", "pod/client-b", "--timeout=120s")
	servers := getPods(t, ns, "app=server")
	if len(servers) != 2 {
		t.Fatalf("%d server pods", len(servers))
	}
	s0, s1 := servers[0].Status.PodIP+":80", servers[1].Status.PodIP+":80"
	s0b := servers[0].Status.PodIP + ":81"

	expect(t, ns, "no policy: everything connects", []cell{
		{"client-a", s0, true}, {"client-a", s1, true}, {"client-a", s0b, true},
		{"client-b", s0, true}, {"client-b", s0b, true},
	})

	// NetworkPolicy: the servers accept only client-a, only on port 80.
	// Events carry whole seconds: anything from this second on counts.
	policyApplied := time.Now().Truncate(time.Second)
	mustKubectl(t, serversFromA(ns, "server-from-a"), "apply", "-f", "-")
	withPolicy := []cell{
		{"client-a", s0, true}, {"client-a", s1, true}, {"client-a", s0b, false},
		{"client-b", s0, false}, {"client-b", s1, false}, {"client-b", s0b, false},
	}
	expect(t, ns, "NetworkPolicy server-from-a", withPolicy)
	// The kubelet's readiness probes to port 81 (which the policy allows
	// to nobody) still pass: a failed one would be an Unhealthy event.
	// Only events seen after the policy count: a probe that ran before the
	// server listened ("connection refused" at start-up) is not policy's.
	time.Sleep(3 * time.Second)
	if failed := unhealthySince(t, ns, policyApplied); len(failed) > 0 {
		t.Errorf("kubelet probes failed under the NetworkPolicy (own-node ingress):\n%s", strings.Join(failed, "\n"))
	} else {
		t.Logf("kubelet readiness probes pass under the NetworkPolicy")
	}

	// A ClusterNetworkPolicy (v1beta1, Admin tier) denying all ingress to the
	// namespace overrides the NetworkPolicy; the agent writes its status.
	cnp := "np-e2e-deny-" + ns
	mustKubectl(t, fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: %s}}}
  ingress:
  - {name: deny-all, action: Deny, from: [{namespaces: {}}]}
`, cnp, ns), "apply", "-f", "-")
	expect(t, ns, "ClusterNetworkPolicy Admin Deny over the NetworkPolicy", []cell{
		{"client-a", s0, false}, {"client-b", s0, false},
	})
	eventually(t, 30*time.Second, "ClusterNetworkPolicy status Accepted=True", func() error {
		out, err := kubectl(t, "", "get", "clusternetworkpolicies.policy.networking.k8s.io", cnp,
			"-o", `jsonpath={.status.conditions[?(@.type=="Accepted")].status}`)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "True" {
			return fmt.Errorf("Accepted=%q", out)
		}
		return nil
	})
	mustKubectl(t, "", "delete", "clusternetworkpolicies.policy.networking.k8s.io", cnp)
	expect(t, ns, "ClusterNetworkPolicy deleted", withPolicy)

	// A ClusterIP and NodePort Service, load-balanced by netpol (no
	// kube-proxy); policy applies after DNAT.
	vip, nodePort := serverService(t, ns, "server")
	np := nodeIP + ":" + nodePort
	// (A NodePort connection is masqueraded to the node's address, as
	// kube-proxy does, so the policy does not see client-a there: it is
	// checked once the policy is gone.)
	expect(t, ns, "ClusterIP "+vip+" through netpol, policy after DNAT", []cell{
		{"client-a", vip, true}, {"client-b", vip, false},
	})
	seen := map[string]bool{}
	for i := 0; i < 40 && len(seen) < 2; i++ {
		if out, err := probe(t, ns, "client-a", vip); err == nil {
			seen[out] = true
		}
	}
	if len(seen) != 2 {
		t.Errorf("ClusterIP answered by %v, want both server pods", seen)
	} else {
		t.Logf("ClusterIP load-balanced over %v", keys(seen))
	}

	// Probes that must not flip while the agent is replaced or the kubelet
	// restarts: the kernel keeps what was programmed.
	steady := []cell{{"client-a", vip, true}, {"client-b", s0, false}, {"client-a", s0, true}}

	// The agent pod deleted: the DaemonSet makes a new one, which adopts the
	// table; no probe flips meanwhile.
	t.Run("agent pod recreated", func(t *testing.T) {
		old := getPods(t, "netpol-system", "app.kubernetes.io/name=netpol")[0].Metadata.Name
		noFlips(t, ns, steady, func() {
			mustKubectl(t, "", "-n", "netpol-system", "delete", "pod", old, "--wait=true")
			newAgentReady(t, old)
		})
	})

	// A rollout to a new image tag (the same image, tagged again in the
	// node's containerd): the DaemonSet replaces the pod; no probe flips.
	t.Run("rollout to a new image tag", func(t *testing.T) {
		ctr := filepath.Join(clusterDir, "bin", "ctr")
		sock := filepath.Join(clusterDir, "containerd", "containerd.sock")
		if out, err := exec.Command(ctr, "--address", sock, "-n", "k8s.io", "images", "tag", "--force", "netpol.local/netpol:dev", "netpol.local/netpol:rollout").CombinedOutput(); err != nil {
			t.Fatalf("ctr images tag: %v: %s", err, out)
		}
		old := getPods(t, "netpol-system", "app.kubernetes.io/name=netpol")[0].Metadata.Name
		noFlips(t, ns, steady, func() {
			mustKubectl(t, "", "-n", "netpol-system", "set", "image", "daemonset/netpol-agent", "agent=netpol.local/netpol:rollout")
			mustKubectl(t, "", "-n", "netpol-system", "rollout", "status", "daemonset/netpol-agent", "--timeout=120s")
			newAgentReady(t, old)
		})
		agent := getPods(t, "netpol-system", "app.kubernetes.io/name=netpol")[0]
		if img := agent.Spec.Containers[0].Image; img != "netpol.local/netpol:rollout" {
			t.Errorf("agent runs %s after the rollout", img)
		}
	})

	// The kubelet restarted (as a node's service manager would): the pods
	// go on, the agent too; no probe flips.
	t.Run("kubelet restarted", func(t *testing.T) {
		agent := getPods(t, "netpol-system", "app.kubernetes.io/name=netpol")[0].Metadata.Name
		noFlips(t, ns, steady, func() {
			if out, err := exec.Command("../../hack/cluster-restart.sh", "kubelet").CombinedOutput(); err != nil {
				t.Fatalf("restarting the kubelet: %v: %s", err, out)
			}
			time.Sleep(2 * time.Second) // the node is still Ready from before
			mustKubectl(t, "", "wait", "--for=condition=Ready", "node", "--all", "--timeout=120s")
			mustKubectl(t, "", "-n", "netpol-system", "rollout", "status", "daemonset/netpol-agent", "--timeout=120s")
		})
		if now := getPods(t, "netpol-system", "app.kubernetes.io/name=netpol")[0].Metadata.Name; now != agent {
			t.Errorf("the agent pod changed from %s to %s over a kubelet restart", agent, now)
		}
	})

	// The policy gone: client-b connects again.
	mustKubectl(t, "", "-n", ns, "delete", "networkpolicy", "server-from-a")
	expect(t, ns, "policy deleted", []cell{
		{"client-b", s0, true}, {"client-b", vip, true}, {"client-a", s0b, true},
		{"client-a", np, true}, {"client-b", np, true},
	})

	t.Run("domainNames through the cluster DNS", func(t *testing.T) { testDomainNames(t, ns, nodeIP) })
}

// testDomainNames: an Admin policy lets the namespace's pods reach the node
// only by the name outside.netpol.test, which the cluster DNS (CoreDNS,
// built from source by make e2e-images; its hosts plugin serves the
// netpol.test zone: hack/cluster/coredns.yaml) answers with the node's
// address. A host-network server there is refused to client-a by address
// until client-a resolves the name through kube-dns: the agent learns the
// answer (domainNames), and the same address connects.
func testDomainNames(t *testing.T, ns, nodeIP string) {
	if _, err := kubectl(t, "", "-n", "kube-system", "get", "service", "kube-dns"); err != nil {
		t.Skip("no cluster DNS: make e2e-images before cluster-up deploys CoreDNS (kube-system/kube-dns)")
	}
	mustKubectl(t, "", "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s")
	const port = "18080"
	mustKubectl(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: node-server, namespace: %[1]s}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: probe
    image: netpol.local/probe:dev
    imagePullPolicy: IfNotPresent
    args: [serve, "%[2]s"]
`, ns, port), "apply", "-f", "-")
	mustKubectl(t, "", "-n", ns, "wait", "--for=condition=Ready", "pod/node-server", "--timeout=120s")
	byAddr := nodeIP + ":" + port
	expect(t, ns, "the node's server, no policy", []cell{{"client-a", byAddr, true}})
	cnp := "np-e2e-domains-" + ns
	mustKubectl(t, fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %[1]s}
spec:
  tier: Admin
  priority: 15
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: %[2]s}}}
  egress:
  - name: by-name
    action: Accept
    to: [{domainNames: [outside.netpol.test]}]
  - name: not-by-address
    action: Deny
    to: [{networks: [%[3]s/32]}]
`, cnp, ns, nodeIP), "apply", "-f", "-")
	t.Cleanup(func() { kubectl(t, "", "delete", "clusternetworkpolicies.policy.networking.k8s.io", cnp) })
	expect(t, ns, "the node by address, before any answer", []cell{{"client-a", byAddr, false}})
	// Resolved by the pod's resolver (Go's, /etc/resolv.conf: kube-dns),
	// then the connection to the address it got.
	took := eventually(t, 30*time.Second, "outside.netpol.test resolved and connected", func() error {
		out, err := probe(t, ns, "client-a", "outside.netpol.test:"+port)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	t.Logf("outside.netpol.test answered by CoreDNS, learned and connected in %s", took.Round(time.Millisecond))
	expect(t, ns, "the node by address, once learned", []cell{{"client-a", byAddr, true}})
}

// testConformanceRunner runs the conformance suite's cluster runner on the
// cluster: NetworkPolicy (the upstream e2e cases) and the admin tiers'
// Pass cases (AdminNetworkPolicy, BaselineAdminNetworkPolicy,
// ClusterNetworkPolicy v1alpha2 and v1beta1), real probe pods of netpol's
// image, every cell compared with the evaluator fed the live objects.
func testConformanceRunner(t *testing.T) {
	cfg, err := cluster.RESTConfig(cluster.APIOptions{Kubeconfig: kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	cases := generator.Select(generator.All(), []string{"upstream-e2e", "pass"}, nil)
	rep, err := conformance.RunCluster(context.Background(), cases, conformance.ClusterOptions{
		Config: cfg, Logf: t.Logf,
		CaseDone: func(res conformance.CaseResult) {
			if !res.Passed {
				t.Logf("FAIL %s: %s", res.Name, res.Error)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "_output", "conformance-cluster")
	if err := creport.WriteDir(dir, rep); err != nil {
		t.Error(err)
	}
	for _, n := range rep.Notes {
		t.Logf("note: %s", n)
	}
	s := rep.Summary
	t.Logf("cluster runner: %d cases, %d steps, %d probes, %d mismatches, %d skipped, %.0f s (report in %s)",
		s.Cases, s.Steps, s.Probes, s.Mismatches, s.Skipped, s.DurationSeconds, dir)
	if s.Cases < 50 {
		t.Errorf("%d cases ran, want at least 50", s.Cases)
	}
	for _, c := range rep.Cases {
		if c.Error != "" {
			t.Errorf("%s: %s", c.Name, c.Error)
		}
		for _, st := range c.Steps {
			for _, m := range st.Mismatches {
				t.Errorf("%s step %d: %s -> %s %s/%d expected allowed=%v, observed %s\n%s\n%s", c.Name, st.Step, m.From, m.To, m.Protocol, m.Port, m.Expected, m.Result, m.Explain, m.Trace)
			}
		}
	}
	// Nothing of the run is left.
	if out := mustKubectl(t, "", "get", "namespaces", "-l", generator.RunLabel, "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("namespaces left by the run: %s", out)
	}
	for _, kind := range []string{"adminnetworkpolicies", "baselineadminnetworkpolicies", "clusternetworkpolicies"} {
		if out := mustKubectl(t, "", "get", kind, "-l", generator.RunLabel, "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("%s left by the run: %s", kind, out)
		}
	}
}

// noFlips probes cells over and over while during runs, and fails the
// test for every probe that did not give the expected answer.
//
// The probes run from the pods' network namespaces on the host (nsenter),
// not through kubectl exec: the kubelet serves exec, and its restart is one
// of the things that must not flip a probe.
func noFlips(t *testing.T, ns string, cells []cell, during func()) {
	t.Helper()
	pids := map[string]string{}
	for _, c := range cells {
		if pids[c.from] == "" {
			pids[c.from] = podPID(t, ns, c.from)
		}
	}
	done := make(chan struct{})
	flips := make(chan string, 100)
	rounds := 0
	go func() {
		defer close(flips)
		for {
			select {
			case <-done:
				return
			default:
			}
			rounds++
			for _, c := range cells {
				if err := probeFromHost(pids[c.from], c.to); (err == nil) != c.allowed {
					select {
					case flips <- fmt.Sprintf("%s -> %s allowed=%v at %s", c.from, c.to, err == nil, time.Now().Format(time.StampMilli)):
					default:
					}
				}
			}
		}
	}()
	during()
	time.Sleep(2 * time.Second)
	close(done)
	for f := range flips {
		t.Errorf("flipped: %s", f)
	}
	t.Logf("%d rounds of %d probes, none flipped", rounds, len(cells))
}

// newAgentReady waits for an agent pod other than old to be Ready.
func newAgentReady(t *testing.T, old string) {
	t.Helper()
	eventually(t, 90*time.Second, "a new agent pod Ready", func() error {
		for _, p := range getPods(t, "netpol-system", "app.kubernetes.io/name=netpol") {
			if p.Metadata.Name != old && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready {
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkAgentCaps finds the agent's process (netpol agent, a child of a
// containerd shim of this cluster) and checks its effective capabilities
// are exactly NET_ADMIN (12) and NET_RAW (13).
func checkAgentCaps(t *testing.T) {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	found := false
	for _, d := range dirs {
		cmdline, err := os.ReadFile(d + "/cmdline")
		if err != nil || !bytes.HasPrefix(cmdline, []byte("/bin/netpol\x00agent\x00")) {
			continue
		}
		status, err := os.ReadFile(d + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
				found = true
				if got := strings.TrimSpace(v); got != "0000000000003000" {
					t.Errorf("agent process %s CapEff %s, want 0000000000003000 (NET_ADMIN, NET_RAW)", d, got)
				}
			}
		}
	}
	if !found {
		t.Errorf("no /bin/netpol agent process found")
	}
}

// unhealthySince lists the namespace's Unhealthy events (failed kubelet
// probes) last observed at or after since, with their messages.
func unhealthySince(t *testing.T, ns string, since time.Time) []string {
	t.Helper()
	out := mustKubectl(t, "", "-n", ns, "get", "events", "--field-selector", "reason=Unhealthy", "-o", "json")
	var list corev1.EventList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("events: %v", err)
	}
	var failed []string
	for _, ev := range list.Items {
		last := ev.LastTimestamp.Time
		if ev.Series != nil && ev.Series.LastObservedTime.After(last) {
			last = ev.Series.LastObservedTime.Time
		}
		if ev.EventTime.After(last) {
			last = ev.EventTime.Time
		}
		if last.Before(since) {
			t.Logf("before the policy, not counted: %s %s (x%d at %s): %s", ev.InvolvedObject.Name, ev.Reason, ev.Count, last.Format(time.RFC3339), ev.Message)
			continue
		}
		failed = append(failed, fmt.Sprintf("%s (x%d, last %s): %s", ev.InvolvedObject.Name, ev.Count, last.Format(time.RFC3339), ev.Message))
	}
	return failed
}

func workloads(ns string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: server, namespace: %[1]s}
spec:
  replicas: 2
  selector: {matchLabels: {app: server}}
  template:
    metadata: {labels: {app: server}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: probe
        image: netpol.local/probe:dev
        imagePullPolicy: IfNotPresent
        args: [serve, "80", "81"]
        # The kubelet probes from the CNI's host-side address, not the
        # Node's: "ingress from the pod's own node" must admit it under a
        # NetworkPolicy that allows nothing on port 81. Generous threshold:
        # the Admin Deny step below blocks it, as Admin policy may.
        readinessProbe:
          tcpSocket: {port: 81}
          periodSeconds: 1
          timeoutSeconds: 1
          failureThreshold: 60
`, ns) + clientPod(ns, "a") + clientPod(ns, "b")
}

// clientPod is the probe pod client-ROLE of ns, labelled role=ROLE: the
// policies tell the clients apart by that label.
func clientPod(ns, role string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: client-%[2]s, namespace: %[1]s, labels: {role: %[2]s}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: probe
    image: netpol.local/probe:dev
    imagePullPolicy: IfNotPresent
    args: [serve, "80"]
`, ns, role)
}
