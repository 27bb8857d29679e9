#!/usr/bin/env bash
# Builds etcd from source (the hack/etcd module) unless it is already
# there, and prints its path: _output/tools/etcd-<version>/etcd. Used by
# `make bench-scale`, so that the test API server streams the agent's
# initial lists (WatchList), as it does on a cluster with a supported etcd;
# the tests keep Debian's etcd 3.4 (hack/install-etcd.sh). A cold build
# took 43 s here on 2 cores (3 min next to a running benchmark); the
# binary is also kept in $NETPOL_TOOLS_CACHE (default
# ~/.cache/netpol-tools/), as hack/build-kube-tools.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" { print $3 }' hack/etcd/go.mod)
if [ -z "$version" ]; then
	echo "build-etcd: no go.etcd.io/etcd/server/v3 requirement in hack/etcd/go.mod" >&2
	exit 1
fi
out="$PWD/_output/tools/etcd-$version/etcd"
cached="${NETPOL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/netpol-tools}/etcd-$version/etcd"
if [ -x "$out" ]; then
	echo "$out"
	exit 0
fi
mkdir -p "$(dirname "$out")" "$(dirname "$cached")"
if [ ! -x "$cached" ]; then
	echo "build-etcd: building etcd $version from source..." >&2
	(
		cd hack/etcd
		GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 \
			go build -trimpath -ldflags "-s -w" -o "$cached.tmp.$$" go.etcd.io/etcd/server/v3
	)
	"$cached.tmp.$$" --version >&2
	mv "$cached.tmp.$$" "$cached"
fi
cp "$cached" "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
echo "$out"
