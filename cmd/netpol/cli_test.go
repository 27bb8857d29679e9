package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/netpol/netpol/pkg/dnssnoop"
	"github.com/netpol/netpol/pkg/lab"
	"github.com/netpol/netpol/pkg/node"
	"github.com/netpol/netpol/pkg/proxy"
)

const (
	demo      = "../../examples/demo"
	nodePorts = "testdata/nodeports.yaml"
	// outside is an address in neither the pod network nor the nodes.
	outside = "172.18.0.254"
)

// Issue 12, defects 2-4: a Service is explained after DNAT whether it is
// named (svc/, service/, nodeport/) or given as its address, from pods and
// from addresses, with a top-level allowed.
func TestExplainServiceFrontends(t *testing.T) {
	tests := []struct {
		name, src, dst, port string
		allowed              bool
		frontend             string
		droppedBy            string
		policySource         string // of the first endpoint, "" for none
		endpoints            int
	}{
		{"ClusterIP as an address, denied by policy after DNAT", "sandbox/toolbox", "10.96.0.20", "tcp/80", false, proxy.FrontendClusterIP.String(), "policy", "sandbox/toolbox", 1},
		{"ClusterIP as an address, allowed", "web/frontend", "10.96.0.20", "tcp/80", true, proxy.FrontendClusterIP.String(), "", "web/frontend", 1},
		{"service/ as lab probe prints it", "web/frontend", "service/api/orders", "tcp/80", true, proxy.FrontendClusterIP.String(), "", "web/frontend", 1},
		{"svc/ from a pod given by address", "10.244.1.10", "svc/api/orders", "tcp/80", true, proxy.FrontendClusterIP.String(), "", "10.244.1.10", 1},
		{"eTP Local, node without endpoint", outside, "nodeport/node-1/api/orders-local", "tcp/30080", false, proxy.FrontendNodePort.String(), "traffic policy", "", 0},
		{"eTP Local keeps the client: policy denies it", outside, "nodeport/node-2/api/orders-local", "tcp/30080", false, proxy.FrontendNodePort.String(), "policy", outside, 1},
		{"eTP Local: a pod uses the cluster endpoints", "web/frontend", "nodeport/node-1/api/orders-local", "tcp/30080", true, proxy.FrontendNodePort.String(), "", "web/frontend", 1},
		{"eTP Cluster: masqueraded to node-1, policy denies", outside, "nodeport/node-1/api/orders-cluster", "tcp/30081", false, proxy.FrontendNodePort.String(), "policy", "172.18.0.2 (node node-1)", 1},
		{"eTP Cluster: local endpoint sees the client", outside, "nodeport/node-2/api/orders-cluster", "tcp/30081", false, proxy.FrontendNodePort.String(), "policy", outside, 1},
		{"eTP Cluster: pod on the endpoint's node", "web/frontend", "nodeport/node-2/api/orders-cluster", "tcp/30081", true, proxy.FrontendNodePort.String(), "", "web/frontend", 1},
		{"NodePort as node address and port", outside, "172.18.0.2", "tcp/30081", false, proxy.FrontendNodePort.String(), "policy", "172.18.0.2 (node node-1)", 1},
		{"hairpin through another node: masqueraded by it, the isolated pod denies that node", "api/orders", "nodeport/node-1/api/orders-local", "tcp/30080", false, proxy.FrontendNodePort.String(), "policy", "172.18.0.2 (node node-1)", 1},
		{"load-balancer IP from outside: the first node, masqueraded", outside, "192.0.2.10", "tcp/80", false, proxy.FrontendLoadBalancer.String(), "policy", "172.18.0.2 (node node-1)", 1},
		{"external IP from a pod: its node, masqueraded", "web/frontend", "198.51.100.7", "tcp/80", false, proxy.FrontendExternalIP.String(), "policy", "172.18.0.2 (node node-1)", 1},
		{"the LB Service's ClusterIP keeps the pod", "web/frontend", "10.96.0.40", "tcp/80", true, proxy.FrontendClusterIP.String(), "", "web/frontend", 1},
		{"an external IP on another port is not the Service", "web/frontend", "198.51.100.7", "tcp/81", true, "", "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, err := run(t, "", "explain", "-f", demo, "-f", nodePorts, "-f", "testdata/loadbalancer.yaml", tt.src, tt.dst, "--port", tt.port, "-o", "json")
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			var sv struct {
				Allowed   *bool  `json:"allowed"`
				Frontend  string `json:"frontend"`
				DroppedBy string `json:"droppedBy"`
				Endpoints []struct {
					PolicySource string `json:"policySource"`
					Verdict      struct {
						Allowed *bool `json:"allowed"`
					} `json:"verdict"`
				} `json:"endpoints"`
			}
			if err := json.Unmarshal([]byte(out), &sv); err != nil {
				t.Fatal(err)
			}
			if sv.Allowed == nil || *sv.Allowed != tt.allowed {
				t.Errorf("allowed = %v, want %v\n%s", sv.Allowed, tt.allowed, out)
			}
			if sv.Frontend != tt.frontend || sv.DroppedBy != tt.droppedBy || len(sv.Endpoints) != tt.endpoints {
				t.Errorf("frontend %q droppedBy %q endpoints %d; want %q %q %d", sv.Frontend, sv.DroppedBy, len(sv.Endpoints), tt.frontend, tt.droppedBy, tt.endpoints)
			}
			if tt.endpoints > 0 && sv.Endpoints[0].PolicySource != tt.policySource {
				t.Errorf("policy source %q, want %q", sv.Endpoints[0].PolicySource, tt.policySource)
			}
		})
	}
}

