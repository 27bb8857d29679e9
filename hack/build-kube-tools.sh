#!/usr/bin/env bash
# Builds Kubernetes binaries from source (the hack/tools module) unless they
# are already there:
#   hack/build-kube-tools.sh kube-apiserver kubelet kubectl ...
#   -> _output/tools/<version>/<name>
# Every name is a k8s.io/kubernetes/cmd/<name> that hack/tools/tools.go
# imports. A cold build (empty Go module and build caches) of kube-apiserver
# takes about 4-9 minutes on a 2-core machine, the others a few more minutes
# together (they share most of the build cache); with a warm Go build cache,
# seconds each. Each built binary is also kept in a per-machine cache,
# $NETPOL_TOOLS_CACHE (default ~/.cache/netpol-tools/<version>/), so a fresh
# clone on the same machine (CI runs in one) copies it instead of building.
# Prints each binary's path on stdout, one a line, in the order asked.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ $# -eq 0 ]; then
	echo "usage: $0 NAME... (kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)" >&2
	exit 2
fi

# The version is hack/tools/go.mod's k8s.io/kubernetes requirement.
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' hack/tools/go.mod)
if [ -z "$version" ]; then
	echo "build-kube-tools: no k8s.io/kubernetes requirement in hack/tools/go.mod" >&2
	exit 1
fi
outdir="$root/_output/tools/$version"
cache_dir="${NETPOL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netpol-tools}/$version"
mkdir -p "$outdir"

# The version stamp kubernetes' own build sets (hack/lib/version.sh), so that
# --version and /version report the release instead of v0.0.0-master. No
# build date: the same sources give the same binary.
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

tmp=
trap 'if [ -n "$tmp" ]; then rm -f "$tmp"; fi' EXIT
for name in "$@"; do
	case $name in
	*/* | "" | .*)
		echo "build-kube-tools: $name: not a command name" >&2
		exit 2
		;;
	esac
	if ! grep -q "\"k8s.io/kubernetes/cmd/$name\"" hack/tools/tools.go; then
		echo "build-kube-tools: k8s.io/kubernetes/cmd/$name is not imported by hack/tools/tools.go (add it, then go mod tidy in hack/tools)" >&2
		exit 1
	fi
	out="$outdir/$name"
	cached="$cache_dir/$name"
	if [ -x "$out" ]; then
		echo "$out"
		continue
	fi
	if [ -x "$cached" ]; then
		echo "build-kube-tools: using the cached $cached" >&2
		cp "$cached" "$out.tmp.$$"
		mv "$out.tmp.$$" "$out"
		echo "$out"
		continue
	fi
	tmp="$out.tmp.$$"
	echo "build-kube-tools: building $name $version from source (minutes the first time)..." >&2
	start=$(date +%s)
	(
		cd hack/tools
		GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 \
			go build -trimpath -ldflags "$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$name"
	)
	case $name in
	kubectl) "$tmp" version --client >&2 ;;
	*) "$tmp" --version >&2 ;;
	esac
	mv "$tmp" "$out"
	tmp=
	echo "build-kube-tools: built $name in $(($(date +%s) - start)) s" >&2
	if mkdir -p "$cache_dir" 2>/dev/null && cp "$out" "$cached.tmp.$$" 2>/dev/null; then
		mv "$cached.tmp.$$" "$cached"
	else
		echo "build-kube-tools: could not cache $name in $cache_dir" >&2
	fi
	echo "$out"
done
