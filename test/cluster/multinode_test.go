//go:build e2e_cluster

package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// node is one of the cluster's nodes.
type node struct{ name, ip, podCIDR string }

// clusterNodes lists the cluster's nodes by name.
func clusterNodes(t testing.TB) []node {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct{ Name string } `json:"metadata"`
			Spec     struct {
				PodCIDR string `json:"podCIDR"`
			} `json:"spec"`
			Status struct {
				Addresses []struct{ Type, Address string } `json:"addresses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(mustKubectl(t, "", "get", "nodes", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	var out []node
	for _, it := range list.Items {
		n := node{name: it.Metadata.Name, podCIDR: it.Spec.PodCIDR}
		for _, a := range it.Status.Addresses {
			if a.Type == "InternalIP" {
				n.ip = a.Address
			}
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// TestMultiNode runs deploy/ on a cluster of two or more nodes (make
// e2e-cluster NODES=N): node 1 in the host's network namespace, the others
// each in one of their own (hack/cluster-up.sh), so that every connection
// between pods of two nodes leaves one node's tables and enters another's.
// A policy on the destination's side is enforced by the destination
// node's agent, one on the source's side by the source node's; a Service's
// endpoints on every node are reached from every node, and a NodePort on
// every node's address.
func TestMultiNode(t *testing.T) {
	if _, err := os.Stat(kubeconfig); err != nil {
		t.Fatalf("no cluster (%v): run make e2e-cluster NODES=2", err)
	}
	mustKubectl(t, "", "wait", "--for=condition=Ready", "node", "--all", "--timeout=60s")
	nodes := clusterNodes(t)
	if len(nodes) < 2 {
		t.Skipf("one node: make e2e-cluster NODES=2 (or more) runs this test")
	}
	for _, n := range nodes {
		t.Logf("node %s at %s, pods %s", n.name, n.ip, n.podCIDR)
	}

	deployNetpol(t)
	// One Ready agent on every node.
	eventually(t, 120*time.Second, "an agent Ready on every node", func() error {
		out := mustKubectl(t, "", "-n", "netpol-system", "get", "pods", "-l", "app.kubernetes.io/name=netpol", "-o",
			`jsonpath={range .items[*]}{.spec.nodeName}={.status.containerStatuses[0].ready}{"\n"}{end}`)
		ready := map[string]bool{}
		for _, l := range strings.Fields(out) {
			if name, ok := strings.CutSuffix(l, "=true"); ok {
				ready[name] = true
			}
		}
		for _, n := range nodes {
			if !ready[n.name] {
				return fmt.Errorf("agents ready on %v, not on %s", keys(ready), n.name)
			}
		}
		return nil
	})
	// Each agent programs its own node's network namespace: one netpol
	// table in each.
	for i, n := range nodes {
		args := []string{"nft", "list", "tables"}
		if i > 0 {
			args = append([]string{"nsenter", "--net=/run/netns/" + n.name, "--"}, args...)
		}
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "netpol") {
			t.Fatalf("node %s: no netpol table (%v): %s", n.name, err, out)
		}
	}

	ns := testNamespace(t, "np-multi")
	// On every node: a server and two clients (role a and b), placed by
	// nodeName.
	var pods strings.Builder
	for i, n := range nodes {
		for _, p := range []struct{ name, labels, ports string }{
			{"server", "app: server", `"80", "81"`}, {"a", "role: a", `"80"`}, {"b", "role: b", `"80"`},
		} {
			fmt.Fprintf(&pods, `---
apiVersion: v1
kind: Pod
metadata: {name: %s-%d, namespace: %s, labels: {%s}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - {name: probe, image: netpol.local/probe:dev, imagePullPolicy: IfNotPresent, args: [serve, %s]}
`, p.name, i+1, ns, p.labels, n.name, p.ports)
		}
	}
	mustKubectl(t, pods.String(), "apply", "-f", "-")
	mustKubectl(t, "", "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=180s")
	servers := map[string]string{} // server-i -> its address
	for i := range nodes {
		name := fmt.Sprintf("server-%d", i+1)
		servers[name] = strings.TrimSpace(mustKubectl(t, "", "-n", ns, "get", "pod", name, "-o", "jsonpath={.status.podIP}"))
	}
	// cells: every client of role to every server, on port.
	cells := func(role string, port int, allowed bool) []cell {
		var out []cell
		for i := range nodes {
			for j := range nodes {
				out = append(out, cell{fmt.Sprintf("%s-%d", role, i+1), fmt.Sprintf("%s:%d", servers[fmt.Sprintf("server-%d", j+1)], port), allowed})
			}
		}
		return out
	}
	both := func(a, b []cell) []cell { return append(append([]cell(nil), a...), b...) }

	expect(t, ns, "no policy: every client reaches every server, across nodes", both(cells("a", 80, true), cells("b", 80, true)))

	// Ingress, decided on the server's node.
	mustKubectl(t, serversFromA(ns, "servers-from-a"), "apply", "-f", "-")
	expect(t, ns, "ingress policy on the servers' nodes", both(both(cells("a", 80, true), cells("a", 81, false)), cells("b", 80, false)))
	mustKubectl(t, "", "-n", ns, "delete", "networkpolicy", "servers-from-a")

	// Egress, decided on the client's node.
	mustKubectl(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-no-egress, namespace: %s}
spec:
  podSelector: {matchLabels: {role: b}}
  policyTypes: [Egress]
`, ns), "apply", "-f", "-")
	expect(t, ns, "egress policy on the clients' nodes", both(cells("a", 80, true), cells("b", 80, false)))

	// A ClusterIP Service with an endpoint on every node: every node's
	// clients are answered by every server.
	vip, nodePort := serverService(t, ns, "servers")
	var svc []cell
	for i := range nodes {
		svc = append(svc, cell{fmt.Sprintf("a-%d", i+1), vip, true}, cell{fmt.Sprintf("b-%d", i+1), vip, false})
		for _, n := range nodes {
			// NodePort on every node's address, from every node: the
			// connection is masqueraded to the address of the node it
			// entered, where the endpoint may be on another node.
			svc = append(svc, cell{fmt.Sprintf("a-%d", i+1), n.ip + ":" + nodePort, true},
				cell{fmt.Sprintf("b-%d", i+1), n.ip + ":" + nodePort, false})
		}
	}
	expect(t, ns, "ClusterIP and NodePort across nodes", svc)
	for i := range nodes {
		from := fmt.Sprintf("a-%d", i+1)
		seen := map[string]bool{}
		for try := 0; try < 60 && len(seen) < len(nodes); try++ {
			if out, err := probe(t, ns, from, vip); err == nil {
				seen[out] = true
			}
		}
		if len(seen) != len(nodes) {
			t.Errorf("%s: ClusterIP answered by %v, want a server on each of the %d nodes", from, keys(seen), len(nodes))
		} else {
			t.Logf("%s (node %s): ClusterIP answered by %v", from, nodes[i].name, keys(seen))
		}
	}
	mustKubectl(t, "", "-n", ns, "delete", "networkpolicy", "b-no-egress")

	// An Admin ClusterNetworkPolicy denying the servers' ingress from a,
	// over the NetworkPolicy tier: decided on the servers' nodes.
	cnp := "np-multi-deny-" + ns
	mustKubectl(t, fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - name: deny-a
    action: Deny
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {role: a}}}}]
`, cnp, ns), "apply", "-f", "-")
	t.Cleanup(func() {
		kubectl(t, "", "delete", "clusternetworkpolicies.policy.networking.k8s.io", cnp, "--ignore-not-found")
	})
	expect(t, ns, "Admin Deny on the servers' nodes", both(cells("a", 80, false), cells("b", 80, true)))
	mustKubectl(t, "", "delete", "clusternetworkpolicies.policy.networking.k8s.io", cnp)
	expect(t, ns, "policies gone", both(cells("a", 80, true), cells("b", 81, true)))

	// The conformance suite's cluster runner, its base's two nodes on two
	// of the cluster's.
	t.Run("conformance cluster runner", testConformanceRunner)
}
