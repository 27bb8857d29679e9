//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/netpol/netpol/internal/nsexec"
	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/compiler"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/nft/kernel"
	"github.com/netpol/netpol/pkg/policy"
)

// The ports of the secure agent in TestAgentServing, inside node-1's
// namespace (--listen-in-netns), as a host-network DaemonSet pod's.
const (
	healthPort = 9754
	debugPort  = 9755
	securePort = 9756
)

// nsClient is an HTTP client whose connections are made inside a network
// namespace (a lab pod's or node's), with short timeouts: a dropped SYN is
// a timeout, not a wait.
func nsClient(h netns.NsHandle) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := nsexec.In(h, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dial,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
}

// outcome is what a GET got: an HTTP status, or "timeout" / "refused".
func outcome(c *http.Client, url, token string) (string, string) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return "refused", ""
		case errors.As(err, &ne) && ne.Timeout():
			return "timeout", ""
		}
		return "error: " + err.Error(), ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return fmt.Sprint(resp.StatusCode), string(b)
}

// startSecureAgent replaces node's agent by one that serves in the node's
// namespace: health on every address, debug on 127.0.0.1, metrics and
// debug on the secure port (delegated authn/authz as deploy/'s service
// account), and --protect-agent-ports with allow as the one other client.
func (w *world) startSecureAgent(n *lab.Node, allow netip.Addr) *agentProc {
	w.agent[n.Name].kill()
	a := &agentProc{node: n}
	a.cmd = exec.Command(netpolBin, "agent", "--kubeconfig", w.kcfg, "--node-name", n.Name, "--netns", n.NetNS,
		"--listen-in-netns", "--health-bind-address", fmt.Sprintf(":%d", healthPort),
		"--debug-bind-address", fmt.Sprintf("127.0.0.1:%d", debugPort), "--secure-port", fmt.Sprint(securePort),
		"--protect-agent-ports", "--agent-ports-allow", allow.String(), "--log-format", "json")
	c := nsClient(n.Handle)
	w.launch(a, "the secure agent", func() bool {
		got, _ := outcome(c, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort), "")
		return got == "200"
	})
	return a
}

