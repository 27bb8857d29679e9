#!/usr/bin/env bash
# Builds kube-apiserver from source (the hack/tools module) for the e2e test
# environment (internal/testenv) unless it is already there or cached:
#   _output/tools/<version>/kube-apiserver
# See hack/build-kube-tools.sh (this is `hack/build-kube-tools.sh
# kube-apiserver`). Prints the binary's path on stdout.
exec "$(dirname "$0")/build-kube-tools.sh" kube-apiserver
