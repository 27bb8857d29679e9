#!/usr/bin/env bash
# make cluster-down: removes everything hack/cluster-up.sh made and nothing
# else: the pods (through the kubelet while it runs, so CNI tears their
# network down), the processes, the containers' processes and cgroups, the
# mounts under $CLUSTER_DIR, the pods' network namespaces that were not there
# before, the node's address on lo, netpol's nftables tables in the host namespace and
# the kubelet's iptables canary chains, then restores the sysctls saved at
# cluster-up and deletes $CLUSTER_DIR. Idempotent. Root.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. hack/cluster/common.sh
trap 'log "cluster-down failed at line $LINENO"' ERR

[ "$(id -u)" = 0 ] || die "root is needed"
if [ ! -d "$CLUSTER_DIR" ]; then
	log "nothing to take down ($CLUSTER_DIR does not exist)"
	exit 0
fi
take_lock "$0" "$@"
start_time=$(date +%s)
KUBECTL=$CLUSTER_DIR/bin/kubectl

# 1. While the kubelet and the API server run: delete every workload so that
#    the kubelet stops the pods and CNI removes their veths and addresses.
if alive kube-apiserver && alive kubelet && [ -x "$KUBECTL" ]; then
	kc() { timeout 60 "$KUBECTL" --kubeconfig "$KUBECONFIG" --request-timeout 10s "$@"; }
	kc delete daemonsets,deployments,replicasets,statefulsets,jobs --all --all-namespaces --wait=false >/dev/null 2>&1 || true
	kc delete pods --all --all-namespaces --grace-period 1 --wait=true --timeout 45s >/dev/null 2>&1 || true
fi

nodes=$(cluster_nodes)
# 2. The processes, the kubelets first.
for k in $(seq "$nodes" -1 1); do
	stop "$(node_proc kubelet "$k")"
done
for name in kube-scheduler kube-controller-manager; do
	stop "$name"
done

