#!/usr/bin/env bash
# make cluster-up [NODES=N]: a Kubernetes cluster on this machine
# (docs/cluster.md), one node by default; node 1 in the host's network
# namespace, nodes 2..N each in a network namespace of its own on a shared
# underlay, with its own containerd and kubelet (hack/cluster/common.sh).
# etcd (Debian etcd-server), kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl built from hack/tools (cached), containerd
# + runc + CNI plugins from Debian, the images of make image imported; no
# kube-proxy (netpol is the Service proxy). Everything is in $CLUSTER_DIR
# (default /tmp/netpol-cluster); hack/cluster-down.sh removes it all.
# Idempotent: a cluster that is up and Ready is left as it is. Root.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. hack/cluster/common.sh
trap 'log "cluster-up failed at line $LINENO"' ERR

[ "$(id -u)" = 0 ] || die "root is needed (containerd, kubelet, network namespaces)"

# What is missing, all at once.
missing=()
for cmd in containerd ctr runc; do
	command -v $cmd >/dev/null || missing+=("$cmd (apt-get install containerd runc)")
done
[ -x "$CNI_BIN_DIR/ptp" ] && [ -x "$CNI_BIN_DIR/host-local" ] ||
	missing+=("CNI plugins in $CNI_BIN_DIR (apt-get install containernetworking-plugins)")
command -v openssl >/dev/null || missing+=("openssl (apt-get install openssl)")
command -v ip >/dev/null || missing+=("ip (apt-get install iproute2)")
command -v flock >/dev/null || missing+=("flock (apt-get install util-linux)")
for img in netpol pause probe; do
	[ -f "$IMAGES_DIR/$img.tar" ] || missing+=("$IMAGES_DIR/$img.tar (make image)")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ -n "${CLUSTER_APT_INSTALL:-}" ] && command -v apt-get >/dev/null; then
		log "installing containerd runc containernetworking-plugins (CLUSTER_APT_INSTALL is set)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends containerd runc containernetworking-plugins openssl >&2
	else
		printf 'cluster-up: missing:\n' >&2
		printf '  %s\n' "${missing[@]}" >&2
		exit 1
	fi
fi
hack/install-etcd.sh >/dev/null
ETCD=${ETCD_BIN:-$(command -v etcd)}