// The same in text: the headline carries the Service verdict and why.
func TestExplainServiceText(t *testing.T) {
	out, _, err := run(t, "", "explain", "-f", demo, "sandbox/toolbox", "10.96.0.20", "--port", "tcp/80")
	if err != nil {
		t.Fatal(err)
	}
	wantContains(t, "output", out,
		"sandbox/toolbox -> service api/orders tcp/80 (ClusterIP 10.96.0.20): DENIED",
		"policy after DNAT denies sandbox/toolbox -> endpoint api/orders",
	)
}

func TestExplainServiceErrors(t *testing.T) {
	tests := []struct {
		src, dst, port string
		want           string
		notWant        string
	}{
		{outside, "svc/api/orders", "tcp/80", "neither a pod nor a node", "pod " + outside},
		{"web/frontend", "svc/api/nope", "tcp/80", "no such Service api/nope", ""},
		{"web/frontend", "svc/api/orders", "tcp/81", "Service api/orders has no IPv4 port tcp/81; it has IPv4 tcp/80", ""},
		{"web/frontend", "10.96.0.20", "tcp/81", "10.96.0.20 is the ClusterIP of Service api/orders, which has no port tcp/81", ""},
		{"web/frontend", "nodeport/node-9/api/orders-local", "tcp/30080", "node node-9", ""},
		{"web/frontend", "nodeport/node-1/api", "tcp/30080", "nodeport/NODE/NAMESPACE/NAME", ""},
		{"web/frontend", "service/api", "tcp/80", "service/NAMESPACE/NAME", ""},
		{"nope/nope", "svc/api/orders", "tcp/80", "pod nope/nope is not in the snapshot", ""},
	}
	for _, tt := range tests {
		_, _, err := run(t, "", "explain", "-f", demo, "-f", nodePorts, tt.src, tt.dst, "--port", tt.port)
		if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.notWant != "" && strings.Contains(err.Error(), tt.notWant)) {
			t.Errorf("%s -> %s %s: got %v, want an error with %q", tt.src, tt.dst, tt.port, err, tt.want)
		}
	}
}

