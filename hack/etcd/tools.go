//go:build tools

// Package etcd pins the etcd server that hack/build-etcd.sh builds for
// `make bench-scale`: a release whose watch progress requests let
// kube-apiserver serve WatchList streams (Debian's etcd 3.4.23 does not),
// as a cluster on a supported etcd does. A module of its own: etcd's
// dependencies are not kube-apiserver's.
package etcd

import _ "go.etcd.io/etcd/server/v3"
