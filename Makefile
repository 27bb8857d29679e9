# netpol — see README.md. Every target works on a fresh machine with Go.
GO      ?= go
BIN     := bin/netpol
# The commit `netpol version` prints when the build has no VCS stamp
# (GOFLAGS=-buildvcs=false, a tarball).
COMMIT  := $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD -- 2>/dev/null || echo " (modified)")
PKGS    := ./...

.PHONY: build install uninstall test lint bench bench-agent bench-churn bench-scale bench-peers fuzz demo clean e2e e2e-deps image cluster-up cluster-down e2e-cluster e2e-images conformance-upstream

# Where `make install` puts netpol (and kubectl-netpol, so that
# `kubectl netpol ...` works): $(DESTDIR)$(PREFIX)/bin.
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin

build:
	@echo "building $(BIN) (the first build downloads Go modules; minutes on a cold machine)" >&2
	$(GO) build -ldflags '-X "main.gitCommit=$(COMMIT)"' -o $(BIN) ./cmd/netpol

install: build
	install -d $(DESTDIR)$(BINDIR)
	install -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/netpol
	ln -sf netpol $(DESTDIR)$(BINDIR)/kubectl-netpol

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/netpol $(DESTDIR)$(BINDIR)/kubectl-netpol

# The README's main job: a 2-node lab (network namespaces, real nftables)
# with the example policies and Service; prints the kernel's observed truth
# table next to the evaluator's and every difference, and each pod's
# connection through the Service, then tears the lab down. Root.
demo: build
	$(BIN) lab probe -f examples/demo --compare --services

# The README's test command; .ci/run runs it. The kernel tests need root.
# NETPOL_REQUIRE_KERNEL=1: a kernel test that cannot run (not root) fails
# here instead of skipping (internal/kerneltest).
test: lint
	NETPOL_REQUIRE_KERNEL=1 $(GO) test -count=1 -timeout 30m $(PKGS)

lint:
	$(GO) vet -tags e2e $(PKGS)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

# End-to-end tests against a real etcd + kube-apiserver (internal/testenv;
# docs/e2e.md). e2e-deps installs etcd (Debian's etcd-server) and builds
# kube-apiserver from source into _output/tools/<version>/ unless it is
# there or in the machine's cache (4-6 min the first time on 2 cores).
E2E_DIRS := $(wildcard internal/testenv test/e2e)

e2e-deps:
	hack/install-etcd.sh
	hack/build-kube-apiserver.sh

e2e: e2e-deps build
	$(GO) test -count=1 -tags e2e -timeout 30m $(addprefix ./,$(addsuffix /...,$(E2E_DIRS)))

# Benchmarks and scale harnesses; results go to docs/history/benchmarks-journal.md by hand (the current figures to docs/benchmarks.md).
# The kernel ones (pkg/nft/kernel, conformance) need root.
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 5x -count 1 ./pkg/eval ./pkg/compiler
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 ./pkg/whatif
	$(GO) test -run '^$$' -bench . -benchtime 2x -count 1 ./pkg/dataplane
	$(GO) test -run '^$$' -bench . -skip BenchmarkNewSetLookups -benchtime 20x -count 1 ./pkg/nft/kernel
	$(GO) test -run '^$$' -bench BenchmarkNewSetLookups -benchtime 1x -count 1 ./pkg/nft/kernel
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 ./pkg/proxy
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./pkg/dnssnoop
	$(GO) test -run '^$$' -bench . -benchtime 10x -count 1 ./pkg/node
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 -timeout 1h ./conformance
	$(MAKE) e2e-deps
	$(GO) test -tags e2e -run '^$$' -bench . -benchtime 1x -count 1 -v ./test/e2e
	hack/bench-cli.sh
	hack/bench-layout.sh

