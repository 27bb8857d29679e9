# Shared by hack/cluster-up.sh and hack/cluster-down.sh (sourced).
# Everything the cluster makes is under $CLUSTER_DIR, except what the kernel
# keeps elsewhere (the node's address on lo, the pods' network namespaces and veths,
# cgroups, nftables/iptables state, sysctls); cluster-up records what it
# changes there and cluster-down undoes exactly that.
CLUSTER_DIR=${CLUSTER_DIR:-/tmp/netpol-cluster}
case $CLUSTER_DIR in
/ | "" | /tmp | /root | /home | /var | /usr | /etc)
	echo "cluster: refusing CLUSTER_DIR=$CLUSTER_DIR" >&2
	exit 2
	;;
esac
NODE_NAME=${CLUSTER_NODE_NAME:-netpol-node}
# The node's address: a /32 on lo, so that nothing of the host's real
# interfaces is used or exposed.
NODE_IP=${CLUSTER_NODE_IP:-172.31.254.1}
APISERVER_PORT=${CLUSTER_APISERVER_PORT:-6443}
ETCD_PORT=${CLUSTER_ETCD_PORT:-12379}
POD_CIDR=${CLUSTER_POD_CIDR:-10.247.0.0/24}
CLUSTER_CIDR=${CLUSTER_CLUSTER_CIDR:-10.247.0.0/16}
SERVICE_CIDR=${CLUSTER_SERVICE_CIDR:-10.98.0.0/16}
SERVICE_IP=${CLUSTER_SERVICE_IP:-10.98.0.1}
# The cluster DNS's Service address (kubelet clusterDNS), when make
# e2e-images has built CoreDNS (hack/cluster/coredns.yaml).
DNS_IP=${CLUSTER_DNS_IP:-10.98.0.10}
LOCK=${NETPOL_LAB_LOCK:-/tmp/netpol-lab.lock}
CNI_BIN_DIR=${CLUSTER_CNI_BIN_DIR:-/usr/lib/cni}
IMAGES_DIR=${CLUSTER_IMAGES_DIR:-$PWD/_output/images}
PAUSE_IMAGE=${PAUSE_IMAGE:-netpol.local/pause:dev}

# Nodes (make cluster-up NODES=N): node 1 runs in the host's network
# namespace, as the one-node cluster always has; node k (2..N) in a network
# namespace of its own named as the node, with its own containerd, kubelet
# (cgroup root /NAME) and state under $CLUSTER_DIR/nodes/NAME. With more than
# one node the nodes share an underlay: a bridge in the network namespace
# $UNDERLAY_NS, which the host reaches through $UNDERLAY_LINK (node 1's
# address moves there from lo) and node k through its eth0. The bridge is
# in a namespace of its own so that bridged frames between other nodes
# never cross the host's netfilter hooks (br_netfilter), where node 1's
# agent enforces.
NODES=${NODES:-1}
UNDERLAY_NS=${CLUSTER_UNDERLAY_NS:-netpol-underlay}
UNDERLAY_LINK=${CLUSTER_UNDERLAY_LINK:-netpol-ul}
UNDERLAY_PREFIX=24

RUN=$CLUSTER_DIR/run
LOGS=$CLUSTER_DIR/logs
PKI=$CLUSTER_DIR/pki
CTRD_SOCK=$CLUSTER_DIR/containerd/containerd.sock
export KUBECONFIG=$CLUSTER_DIR/kubeconfig
SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward net.ipv4.conf.all.route_localnet"

log() { echo "cluster: $*" >&2; }
die() {
	echo "cluster: $*" >&2
	exit 1
}

# take_lock re-runs the calling script under $LOCK (the lab lock: it changes
# host networking state) unless the caller already holds it.
take_lock() {
	if [ -z "${NETPOL_LAB_LOCKED:-}" ]; then
		command -v flock >/dev/null || die "flock is missing (apt-get install util-linux)"
		export NETPOL_LAB_LOCKED=1
		exec flock "$LOCK" "$@"
	fi
}

# alive NAME: the process of $RUN/NAME.pid runs.
alive() {
	local pid
	[ -f "$RUN/$1.pid" ] || return 1
	pid=$(cat "$RUN/$1.pid")
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# stop NAME: SIGTERM the process of $RUN/NAME.pid, SIGKILL after 10 s.
stop() {
	local pid i
	[ -f "$RUN/$1.pid" ] || return 0
	pid=$(cat "$RUN/$1.pid")
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
		for i in $(seq 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$RUN/$1.pid"
}

# start NAME COMMAND...: COMMAND in the background, in a session of its
# own, with no inherited descriptor but stdio (an inherited lab lock would
# stay held), logging to $LOGS/NAME.log; its pid goes to $RUN/NAME.pid and
# its command line to $RUN/NAME.cmd (hack/cluster-restart.sh reads it).
start() {
	local name=$1
	shift
	printf '%s\0' "$@" >"$RUN/$name.cmd"
	(
		for fd in $(ls /proc/$BASHPID/fd); do
			[ "$fd" -gt 2 ] && { eval "exec $fd>&-" 2>/dev/null || true; }
		done
		exec setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null
	) &
	echo $! >"$RUN/$name.pid"
}

# node_name K, node_ip K, node_dir K (node 1's files are where the one-node
# cluster's always were), node_sock K (its containerd), node_proc NAME K
# (the name start and stop know node K's daemon NAME by), node_netns K (""
# for node 1: the host's).
node_name() { if [ "$1" = 1 ]; then echo "$NODE_NAME"; else echo "$NODE_NAME-$1"; fi; }
node_ip() { echo "${NODE_IP%.*}.$((${NODE_IP##*.} + $1 - 1))"; }
node_dir() { if [ "$1" = 1 ]; then echo "$CLUSTER_DIR"; else echo "$CLUSTER_DIR/nodes/$(node_name "$1")"; fi; }
node_sock() { echo "$(node_dir "$1")/containerd/containerd.sock"; }
node_proc() { if [ "$2" = 1 ]; then echo "$1"; else echo "$1-$(node_name "$2")"; fi; }
node_netns() { if [ "$1" = 1 ]; then echo ""; else node_name "$1"; fi; }
# in_node K COMMAND...: COMMAND in node K's network namespace (nsenter, not
# ip netns exec: that would remount /sys and hide the cgroup hierarchies).
in_node() {
	local k=$1
	shift
	if [ "$k" = 1 ]; then "$@"; else nsenter --net="/run/netns/$(node_netns "$k")" -- "$@"; fi
}
# cluster_nodes: how many nodes the cluster that is up has.
cluster_nodes() { cat "$CLUSTER_DIR/nodes.count" 2>/dev/null || echo 1; }
