package lab

import (
	"slices"
	"strings"
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/ipfamily"
)

const podTemplate = `
apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: "NS", labels: {pod: NAME}}
spec:
  nodeName: NODE
  hostNetwork: HOSTNET
  containers:
  - name: c
    ports:
    - {containerPort: PORT, protocol: TCP}
    - {containerPort: UPORT, protocol: UDP}
status:
  phase: Running
  podIPs: [IPS]
`

// podYAML is a running pod serving tcp/<tcp> and udp/<udp>.
func podYAML(ns, name, node string, hostNetwork bool, tcp, udp string, ips ...string) string {
	var list []string
	for _, ip := range ips {
		list = append(list, `{ip: "`+ip+`"}`)
	}
	hn := "false"
	if hostNetwork {
		hn = "true"
	}
	return strings.NewReplacer("NAME", name, "NS", ns, "NODE", node, "HOSTNET", hn, "UPORT", udp, "PORT", tcp,
		"IPS", strings.Join(list, ", ")).Replace(podTemplate)
}

const node3 = `
apiVersion: v1
kind: Node
metadata: {name: node-3}
spec: {podCIDR: 10.244.3.0/24}
status:
  addresses: [{type: InternalIP, address: 172.18.0.4}]
`

func TestUpdate(t *testing.T) {
	base := loadBase(t, "hostnet.yaml")
	l := upLab(t, base, Options{})
	node1 := l.Node("node-1").NetNS
	podNS := map[string]string{}
	for _, p := range l.Pods() {
		podNS[p.Name] = p.NetNS
	}

	next := loadBase(t, "hostnet.yaml")
	next.Delete(cluster.ObjectKey{Kind: cluster.KindPod, Namespace: "y", Name: "b"})
	next.Pod("x", "a").Labels["changed"] = "yes" // needs nothing
	addYAML(t, next, strings.Join([]string{
		podYAML("x", "b", "node-2", false, "80", "81", "10.244.2.12"), // new address: recreated
		podYAML("x", "new", "node-2", false, "80", "81", "10.244.2.40"),
		podYAML("x", "h3", "node-1", true, "8080", "8081", "172.18.0.2"), // a second host-network pod on node-1
		node3,
		podYAML("y", "c", "node-3", false, "80", "81", "10.244.3.10"),
		podYAML("y", "odd", "node-2", false, "80", "81", "10.99.0.5"), // in no podCIDR: host routes
		// IPv6 on IPv4-only nodes: they get synthetic IPv6 next hops.
		podYAML("z", "six", "node-1", false, "80", "81", "fd00:99::6"),
		podYAML("z", "six2", "node-3", false, "80", "81", "fd00:99::7"),
	}, "\n---\n"))
	if err := l.Update(t.Context(), next); err != nil {
		t.Fatalf("Update: %v", err)
	}

	probes := mustProbes(t, "tcp/80", "udp/81")
	for _, family := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
		opts := eval.TruthTableOptions{Probes: probes, Family: family}
		got, _ := probeLab(t, l, ProbeOptions{Probes: probes, Family: family})
		sameTable(t, evalTable(next, opts), got)
	}
	o, err := l.ProbeOne(t.Context(), "y/c", "x/h3", mustProbes(t, "tcp/8080")[0], ipfamily.IPv4)
	if err != nil || o.Reply != "x/h3" {
		t.Errorf("y/c -> x/h3 tcp/8080: %+v, %v; want a reply from x/h3", o, err)
	}

	if got := l.Node("node-1").NetNS; got != node1 {
		t.Errorf("node-1 moved from %s to %s: node namespaces must survive Update", node1, got)
	}
	after := map[string]string{}
	for _, p := range l.Pods() {
		after[p.Name] = p.NetNS
	}
	if after["x/a"] != podNS["x/a"] {
		t.Errorf("x/a was recreated (%s -> %s) for a label change", podNS["x/a"], after["x/a"])
	}
	if after["x/b"] == podNS["x/b"] {
		t.Errorf("x/b kept namespace %s though its address changed", podNS["x/b"])
	}
	if _, ok := after["y/b"]; ok {
		t.Errorf("y/b is still in the lab")
	}
	if syn := l.Node("node-1").Synthetic; len(syn) != 1 || !syn[0].Is6() {
		t.Errorf("node-1 synthetic addresses %v, want one IPv6 address; notes %v", syn, l.Notes())
	}

	// And back: node-3, the new pods and the synthetic addresses go.
	if err := l.Update(t.Context(), loadBase(t, "hostnet.yaml")); err != nil {
		t.Fatalf("Update back: %v", err)
	}
	got, _ := probeLab(t, l, ProbeOptions{})
	sameTable(t, evalTable(base, eval.TruthTableOptions{}), got)
	var names []string
	for _, n := range l.Nodes() {
		names = append(names, n.Name)
		if len(n.Synthetic) > 0 {
			t.Errorf("node %s keeps synthetic addresses %v", n.Name, n.Synthetic)
		}
	}
	if !slices.Equal(names, []string{"node-1", "node-2"}) {
		t.Errorf("nodes %v after update back", names)
	}
	if left, _ := namespacesWithPrefix(l.Prefix() + "-"); len(left) != 1+2+4 {
		t.Errorf("namespaces after update back: %v, want underlay, 2 nodes and 4 pods", left)
	}
}
