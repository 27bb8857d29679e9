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
#                network-policy-api's conformance ask for it; also tagged
#                as glibc-dns-testing (the DNS tests' glibc querier runs sh,
#                dig and getent); /coredns as upstream's has it.
#   busybox.tar  Debian's busybox-static, every applet linked.
#   nginx.tar    Debian's nginx answering on port 80 (hack/e2e-images/nginx.conf).
#   regression-issue-74839.tar  test/images/regression-issue-74839 (the
#                conntrack test's server), as upstream's: the one binary.
#                Both Debian packages are unpacked, not installed.
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
kube_src=$(cd hack/tools && GOWORK=off go mod download -json k8s.io/kubernetes | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
manifest=$kube_src/test/utils/image/manifest.go
[ -f "$manifest" ] || { log "no $manifest (go mod download k8s.io/kubernetes in hack/tools)"; exit 1; }
# configs[Agnhost] = Config{list.PromoterE2eRegistry, "agnhost", "2.66.1"}
manifest_image() { # NAME: "image:tag" of manifest.go's configs[NAME]
	local t
	t=$(sed -n 's/.*configs\['"$1"'\] = Config{[^,]*, "\([^"]*\)", "\([^"]*\)"}.*/\1:\2/p' "$manifest")
	[ -n "$t" ] || { log "no configs[$1] in $manifest"; exit 1; }
	echo "$t"
}
e2e_tag() { # NAME: configs[NAME] in the e2e images' registry
	local t
	t=$(manifest_image "$1")
	echo "registry.k8s.io/e2e-test-images/$t"
}
# network-policy-api's conformance manifests (v0.1.7 and v0.3.0) run 2.45.
tags="$(e2e_tag Agnhost),registry.k8s.io/e2e-test-images/agnhost:2.45"
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
build regression-issue-74839 hack/tools k8s.io/kubernetes/test/images/regression-issue-74839
build "coredns-$coredns_version" hack/coredns github.com/coredns/coredns

# Files of the image being built: -file IMAGE_PATH=HOST_PATH arguments of
# hack/image, each path once.
files=()
declare -A seen=()
add() { # IMAGE_PATH HOST_PATH
	[ -n "${seen[$1]:-}" ] && return
	seen[$1]=1
	files+=(-file "$1=$2")
}
add_binary() { # IMAGE_PATH HOST_PATH: the binary, every library it loads and the loader
	local lib
	add "$1" "$2"
	# ldd: "libx.so.1 => /lib/x86_64-linux-gnu/libx.so.1 (0x...)" and the loader.
	while read -r lib; do
		add "${lib#/}" "$(readlink -f "$lib")"
	done < <(ldd "$2" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
	lib=$(ldd "$2" | grep 'not found' || true) # not grep -q: with pipefail, ldd could die of SIGPIPE
	if [ -n "$lib" ]; then
		log "$2 needs a library this machine lacks: $(echo "$lib" | tr -s '\t\n' ' ')"
		exit 1
	fi
}
new_image() { files=(); seen=(); }
# deb PACKAGE: the directory Debian's package is unpacked in (not
# installed: nginx's would start a server on this machine); the .deb is
# cached with the tools.
deb() {
	local pkg=$1 dir=$images/deb/$1 cache=${cache_dir%/*}/debs debfile
	if [ ! -f "$dir/.unpacked" ]; then
		mkdir -p "$cache"
		debfile=$(ls "$cache/$pkg"_*.deb 2>/dev/null | tail -1 || true)
		if [ -z "$debfile" ]; then
			if ! (cd "$cache" && apt-get download "$pkg" >/dev/null 2>&1); then
				[ "$(id -u)" = 0 ] || { log "apt-get download $pkg failed (apt-get update as root first)"; exit 1; }
				apt-get update >/dev/null
				(cd "$cache" && apt-get download "$pkg" >/dev/null)
			fi
			debfile=$(ls "$cache/$pkg"_*.deb | tail -1)
		fi
		rm -rf "$dir"
		mkdir -p "$dir"
		dpkg-deb -x "$debfile" "$dir"
		touch "$dir/.unpacked"
	fi
	echo "$dir"
}

# agnhost, also tagged as glibc-dns-testing: the DNS tests' glibc querier
# needs only sh, dig and getent (glibc's resolver), which this image has.
tools=(bash dash nc curl wget seq nslookup dig host getent ip ss cat sleep ls grep head tail tr cut wc sort uniq sed awk tee xargs date hostname timeout env echo printf test true false kill dd mkdir rm touch id)
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
# (docs/conformance.md). As in upstream's image (its Dockerfile): /coredns
# (a DNS test runs it), porter's TLS certificate /localhost.crt and key
# /localhost.key (the Proxy tests' TLS ports), /uploads, /agnhost-2. /bin
# is /usr/bin, as on Debian: the tests exec /bin/sleep, /bin/false ...
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$images/bin/agnhost-sctp" ./hack/agnhost-sctp
new_image
add agnhost "$images/bin/agnhost-sctp"
add agnhost-upstream "$out/agnhost"
add coredns "$out/coredns-$coredns_version"
add localhost.crt "$kube_src/test/images/agnhost/porter/localhost.crt"
add localhost.key "$kube_src/test/images/agnhost/porter/localhost.key"
for t in "${tools[@]}"; do
	bin=$(readlink -f "$(type -P "$t")")
	case $t in
	dash) add_binary usr/bin/sh "$bin" ;;
	*) add_binary "usr/bin/$t" "$bin" ;;
	esac
done
go run ./hack/image -o "$images/agnhost.tar" -tag "$tags,$(e2e_tag GlibcDnsTesting)" -entrypoint /agnhost -cmd pause \
	-dirs tmp,uploads -link agnhost-2=agnhost -link bin=usr/bin "${files[@]}"

# busybox: Debian's static busybox with every applet linked, default sh.
bb=$(deb busybox-static)/bin/busybox
links=()
while read -r applet; do
	[ "$applet" = bin/busybox ] || links+=(-link "$applet=/bin/busybox")
done < <("$bb" --list-full)
go run ./hack/image -o "$images/busybox.tar" -tag "$(e2e_tag BusyBox)" -cmd sh -file bin/busybox="$bb" "${links[@]}"

# regression-issue-74839: the conntrack test's server, which sends a TCP
# segment out of the window (upstream's image is the one binary).
go run ./hack/image -o "$images/regression-issue-74839.tar" -tag "$(e2e_tag RegressionIssue74839)" \
	-entrypoint /regression-issue-74839 -file regression-issue-74839="$out/regression-issue-74839"

# nginx: Debian's nginx answering on port 80 (hack/e2e-images/nginx.conf).
new_image
add_binary usr/sbin/nginx "$(deb nginx)/usr/sbin/nginx"
add etc/nginx/nginx.conf hack/e2e-images/nginx.conf
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$images/bin/passwd"
printf 'root:x:0:\n' >"$images/bin/group"
add etc/passwd "$images/bin/passwd"
add etc/group "$images/bin/group"
go run ./hack/image -o "$images/nginx.tar" -tag "$(e2e_tag Nginx),$(e2e_tag NginxNew)" -dirs tmp,run,var/log/nginx,var/lib/nginx \
	-entrypoint "/usr/sbin/nginx -e stderr -c /etc/nginx/nginx.conf" "${files[@]}"
# The sandbox image the suites name (the kubelet's is netpol.local/pause).
pause_image=$(manifest_image Pause)
CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$images/bin/pause" ./hack/pause
go run ./hack/image -o "$images/pause-upstream.tar" -tag "registry.k8s.io/$pause_image" -entrypoint /pause -file pause="$images/bin/pause"
go run ./hack/image -o "$images/coredns.tar" -tag "registry.k8s.io/coredns/coredns:$coredns_version" \
	-entrypoint /coredns -file coredns="$out/coredns-$coredns_version"