# The agent scale harness (pkg/agent BenchmarkAgentEvents, issue 14):
# one node's agent fed a synthetic cluster through its informers, per-event
# latency and CPU at each size in BENCH_PODS, BENCH_EVENTS events per kind,
# in each shape of BENCH_SHAPES and layout of BENCH_LAYOUTS (the address
# layout on the realistic shape is pods x policies: keep it to 30,000 pods,
# BENCH_SHAPES=realistic BENCH_LAYOUTS=addresses,identities BENCH_PODS=10000,30000).
BENCH_PODS    ?= 10000,30000,100000
BENCH_EVENTS  ?= 200
BENCH_SHAPES  ?= easy,realistic
BENCH_LAYOUTS ?= identities
bench-agent:
	NETPOL_BENCH_PODS=$(BENCH_PODS) NETPOL_BENCH_EVENTS=$(BENCH_EVENTS) \
		NETPOL_BENCH_SHAPES=$(BENCH_SHAPES) NETPOL_BENCH_LAYOUTS=$(BENCH_LAYOUTS) \
		$(GO) test -run '^$$' -bench BenchmarkAgentEvents -benchtime 1x -count 1 -timeout 3h ./pkg/agent

# Pod churn against the real test API server (test/e2e BenchmarkPodChurn,
# root): CHURN_RATE pod events per second for CHURN_SECONDS, marker
# latency idle and under churn, the kernels checked against a full compile.
CHURN_RATE    ?= 1000
CHURN_SECONDS ?= 60
bench-churn: e2e-deps build
	NETPOL_CHURN_RATE=$(CHURN_RATE) NETPOL_CHURN_SECONDS=$(CHURN_SECONDS) \
		$(GO) test -tags e2e -run '^$$' -bench BenchmarkPodChurn -benchtime 1x -count 1 -v -timeout 30m ./test/e2e

# One `netpol agent` process against the real test API server holding a
# synthetic cluster of each size in SCALE_PODS (test/e2e
# BenchmarkAgentScale, root): time to ready, first sync, peak RSS. Writing
# the 100,000-pod cluster takes the API server several minutes;
# NETPOL_SCALE_KEEP=/dev/shm/DIR in the environment keeps it for the next
# run.
SCALE_PODS ?= 10000,100000
# The synthetic shapes (easy, realistic: internal/synth); SCALE_STATE=FILE
# runs on the objects of a YAML/JSON dump instead (SCALE_NODE: the node the
# agent runs as, default the dump's first Node).
SCALE_SHAPES ?= easy
SCALE_STATE ?=
SCALE_NODE ?=
# Each size again with the agent in a memory cgroup of each limit (a
# container's resources.limits.memory; the agent's soft limit is 90% of it).
SCALE_MEMORY_LIMITS ?= 512Mi
# etcd built from source (hack/build-etcd.sh): kube-apiserver then streams
# the agent's initial lists (WatchList), as on a cluster with a supported
# etcd; with Debian's etcd 3.4 it sends them as one LIST each.
bench-scale: e2e-deps build
	ETCD_BIN=$$(hack/build-etcd.sh) NETPOL_SCALE_PODS=$(SCALE_PODS) NETPOL_SCALE_MEMORY_LIMITS=$(SCALE_MEMORY_LIMITS) \
		NETPOL_SCALE_SHAPES=$(SCALE_SHAPES) NETPOL_SCALE_STATE=$(SCALE_STATE) NETPOL_SCALE_NODE=$(SCALE_NODE) \
		$(GO) test -tags e2e -run '^$$' -bench BenchmarkAgentScale -benchtime 1x -count 1 -v -timeout 2h ./test/e2e

# A short run of every fuzz target.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzAddDocuments -fuzztime 30s ./pkg/cluster
	$(GO) test -run '^$$' -fuzz FuzzEvaluate -fuzztime 30s ./pkg/eval
	$(GO) test -run '^$$' -fuzz FuzzSyncer -fuzztime 30s ./pkg/proxy
	$(GO) test -run '^$$' -fuzz FuzzCompile -fuzztime 30s ./pkg/compiler

# Container images without Docker or a registry (README "The image"):
# docker-archive tarballs in _output/images/ that `ctr -n k8s.io images
# import`, `kind load image-archive`, `docker load` and `podman load` read.
# netpol.tar is deploy/'s image (a static bin/netpol); pause.tar the pod
# sandbox image of make cluster-up; probe.tar make e2e-cluster's workload.
IMAGE       ?= netpol.local/netpol:dev
PAUSE_IMAGE ?= netpol.local/pause:dev
PROBE_IMAGE ?= netpol.local/probe:dev
IMAGES_DIR  := _output/images