// badServices is the demo plus Services with entries proxy.Build rejects:
// api/lb (a bad source range, and a slice with a bad address) in front of
// api/orders, and api/other (a bad external IP).
func badServices(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "services.yaml")
	doc := `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: api}
spec:
  type: LoadBalancer
  selector: {app: orders}
  clusterIP: 10.96.0.50
  loadBalancerSourceRanges: [bogus, 10.0.0.0/8]
  ports:
  - {name: http, port: 80, targetPort: http, nodePort: 30091, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: api
  labels: {kubernetes.io/service-name: lb}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.244.2.10]
  conditions: {ready: true}
  nodeName: node-2
  targetRef: {kind: Pod, namespace: api, name: orders}
- addresses: [not-an-ip]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: api}
spec:
  clusterIP: 10.96.0.51
  externalIPs: [300.1.1.1]
  ports:
  - {port: 80, protocol: TCP}
`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Service errors name the file and document, as the loader's and the
// policy model's do; explain reports those of the Service it explains
// (and of its EndpointSlices), still explains, and exits 1.
func TestServiceErrorsNameTheirOrigin(t *testing.T) {
	path := badServices(t)
	lb := path + ` (document 1): Service api/lb: spec.loadBalancerSourceRanges[0]: invalid CIDR "bogus"`
	slice := path + ` (document 2): EndpointSlice api/lb-1: endpoints[1].addresses[0]: invalid IP "not-an-ip"`
	other := path + ` (document 3): Service api/other: spec.externalIPs[0]: invalid IP "300.1.1.1"`
	tests := []struct {
		name     string
		args     []string
		stdout   string
		want     []string
		not      []string
		problems int
	}{
		{"compile --services", []string{"compile", "--node", "node-1", "--services"}, "table inet netpol-proxy",
			[]string{lb, slice, other}, nil, 3},
		{"explain svc/", []string{"explain", "web/frontend", "svc/api/lb", "--port", "tcp/80"}, "web/frontend -> service api/lb tcp/80",
			[]string{lb, slice}, []string{"api/other"}, 2},
		{"explain by ClusterIP address, as JSON", []string{"explain", "web/frontend", "10.96.0.50", "--port", "tcp/80", "-o", "json"}, `"service": "api/lb"`,
			[]string{lb, slice}, []string{"api/other"}, 2},
		{"explain another Service", []string{"explain", "web/frontend", "svc/api/orders", "--port", "tcp/80"}, "web/frontend -> service api/orders tcp/80",
			nil, []string{"api/lb", "api/other"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, stderr, err := run(t, "", append(tt.args, "-f", demo, "-f", path)...)
			if !strings.Contains(out, tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, "error: "+w+"\n") {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			for _, w := range tt.not {
				if strings.Contains(stderr, w) {
					t.Errorf("stderr mentions %q:\n%s", w, stderr)
				}
			}
			var partial *partialError
			switch {
			case tt.problems == 0 && err != nil:
				t.Errorf("err %v, want none", err)
			case tt.problems > 0 && (!errors.As(err, &partial) || partial.n != tt.problems):
				t.Errorf("err %v, want %d problem(s) (exit status 1)", err, tt.problems)
			}
		})
	}
}

// Defect 5: reading no object at all is an error naming the paths.
func TestEmptyInputIsAnError(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.yaml")
	comments := filepath.Join(dir, "comments.yaml")
	emptyDir := filepath.Join(dir, "nothing")
	textDir := filepath.Join(dir, "text")
	for _, d := range []string{emptyDir, textDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for path, data := range map[string]string{empty: "", comments: "# nothing\n---\n---\n", filepath.Join(textDir, "notes.txt"): "kind: Pod\n"} {
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		args  []string
		stdin string
		want  []string
	}{
		{[]string{"-f", empty}, "", []string{empty + ": no object"}},
		{[]string{"-f", comments}, "", []string{comments + ": no object"}},
		{[]string{"-f", emptyDir}, "", []string{emptyDir + ": a directory without .yaml, .yml or .json files"}},
		{[]string{"-f", textDir, "-f", empty}, "", []string{textDir + ": a directory without", empty + ": no object"}},
		{[]string{"-f", "-"}, "\n", []string{"- (stdin): no object"}},
	}
	for _, tt := range tests {
		for _, cmd := range [][]string{{"table"}, {"explain", "x/a", "y/b"}, {"compile", "--node", "n"}} {
			args := append(append([]string{}, cmd...), tt.args...)
			_, _, err := run(t, tt.stdin, args...)
			if err == nil {
				t.Errorf("%v: no error", args)
				continue
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), "no Kubernetes object read from") || !strings.Contains(err.Error(), w) {
					t.Errorf("%v: got %q, want it to name %q", args, err, w)
				}
			}
		}
	}
	// One path with objects is enough; the empty one is a note.
	_, stderr, err := run(t, "", "table", "-f", demo, "-f", empty, "--ports", "tcp/80")
	if err != nil || !strings.Contains(stderr, "note: nothing read from "+empty) {
		t.Errorf("demo + empty file: err %v, stderr %q", err, stderr)
	}
}

// Defect 5: a namespace without pods is named; exit 0.
func TestTableNamespaceWithoutPods(t *testing.T) {
	out, stderr, err := run(t, "", "table", "-f", demo, "-n", "nosuchns,web", "--ports", "tcp/80")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "namespace nosuchns has no pods (there is no such namespace)") || strings.Contains(stderr, "namespace web") {
		t.Errorf("stderr: %q", stderr)
	}
	if !strings.Contains(out, "web/frontend") {
		t.Errorf("web's pods missing:\n%s", out)
	}
	_, stderr, _ = run(t, "", "table", "-f", demo, "-n", "nosuchns")
	if !strings.Contains(stderr, "namespace nosuchns has no pods") {
		t.Errorf("stderr: %q", stderr)
	}
}

