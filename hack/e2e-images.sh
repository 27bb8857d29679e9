#!/usr/bin/env bash
# make e2e-images: the images the upstream suites run, built from source as
# docker-archive tarballs in _output/images (issue 37), for cluster-up to
# import (the kubelet never pulls):
#   agnhost.tar  k8s.io/kubernetes/test/images/agnhost at hack/tools'
#                version, laid out as upstream's image (/agnhost, entrypoint
#                /agnhost, default `pause`; /agnhost runs upstream's binary,
#                except for porter's SCTP ports on a kernel without SCTP:
#                hack/agnhost-sctp), with what the tests exec in it:
#                /bin/sh, bash, nc (OpenBSD netcat: -t, -u), curl, wget, seq,
#                nslookup, dig, host, ip and a few coreutils (upstream's
#                Alpine image has them from busybox and bind-tools), from
#                this machine's Debian packages with their libraries; tagged as Kubernetes' e2e
#                suite at that version (test/utils/image/manifest.go) and
#                network-policy-api's conformance ask for it.
#   coredns.tar  github.com/coredns/coredns at the version kubeadm of that
#                Kubernetes version installs (hack/coredns), at /coredns.
#   pause-upstream.tar  hack/pause, tagged as the suites' sandbox image.
# Binaries are built once and cached as hack/build-kube-tools.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
images=${CLUSTER_IMAGES_DIR:-$root/_output/images}
mkdir -p "$images/bin"
log() { echo "e2e-images: $*" >&2; }

version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' hack/tools/go.mod)
manifest=$(cd hack/tools && GOWORK=off go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/test/utils/image/manifest.go
[ -f "$manifest" ] || { log "no $manifest (go mod download k8s.io/kubernetes in hack/tools)"; exit 1; }
# configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
agnhost_tag=$(sed -n 's/.*configs\[Agnhost\] = Config{[^,]*, "agnhost", "\([^"]*\)"}.*/\1/p' "$manifest")
[ -n "$agnhost_tag" ] || { log "no agnhost version in $manifest"; exit 1; }
# network-policy-api's conformance manifests (v0.1.7 and v0.3.0) run 2.45.
tags="registry.k8s.io/e2e-test-images/agnhost:$agnhost_tag,registry.k8s.io/e2e-test-images/agnhost:2.45"
coredns_version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }' hack/coredns/go.mod)
[ -n "$coredns_version" ] || { log "no github.com/coredns/coredns requirement in hack/coredns/go.mod"; exit 1; }

out="$root/_output/tools/$version"
cache_dir="${NETPOL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netpol-tools}/$version"
mkdir -p "$out"
# build NAME MODULE_DIR PACKAGE: into $out/NAME unless it or the machine's
# cache has it (a cold build is minutes; CI's clean clones share the cache).
build() {
	local name=$1 dir=$2 pkg=$3
	[ -x "$out/$name" ] && return
	if [ -x "$cache_dir/$name" ]; then
		cp "$cache_dir/$name" "$out/$name.tmp.$$" && mv "$out/$name.tmp.$$" "$out/$name"
		return
	fi
	log "building $pkg (minutes the first time)"
	(cd "$dir" && GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 go build -trimpath -ldflags '-s -w' -o "$out/$name.tmp.$$" "$pkg")
	mv "$out/$name.tmp.$$" "$out/$name"
	if mkdir -p "$cache_dir" 2>/dev/null && cp "$out/$name" "$cache_dir/$name.tmp.$$" 2>/dev/null; then
		mv "$cache_dir/$name.tmp.$$" "$cache_dir/$name"
	fi
}
build agnhost hack/tools k8s.io/kubernetes/test/images/agnhost
build "coredns-$coredns_version" hack/coredns github.com/coredns/coredns

# The tools, with every library they load and the loader.
tools=(bash dash nc curl wget seq nslookup dig host ip cat sleep ls grep head tail tr cut wc sort uniq sed awk tee xargs date hostname timeout env echo printf test true false kill)
missing=()
for t in "${tools[@]}"; do
	type -P "$t" >/dev/null || missing+=("$t") # the binary, not a shell builtin
done
if [ ${#missing[@]} -gt 0 ]; then
	log "missing ${missing[*]}: apt-get install netcat-openbsd bind9-dnsutils curl wget iproute2 coreutils"
	exit 1
fi
# /agnhost is hack/agnhost-sctp, which runs upstream's binary
# (/agnhost-upstream) as it is, except porter on a kernel without SCTP
# (docs/conformance.md).
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$images/bin/agnhost-sctp" ./hack/agnhost-sctp
files=(-file agnhost="$images/bin/agnhost-sctp" -file agnhost-upstream="$out/agnhost")
declare -A seen=()
add() { # IMAGE_PATH HOST_PATH
	[ -n "${seen[$1]:-}" ] && return
	seen[$1]=1
	files+=(-file "$1=$2")
}
for t in "${tools[@]}"; do
	bin=$(readlink -f "$(type -P "$t")")
	case $t in
	dash) add bin/sh "$bin" ;;
	bash) add bin/bash "$bin" ;;
	*) add "usr/bin/$t" "$bin" ;;
	esac
	# ldd: "libx.so.1 => /lib/x86_64-linux-gnu/libx.so.1 (0x...)" and the loader.
	while read -r lib; do
		add "${lib#/}" "$(readlink -f "$lib")"
	done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
done
go run ./hack/image -o "$images/agnhost.tar" -tag "$tags" -entrypoint /agnhost -cmd pause "${files[@]}"
# The sandbox image the suites name (the kubelet's is netpol.local/pause).
pause_tag=$(sed -n 's/.*configs\[Pause\] = Config{[^,]*, "pause", "\([^"]*\)"}.*/\1/p' "$manifest")
[ -n "$pause_tag" ] || { log "no pause version in $manifest"; exit 1; }
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$images/bin/pause" ./hack/pause
go run ./hack/image -o "$images/pause-upstream.tar" -tag "registry.k8s.io/pause:$pause_tag" -entrypoint /pause -file pause="$images/bin/pause"
go run ./hack/image -o "$images/coredns.tar" -tag "registry.k8s.io/coredns/coredns:$coredns_version" \
	-entrypoint /coredns -file coredns="$out/coredns-$coredns_version"
