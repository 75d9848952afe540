# The README's commands. `make test` is what CI runs.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: run test test-short lint vet bench bench-go build conformance config-compare failmodes

# Run the service on the embedded store with the example config. The ports
# are ENVOY_RLS_GRPC_ADDR and ENVOY_RLS_HTTP_ADDR (default :8081 and :8080).
run: build
	./bin/envoy-rls serve --config examples/ratelimit.yaml

# -v lists the packages as they compile, so a first build (minutes) is not
# silent; -buildvcs=auto records the git commit for `envoy-rls version`
# even where GOFLAGS turns it off.
build:
	@echo "building bin/envoy-rls (the first build downloads modules and compiles for several minutes)"
	$(GO) build -v -buildvcs=auto -o bin/envoy-rls ./cmd/envoy-rls

# Everything CI checks: formatting, vet, staticcheck, and every test under -race,
# including deploy/, a module of its own (the Dockerfile, compose file,
# Kubernetes manifests and gateway examples).
test: lint
	$(GO) test -race -count=1 -timeout 30m ./...
	cd deploy && $(GO) test -race -count=1 -timeout 30m ./...

# The short tier: pure and in-process tests only, in seconds; what needs a
# process of its own (redis-server, the built binary) is skipped.
test-short:
	$(GO) test -short -count=1 ./...

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd deploy && $(GO) vet ./...

lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd deploy && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

# The floor, envoy-rls (memory, Redis) and, with REF_BIN set, the reference
# server under the same load, side by side (see README, Performance).
bench:
	bench/bench.sh $(BENCH_FLAGS)

# The Go benchmarks of the hot path.
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime=1s ./pkg/...

# Measures, for each failure mode, what three instances sharing one
# redis-server allow while Redis is overloaded, slow, frozen and killed, and
# prints the table of README's Failure policy (test/integration's
# TestFailureModes, which CI runs with its assertions, on a normal build).
failmodes:
	@out=$$(mktemp); if $(GO) test -count=1 -v -timeout 10m -run '^TestFailureModes$$' ./test/integration \
		-args -build-race=false -failmodes.table >$$out 2>&1; then sed -n '/^| mode/,/^$$/p' $$out; rm -f $$out; \
	else cat $$out; rm -f $$out; exit 1; fi

# Replays request sequences from the reference server's test suite against
# the reference (REF_BIN, built from github.com/envoyproxy/ratelimit) and
# envoy-rls on both stores, and prints every difference. Not part of CI.
conformance:
	@if [ -z "$(REF_BIN)" ]; then echo "usage: make conformance REF_BIN=/path/to/ratelimit"; exit 2; fi
	$(GO) run ./test/conformance -ref-bin "$(REF_BIN)"

# Each config file checked alone by the reference's checker and by envoy-rls,
# natively and with --config-lenient; fails when the reference accepts a file
# that lenient mode refuses (REF_CHECK: ratelimit_config_check built from
# envoyproxy/ratelimit; CONFIGS: more files, e.g. the reference's
# test/config/*.yaml).
config-compare:
	@if [ -z "$(REF_CHECK)" ]; then echo "usage: make config-compare REF_CHECK=/path/to/config_check [CONFIGS='more/*.yaml']"; exit 2; fi
	$(GO) build -o bin/envoy-rls ./cmd/envoy-rls
	./test/conformance/configcheck.sh "$(REF_CHECK)" bin/envoy-rls test/conformance/configs/*.yaml $(CONFIGS)
