#!/usr/bin/env bash
# hack/cluster-restart.sh NAME: restart one daemon of make cluster-up's
# cluster (kubelet, containerd, kube-apiserver, ...) with the command line
# it was started with, as a node's service manager would. Root; takes the
# lab lock unless the caller holds it (make e2e-cluster's test does).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/cluster/common.sh
[ $# -eq 1 ] || die "usage: hack/cluster-restart.sh NAME (one of: $(cd "$RUN" 2>/dev/null && ls *.cmd | sed 's/\.cmd$//' | tr '\n' ' '))"
name=$1
[ -f "$RUN/$name.cmd" ] || die "no $RUN/$name.cmd: is the cluster up (make cluster-up), and is $name one of its daemons?"
take_lock "$0" "$@"
mapfile -d '' argv <"$RUN/$name.cmd"
stop "$name"
start "$name" "${argv[@]}"
log "$name restarted (pid $(cat "$RUN/$name.pid"))"