# The Kubernetes binaries: built once, cached (hack/build-kube-tools.sh).
mapfile -t bins < <(hack/build-kube-tools.sh kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
APISERVER=${bins[0]} KCM=${bins[1]} SCHEDULER=${bins[2]} KUBELET=${bins[3]} KUBECTL=${bins[4]}

take_lock "$0" "$@"

case $NODES in '' | *[!0-9]*) die "NODES=$NODES: the number of nodes, 1 to 16" ;; esac
[ "$NODES" -ge 1 ] && [ "$NODES" -le 16 ] || die "NODES=$NODES: the number of nodes, 1 to 16"

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG" "$@"; }
node_ready() { # K
	kc get node "$(node_name "$1")" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

if [ -f "$CLUSTER_DIR/up" ] && [ "$(cluster_nodes)" = "$NODES" ] &&
	alive etcd && alive kube-apiserver && alive kube-controller-manager && alive kube-scheduler; then
	up=1
	for k in $(seq "$NODES"); do
		alive "$(node_proc containerd "$k")" && alive "$(node_proc kubelet "$k")" && node_ready "$k" || up=
	done
	if [ -n "$up" ]; then
		log "already up ($NODES node(s)): export KUBECONFIG=$KUBECONFIG"
		exit 0
	fi
fi
if [ -d "$CLUSTER_DIR" ]; then
	log "a partial cluster is in $CLUSTER_DIR: taking it down first"
	hack/cluster-down.sh
fi

start_time=$(date +%s.%N)
mkdir -p "$RUN" "$LOGS" "$PKI" "$CLUSTER_DIR/bin"
ln -sf "$KUBECTL" "$CLUSTER_DIR/bin/kubectl"
ln -sf "$(command -v ctr)" "$CLUSTER_DIR/bin/ctr"

# What cluster-down restores or keeps: the sysctls the kubelet, CNI and
# kube-proxy may change, and the network namespaces there were before.
for s in $SYSCTLS; do
	echo "$s=$(sysctl -n "$s")"
done >"$CLUSTER_DIR/sysctls.saved"
ls /run/netns 2>/dev/null >"$CLUSTER_DIR/netns.before" || true
if command -v nft >/dev/null; then
	nft list tables >"$CLUSTER_DIR/nft-tables.before" 2>/dev/null || true
fi
# The kubelet adds iptables chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY);
# cluster-down removes those that were not there.
for ipt in iptables ip6tables; do
	command -v $ipt >/dev/null || continue
	for table in filter nat mangle; do
		$ipt -w -t $table -S 2>/dev/null | awk -v t=$table '$1 == "-N" { print t, $2 }'
	done >"$CLUSTER_DIR/$ipt-chains.before"
done
[ -d /run/containerd ] && touch "$CLUSTER_DIR/run-containerd.existed"

echo "$NODES" >"$CLUSTER_DIR/nodes.count"
if [ "$NODES" = 1 ]; then
	# The node's address: a /32 of its own on the host's loopback (this
	# kernel may have no dummy links), so no real interface is used or exposed.
	if ! ip -4 -o addr show dev lo | grep -q " $NODE_IP/32 "; then
		ip addr add "$NODE_IP/32" dev lo
		touch "$CLUSTER_DIR/addr.created"
	fi
else
	# The underlay: a bridge in a namespace of its own; node 1 (the host)
	# on it through $UNDERLAY_LINK, node k through the eth0 of its own
	# namespace. Node k routes the Services' range to node 1 only so that
	# a connection to a ClusterIP from its host network gets past the
	# routing decision: its own table DNATs it first. The pod ranges get
	# routes once the controller manager has given the nodes theirs.
	for ns in "$UNDERLAY_NS" $(for k in $(seq 2 "$NODES"); do node_netns "$k"; done); do
		[ ! -e "/run/netns/$ns" ] || die "network namespace $ns exists already (a cluster of another CLUSTER_DIR?)"
	done
	! ip link show "$UNDERLAY_LINK" >/dev/null 2>&1 || die "link $UNDERLAY_LINK exists already"
	ip netns add "$UNDERLAY_NS"
	ip -n "$UNDERLAY_NS" link set lo up
	ip -n "$UNDERLAY_NS" link add br0 type bridge
	ip -n "$UNDERLAY_NS" link set br0 up
	ip link add "$UNDERLAY_LINK" type veth peer name n1 netns "$UNDERLAY_NS"
	ip -n "$UNDERLAY_NS" link set n1 master br0 up
	ip addr add "$NODE_IP/$UNDERLAY_PREFIX" dev "$UNDERLAY_LINK"
	ip link set "$UNDERLAY_LINK" up
	for k in $(seq 2 "$NODES"); do
		ns=$(node_netns "$k")
		ip netns add "$ns"
		ip -n "$ns" link set lo up
		ip -n "$UNDERLAY_NS" link add "n$k" type veth peer name eth0 netns "$ns"
		ip -n "$UNDERLAY_NS" link set "n$k" master br0 up
		ip -n "$ns" addr add "$(node_ip "$k")/$UNDERLAY_PREFIX" dev eth0
		ip -n "$ns" link set eth0 up
		ip -n "$ns" route add "$SERVICE_CIDR" via "$NODE_IP"
		in_node "$k" sysctl -q -w net.ipv4.ip_forward=1
	done
fi

# Certificates: one CA (ECDSA P-256) signs every server and client.
cd "$PKI"
openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=netpol-cluster-ca" -out ca.crt 2>/dev/null
cert() { # NAME SUBJECT [SANS] [USAGE]
	local name=$1 subj=$2 sans=${3:-} usage=${4:-clientAuth}
	openssl ecparam -name prime256v1 -genkey -noout -out "$name.key" 2>/dev/null
	openssl req -new -key "$name.key" -subj "$subj" -out "$name.csr" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$usage"
		[ -n "$sans" ] && echo "subjectAltName=$sans"
	} >"$name.ext"
	openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 30 \
		-extfile "$name.ext" -out "$name.crt" 2>/dev/null
	rm -f "$name.csr" "$name.ext"
}
cert apiserver "/CN=kube-apiserver" \
	"DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$NODE_IP,IP:$SERVICE_IP,IP:127.0.0.1" serverAuth
