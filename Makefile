# netpol — see README.md. Every target works on a fresh machine with Go.
GO      ?= go
BIN     := bin/netpol
PKGS    := ./...

.PHONY: build test lint bench fuzz demo clean

build:
	$(GO) build -o $(BIN) ./cmd/netpol

# The README's main job: a 2-node lab (network namespaces, real nftables)
# with the example policies; prints the kernel's observed truth table next
# to the evaluator's and every difference, then tears the lab down. Root.
demo: build
	$(BIN) lab probe -f examples/demo --compare

# The README's test command; .ci/run runs it. The kernel tests need root.
test: lint
	$(GO) test -count=1 $(PKGS)

lint:
	$(GO) vet $(PKGS)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi

# Benchmarks and scale harnesses; results go to docs/benchmarks.md by hand.
# The kernel ones (pkg/nft, conformance) need root.
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 5x -count 1 ./pkg/eval ./pkg/compiler
	$(GO) test -run '^$$' -bench . -benchtime 20x -count 1 ./pkg/nft
	$(GO) test -run '^$$' -bench . -benchtime 3x -count 1 ./conformance
	hack/bench-cli.sh

# A short run of every fuzz target.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzAddDocuments -fuzztime 30s ./pkg/cluster
	$(GO) test -run '^$$' -fuzz FuzzEvaluate -fuzztime 30s ./pkg/eval

clean:
	rm -rf bin
