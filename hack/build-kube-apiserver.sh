#!/usr/bin/env bash
# Builds kube-apiserver from source (the hack/tools module) for the e2e test
# environment (internal/testenv) unless it is already there:
#   _output/tools/<version>/kube-apiserver
# A cold build (empty Go module and build caches) takes about 4-6 minutes on
# a 2-core machine; with a warm Go build cache, seconds. Each built binary
# is also kept in a per-machine cache, $NETPOL_TOOLS_CACHE (default
# ~/.cache/netpol-tools/<version>/), so a fresh clone on the same machine
# (CI runs in one) copies it instead of building again.
# Prints the binary's path on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# The version is hack/tools/go.mod's k8s.io/kubernetes requirement.
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' hack/tools/go.mod)
if [ -z "$version" ]; then
	echo "build-kube-apiserver: no k8s.io/kubernetes requirement in hack/tools/go.mod" >&2
	exit 1
fi
out="$root/_output/tools/$version/kube-apiserver"
cache_dir="${NETPOL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netpol-tools}/$version"
cached="$cache_dir/kube-apiserver"

if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
if [ -x "$cached" ]; then
	echo "build-kube-apiserver: using the cached $cached" >&2
	cp "$cached" "$out.tmp.$$"
	mv "$out.tmp.$$" "$out"
	echo "$out"
	exit 0
fi

tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

# The version stamp kubernetes' own build sets (hack/lib/version.sh), so that
# /version reports the release instead of v0.0.0-master. No build date: the
# same sources give the same binary.
minor=${version#v1.}
minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

echo "build-kube-apiserver: building kube-apiserver $version from source (a few minutes the first time)..." >&2
start=$(date +%s)
(
	cd hack/tools
	GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 \
		go build -trimpath -ldflags "$ldflags" -o "$tmp" k8s.io/kubernetes/cmd/kube-apiserver
)
"$tmp" --version >&2
mv "$tmp" "$out"
echo "build-kube-apiserver: built in $(($(date +%s) - start)) s" >&2
if mkdir -p "$cache_dir" 2>/dev/null && cp "$out" "$cached.tmp.$$" 2>/dev/null; then
	mv "$cached.tmp.$$" "$cached"
else
	echo "build-kube-apiserver: could not cache the binary in $cache_dir" >&2
fi
echo "$out"
