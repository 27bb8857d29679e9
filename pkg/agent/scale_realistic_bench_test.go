package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// realisticEvents are BenchmarkAgentEvents' events on the realistic shape
// (internal/synth, realistic.go), as such clusters see them:
//   - pod-add: a Deployment scaled up: a replica of a running pod (its
//     labels and ports, so an identity that exists) on the same node, at
//     an unused address of the node's pod network; pod-delete removes
//     them;
//   - pod-label-rollout: a rollout's new pod-template-hash, a label no
//     selector reads;
//   - pod-label: the pod's app.kubernetes.io/component changed to another
//     component: it leaves some policies' peers and joins others';
//   - namespace-label: a team namespace's pci label flipped (database
//     protection policies read it);
//   - networkpolicy-add: an allow rule from a team's namespaces to a
//     component, on a port;
//   - clusternetworkpolicy-add: an Admin Deny from dev namespaces to a
//     team's namespaces, on a port.
var realisticEvents = []scaleEvent{
	{"pod-add", func(sb *scaleBench, i int) (func() error, error) {
		p, err := sb.replica(i)
		if err != nil {
			return nil, err
		}
		sb.added = append(sb.added, p.Namespace+"/"+p.Name)
		return func() error {
			_, err := sb.h.kube.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
			return err
		}, nil
	}},
	scaleEvents[1], // pod-delete
	{"pod-label-rollout", func(sb *scaleBench, i int) (func() error, error) {
		p, err := sb.modelPod(i)
		if err != nil {
			return nil, err
		}
		p.Labels["pod-template-hash"] = fmt.Sprintf("bench%d", i)
		return sb.updatePod(p), nil
	}},
	{"pod-label", func(sb *scaleBench, i int) (func() error, error) {
		p, err := sb.modelPod(i)
		if err != nil {
			return nil, err
		}
		components := []string{"frontend", "api", "backend", "worker", "database", "cache"}
		const key = "app.kubernetes.io/component"
		if j := slices.Index(components, p.Labels[key]); j >= 0 {
			p.Labels[key] = components[(j+1)%len(components)]
		} else {
			p.Labels[key] = components[i%len(components)] // a platform pod's
		}
		return sb.updatePod(p), nil
	}},
	{"namespace-label", func(sb *scaleBench, i int) (func() error, error) {
		ns, err := sb.h.kube.CoreV1().Namespaces().Get(context.Background(), sb.namespaces[i%len(sb.namespaces)], metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if ns.Labels["pci"] == "true" {
			ns.Labels["pci"] = "false"
		} else {
			ns.Labels["pci"] = "true"
		}
		return func() error {
			_, err := sb.h.kube.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{})
			return err
		}, nil
	}},
	{"networkpolicy-add", func(sb *scaleBench, i int) (func() error, error) {
		ns, err := sb.h.kube.CoreV1().Namespaces().Get(context.Background(), sb.namespaces[(i*7)%len(sb.namespaces)], metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return sb.createAllow(i, ns.Name, map[string]string{"app.kubernetes.io/component": "backend"}, ns.Labels["team"]), nil
	}},
	{"clusternetworkpolicy-add", func(sb *scaleBench, i int) (func() error, error) {
		ns, err := sb.h.kube.CoreV1().Namespaces().Get(context.Background(), sb.namespaces[(i*13)%len(sb.namespaces)], metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return sb.createDevDeny(i, ns.Labels["team"]), nil
	}},
}

// modelPod is the current version of the i-th model pod (spread over the
// cluster), from the API.
func (sb *scaleBench) modelPod(i int) (*corev1.Pod, error) {
	m := sb.models[(i*7919)%len(sb.models)]
	return sb.h.kube.CoreV1().Pods(m.Namespace).Get(context.Background(), m.Name, metav1.GetOptions{})
}

func (sb *scaleBench) updatePod(p *corev1.Pod) func() error {
	return func() error {
		_, err := sb.h.kube.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{})
		return err
	}
}

// replica is pod-add's i-th pod: a copy of a model pod on its node, at
// the node pod network's next unused host number counted down from the
// top (synth numbers from the bottom).
func (sb *scaleBench) replica(i int) (*corev1.Pod, error) {
	m := sb.models[(i*7919)%len(sb.models)]
	addr, err := netip.ParseAddr(m.Status.PodIP)
	if err != nil || !addr.Is4() {
		return nil, fmt.Errorf("model pod %s/%s: address %q", m.Namespace, m.Name, m.Status.PodIP)
	}
	node := m.Spec.NodeName
	host := 254 - sb.free[node]
	sb.free[node]++
	if host < 160 {
		return nil, fmt.Errorf("node %s: no unused address left for replicas", node)
	}
	a := addr.As4()
	a[3] = byte(host)
	ip := netip.AddrFrom4(a).String()
	p := m.DeepCopy()
	p.ResourceVersion = ""
	p.Name = fmt.Sprintf("%s-bench-%d", strings.TrimSuffix(m.Name, "-"), i)
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	return p, nil
}
