//go:build tools

// Package tools pins the binaries that hack/ builds from this module
// (hack/build-kube-tools.sh): kube-apiserver for the e2e environment, and
// the rest of a one-node cluster for make cluster-up (hack/cluster-up.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
