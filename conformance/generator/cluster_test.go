package generator

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/policy"
)

// testEnv is a one-node cluster, as make cluster-up makes.
func testEnv() ClusterEnv {
	env := ClusterEnv{Run: "r1", Namespaces: map[string]string{}, PodIPs: map[string]netip.Addr{},
		NodeIPs:      map[string]netip.Addr{"node-1": netip.MustParseAddr("172.31.254.1"), "node-2": netip.MustParseAddr("172.31.254.1")},
		NodePodCIDRs: map[string]netip.Prefix{"node-1": netip.MustParsePrefix("10.247.0.0/24"), "node-2": netip.MustParsePrefix("10.247.0.0/24")},
		PodsCIDR:     netip.MustParsePrefix("10.247.0.0/23"), NodesCIDR: netip.MustParsePrefix("172.31.254.0/24"),
		NodeNames:     map[string]string{"node-1": "netpol-node", "node-2": "netpol-node"},
		NodeHostnames: map[string]string{"node-1": "netpol-node", "node-2": "netpol-node"}}
	for _, ns := range BaseNamespaces() {
		env.Namespaces[ns] = "conf-r1-" + ns
	}
	for i, p := range BasePods() {
		env.PodIPs[p.Namespace+"/"+p.Name] = netip.AddrFrom4([4]byte{10, 247, 0, byte(10 + i)})
	}
	return env
}

// testEnvNodes is two nodes, the runner's host-network pod and its rack
// label on them, as on make cluster-up NODES=2.
func testEnvNodes() ClusterEnv {
	env := testEnv()
	env.NodeIPs["node-2"] = netip.MustParseAddr("172.31.254.2")
	env.NodePodCIDRs["node-2"] = netip.MustParsePrefix("10.247.1.0/24")
	env.NodeNames = map[string]string{"node-1": "netpol-node", "node-2": "netpol-node-2"}
	env.NodeHostnames = map[string]string{"node-1": "netpol-node", "node-2": "netpol-node-2"}
	env.RackLabel = "netpol.io/rack-r1"
	env.Namespaces["h"] = "conf-r1-h"
	for i, p := range BasePods() {
		if p.Node == "node-2" {
			env.PodIPs[p.Namespace+"/"+p.Name] = netip.AddrFrom4([4]byte{10, 247, 1, byte(10 + i)})
		}
	}
	return env
}

// TestForClusterSuite: most of the suite runs on a cluster; every case
// rewritten loads and builds without errors, names only the run's
// namespaces and the cluster's addresses, and narrows admin subjects to
// the run.
func TestForClusterSuite(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  ClusterEnv
		want int // cases at least
	}{
		// Left out on one node: node selectors, h/h, and the CIDRs that
		// split a node's pods.
		{"one node", testEnv(), 510},
		// Left out on two: only the CIDRs that split a node's pods.
		{"two nodes", testEnvNodes(), 551},
	} {
		t.Run(tt.name, func(t *testing.T) { testForClusterSuite(t, tt.env, tt.want) })
	}
}

func testForClusterSuite(t *testing.T, env ClusterEnv, want int) {
	all := All()
	reasons := map[string]int{}
	ok := 0
	for _, c := range all {
		tc, err := ForCluster(c, env)
		if err != nil {
			reasons[err.Error()]++
			continue
		}
		ok++
		if tc.Name != c.Name || len(tc.Steps) != len(c.Steps) {
			t.Fatalf("%s: rewritten as %s with %d steps", c.Name, tc.Name, len(tc.Steps))
		}
		snap := cluster.New()
		for i, st := range tc.Steps {
			for _, ref := range st.Delete {
				if ref.Namespace != "" && !strings.HasPrefix(ref.Namespace, "conf-r1-") {
					t.Errorf("%s step %d: deletes in namespace %q", c.Name, i, ref.Namespace)
				}
			}
			if rep := snap.AddDocuments([]byte(st.Apply), c.Name, true); len(rep.Errors) > 0 {
				t.Errorf("%s step %d: %v", c.Name, i, rep.Errors)
			}
			for _, bad := range []string{"10.244.", "172.18.", "namespace: x\n", "namespace: \"x\"", "nodeName: node-", "rack:", "hostname: node-"} {
				if strings.Contains(st.Apply, bad) {
					t.Errorf("%s step %d: still names %q:\n%s", c.Name, i, bad, st.Apply)
				}
			}
		}
		if m := policy.Build(snap); len(m.Errors) > 0 {
			t.Errorf("%s: %v", c.Name, m.Errors)
		}
	}
	t.Logf("%d of %d cases run on a cluster; left out: %v", ok, len(all), reasons)
	if ok < want {
		t.Errorf("only %d of %d cases run on a cluster, want at least %d", ok, len(all), want)
	}
}