cert admin "/O=system:masters/CN=admin"
cert kube-controller-manager "/CN=system:kube-controller-manager"
cert kube-scheduler "/CN=system:kube-scheduler"
# Each node's kubelet: node 1's files are named as the one node's always were.
node_suffix() { if [ "$1" = 1 ]; then echo ""; else echo "-$(node_name "$1")"; fi; }
for k in $(seq "$NODES"); do
	n=$(node_name "$k")
	cert "kubelet-client$(node_suffix "$k")" "/O=system:nodes/CN=system:node:$n"
	cert "kubelet-serving$(node_suffix "$k")" "/CN=$n" "DNS:$n,IP:$(node_ip "$k")" serverAuth
done
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
openssl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
chmod 600 ./*.key
cd "$root"

kubeconfig() { # FILE USER
	cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: netpol-cluster
  cluster:
    server: https://$NODE_IP:$APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: netpol-cluster
  context: {cluster: netpol-cluster, user: $2}
current-context: netpol-cluster
KC
}
kubeconfig "$KUBECONFIG" admin
kubeconfig "$CLUSTER_DIR/kube-controller-manager.kubeconfig" kube-controller-manager
kubeconfig "$CLUSTER_DIR/kube-scheduler.kubeconfig" kube-scheduler
for k in $(seq "$NODES"); do
	mkdir -p "$(node_dir "$k")"
	kubeconfig "$(node_dir "$k")/kubelet.kubeconfig" "kubelet-client$(node_suffix "$k")"
done

# start NAME COMMAND...: in the background, in its own session, logging to
# $LOGS/NAME.log; the pid in $RUN/NAME.pid. Every other file descriptor is
# closed first: the daemons must not keep the lab lock's open.
# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
	local what=$1 secs=$2 i
	shift 2
	for i in $(seq $((secs * 5))); do
		if "$@" >/dev/null 2>&1; then
			return 0
		fi
		sleep 0.2
	done
	die "$what not ready after ${secs}s (logs in $LOGS)"
}

touch "$CLUSTER_DIR/up"

etcd_flags=()
"$ETCD" --help 2>&1 | grep -q -- --unsafe-no-fsync && etcd_flags+=(--unsafe-no-fsync)
start etcd "$ETCD" --name netpol-cluster --data-dir "$CLUSTER_DIR/etcd" --log-level warn \
	--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
	--initial-cluster "netpol-cluster=http://127.0.0.1:$((ETCD_PORT + 1))" \
	--experimental-watch-progress-notify-interval=5s "${etcd_flags[@]}"

wg=()
# The WatchList gate needs etcd >= 3.4.31 (Debian's is 3.4.23): see docs/e2e.md.
if "$ETCD" --version 2>/dev/null | grep -Eq 'etcd Version: 3\.(4\.([0-9]|[12][0-9]|30)|5\.([0-9]|1[0-2]))$'; then
	wg=(--feature-gates=WatchList=false)
fi
start kube-apiserver "$APISERVER" \
	--etcd-servers "http://127.0.0.1:$ETCD_PORT" \
	--bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$APISERVER_PORT" \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --cert-dir "$PKI" \
	--client-ca-file "$PKI/ca.crt" \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-preferred-address-types InternalIP \
	--service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
	--service-account-signing-key-file "$PKI/sa.key" \
	--service-cluster-ip-range "$SERVICE_CIDR" \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged=true \
	"${wg[@]}"
wait_for kube-apiserver 60 "$KUBECTL" --kubeconfig "$KUBECONFIG" get --raw /readyz

start kube-controller-manager "$KCM" \
	--kubeconfig "$CLUSTER_DIR/kube-controller-manager.kubeconfig" \
	--authentication-kubeconfig "$CLUSTER_DIR/kube-controller-manager.kubeconfig" \
	--authorization-kubeconfig "$CLUSTER_DIR/kube-controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
	--use-service-account-credentials=true \
	--allocate-node-cidrs=true --cluster-cidr "$CLUSTER_CIDR" --node-cidr-mask-size 24 \
	--service-cluster-ip-range "$SERVICE_CIDR"
start kube-scheduler "$SCHEDULER" \
	--kubeconfig "$CLUSTER_DIR/kube-scheduler.kubeconfig" \
	--authentication-kubeconfig "$CLUSTER_DIR/kube-scheduler.kubeconfig" \
	--authorization-kubeconfig "$CLUSTER_DIR/kube-scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port 0 --leader-elect=false

# write_containerd_config K: node K's containerd, with its own root, state
# and socket; the CRI settings this machine needs (docs/cluster.md):
# restrict_oom_score_adj (root here lacks CAP_SYS_RESOURCE), no AppArmor,
# runc (crun fails on hybrid cgroups), cgroupfs, the local pause image.
write_containerd_config() {
	local dir
	dir=$(node_dir "$1")
	mkdir -p "$dir/containerd" "$dir/cni/net.d" "$dir/cni/ipam"
	cat >"$dir/containerd/config.toml" <<TOML
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$dir/containerd/containerd.sock"
[ttrpc]
  address = "$dir/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$dir/containerd/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$dir/cni/net.d"
    max_conf_num = 1
TOML
}

# write_cni_config K POD_CIDR: ptp, a routed veth per pod, so pod-to-pod
# traffic crosses the node's forward hook (where netpol enforces). No
# masquerade: nothing leaves. hostPort is the CNI's job, not a Service
# proxy's: portmap (iptables DNAT, as on kind). containerd picks the file
# up when it appears.
write_cni_config() {
	local dir
	dir=$(node_dir "$1")
	cat >"$dir/cni/net.d/10-netpol-cluster.conflist.tmp" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "netpol-cluster",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$2"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$dir/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
	mv "$dir/cni/net.d/10-netpol-cluster.conflist.tmp" "$dir/cni/net.d/10-netpol-cluster.conflist"
}

# start_containerd K: node K's containerd, in its network namespace, with
# the images imported: the upstream suites' images and the cluster DNS too,
# when make e2e-images has built them (hack/e2e-images.sh).
start_containerd() {
	local k=$1 sock img cmd=()
	sock=$(node_sock "$k")
	[ "$k" = 1 ] || cmd=(nsenter --net="/run/netns/$(node_netns "$k")" --)
	start "$(node_proc containerd "$k")" "${cmd[@]}" containerd --config "$(node_dir "$k")/containerd/config.toml"
	wait_for "containerd of $(node_name "$k")" 30 ctr --address "$sock" version
	for img in pause netpol probe agnhost busybox nginx regression-issue-74839 coredns pause-upstream; do
		case $img in pause | netpol | probe) ;; *) [ -f "$IMAGES_DIR/$img.tar" ] || continue ;; esac
		ctr --address "$sock" -n k8s.io images import "$IMAGES_DIR/$img.tar" >/dev/null ||
			die "ctr could not import $IMAGES_DIR/$img.tar into $(node_name "$k")'s containerd"
	done
}

cluster_dns=
if [ -f "$IMAGES_DIR/coredns.tar" ]; then
	cluster_dns="clusterDNS: [$DNS_IP]
clusterDomain: cluster.local"
fi

# start_kubelet K: node K's kubelet, in its network namespace; node k > 1
# puts its pods under the cgroup /NAME (made here in every v1 hierarchy)
# so that no two kubelets manage the same cgroups.
start_kubelet() {
	local k=$1 dir ip sfx cgroup_root= cmd=() h
	dir=$(node_dir "$k") ip=$(node_ip "$k") sfx=$(node_suffix "$k")
	if [ "$k" != 1 ]; then
		cmd=(nsenter --net="/run/netns/$(node_netns "$k")" --)
		cgroup_root="cgroupRoot: /$(node_name "$k")"
		for h in /sys/fs/cgroup/*/; do
			case $h in */unified/) continue ;; esac
			mkdir -p "$h$(node_name "$k")"
			if [ -f "${h}cpuset.cpus" ]; then
				cat "${h}cpuset.cpus" >"$h$(node_name "$k")/cpuset.cpus"
				cat "${h}cpuset.mems" >"$h$(node_name "$k")/cpuset.mems"
			fi
		done
	fi
	mkdir -p "$dir/kubelet"
	cat >"$dir/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine: cgroup v1 hierarchies, swap may be on.