// Defect 5: a lab of a state without Nodes is refused before any
// namespace is made (no root needed to see it).
func TestLabRefusesStateWithoutNodes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pods.yaml")
	pods := `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x}
spec: {nodeName: n1, containers: [{name: c}]}
status: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.1}]}
`
	if err := os.WriteFile(path, []byte(pods), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"probe", "up"} {
		out, _, err := run(t, "", "lab", sub, "-f", path, "--prefix", "netpol-nonodes-")
		if err == nil || !strings.Contains(err.Error(), "has no Node objects") || out != "" {
			t.Errorf("lab %s: got %v, output %q; want a refusal naming the missing Nodes", sub, err, out)
		}
	}
}

// Defect 7: with no agent, model watch says once what it waits for and
// backs off instead of retrying every interval.
func TestModelWatchBacksOff(t *testing.T) {
	var attempts atomic.Int32
	client := &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		attempts.Add(1)
		return nil, errors.New("connection refused")
	})}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	var out, stderr bytes.Buffer
	if err := watchModel(ctx, client, "http://127.0.0.1:1/debug/model", 10*time.Millisecond, &out, &stderr); err != nil {
		t.Fatal(err)
	}
	// Every 10ms would be ~70 attempts; doubling from 20ms is 5.
	if n := attempts.Load(); n < 2 || n > 8 {
		t.Errorf("%d attempts in 700ms, want a backoff (2-8)", n)
	}
	if n := strings.Count(stderr.String(), "waiting for the agent at http://127.0.0.1:1/debug/model"); n != 1 || strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("stderr should say once what it waits for:\n%s", stderr.String())
	}
	if out.Len() != 0 {
		t.Errorf("stdout: %q", out.String())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Rough edges: text explain says what skipped rules wanted, one per line,
// and the fail-closed reason of the deciding rule.
func TestExplainTextSaysWhatRulesWanted(t *testing.T) {
	state := `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: a}}
spec: {nodeName: n1, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
status: {podIP: 10.0.0.1, podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: x, labels: {app: b}}
spec: {nodeName: n1, containers: [{name: c}]}
status: {podIP: 10.0.0.2, podIPs: [{ip: 10.0.0.2}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {matchLabels: {app: a}}
  ingress:
  - from: [{ipBlock: {cidr: 10.1.0.0/16, except: [10.1.1.0/24]}}]
  - from: [{podSelector: {matchLabels: {app: b}}}]
    ports: [{port: http}]
---
apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny-odd}
spec:
  priority: 5
  subject: {namespaces: {}}
  egress:
  - name: odd
    action: Deny
    to: [{networks: [not-a-cidr]}]
`
	tests := []struct {
		src, dst string
		want     []string
	}{
		{"x/b", "x/a", []string{
			"  NetworkPolicy tier:\n    - NetworkPolicy x/np ingress[0] (Accept): peer did not match; wanted ipBlock 10.1.0.0/16 except 10.1.1.0/24\n" +
				"    - NetworkPolicy x/np ingress[1] (Accept): port did not match; wanted named port TCP/http = TCP/8080 on x/a\n",
		}},
		{"x/a", "x/b", []string{
			`DENIED by the Admin tier: AdminNetworkPolicy deny-odd egress[0] "odd", action Deny`,
			"  Why: AdminNetworkPolicy deny-odd egress[0] \"odd\" matches (it fails closed and matches everything: invalid rule:",
		}},
	}
	for _, tt := range tests {
		out, _, _ := run(t, state, "explain", "-f", "-", tt.src, tt.dst, "--port", "tcp/80")
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s -> %s: output lacks %q:\n%s", tt.src, tt.dst, w, out)
			}
		}
	}
}

// Rough edges: --exit-code makes a denied verdict exit 1; without it the
// exit status is 0 whatever the verdict.
func TestExplainExitCode(t *testing.T) {
	tests := []struct {
		args       []string
		wantDenied bool
	}{
		{[]string{"sandbox/toolbox", "db/postgres", "--port", "tcp/5432", "--exit-code"}, true},
		{[]string{"sandbox/toolbox", "db/postgres", "--port", "tcp/5432"}, false},
		{[]string{"web/frontend", "api/orders", "--port", "tcp/8080", "--exit-code"}, false},
		{[]string{"sandbox/toolbox", "svc/api/orders", "--exit-code", "-o", "json"}, true},
		{[]string{"web/frontend", "svc/api/orders", "--exit-code"}, false},
	}
	for _, tt := range tests {
		out, _, err := run(t, "", append([]string{"explain", "-f", demo}, tt.args...)...)
		var denied *deniedError
		if errors.As(err, &denied) != tt.wantDenied || (!tt.wantDenied && err != nil) || out == "" {
			t.Errorf("%v: err %v, output %d bytes; want denied=%v with the verdict printed", tt.args, err, len(out), tt.wantDenied)
		}
	}
}