func TestForClusterRewrites(t *testing.T) {
	tests := []struct {
		name  string
		nodes bool // testEnvNodes, else testEnv
		apply string
		want  []string // substrings of the rewritten YAML
		err   string
	}{{
		name: "NetworkPolicy namespace, namespace selector, pod address",
		apply: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}
    - namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: In, values: [x, z]}]}
    - ipBlock: {cidr: 10.244.0.0/16, except: [10.244.1.10/32, 10.244.2.0/24]}
`,
		want: []string{"namespace: conf-r1-x", "kubernetes.io/metadata.name: conf-r1-y", "- conf-r1-x\n", "- conf-r1-z\n",
			"cidr: 10.247.0.0/23", "- 10.247.0.10/32", "- 10.247.0.0/24"},
	}, {
		name: "admin subject narrowed to the run, name prefixed, labelled",
		apply: `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: deny}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {}}
  egress:
  - {name: r, action: Deny, to: [{networks: [172.18.0.2/32, 192.0.2.0/24]}]}
`,
		want: []string{"name: r1-deny", "netpol.io/conformance-run: r1", "namespaces:\n      matchLabels:\n        netpol.io/conformance-run: r1",
			"- 172.31.254.1/32", "- 192.0.2.0/24"},
	}, {
		name: "a pod's labels change",
		apply: `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {pod: a, new: "yes"}}
spec: {nodeName: node-1}
`,
		want: []string{"namespace: conf-r1-x", "new: \"yes\""},
	}, {
		name: "a pod added: created on the live node",
		apply: `apiVersion: v1
kind: Pod
metadata: {name: d, namespace: x, labels: {pod: b}}
spec: {nodeName: node-1}
`,
		want: []string{"namespace: conf-r1-x", "pod: b", "nodeName: netpol-node\n"},
	}, {
		name:  "a pod moved to node-2",
		nodes: true,
		apply: `apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {pod: a}}
spec: {nodeName: node-2}
`,
		want: []string{"name: a\n", "nodeName: netpol-node-2"},
	}, {
		name:  "node selectors and a Node's rack",
		nodes: true,
		apply: `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny}
spec:
  priority: 5
  subject: {namespaces: {}}
  egress:
  - {name: r, action: Deny, to: [{nodes: {matchLabels: {kubernetes.io/hostname: node-2, kubernetes.io/os: linux}}}]}
  - {name: s, action: Deny, to: [{nodes: {matchExpressions: [{key: rack, operator: In, values: [r1, r2]}]}}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {kubernetes.io/hostname: node-1, rack: r2}}
`,
		want: []string{"kubernetes.io/hostname: netpol-node-2", "kubernetes.io/os: linux", "key: netpol.io/rack-r1",
			"kind: Node\nmetadata:\n  labels:\n    netpol.io/rack-r1: r2\n  name: netpol-node\n"},
	}, {
		name: "node selectors by rack on one node",
		apply: `apiVersion: policy.networking.k8s.io/v1alpha1
kind: AdminNetworkPolicy
metadata: {name: deny}
spec:
  priority: 5
  subject: {namespaces: {}}
  egress: [{name: r, action: Deny, to: [{nodes: {matchLabels: {rack: r1}}}]}]
`,
		err: "one node here",
	}, {
		name: "a CIDR holding every pod and no node stays",
		apply: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  egress: [{to: [{ipBlock: {cidr: 0.0.0.0/4, except: [10.244.2.11/32]}}]}]
`,
		want: []string{"cidr: 0.0.0.0/4", "- 10.247.0.11/32"},
	}, {
		name: "a CIDR with no counterpart",
		apply: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.244.1.0/28}}]}]
`,
		err: "CIDR 10.244.1.0/28 has no counterpart",
	}, {
		name: "namespace h",
		apply: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: h}}}]}]
`,
		err: "namespace h",
	}, {
		name:  "namespace h, where the runner makes h/h",
		nodes: true,
		apply: `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: np, namespace: x}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: h}}}]}]
`,
		want: []string{"kubernetes.io/metadata.name: conf-r1-h"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := testEnv()
			if tt.nodes {
				env = testEnvNodes()
			}
			got, err := ForCluster(Case{Name: "c", Steps: []Step{{Apply: tt.apply}}}, env)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(got.Steps[0].Apply, w) {
					t.Errorf("no %q in\n%s", w, got.Steps[0].Apply)
				}
			}
		})
	}
}
