#!/usr/bin/env bash
# make conformance-upstream: Kubernetes' own sig-network e2e tests and
# network-policy-api's conformance suites, unmodified, live against netpol
# on make cluster-up's cluster (issue 37; root; .ci/run runs a slice of
# the v0.3.0 suite, docs/conformance.md the rest). Brings a cluster
# of NODES nodes (default 2 here: network-policy-api's host-network pods
# need two) up with the upstream images and the cluster DNS
# (hack/e2e-images.sh) and takes it down at the end, unless KEEP_CLUSTER is
# set (then a cluster that is up is used, and left up), deploys deploy/,
# builds e2e.test from the k8s.io/kubernetes module (hack/e2e-upstream,
# cached by its sources) and each network-policy-api version's conformance
# test from that module's own sources (its own go.mod; cached by version),
# runs each suite and writes _output/conformance-upstream/: summary.json
# ([{"suite", "version", "passed", "failed", "skipped", "skippedWhy",
# "nodes"}]) and per suite its log and JUnit (SUITE/junit_01.xml) or go
# test events and conformance report (SUITE/report.yaml).
#
# Suites (SUITES, comma-separated; default all five, about 45 minutes on
# two nodes):
#   netpol        [sig-network] Netpol
#   services      [sig-network] Services ... [Conformance]
#   sig-network   [sig-network], less what kube-proxy replacements skip
#                 (kpng's e2e list: machinery|Feature|Federation|
#                 PerformanceDNS|Disruptive|Serial|LoadBalancer|KubeProxy|
#                 GCE|Netpol|NetworkPolicy; and kube-proxy, from Cilium's:
#                 the one spec it adds checks kube-proxy's own status URLs);
#                 on PROCS (default 3) ginkgo processes, about 20 minutes
#   npapi-v0.3.0  network-policy-api v0.3.0 TestConformanceProfiles,
#                 profile ClusterNetworkPolicy, every feature, on that
#                 version's experimental CRD
#   npapi-v0.1.7  network-policy-api v0.1.7 TestConformanceProfiles,
#                 profiles AdminNetworkPolicy,BaselineAdminNetworkPolicy,
#                 every feature, on that version's experimental CRDs
# Where the kernel has no SCTP sockets, what connects over SCTP is skipped
# (found in the suites' own sources) and said in skippedWhy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# Two nodes unless NODES says otherwise (before common.sh, whose default is one).
export NODES=${NODES:-2}
. hack/cluster/common.sh
log() { echo "conformance-upstream: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "root is needed (the cluster)"; exit 1; }

out=$root/_output/conformance-upstream
mkdir -p "$out"
suites=${SUITES:-netpol,services,sig-network,npapi-v0.3.0,npapi-v0.1.7}
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' hack/tools/go.mod)
start=$(date +%s)

hack/e2e-images.sh
mapfile -t bins < <(hack/build-kube-tools.sh kubectl)
KUBECTL=${bins[0]}
mkdir -p "$out/bin"
ln -sf "$KUBECTL" "$out/bin/kubectl"
export PATH="$out/bin:$PATH" # the Services tests run kubectl exec

# e2e.test, built again only when its sources change, when a suite of
# Kubernetes' e2e tests is asked for.
stamp=$(cat hack/e2e-upstream/go.mod hack/e2e-upstream/go.sum hack/e2e-upstream/*.go | sha256sum | cut -c1-16)
e2e=$root/_output/tools/$version/e2e.test-$stamp
if [ ! -x "$e2e" ] && [[ ",$suites," =~ ,(netpol|services|sig-network), ]]; then
	log "building e2e.test ($version)"
	(cd hack/e2e-upstream && go test -c -o "$e2e" .)
fi
# The ginkgo CLI, for the suites run on PROCS parallel processes.
ginkgo=$root/_output/tools/$version/ginkgo-$stamp
if [ ! -x "$ginkgo" ] && [[ ",$suites," =~ ,sig-network, ]]; then
	(cd hack/e2e-upstream && GOWORK=off go build -o "$ginkgo" github.com/onsi/ginkgo/v2/ginkgo)
fi

# network-policy-api's conformance tests, each version built from its own
# module (its k8s.io dependencies are not netpol's), in a copy of the
# module's sources; cached by version.
npapi_src() { # VERSION: the module's directory in the module cache
	(cd / && GOWORK=off GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/network-policy-api@$1" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}
npapi_test() { # VERSION: the conformance test binary
	local v=$1 dir=$root/_output/tools/network-policy-api-$1 src
	local cache=${NETPOL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netpol-tools}/network-policy-api-$1
	if [ ! -x "$dir/conformance.test" ] && [ -x "$cache/conformance.test" ]; then
		mkdir -p "$dir"
		cp "$cache/conformance.test" "$dir/conformance.test.tmp" && mv "$dir/conformance.test.tmp" "$dir/conformance.test"
	fi
	if [ ! -x "$dir/conformance.test" ]; then
		src=$(npapi_src "$v")
		[ -d "$src/conformance" ] || { log "no conformance tests in sigs.k8s.io/network-policy-api@$v ($src)"; exit 1; }
		log "building network-policy-api $v's conformance test"
		rm -rf "$dir/src"
		mkdir -p "$dir"
		cp -r "$src" "$dir/src"
		chmod -R u+w "$dir/src"
		(cd "$dir/src" && GOWORK=off GOFLAGS=-mod=mod go test -c -o "$dir/conformance.test.tmp" ./conformance)
		mv "$dir/conformance.test.tmp" "$dir/conformance.test"
		rm -rf "$dir/src"
		if mkdir -p "$cache" 2>/dev/null && cp "$dir/conformance.test" "$cache/conformance.test.tmp" 2>/dev/null; then
			mv "$cache/conformance.test.tmp" "$cache/conformance.test"
		fi
	fi
	echo "$dir/conformance.test"
}
IFS=, read -ra want <<<"$suites"
for s in "${want[@]}"; do
	case $s in npapi-*) npapi_test "${s#npapi-}" >/dev/null ;; esac
done

if [ -z "${KEEP_CLUSTER:-}" ] || [ ! -f "$CLUSTER_DIR/up" ] || [ "$(cluster_nodes)" != "$NODES" ]; then
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
run_suite() { # NAME FOCUS SKIP PROCS
	local name=$1 focus=$2 skip=$3 procs=$4 t0 rc
	# --num-nodes: the specs that need two nodes read it (the skeleton
	# provider does not count them).
	local args=(--provider=skeleton --kubeconfig="$KUBECONFIG" --report-dir="$out/$name" --disable-log-dump --num-nodes="$nodes")
	rm -rf "${out:?}/$name"
	mkdir -p "$out/$name"
	log "$name: --ginkgo.focus='$focus' --ginkgo.skip='$skip'${procs:+, $procs processes}"
	t0=$(date +%s)
	set +e
	if [ -n "$procs" ]; then
		# The CLI runs a compiled suite only by a name ending in .test.
		ln -sf "$e2e" "$out/bin/e2e.test"
		"$ginkgo" --procs="$procs" --focus="$focus" --skip="$skip" --no-color --timeout=4h "$out/bin/e2e.test" -- "${args[@]}" >"$out/$name/log" 2>&1
	else
		"$e2e" "${args[@]}" --ginkgo.focus="$focus" --ginkgo.skip="$skip" --ginkgo.no-color -test.timeout=0 >"$out/$name/log" 2>&1
	fi
	rc=$?
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
	[sig-network]='machinery|Feature|Federation|PerformanceDNS|Disruptive|Serial|LoadBalancer|KubeProxy|kube-proxy|GCE|Netpol|NetworkPolicy'
)
# The wider set is a hundred and more specs, most of them waiting on pods:
# run on parallel processes (the others one at a time, as measured before).
declare -A procs=([sig-network]=${PROCS:-3})

# run_npapi NAME VERSION PROFILES: one network-policy-api
# conformance run, on that version's experimental CRDs only (the suite
# stops when the policy CRDs' bundle versions differ); deploy/'s CRDs are
# put back afterwards. Where the kernel has no SCTP, the conformance tests
# that connect over SCTP (found in the version's test sources) are left
# out with -test.skip and listed in NAME/not-run, and so are the tests
# that NPAPI_TESTS (a regular expression of test names), when set, does not
# match (hack/conformance-summary writes the suite's report again with them
# skipped, by the version's own rule: npapi_skipped).
policy_crds="adminnetworkpolicies.policy.networking.k8s.io baselineadminnetworkpolicies.policy.networking.k8s.io clusternetworkpolicies.policy.networking.k8s.io"
run_npapi() {
	local name=$1 v=$2 profiles=$3 bin src t0 rc tests=() left=() skip_re= f
	bin=$(npapi_test "$v") src=$(npapi_src "$v")
	rm -rf "${out:?}/$name"
	mkdir -p "$out/$name"
	# shellcheck disable=SC2086
	kc delete crd $policy_crds --ignore-not-found --wait=true >/dev/null
	for f in "$src"/config/crd/experimental/policy.networking.k8s.io_*.yaml; do
		kc apply -f "$f" >/dev/null
		kc wait --for=condition=Established --timeout=60s -f "$f" >/dev/null
	done
	: >"$out/$name/not-run"
	# Every conformance test of the version (its ShortName) with its file,
	# how many of its probes connect over "sctp", and the features it names.
	mapfile -t tests < <(for f in "$src"/conformance/tests/*.go; do
		awk -v file="$(basename "$f")" '
			function out() { if (n != "") print n, file, c, (feat == "" ? "-" : feat) }
			/ShortName:/ { out(); match($0, /"[^"]*"/); n = substr($0, RSTART + 1, RLENGTH - 2); c = 0; feat = "" }
			/"sctp",/ { c++ }
			/suite\.Support[A-Za-z]+,/ { match($0, /Support[A-Za-z]+/); feat = feat (feat == "" ? "" : ",") substr($0, RSTART, RLENGTH) }
			END { out() }' "$f"
	done)
	local test file sctp features profile level why
	for f in "${tests[@]}"; do
		read -r test file sctp features <<<"$f"
		why=
		if [ -n "$sctp_skip" ] && [ "$sctp" -gt 0 ]; then
			why="connects over SCTP: this kernel has no SCTP sockets"
		elif [ -n "${NPAPI_TESTS:-}" ] && ! [[ $test =~ ^($NPAPI_TESTS)$ ]]; then
			why="not in this run's NPAPI_TESTS"
		fi
		[ -n "$why" ] || continue
		# The profile the suite counts the test in: the one with every
		# feature the test names; none ("-") for v0.1.7's tests that name
		# both the Admin and the Baseline feature.
		profile=ClusterNetworkPolicy level=standard
		case ,$features, in
		*,SupportAdminNetworkPolicy,*,SupportBaselineAdminNetworkPolicy,* | *,SupportBaselineAdminNetworkPolicy,*,SupportAdminNetworkPolicy,*) profile=- ;;
		*,SupportBaselineAdminNetworkPolicy,*) profile=BaselineAdminNetworkPolicy ;;
		*,SupportAdminNetworkPolicy,*) profile=AdminNetworkPolicy ;;
		esac
		case $file in *experimental*) level=experimental ;; esac
		echo "$test $profile $level $why" >>"$out/$name/not-run"
		left+=("$test")
		skip_re+="${skip_re:+|}$test"
	done
	log "$name: network-policy-api $v, profiles $profiles, all features, ${#tests[@]} tests${skip_re:+, ${#left[@]} left out ($out/$name/not-run)}"
	t0=$(date +%s)
	set +e
	"$bin" -test.run '^TestConformanceProfiles$' ${skip_re:+-test.skip "^TestConformanceProfiles\$/^($skip_re)\$"} \
		-test.v=test2json -test.timeout 90m \
		-conformance-profiles="$profiles" -all-features \
		-organization=netpol -project=netpol -url=https://github.com/netpol/netpol \
		-version="$netpol_git" -contact=netpol-maintainers \
		-additional-info="make conformance-upstream (hack/conformance-upstream.sh), $nodes node(s), netpol $netpol_version" \
		-report-output="$out/$name/report.suite.yaml" >"$out/$name/log" 2>&1
	rc=$?
	set -e
	go tool test2json -t -p "$name" <"$out/$name/log" >"$out/$name/events.json"
	# The suite deletes its namespaces at the end without waiting: the next
	# run would meet them terminating.
	local i
	for i in $(seq 300); do
		# (grep reads it all: with -q, kubectl could die of SIGPIPE and
		# pipefail end the wait early.)
		kc get namespaces -o name | grep '^namespace/network-policy-conformance-' >/dev/null || break
		sleep 1
	done
	log "$name: exit $rc in $(($(date +%s) - t0)) s ($out/$name/log)"
	[ $rc = 0 ] || failed+=("$name")
	# shellcheck disable=SC2086
	kc delete crd $policy_crds --ignore-not-found --wait=true >/dev/null
	kc apply -f deploy/crds/ >/dev/null
}

netpol_git=$(git describe --always --dirty 2>/dev/null || echo unknown)
summary=()
declare -A npapi_version=([npapi-v0.3.0]=v0.3.0 [npapi-v0.1.7]=v0.1.7)
declare -A npapi_profiles=([npapi-v0.3.0]=ClusterNetworkPolicy [npapi-v0.1.7]=AdminNetworkPolicy,BaselineAdminNetworkPolicy)
declare -A npapi_skipped=([npapi-v0.3.0]=failure [npapi-v0.1.7]=partial)
for s in "${want[@]}"; do
	if [ -n "${npapi_version[$s]:-}" ]; then
		run_npapi "$s" "${npapi_version[$s]}" "${npapi_profiles[$s]}"
		summary+=(-gosuite "$s=${npapi_version[$s]}=${npapi_skipped[$s]}")
		continue
	fi
	[ -n "${focus[$s]:-}" ] || { log "unknown suite $s (${!focus[*]} ${!npapi_version[*]})"; exit 2; }
	run_suite "$s" "${focus[$s]}" "${skip[$s]:-NOTHING}$sctp_skip" "${procs[$s]:-}"
	summary+=(-suite "$s=${focus[$s]}")
	if [ -n "${skip[$s]:-}" ]; then
		summary+=(-skip "$s=${skip[$s]}=--ginkgo.skip: what kube-proxy replacements skip (kpng's e2e list; kube-proxy from Cilium's: kube-proxy's own status URLs)")
	fi
	if [ -n "$sctp_skip" ]; then
		summary+=(-skip "$s=SCTP=--ginkgo.skip SCTP: this kernel has no SCTP sockets")
	fi
done

# summary.json from this run's JUnit files.
go run ./hack/conformance-summary -dir "$out" -version "$version" -nodes "$nodes" "${summary[@]}" >"$out/summary.json"
cat "$out/summary.json"
log "done in $(($(date +%s) - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
	log "failed: ${failed[*]}"
	exit 1
fi
