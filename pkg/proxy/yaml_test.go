package proxy

import (
	"testing"

	"github.com/netpol/netpol/pkg/cluster"
)

// TestFromYAML builds the model from manifests as the cluster loader reads
// them (no API server defaulting: the slice port has no protocol).
func TestFromYAML(t *testing.T) {
	const manifests = `
apiVersion: v1
kind: Node
metadata: {name: n1, labels: {topology.kubernetes.io/zone: z1}}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}, {type: Hostname, address: n1}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ipFamilies: [IPv4]
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{name: http, protocol: TCP, port: 80, targetPort: web, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.1.1]
  nodeName: n1
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: ns, name: web-1}
- addresses: [10.0.2.1]
  nodeName: n2
  conditions: {ready: false, serving: true, terminating: true}
  targetRef: {kind: Pod, namespace: ns, name: web-2}
`
	snap := cluster.New()
	if r := snap.AddDocuments([]byte(manifests), "test.yaml", false); len(r.Errors) > 0 {
		t.Fatalf("load: %v", r.Errors)
	}
	m := Build(snap, "n1", Options{})
	noErrors(t, m)
	if len(m.NodePortAddresses) != 1 || m.NodePortAddresses[0].String() != "192.168.0.1" || m.Zone != "z1" {
		t.Errorf("node: zone %q addresses %v", m.Zone, m.NodePortAddresses)
	}
	p := port(t, m, "web", "http", v4)
	if p.NodePort != 30080 || !p.ExternalPolicyLocal || p.HealthCheckNodePort != 0 {
		t.Errorf("port %+v", p)
	}
	if got := names(p.InternalEndpoints()); got != "web-1@10.0.1.1:8080" {
		t.Errorf("internal %q", got)
	}
	if got := names(p.ExternalEndpoints()); got != "web-1@10.0.1.1:8080" {
		t.Errorf("external %q", got)
	}
}