// Rough edges: errors people can read.
func TestReadableErrors(t *testing.T) {
	t.Run("no kubeconfig", func(t *testing.T) {
		t.Setenv("KUBECONFIG", "")
		t.Setenv("HOME", t.TempDir())
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		_, _, err := run(t, "", "table")
		if err == nil || !strings.Contains(err.Error(), "no kubeconfig found") || !strings.Contains(err.Error(), "-f PATH") || strings.Contains(err.Error(), "KUBERNETES_MASTER") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("invalid CIDRs name the file, the document and every entry", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "np.yaml")
		np := `apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from: [{ipBlock: {cidr: 10.1.0.0/16, except: [10.1.1.0/33, 10.1.2.0/24, bogus]}}]
`
		if err := os.WriteFile(path, []byte(np), 0o644); err != nil {
			t.Fatal(err)
		}
		_, stderr, err := run(t, "", "table", "-f", path)
		var partial *partialError
		if !errors.As(err, &partial) || partial.n != 2 {
			t.Fatalf("err %v, want 2 problems", err)
		}
		wantContains(t, "stderr", stderr,
			path+` (document 2): NetworkPolicy x/np: spec.ingress[0].from[0].ipBlock.except[0]: invalid CIDR "10.1.1.0/33"`,
			path+` (document 2): NetworkPolicy x/np: spec.ingress[0].from[0].ipBlock.except[2]: invalid CIDR "bogus"`,
		)
	})
	t.Run("not a Kubernetes object", func(t *testing.T) {
		_, stderr, _ := run(t, "\"just a string\"\n---\napiVersion: v1\nkind: Pod\nmetadata: x\n", "table", "-f", "-")
		wantContains(t, "stderr", stderr,
			"<stdin> (document 1): not a Kubernetes object: the document is a string, not a mapping with apiVersion and kind",
			"<stdin> (document 2): not a Kubernetes object: metadata is a string, not a mapping",
		)
		if strings.Contains(stderr, "Go value") {
			t.Errorf("stderr speaks Go:\n%s", stderr)
		}
	})
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, _, err := run(t, "", args...)
		if err != nil {
			t.Fatal(err)
		}
		wantContains(t, fmt.Sprint(args), out, "netpol ", "git commit: ", "go:         go1.", "NetworkPolicy networking.k8s.io/v1", "ClusterNetworkPolicy policy.networking.k8s.io/v1alpha2, policy.networking.k8s.io/v1beta1", "AdminNetworkPolicy policy.networking.k8s.io/v1alpha1")
	}
}

// Rough edges: input flags appear only on the commands that use them.
func TestInputFlagsOnlyWhereTheyAct(t *testing.T) {
	tests := []struct {
		cmd  []string
		want map[string]bool // flag -> present
	}{
		{[]string{"explain"}, map[string]bool{"filename": true, "kubeconfig": true, "context": true}},
		{[]string{"table"}, map[string]bool{"filename": true, "kubeconfig": true, "context": true}},
		{[]string{"compile"}, map[string]bool{"filename": true, "kubeconfig": true, "context": true}},
		{[]string{"lab", "probe"}, map[string]bool{"filename": true, "kubeconfig": false, "context": false}},
		{[]string{"lab", "up"}, map[string]bool{"filename": true, "kubeconfig": false, "context": false}},
		{[]string{"lab", "down"}, map[string]bool{"filename": false, "kubeconfig": false, "context": false}},
		{[]string{"lab", "status"}, map[string]bool{"filename": false, "kubeconfig": false, "context": false}},
		{[]string{"model", "watch"}, map[string]bool{"filename": false, "kubeconfig": true, "context": true}},
		{[]string{"agent"}, map[string]bool{"filename": false, "kubeconfig": true, "context": false}},
		{[]string{"version"}, map[string]bool{"filename": false, "kubeconfig": false, "context": false}},
	}
	root := newRootCommand()
	for _, tt := range tests {
		c, _, err := root.Find(tt.cmd)
		if err != nil {
			t.Fatal(err)
		}
		for flag, want := range tt.want {
			if got := c.Flags().Lookup(flag) != nil; got != want {
				t.Errorf("%v --%s: present %v, want %v", tt.cmd, flag, got, want)
			}
		}
	}
	out, _, _ := run(t, "", "agent", "--help")
	found := false
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--node-name") {
			found = true
			if n := strings.Count(line, "default"); n != 1 {
				t.Errorf("--node-name prints its default %d times: %s", n, line)
			}
		}
	}
	if !found {
		t.Error("agent --help has no --node-name")
	}
}

