#!/usr/bin/env bash
# make conformance-upstream: Kubernetes' own sig-network e2e tests, unmodified,
# live against netpol on make cluster-up's cluster (issue 37; root; not in
# CI). Brings a cluster up with the upstream images and the cluster DNS
# (hack/e2e-images.sh) and takes it down at the end, unless KEEP_CLUSTER is
# set (then a cluster that is up is used, and left up), deploys
# deploy/, builds e2e.test from the k8s.io/kubernetes module (hack/e2e-upstream,
# cached by its sources), runs each suite and writes
# _output/conformance-upstream/: summary.json ([{"suite", "version",
# "passed", "failed", "skipped", "skippedWhy", "nodes"}]) and each suite's
# JUnit (SUITE/junit_01.xml) and log.
#
# Suites (SUITES, comma-separated; default netpol,services):
#   netpol       [sig-network] Netpol
#   services     [sig-network] Services ... [Conformance]
#   sig-network  [sig-network], less what kube-proxy replacements skip
#                (kpng's e2e list: machinery|Feature|Federation|
#                PerformanceDNS|Disruptive|Serial|LoadBalancer|KubeProxy|
#                GCE|Netpol|NetworkPolicy); about half an hour or more
# SCTP is skipped where the kernel has no SCTP sockets.
# The cluster has one node for now: what needs two is skipped by the
# suites themselves, and said in skippedWhy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. hack/cluster/common.sh
log() { echo "conformance-upstream: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "root is needed (the cluster)"; exit 1; }

out=$root/_output/conformance-upstream
mkdir -p "$out"
suites=${SUITES:-netpol,services}
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' hack/tools/go.mod)
start=$(date +%s)

hack/e2e-images.sh
mapfile -t bins < <(hack/build-kube-tools.sh kubectl)
KUBECTL=${bins[0]}
mkdir -p "$out/bin"
ln -sf "$KUBECTL" "$out/bin/kubectl"
export PATH="$out/bin:$PATH" # the Services tests run kubectl exec

# e2e.test, built again only when its sources change.
stamp=$(cat hack/e2e-upstream/go.mod hack/e2e-upstream/go.sum hack/e2e-upstream/*.go | sha256sum | cut -c1-16)
e2e=$root/_output/tools/$version/e2e.test-$stamp
if [ ! -x "$e2e" ]; then
	log "building e2e.test ($version)"
	(cd hack/e2e-upstream && go test -c -o "$e2e" .)
fi

if [ -z "${KEEP_CLUSTER:-}" ] || [ ! -f "$CLUSTER_DIR/up" ]; then
	# A cluster of its own, with the images just built; down at the end
	# unless KEEP_CLUSTER is set.
	hack/cluster-down.sh
	hack/cluster-up.sh
fi
if [ -z "${KEEP_CLUSTER:-}" ]; then
	trap 'hack/cluster-down.sh >&2 || true' EXIT
fi
kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }
kc apply -k deploy/ >/dev/null
kc -n netpol-system create configmap kubernetes-services-endpoint \
	--from-literal=KUBERNETES_SERVICE_HOST="$NODE_IP" --from-literal=KUBERNETES_SERVICE_PORT="$APISERVER_PORT" \
	--dry-run=client -o yaml | kc apply -f - >/dev/null
kc -n netpol-system rollout status daemonset/netpol-agent --timeout=180s >/dev/null
if kc -n kube-system get deployment coredns >/dev/null 2>&1; then
	kc -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null
fi
nodes=$(kc get nodes -o name | wc -l)
netpol_version=$(kc -n netpol-system get daemonset netpol-agent -o jsonpath='{.spec.template.spec.containers[0].image}')
log "cluster: $nodes node(s), netpol $netpol_version"

sctp_skip=
if ! python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)' 2>/dev/null; then
	sctp_skip='|SCTP'
fi
run_suite() { # NAME FOCUS SKIP
	local name=$1 focus=$2 skip=$3
	rm -rf "${out:?}/$name"
	mkdir -p "$out/$name"
	log "$name: --ginkgo.focus='$focus' --ginkgo.skip='$skip'"
	local t0
	t0=$(date +%s)
	set +e
	"$e2e" --provider=skeleton --kubeconfig="$KUBECONFIG" --report-dir="$out/$name" --disable-log-dump \
		--ginkgo.focus="$focus" --ginkgo.skip="$skip" --ginkgo.no-color -test.timeout=0 >"$out/$name/log" 2>&1
	local rc=$?
	set -e
	log "$name: exit $rc in $(($(date +%s) - t0)) s ($out/$name/log)"
	[ $rc = 0 ] || failed+=("$name")
}
failed=()
declare -A focus=(
	[netpol]='\[sig-network\] Netpol'
	[services]='\[sig-network\] Services.*\[Conformance\]'
	[sig-network]='\[sig-network\]'
)
declare -A skip=(
	[sig-network]='machinery|Feature|Federation|PerformanceDNS|Disruptive|Serial|LoadBalancer|KubeProxy|GCE|Netpol|NetworkPolicy'
)
IFS=, read -ra want <<<"$suites"
summary=()
for s in "${want[@]}"; do
	[ -n "${focus[$s]:-}" ] || { log "unknown suite $s (${!focus[*]})"; exit 2; }
	run_suite "$s" "${focus[$s]}" "${skip[$s]:-NOTHING}$sctp_skip"
	summary+=(-suite "$s=${focus[$s]}")
	if [ -n "${skip[$s]:-}" ]; then
		summary+=(-skip "${skip[$s]}=--ginkgo.skip: what kube-proxy replacements skip (kpng's e2e list)")
	fi
done
if [ -n "$sctp_skip" ]; then
	summary+=(-skip "SCTP=--ginkgo.skip SCTP: this kernel has no SCTP sockets")
fi

# summary.json from this run's JUnit files.
go run ./hack/conformance-summary -dir "$out" -version "$version" -nodes "$nodes" "${summary[@]}" >"$out/summary.json"
cat "$out/summary.json"
log "done in $(($(date +%s) - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	log "failed: ${failed[*]}"
	exit 1
fi