# 3. What containerd runs: every container's processes (their cgroups under
#    kubepods), then containerd's shims (their command line names our socket),
#    then containerd.
kill_kubepods() {
	local f pid
	for f in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods $(node_cgroups kubepods); do
		[ -d "$f" ] || continue
		find "$f" -name cgroup.procs 2>/dev/null | while read -r procs; do
			while read -r pid; do
				[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
			done <"$procs"
		done
	done
}
# node_cgroups [SUB]: the cgroup roots of nodes 2..N (/NAME), or SUB in them.
node_cgroups() {
	local k
	for k in $(seq 2 "$nodes"); do
		ls -d /sys/fs/cgroup/*/"$(node_name "$k")${1:+/$1}" 2>/dev/null || true
	done
}
our_shims() {
	local d k socks=()
	for k in $(seq "$nodes"); do socks+=(-e "-address $(node_sock "$k") "); done
	for d in /proc/[0-9]*; do
		if tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -q -F "${socks[@]}"; then
			echo "${d#/proc/}"
		fi
	done
}
kill_kubepods
for pid in $(our_shims); do kill -9 "$pid" 2>/dev/null || true; done
for k in $(seq "$nodes" -1 1); do
	stop "$(node_proc containerd "$k")"
done
for pid in $(our_shims); do kill -9 "$pid" 2>/dev/null || true; done
sleep 0.5
kill_kubepods
stop kube-apiserver
stop etcd

# 4. Mounts under $CLUSTER_DIR (deepest first), the pods' network namespaces
#    that cluster-up did not find, and the shims' sockets dir when containerd
#    made /run/containerd.
for i in 1 2 3; do
	mounts=$(awk -v d="$CLUSTER_DIR/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
	[ -z "$mounts" ] && break
	for m in $mounts; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
done
if [ -d /run/netns ]; then
	for ns in $(ls /run/netns); do
		case $ns in cni-*) ;; *) continue ;; esac
		grep -qx -- "$ns" "$CLUSTER_DIR/netns.before" 2>/dev/null && continue
		ip netns delete "$ns" 2>/dev/null || { umount "/run/netns/$ns" 2>/dev/null; rm -f "/run/netns/$ns"; }
	done
fi
if [ ! -e "$CLUSTER_DIR/run-containerd.existed" ] && [ -d /run/containerd ]; then
	rmdir /run/containerd/s /run/containerd 2>/dev/null || true
fi

# 5. cgroups the kubelet made (cgroupfs driver): kubepods in every hierarchy,
#    deepest first, once no process is left in them.
for f in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods $(node_cgroups); do
	[ -d "$f" ] || continue
	find "$f" -depth -type d -exec rmdir {} \; 2>/dev/null || true
done

# 6. Host networking: netpol's tables in the host namespace (the agent ran
#    there, host network), the kubelet's iptables canary chains and
#    portmap's (hostPort) chains, the node's address.
netpol=$root/_output/images/bin/netpol
[ -x "$netpol" ] || netpol=$root/bin/netpol
if [ -f "$CLUSTER_DIR/up" ] && [ -x "$netpol" ]; then
	"$netpol" agent --cleanup >/dev/null 2>&1 || log "netpol agent --cleanup failed"
fi
for ipt in iptables ip6tables; do
	command -v $ipt >/dev/null || continue
	[ -f "$CLUSTER_DIR/$ipt-chains.before" ] || continue
	for table in mangle nat filter; do
		for chain in $($ipt -w -t $table -S 2>/dev/null | awk '$1 == "-N" { print $2 }'); do
			case $chain in KUBE-* | CNI-*) ;; *) continue ;; esac # the kubelet's, portmap's
			grep -qx "$table $chain" "$CLUSTER_DIR/$ipt-chains.before" && continue
			# The rules that jump to it, then the chain.
			$ipt -w -t $table -S 2>/dev/null | grep -- " -j $chain\( \|\$\)" | grep '^-A ' | while read -r _ rest; do
				eval "$ipt -w -t $table -D $rest" 2>/dev/null || true
			done || true
			$ipt -w -t $table -F "$chain" 2>/dev/null || true
			$ipt -w -t $table -X "$chain" 2>/dev/null || true
		done
	done
done
# The tables iptables-nft made for those chains, when they were not there
# before cluster-up and are empty now.
if command -v nft >/dev/null && [ -f "$CLUSTER_DIR/nft-tables.before" ]; then
	nft list tables 2>/dev/null | while read -r _ family name; do
		grep -qx "table $family $name" "$CLUSTER_DIR/nft-tables.before" && continue
		case $name in filter | nat | mangle | raw | security) ;; *) continue ;; esac
		# No rule left (only chain headers, base-chain types and braces).
		if ! nft list table "$family" "$name" 2>/dev/null | grep -vqE '^[[:space:]]*(table |chain |type |\}|#|$)'; then
			nft delete table "$family" "$name" 2>/dev/null || true
		fi
	done
fi
if [ -e "$CLUSTER_DIR/addr.created" ]; then
	ip addr delete "$NODE_IP/32" dev lo 2>/dev/null || true
fi
# The nodes' network namespaces and the underlay (node 1's address on the
# underlay goes with its link).
if [ "$nodes" -gt 1 ]; then
	for ns in $(for k in $(seq 2 "$nodes"); do node_netns "$k"; done) "$UNDERLAY_NS"; do
		if [ -e "/run/netns/$ns" ]; then
			ip netns delete "$ns" || log "could not delete the network namespace $ns"
		fi
	done
	ip link delete "$UNDERLAY_LINK" 2>/dev/null || true
fi

# 7. The sysctls as they were.
if [ -f "$CLUSTER_DIR/sysctls.saved" ]; then
	while IFS= read -r kv; do
		[ -n "$kv" ] && sysctl -q -w "$kv" >/dev/null 2>&1 || log "could not restore $kv"
	done <"$CLUSTER_DIR/sysctls.saved"
fi

# What the nodes made outside the scratch dir must be gone: say what is not.
left=()
for k in $(seq "$nodes"); do
	for name in kubelet containerd; do
		alive "$(node_proc "$name" "$k")" && left+=("process $(node_proc "$name" "$k")")
	done
	[ "$k" = 1 ] && continue
	[ -e "/run/netns/$(node_netns "$k")" ] && left+=("network namespace $(node_netns "$k")")
	for d in $(node_cgroups | grep "/$(node_name "$k")\$" || true); do left+=("cgroup $d"); done
done
[ -e "/run/netns/$UNDERLAY_NS" ] && left+=("network namespace $UNDERLAY_NS")
ip link show "$UNDERLAY_LINK" >/dev/null 2>&1 && left+=("link $UNDERLAY_LINK")
[ ${#left[@]} -eq 0 ] || die "left behind: ${left[*]}"

# 8. The scratch directory (kubelet's files may be immutable-free but mounted:
#    anything still mounted stays and is reported).
if awk -v d="$CLUSTER_DIR/" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
	die "still mounted under $CLUSTER_DIR: $(awk -v d="$CLUSTER_DIR/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | tr '\n' ' ')"
fi
rm -rf "$CLUSTER_DIR"
log "down in $(($(date +%s) - start_time)) s"
