#!/usr/bin/env bash
# Installs etcd for the e2e test environment (internal/testenv) unless an
# `etcd` binary is already on PATH (or ETCD_BIN names one). Uses Debian's
# etcd-server package (etcd 3.4 on bookworm), which kube-apiserver 1.37
# accepts; see docs/e2e.md. Needs root for apt-get.
set -euo pipefail

if [ -n "${ETCD_BIN:-}" ] && [ -x "$ETCD_BIN" ]; then
	echo "$ETCD_BIN"
	exit 0
fi
if command -v etcd >/dev/null; then
	command -v etcd
	exit 0
fi

echo "install-etcd: installing Debian's etcd-server..." >&2
apt-get update >&2
# testenv starts its own etcd on free ports with a temporary data dir; the
# package's own service (if an init system starts it) is not used.
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends etcd-server >&2
command -v etcd
