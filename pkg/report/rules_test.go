package report

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/netpol/netpol/pkg/cluster"
	"github.com/netpol/netpol/pkg/eval"
	"github.com/netpol/netpol/pkg/policy"
)

func TestPeer(t *testing.T) {
	sel := labels.SelectorFromSet(labels.Set{"env": "dev"})
	tests := []struct {
		peer policy.Peer
		want string
	}{
		{policy.Peer{Kind: policy.PeerIPBlock, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			Except: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.0/16")}},
			"ipBlock 10.0.0.0/8 except 10.1.0.0/16, 10.2.0.0/16"},
		{policy.Peer{Kind: policy.PeerPods, Namespaces: sel, Pods: labels.Everything()}, "every pod in namespaces {env=dev}"},
		{policy.Peer{Kind: policy.PeerPods, Namespace: "x", Pods: sel}, "pods {env=dev} in namespace x"},
		{policy.Peer{Kind: policy.PeerPods, Namespaces: labels.Everything(), Pods: labels.Nothing()}, "pods (none) in namespaces (all)"},
		{policy.Peer{Kind: policy.PeerNodes, Nodes: sel}, "nodes {env=dev}"},
		{policy.Peer{Kind: policy.PeerDomainNames, DomainNames: []string{"*.example.com", "a.org"}}, "domainNames *.example.com, a.org"},
	}
	for _, tt := range tests {
		if got := Peer(tt.peer); got != tt.want {
			t.Errorf("Peer = %q, want %q", got, tt.want)
		}
	}
}

// Wanted names what a rule that did not match wanted; named ports are
// resolved on the destination pod.
func TestWanted(t *testing.T) {
	snap := cluster.New()
	snap.Pods = append(snap.Pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "y", Name: "b"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}})
	p := &policy.Policy{Kind: "NetworkPolicy", Namespace: "y", Name: "np"}
	p.Rules[policy.Ingress] = []policy.Rule{
		{Index: 0, Ports: []policy.Port{{Name: "http"}, {Protocol: corev1.ProtocolUDP, Start: 53, End: 53}}, AllPeers: true},
		{Index: 1, Peers: []policy.Peer{{Kind: policy.PeerIPBlock, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}, AllPorts: true},
		{Index: 2, Ports: []policy.Port{{Name: "metrics"}}, AllPeers: true},
	}
	r := NewRules(&policy.Model{Policies: []*policy.Policy{p}}, snap)
	tests := []struct {
		rule, why, dst, want string
	}{
		{"ingress[0]", "port did not match", "y/b", "wanted named port http = TCP/8080 on y/b, UDP/53"},
		{"ingress[1]", "peer did not match", "y/b", "wanted ipBlock 10.0.0.0/8"},
		{"ingress[2]", "port did not match", "y/b", "wanted named port metrics (not declared on y/b: matches nothing)"},
		{"ingress[0]", "port did not match", "10.0.0.1", "wanted named port http (resolved only on a destination pod), UDP/53"},
		{"ingress[1]", "subject not selected", "y/b", ""},
		{"ingress[9]", "port did not match", "y/b", ""},
	}
	for _, tt := range tests {
		if got := r.Wanted("NetworkPolicy y/np", tt.rule, tt.why, tt.dst); got != tt.want {
			t.Errorf("%s %s: %q, want %q", tt.rule, tt.why, got, tt.want)
		}
	}
	if got := (*Rules)(nil).Wanted("NetworkPolicy y/np", "ingress[0]", "port did not match", "y/b"); got != "" {
		t.Errorf("nil Rules: %q", got)
	}
}

// A table that does not hold every cell (only the denied ones) is printed
// as a list, not as a matrix that would show missing cells as denied.
func TestTableFilteredIsAList(t *testing.T) {
	table := &eval.TruthTable{Pods: []string{"x/a", "y/b"}, Ports: []string{"tcp/80"}, Results: []eval.Result{
		{From: "x/a", To: "y/b", Protocol: corev1.ProtocolTCP, Port: 80},
	}}
	var buf bytes.Buffer
	TruthTable(&buf, table, Style{})
	want := "x/a -> y/b TCP/80: DENIED\n\n1 cell(s) shown, 1 denied, of 2 pods x 2 pods x 1 ports\n"
	if buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
	table.Results = append(table.Results, eval.Result{From: "x/a", To: "x/a", Protocol: corev1.ProtocolTCP, Port: 80, Allowed: true},
		eval.Result{From: "y/b", To: "x/a", Protocol: corev1.ProtocolTCP, Port: 80}, eval.Result{From: "y/b", To: "y/b", Protocol: corev1.ProtocolTCP, Port: 80, Allowed: true})
	buf.Reset()
	TruthTable(&buf, table, Style{})
	if !strings.HasPrefix(buf.String(), "tcp/80 x/a y/b") {
		t.Errorf("a full table is a matrix:\n%s", buf.String())
	}
}
