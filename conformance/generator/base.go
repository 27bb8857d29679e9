package generator

import (
	"fmt"
	"strings"

	"github.com/netpol/netpol/pkg/cluster"
)

// The base cluster: the cyclonus model (namespaces x, y, z with pods a, b, c
// serving 80 and 81 on TCP, UDP and SCTP) on two nodes, plus one
// host-network pod h/h on node-1, and one host outside the cluster
// (OutsideAddr). IPv4 only, so every probe is one cell.
const (
	node1IP   = "172.18.0.2"
	node2IP   = "172.18.0.3"
	node1CIDR = "10.244.1.0/24"
	node2CIDR = "10.244.2.0/24"
	podsCIDR  = "10.244.0.0/16"
	nodesCIDR = "172.18.0.0/16"
	// outsideCIDR is TEST-NET-1, outside every other CIDR of the base:
	// OutsideAddr is its one endpoint.
	outsideCIDR = "192.0.2.0/24"
)

// OutsideAddr is the base's endpoint outside the cluster, in outsideCIDR:
// no object of the base, but a host the runner makes (the lab's outside)
// that serves the probe ports and is probed from and to every pod, so
// that peers naming the outside (an ipBlock or networks peer of
// outsideCIDR or 0.0.0.0/0, with or without exceptions) are observed, not
// only compiled. In tables it is a pod named by the address.
const OutsideAddr = "192.0.2.10"

// Namespaces and pods of the base (pod-network pods only).
var (
	baseNamespaces = []string{"x", "y", "z"}
	basePods       = []string{"a", "b", "c"}
)

type basePod struct {
	ns, name, node, ip string
}

// podTable places the nine pods over both nodes: a and c of x and z, and b
// of y, on node-1; the rest on node-2.
func podTable() []basePod {
	var out []basePod
	for i, ns := range baseNamespaces {
		for j, name := range basePods {
			node, subnet := 1, "10.244.1."
			if (i+j)%2 == 1 {
				node, subnet = 2, "10.244.2."
			}
			out = append(out, basePod{ns, name, fmt.Sprintf("node-%d", node), fmt.Sprintf("%s%d", subnet, 10*(i+1)+j)})
		}
	}
	return out
}

// podIP is the address of a base pod ("x/a").
func podIP(ref string) string {
	for _, p := range podTable() {
		if p.ns+"/"+p.name == ref {
			return p.ip
		}
	}
	panic("no base pod " + ref)
}

func nodeIP(node string) string {
	if node == "node-1" {
		return node1IP
	}
	return node2IP
}

const nodeTemplate = `apiVersion: v1
kind: Node
metadata:
  name: %[1]s
  labels:
    kubernetes.io/hostname: %[1]s
    kubernetes.io/os: linux
    rack: %[2]s
spec:
  podCIDR: %[3]s
  podCIDRs: [%[3]s]
status:
  addresses:
  - {type: InternalIP, address: %[4]s}
  - {type: Hostname, address: %[1]s}
`

func namespaceYAML(name string, labels map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %q\n  labels:\n", name)
	for _, k := range sortedKeys(labels) {
		fmt.Fprintf(&b, "    %s: %q\n", k, labels[k])
	}
	return b.String()
}

// baseNamespaceLabels are a namespace's labels in the base.
func baseNamespaceLabels(name string) map[string]string {
	return map[string]string{"ns": name, "kubernetes.io/metadata.name": name}
}

// podYAML is a pod-network pod serving 80 and 81 on every protocol.
func podYAML(ns, name, node, ip string, labels map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: %q\n  labels:\n", name, ns)
	for _, k := range sortedKeys(labels) {
		fmt.Fprintf(&b, "    %s: %q\n", k, labels[k])
	}
	fmt.Fprintf(&b, "spec:\n  nodeName: %s\n  containers:\n  - name: cont-80-81\n    image: registry.k8s.io/e2e-test-images/agnhost:2.53\n    ports:\n", node)
	for _, proto := range []string{"TCP", "UDP", "SCTP"} {
		for _, port := range []int{80, 81} {
			fmt.Fprintf(&b, "    - {name: serve-%d-%s, containerPort: %d, protocol: %s}\n", port, strings.ToLower(proto), port, proto)
		}
	}
	fmt.Fprintf(&b, "status:\n  phase: Running\n  podIP: %s\n  podIPs:\n  - ip: %s\n  hostIP: %s\n", ip, ip, nodeIP(node))
	return b.String()
}

// basePodYAML is base pod ns/name with the given labels (nil: its base
// labels).
func basePodYAML(ns, name string, labels map[string]string) string {
	if labels == nil {
		labels = map[string]string{"pod": name}
	}
	for _, p := range podTable() {
		if p.ns == ns && p.name == name {
			return podYAML(ns, name, p.node, p.ip, labels)
		}
	}
	panic("no base pod " + ns + "/" + name)
}

const hostPodYAML = `apiVersion: v1
kind: Pod
metadata:
  name: h
  namespace: "h"
  labels:
    pod: h
spec:
  nodeName: node-1
  hostNetwork: true
  containers:
  - name: cont-80-81
    image: registry.k8s.io/e2e-test-images/agnhost:2.53
    ports:
    - {name: serve-80-tcp, containerPort: 80, hostPort: 80, protocol: TCP}
    - {name: serve-81-tcp, containerPort: 81, hostPort: 81, protocol: TCP}
    - {name: serve-80-udp, containerPort: 80, hostPort: 80, protocol: UDP}
    - {name: serve-81-udp, containerPort: 81, hostPort: 81, protocol: UDP}
    - {name: serve-80-sctp, containerPort: 80, hostPort: 80, protocol: SCTP}
    - {name: serve-81-sctp, containerPort: 81, hostPort: 81, protocol: SCTP}
status:
  phase: Running
  podIP: ` + node1IP + `
  podIPs:
  - ip: ` + node1IP + `
  hostIP: ` + node1IP + `
`

// baseDocs are the base objects, one YAML document each.
func baseDocs() []string {
	docs := []string{
		fmt.Sprintf(nodeTemplate, "node-1", BaseNodeRack("node-1"), node1CIDR, node1IP),
		fmt.Sprintf(nodeTemplate, "node-2", BaseNodeRack("node-2"), node2CIDR, node2IP),
	}
	for _, ns := range baseNamespaces {
		docs = append(docs, namespaceYAML(ns, baseNamespaceLabels(ns)))
	}
	docs = append(docs, namespaceYAML("h", baseNamespaceLabels("h")))
	for _, p := range podTable() {
		docs = append(docs, basePodYAML(p.ns, p.name, nil))
	}
	return append(docs, hostPodYAML)
}

// BaseYAML is the base cluster as one multi-document YAML stream.
func BaseYAML() string {
	return "# netpol conformance base: namespaces x, y, z (labels ns=<name>) with pods a, b, c\n" +
		"# (labels pod=<name>) serving 80 and 81 on TCP, UDP and SCTP, over node-1 and node-2;\n" +
		"# the host-network pod h/h on node-1 (address " + node1IP + "). Outside the cluster, the\n" +
		"# host " + OutsideAddr + " (in " + outsideCIDR + ", no object here) serves the same ports.\n" +
		strings.Join(baseDocs(), "---\n")
}

// Base is a fresh snapshot of the base cluster.
func Base() *cluster.Snapshot {
	snap := cluster.New()
	if report := snap.AddDocuments([]byte(BaseYAML()), "generator base", false); len(report.Errors) > 0 {
		panic(fmt.Sprintf("generator: base does not load: %v", report.Errors))
	}
	return snap
}