image:
	@mkdir -p $(IMAGES_DIR)/bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X "main.gitCommit=$(COMMIT)"' -o $(IMAGES_DIR)/bin/netpol ./cmd/netpol
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(IMAGES_DIR)/bin/pause ./hack/pause
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(IMAGES_DIR)/bin/probe ./hack/probe
	$(GO) run ./hack/image -o $(IMAGES_DIR)/netpol.tar -tag $(IMAGE) -entrypoint /bin/netpol -file bin/netpol=$(IMAGES_DIR)/bin/netpol
	$(GO) run ./hack/image -o $(IMAGES_DIR)/pause.tar -tag $(PAUSE_IMAGE) -entrypoint /pause -file pause=$(IMAGES_DIR)/bin/pause
	$(GO) run ./hack/image -o $(IMAGES_DIR)/probe.tar -tag $(PROBE_IMAGE) -entrypoint /bin/probe -file bin/probe=$(IMAGES_DIR)/bin/probe

# A Kubernetes cluster on this machine (docs/cluster.md): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, and per node a
# kubelet and containerd (node 1 in the host's network namespace, nodes
# 2..NODES each in one of its own), no kube-proxy; state in
# $(CLUSTER_DIR). Root. cluster-down removes everything cluster-up made.
# NODES=N (make cluster-up, e2e-cluster, conformance-upstream) reaches the
# scripts from make's command line or the environment; cluster-up's default
# is 1, conformance-upstream's 2.
CLUSTER_DIR ?= /tmp/netpol-cluster
export CLUSTER_DIR

cluster-up: image
	hack/cluster-up.sh

cluster-down:
	hack/cluster-down.sh

# The upstream suites' images, built from source (hack/e2e-images.sh):
# agnhost with the tools the tests exec, CoreDNS, the suites' pause tag.
# cluster-up imports them when present and then runs the cluster DNS.
e2e-images:
	hack/e2e-images.sh

# Kubernetes' own sig-network e2e tests against netpol on that cluster
# (hack/conformance-upstream.sh; root; not in CI): SUITES=netpol,services,
# sig-network,npapi-v0.3.0,npapi-v0.1.7 by default (each may be given alone),
# KEEP_CLUSTER=1 uses a cluster that is up; writes
# _output/conformance-upstream/summary.json and each suite's JUnit.
conformance-upstream: image
	flock $(LAB_LOCK) env NETPOL_LAB_LOCKED=1 hack/conformance-upstream.sh

# netpol from deploy/ on that cluster, real pods (test/cluster; root). The
# cluster is brought up if it is not (with the cluster DNS of e2e-images),
# the test runs under the lab lock, and the cluster is taken down
# afterwards unless KEEP_CLUSTER=1.
LAB_LOCK ?= /tmp/netpol-lab.lock

e2e-cluster: image e2e-images
	$(GO) test -c -tags e2e_cluster -o _output/cluster.test ./test/cluster
	flock $(LAB_LOCK) env NETPOL_LAB_LOCKED=1 sh -c '\
		hack/cluster-up.sh && (cd test/cluster && ../../_output/cluster.test -test.v -test.count=1 -test.timeout 20m); rc=$$?; \
		if [ -z "$(KEEP_CLUSTER)" ]; then hack/cluster-down.sh || rc=1; fi; exit $$rc'

# netpol's agent next to kube-proxy v1.37.2 (hack/tools/go.mod) in its
# nftables and iptables modes, one at a time in the same run, against the
# same 10,000 x 10 and 30,000 x 2 Services in a real apiserver, each system
# in a network namespace of its own (test/peers; root; not in CI; 30-60
# min: each full sync is capped at BENCH_PEERS_TIMEOUT, default 10m).
# Writes _output/bench/peers.json and peers.md (docs/history/benchmarks-journal.md by
# hand). Under the lab lock: no lab test shares the machine meanwhile.
bench-peers: build e2e-deps
	hack/build-kube-tools.sh kube-proxy >/dev/null
	$(GO) test -c -tags bench_peers -o _output/peers.test ./test/peers
	flock $(LAB_LOCK) env NETPOL_LAB_LOCKED=1 sh -c 'cd test/peers && ../../_output/peers.test -test.v -test.count=1 -test.timeout 3h'

clean:
	rm -rf bin
