//go:build tools

// Package tools pins CoreDNS, the cluster DNS of make cluster-up, at the
// version kubeadm of hack/tools' Kubernetes version installs (its
// cmd/kubeadm/app/constants CoreDNSVersion): hack/e2e-images.sh builds it.
// A module of its own: CoreDNS's dependencies never reach netpol's.
package tools

import _ "github.com/coredns/coredns"