// TestAgentServing: what the agent exposes on its node, against the real
// API server (TokenReview, SubjectAccessReview, RBAC from deploy/) and
// the real kernel (the node's table protecting the agent's ports).
func TestAgentServing(t *testing.T) {
	w := newWorld(t, "e2e")
	ctx := context.Background()
	var node *lab.Node
	for _, n := range w.lab.Nodes() {
		if n.Name == "node-1" {
			node = n
		}
	}
	var nodeAddr netip.Addr
	for _, a := range node.Addrs {
		if a.Is4() && !nodeAddr.IsValid() {
			nodeAddr = a
		}
	}
	var pods []*lab.Pod // node-1's pod-network pods
	for _, p := range w.lab.Pods() {
		if p.Node == "node-1" && !p.HostNetwork {
			pods = append(pods, p)
		}
	}
	if len(pods) < 2 || !nodeAddr.IsValid() {
		t.Fatalf("node-1 needs two pods and an IPv4 address: %d pods, %v", len(pods), nodeAddr)
	}
	prom, other := pods[0], pods[1] // prom is the operator-listed client
	var promAddr netip.Addr
	for _, a := range prom.Addrs {
		if a.Is4() {
			promAddr = a
		}
	}
	t.Logf("node-1 %v; listed client %s %v; other pod %s", nodeAddr, prom.Name, promAddr, other.Name)

	// Service accounts: reader (bound to deploy/'s netpol-agent-reader),
	// metrics-only (a role for /metrics alone), nobody (no binding).
	if err := w.env.ApplyYAML(ctx, false, `
apiVersion: v1
kind: Namespace
metadata: {name: monitoring}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: monitoring}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-only, namespace: monitoring}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: nobody, namespace: monitoring}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: monitoring-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: netpol-agent-reader}
subjects: [{kind: ServiceAccount, name: reader, namespace: monitoring}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: metrics-only}
rules: [{nonResourceURLs: ["/metrics"], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: monitoring-metrics-only}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-only}
subjects: [{kind: ServiceAccount, name: metrics-only, namespace: monitoring}]
`); err != nil {
		t.Fatal(err)
	}
	token := map[string]string{}
	kubeconfig := map[string]string{}
	for _, sa := range []string{"reader", "metrics-only", "nobody"} {
		kc, cfg, err := w.env.ServiceAccountConfig(ctx, "monitoring", sa)
		if err != nil {
			t.Fatal(err)
		}
		token[sa], kubeconfig[sa] = cfg.BearerToken, kc
	}

	w.startSecureAgent(node, promAddr)
	// The kernel holds the compiled protection, like any rule.
	r := w.expectedResolved()
	opts := compiler.Options{DNS: agentDNS(t, nil, node), AgentPorts: &compiler.AgentPorts{
		Ports: []uint16{securePort}, Allowed: []netip.Prefix{netip.PrefixFrom(promAddr, 32)}}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := kernel.Read(int(node.Handle), compiler.DefaultTable)
		if got != nil && kernel.Diff(got, agentTable(t, r, node, opts, got)).Empty() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-1's kernel table is not the compiled table with the agent-port protection")
		}
		time.Sleep(50 * time.Millisecond)
	}

	self, promC, otherC := nsClient(node.Handle), nsClient(prom.Handle), nsClient(other.Handle)
	secure := func(path string) string {
		return fmt.Sprintf("https://%s%s", net.JoinHostPort(nodeAddr.String(), fmt.Sprint(securePort)), path)
	}
	at := func(port int, path string) string {
		return fmt.Sprintf("http://%s%s", net.JoinHostPort(nodeAddr.String(), fmt.Sprint(port)), path)
	}
	tests := []struct {
		name   string
		c      *http.Client
		url    string
		token  string
		want   string // status, "timeout" or "refused"
		substr string
	}{
		// kubelet-style probes: health is open, on every address.
		{"node probes /healthz", self, at(healthPort, "/healthz"), "", "200", "ok"},
		{"node probes /readyz", self, at(healthPort, "/readyz"), "", "200", "ok"},
		{"a pod reaches /healthz", otherC, at(healthPort, "/healthz"), "", "200", "ok"},
		{"health does not serve the model", otherC, at(healthPort, "/debug/model"), "", "404", ""},
		// Plain debug: on the node's loopback only.
		{"node reads /debug/model on 127.0.0.1", self, fmt.Sprintf("http://127.0.0.1:%d/debug/model", debugPort), "", "200", `"chains"`},
		{"a pod cannot reach plain debug on the node's address", otherC, at(debugPort, "/debug/model"), "", "refused", ""},
		{"no plain metrics listener", otherC, at(9753, "/metrics"), "", "refused", ""},
		// The secure port: the node's table drops everyone but the node and the listed client.
		{"a pod's SYN to the secure port is dropped", otherC, secure("/debug/model"), token["reader"], "timeout", ""},
		{"a pod's SYN to the secure port is dropped (metrics)", otherC, secure("/metrics"), token["reader"], "timeout", ""},
		{"the node itself reaches the secure port", self, secure("/debug/model"), token["reader"], "200", `"chains"`},
		{"the node itself, no token", self, secure("/debug/model"), "", "401", ""},
		// The listed client: delegated authentication and authorization.
		{"listed client, no token", promC, secure("/debug/model"), "", "401", ""},
		{"listed client, a made-up token", promC, secure("/metrics"), "not-a-token", "401", ""},
		{"listed client, token without RBAC: debug", promC, secure("/debug/model"), token["nobody"], "403", ""},
		{"listed client, token without RBAC: metrics", promC, secure("/metrics"), token["nobody"], "403", ""},
		{"listed client, /metrics-only token: debug", promC, secure("/debug/model"), token["metrics-only"], "403", ""},
		{"listed client, /metrics-only token: metrics", promC, secure("/metrics"), token["metrics-only"], "200", "netpol_syncs_total"},
		{"listed client, reader token: debug", promC, secure("/debug/model"), token["reader"], "200", `"node": "node-1"`},
		{"listed client, reader token: metrics", promC, secure("/metrics"), token["reader"], "200", "netpol_syncs_total"},
		{"listed client, health needs no token", promC, secure("/healthz"), "", "200", "ok"},
		{"listed client, unknown path", promC, secure("/debug/pprof/"), token["reader"], "404", ""},
	}
	for _, tt := range tests {
		got, body := outcome(tt.c, tt.url, tt.token)
		if got != tt.want || !strings.Contains(body, tt.substr) {
			t.Errorf("%s: GET %s: %s %q, want %s with %q", tt.name, tt.url, got, trimBody(body), tt.want, tt.substr)
		}
	}

	// netpol model watch from the listed client's namespace, with the
	// reader's kubeconfig: the model, then a change. With nobody's: 403.
	watch := func(sa string) (*exec.Cmd, *cmdOutput) {
		cmd := exec.Command("ip", "netns", "exec", prom.NetNS, netpolBin, "model", "watch", "--agent", secure(""),
			"--kubeconfig", kubeconfig[sa], "--insecure-skip-tls-verify", "--interval", "50ms")
		return cmd, startOutput(t, "remote model watch", cmd)
	}
	_, reader := watch("reader")
	reader.waitFor("the protection rules", func(s string) bool {
		return strings.Contains(s, "+ chain input [") && strings.Contains(s, "@agent-ports jump agent-ports")
	})
	// Isolating the other pod (on node-1) adds it to the ingress dispatch map.
	ns, name, _ := strings.Cut(other.Name, "/")
	var otherAddr netip.Addr
	for _, a := range other.Addrs {
		if a.Is4() {
			otherAddr = a
		}
	}
	w.apply(fmt.Sprintf(`
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: isolate-%s, namespace: %q}
spec:
  podSelector: {matchLabels: {pod: %q}}
  policyTypes: [Ingress]
`, name, ns, name))
	reader.waitFor(other.Name+" joining the ingress dispatch map", func(s string) bool {
		return strings.Contains(s, "+ set ingress-pods4 "+otherAddr.String()+" : jump in.")
	})
	denied, deniedOut := watch("nobody")
	done := make(chan error, 1)
	go func() { done <- denied.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(deniedOut.String(), "403") {
			t.Errorf("model watch without RBAC: exit %v, output %q; want a failure naming 403", err, deniedOut.String())
		}
	case <-time.After(15 * time.Second):
		t.Errorf("model watch without RBAC still runs after 15s: %q", deniedOut.String())
	}
}

func trimBody(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// expectedResolved is the evaluator's resolution of the live cluster.
func (w *world) expectedResolved() *eval.Resolved {
	snap, _, err := cluster.LoadFromAPI(w.ctx, cluster.APIOptions{Kubeconfig: w.env.Kubeconfig})
	if err != nil {
		w.t.Fatal(err)
	}
	return eval.New(snap, policy.Build(snap)).Resolved()
}