failCgroupV1: false
cgroupDriver: cgroupfs
$cgroup_root
failSwapOn: false
oomScoreAdj: 0
containerRuntimeEndpoint: unix://$(node_sock "$k")
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-serving$sfx.crt
tlsPrivateKeyFile: $PKI/kubelet-serving$sfx.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
resolvConf: /etc/resolv.conf
$cluster_dns
# Each node its own: a kubelet removes the log directories of pods it does
# not know from its podLogsDir, so a shared /var/log/pods loses the other
# nodes' logs (kubectl logs fails).
podLogsDir: $dir/kubelet/pod-logs
# A scratch machine: no evictions for its disk or memory.
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
	start "$(node_proc kubelet "$k")" "${cmd[@]}" "$KUBELET" --config "$dir/kubelet/config.yaml" \
		--kubeconfig "$dir/kubelet.kubeconfig" --root-dir "$dir/kubelet/root" \
		--cert-dir "$dir/kubelet/pki" --node-ip "$ip" --hostname-override "$(node_name "$k")" --v=1
}

# Node 1: its pod range is the first the controller manager gives out.
write_containerd_config 1
write_cni_config 1 "$POD_CIDR"
start_containerd 1
# The ServiceAccount admission plugin rejects pods until the controller
# manager has made the namespace's default ServiceAccount.
wait_for "the default ServiceAccount" 60 "$KUBECTL" --kubeconfig "$KUBECONFIG" -n default get serviceaccount default
pod_cidr() { kc get node "$(node_name "$1")" -o jsonpath='{.spec.podCIDR}' 2>/dev/null; }
has_pod_cidr() { [ -n "$(pod_cidr "$1")" ]; }
start_kubelet 1
wait_for "node $NODE_NAME" 120 node_ready 1
wait_for "the pod range of $NODE_NAME" 60 has_pod_cidr 1
[ "$(pod_cidr 1)" = "$POD_CIDR" ] || die "$NODE_NAME has the pod range $(pod_cidr 1), not $POD_CIDR (its CNI configuration's)"

