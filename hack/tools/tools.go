//go:build tools

// Package tools pins the binaries that hack/ builds from this module.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