// Rough edges: lab up's help gives a command that works with the probe
// servers (not HTTP).
func TestLabUpHelp(t *testing.T) {
	out, _, err := run(t, "", "lab", "up", "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "curl") || !strings.Contains(out, "ip netns exec") || !strings.Contains(out, "cat </dev/tcp/") {
		t.Errorf("lab up help:\n%s", out)
	}
}

// Rough edges: a timed-out Service probe says whether policy after DNAT
// or the Service's traffic policy explains it.
func TestServiceProbeWhy(t *testing.T) {
	l, err := (&inputFlags{files: []string{demo, nodePorts}}).load(context.Background(), strings.NewReader(""), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	obs := func(from, to string, port int32, result string) lab.ServiceObservation {
		o := lab.ServiceObservation{From: from, To: to, Protocol: corev1.ProtocolTCP, Port: port, Family: corev1.IPv4Protocol, Result: result,
			FromAddr: netip.MustParseAddr(outside)}
		return o
	}
	tests := []struct {
		o    lab.ServiceObservation
		want string
	}{
		{obs(lab.ExternalSource, "nodeport/node-1/api/orders-local", 30080, lab.ResultTimeout), "no endpoint serves this port for node node-1 under the Service's traffic policy"},
		{obs(lab.ExternalSource, "nodeport/node-2/api/orders-local", 30080, lab.ResultTimeout), "policy after DNAT denies " + outside + " -> endpoint api/orders"},
		{obs(lab.ExternalSource, "nodeport/node-1/api/orders-cluster", 30081, lab.ResultTimeout), "policy after DNAT denies 172.18.0.2 (node node-1) -> endpoint api/orders"},
		{obs("sandbox/toolbox", "service/api/orders", 80, lab.ResultTimeout), "policy after DNAT denies sandbox/toolbox -> endpoint api/orders"},
		{obs("web/frontend", "service/api/orders", 80, lab.ResultOK), ""},
	}
	for _, tt := range tests {
		if got := serviceWhy(l, tt.o); (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s -> %s: why %q, want %q", tt.o.From, tt.o.To, got, tt.want)
		}
	}
	if h := serviceHeader(serviceRows([]lab.ServiceObservation{tests[3].o})); !strings.Contains(h, "no NodePorts") {
		t.Errorf("header %q should say there are no NodePorts", h)
	}
}

// Rough edges: shell completion of pods, Services, nodes and -o values.
func TestCompletion(t *testing.T) {
	tests := []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"explain", "-f", demo, ""}, []string{"web/frontend", "sandbox/toolbox"}, []string{"svc/api/orders"}},
		{[]string{"explain", "-f", demo, "web/frontend", "s"}, []string{"sandbox/toolbox", "svc/api/orders"}, []string{"web/frontend"}},
		{[]string{"explain", "-f", demo, "-f", nodePorts, "web/frontend", "nodeport/node-2/"}, []string{"nodeport/node-2/api/orders-local"}, []string{"nodeport/node-1/api/orders-local"}},
		{[]string{"compile", "-f", demo, "--node", ""}, []string{"node-1", "node-2"}, nil},
		{[]string{"table", "-f", demo, "-n", ""}, []string{"api", "web", "sandbox"}, nil},
		{[]string{"table", "-o", ""}, []string{"table", "json", "yaml"}, []string{"text"}},
		{[]string{"explain", "-o", ""}, []string{"text", "json", "yaml"}, []string{"table"}},
		// A value's remark in brackets is not part of it.
		{[]string{"conformance", "run", "-o", ""}, []string{"text", "json"}, []string{"yaml", "(report.json's", "shape)"}},
	}
	for _, tt := range tests {
		out, _, err := run(t, "", append([]string{"__complete"}, tt.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(out, "\n")
		has := func(s string) bool {
			for _, l := range lines {
				if l == s {
					return true
				}
			}
			return false
		}
		for _, w := range tt.want {
			if !has(w) {
				t.Errorf("%v: no completion %q in\n%s", tt.args, w, out)
			}
		}
		for _, w := range tt.not {
			if has(w) {
				t.Errorf("%v: unexpected completion %q", tt.args, w)
			}
		}
	}
	// Every command's -o completes to its values, each one word.
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.Flags().Lookup("output") == nil {
			return
		}
		args := append([]string{"__complete"}, strings.Fields(c.CommandPath())[1:]...)
		out, _, err := run(t, "", append(args, "-o", "")...)
		var values []string
		for _, l := range strings.Split(out, "\n") {
			if l != "" && !strings.HasPrefix(l, ":") { // ":4" is cobra's directive
				values = append(values, l)
			}
		}
		if err != nil || len(values) < 2 || slices.ContainsFunc(values, func(v string) bool { return strings.ContainsAny(v, " ()") }) {
			t.Errorf("%s -o: completions %q (err %v), want its formats", c.CommandPath(), values, err)
		}
	}
	walk(newRootCommand())
}