# Nodes 2..N, one after the other, so that node k has the k-th pod range;
# each one's CNI configuration once the controller manager has given it
# its range.
for k in $(seq 2 "$NODES"); do
	write_containerd_config "$k"
	start_containerd "$k"
	start_kubelet "$k"
	wait_for "the pod range of $(node_name "$k")" 120 has_pod_cidr "$k"
	write_cni_config "$k" "$(pod_cidr "$k")"
	wait_for "node $(node_name "$k")" 120 node_ready "$k"
done
# Every node routes every other node's pod range to that node's address.
if [ "$NODES" -gt 1 ]; then
	cidrs=()
	for j in $(seq "$NODES"); do cidrs[j]=$(pod_cidr "$j"); done
	for k in $(seq "$NODES"); do
		for j in $(seq "$NODES"); do
			[ "$j" = "$k" ] && continue
			in_node "$k" ip route replace "${cidrs[j]}" via "$(node_ip "$j")"
		done
	done
fi

if [ -n "$cluster_dns" ]; then
	coredns_image=$(tar -xOf "$IMAGES_DIR/coredns.tar" manifest.json | sed -n 's/.*"RepoTags":\["\([^"]*\)".*/\1/p')
	sed -e "s|\${DNS_IP}|$DNS_IP|g" -e "s|\${APISERVER_HOST}|$NODE_IP|g" -e "s|\${APISERVER_PORT}|$APISERVER_PORT|g" \
		-e "s|\${COREDNS_IMAGE}|$coredns_image|g" hack/cluster/coredns.yaml | kc apply -f - >/dev/null
	log "cluster DNS: $coredns_image at $DNS_IP (kube-system/kube-dns)"
fi
log "up in $(printf '%.1f' "$(echo "$(date +%s.%N) - $start_time" | bc 2>/dev/null || echo 0)") s: $NODES node(s) Ready: $(for k in $(seq "$NODES"); do printf '%s (%s) ' "$(node_name "$k")" "$(node_ip "$k")"; done)"
log "  export KUBECONFIG=$KUBECONFIG PATH=$CLUSTER_DIR/bin:\$PATH"