// Rough edges: --denied shows only the denied cells.
func TestTableDenied(t *testing.T) {
	out, _, err := run(t, "", "table", "-f", demo, "--ports", "tcp/80", "--denied", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			From, To string
			Allowed  bool
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	// tcp/80 on the demo: 7 of the 16 cells are denied.
	if len(doc.Results) != 7 {
		t.Errorf("%d results, want the 7 denied cells", len(doc.Results))
	}
	for _, r := range doc.Results {
		if r.Allowed {
			t.Errorf("allowed cell shown: %+v", r)
		}
	}
	text, _, _ := run(t, "", "table", "-f", demo, "--ports", "tcp/80", "--denied")
	if !strings.Contains(text, "sandbox/toolbox -> db/postgres TCP/80: DENIED") || strings.Contains(text, "ALLOWED") {
		t.Errorf("text:\n%s", text)
	}
}

// Rough edges: run as kubectl-netpol, it behaves the same and says
// `kubectl netpol` in help.
func TestKubectlPluginName(t *testing.T) {
	for _, argv0 := range []string{"/usr/local/bin/kubectl-netpol", "netpol"} {
		cmd := commandFor(argv0)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{"explain", "--help"})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		plugin := strings.Contains(argv0, "kubectl-")
		if strings.Contains(out.String(), "kubectl netpol explain SRC DST") != plugin {
			t.Errorf("%s: help usage:\n%s", argv0, out.String())
		}
		cmd = commandFor(argv0)
		out.Reset()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{"explain", "-f", demo, "web/frontend", "api/orders", "--port", "tcp/8080"})
		if err := cmd.Execute(); err != nil || !strings.Contains(out.String(), "ALLOWED") {
			t.Errorf("%s explain: %v\n%s", argv0, err, out.String())
		}
	}
}

// TestTableDomains: `table --domains -o json` resolves the lab's zone for
// every pod and judges the connection to the first address; without the
// zone it says what is missing.
func TestTableDomains(t *testing.T) {
	out, _, err := run(t, "", "table", "-f", "../../examples/lab-dns.yaml", "--domains", "--ports", "tcp/80", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Results []struct {
			From, To, Protocol, Address, Result string
			Port                                int
			Allowed                             bool
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	cells := map[string]string{}
	for _, r := range got.Results {
		cells[r.From+" "+r.To] = fmt.Sprintf("%v %s %s/%d", r.Allowed, r.Address, r.Protocol, r.Port)
	}
	for cell, want := range map[string]string{
		"x/a dns/allowed.example.com": "true 203.0.113.10 TCP/80",
		"x/a dns/www.example.com":     "true 203.0.113.20 TCP/80", // the CNAME's target address
		"x/a dns/api.example.org":     "false 203.0.113.40 TCP/80",
		"x/b dns/api.example.org":     "true 203.0.113.40 TCP/80",  // x/b's own policy
		"x/a dns/example.com":         "false 203.0.113.50 TCP/80", // *.example.com is not example.com
		"x/a dns/mirror.example.net":  "true 203.0.113.60 TCP/80",
		"x/b dns/big.example.com":     "true 198.51.100.1 TCP/80",
	} {
		if cells[cell] != want {
			t.Errorf("%s: %q, want %q", cell, cells[cell], want)
		}
	}
	if len(got.Results) != 24 {
		t.Errorf("%d rows, want 3 pods x 8 names x 1 port", len(got.Results))
	}
	if _, _, err := run(t, "", "table", "-f", "../../examples/demo", "--domains"); err == nil || !strings.Contains(err.Error(), "netpol-lab-dns") {
		t.Errorf("without a zone: %v", err)
	}
}

// TestExplainLearnedDomain: explain names the domainNames pattern and the
// answer that admitted an address, from the lab's zone offline and from
// an agent's /debug/dns (a saved file); an expired entry admits nothing.
func TestExplainLearnedDomain(t *testing.T) {
	out, _, err := run(t, "", "explain", "-f", "../../examples/lab-dns.yaml", "x/a", "203.0.113.20", "--port", "tcp/80")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `Learned: domainNames "*.example.com": www.example.com resolves to 203.0.113.20 in the lab's zone`) {
		t.Errorf("offline, from the zone:\n%s", out)
	}
	now := time.Now()
	status := node.DNSStatus{Queue: "xtables NFQUEUE target (nft compat)", QueueNum: 53, Entries: []dnssnoop.Entry{
		{Pattern: "*.example.com", Name: "api.example.com", Addr: netip.MustParseAddr("198.51.100.7"), Learned: now.Add(-time.Minute), Expires: now.Add(time.Hour)},
		{Pattern: "*.example.com", Name: "old.example.com", Addr: netip.MustParseAddr("198.51.100.8"), Learned: now.Add(-time.Hour), Expires: now.Add(-time.Minute)},
	}}
	data, err := json.Marshal(status)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "dns.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]string{
		"198.51.100.7": "Learned: domainNames \"*.example.com\": api.example.com answered 198.51.100.7 at",
		"198.51.100.8": "DENIED by the Admin tier",
	} {
		out, _, err := run(t, "", "explain", "-f", "../../examples/lab-dns.yaml", "x/a", addr, "--port", "tcp/80", "--learned", file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, want) {
			t.Errorf("%s: want %q in\n%s", addr, want, out)
		}
	}
}

// TestCompileDNS: `compile --dns native` renders the agent's DNS chains
// with the state's cluster DNS; an unknown mode is an error.
func TestCompileDNS(t *testing.T) {
	out, _, err := run(t, "", "compile", "-f", "../../examples/lab-dns.yaml", "--node", "node-1", "--dns", "native")
	if err != nil {
		t.Fatal(err)
	}
	wantContains(t, "output", out, "10.244.1.53 . udp . 53", "chain dns-forward", "counter queue flags bypass to 53")
	if out, _, _ := run(t, "", "compile", "-f", "../../examples/lab-dns.yaml", "--node", "node-1"); strings.Contains(out, "dns-forward") {
		t.Error("the DNS chains without --dns")
	}
	if _, _, err := run(t, "", "compile", "-f", "../../examples/lab-dns.yaml", "--node", "node-1", "--dns", "yes"); err == nil {
		t.Error("--dns yes: no error")
	}
}

// `netpol lint` on the demo warns of nothing; on examples/lint's
// policies, of each kind once, in text and JSON; --exit-code makes a
// warning exit 1.
func TestLintCLI(t *testing.T) {
	out, _, err := run(t, "", "lint", "-f", demo)
	if err != nil || !strings.Contains(out, "0 warning(s) in 4 policies") {
		t.Fatalf("lint on the demo: %v\n%s", err, out)
	}
	if _, _, err := run(t, "", "lint", "-f", demo, "--exit-code"); err != nil {
		t.Errorf("lint --exit-code without a warning: %v", err)
	}
	files := []string{"-f", demo + "/cluster.yaml", "-f", "../../examples/lint/policies.yaml"}
	out, _, err = run(t, "", append([]string{"lint", "-o", "json"}, files...)...)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Warnings []struct {
			Kind   string `json:"kind"`
			Object struct {
				Kind, Namespace, Name string
			} `json:"object"`
			Field   string `json:"field"`
			Message string `json:"message"`
		} `json:"warnings"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var kinds []string
	for _, w := range got.Warnings {
		kinds = append(kinds, w.Kind+" "+w.Object.Namespace+"/"+w.Object.Name+" "+w.Field)
		if w.Message == "" {
			t.Errorf("warning without a message: %+v", w)
		}
	}
	want := []string{
		"domain-names /baseline-egress spec.egress[0].to[0].domainNames",
		"ambiguous-priority /frontend-debug spec.ingress[0]",
		"peer-matches-nothing /frontend-debug spec.ingress[1].from[0]",
		"shadowed-rule api/orders-ingress spec.ingress[1]",
		"selects-nothing db/postgress-from-api spec.podSelector",
		"named-port-unresolved web/frontend-egress spec.egress[0].ports[0]",
	}
	if !slices.Equal(kinds, want) {
		t.Errorf("warnings:\n got %q\nwant %q", kinds, want)
	}
	text, _, err := run(t, "", append([]string{"lint", "--exit-code"}, files...)...)
	var warned *lintWarningsError
	if !errors.As(err, &warned) || warned.n != len(want) {
		t.Errorf("lint --exit-code with warnings: %v", err)
	}
	wantContains(t, "lint text", text, "warning: NetworkPolicy api/orders-ingress: spec.ingress[1]: never decides: ingress[0] allows every connection it allows (shadowed-rule)",
		fmt.Sprintf("%d warning(s) in 6 policies", len(want)))
}
