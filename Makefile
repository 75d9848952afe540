# The README's commands. `make test` is what CI runs.
GO ?= go
STATICCHECK_VERSION ?= v0.8.2

.PHONY: run test lint vet bench build

# Run the service on the embedded store with the example config.
run:
	$(GO) run ./cmd/envoy-rls serve --config examples/ratelimit.yaml

build:
	$(GO) build -o bin/envoy-rls ./cmd/envoy-rls

# Everything CI checks: formatting, vet, staticcheck, and every test under -race.
test: lint
	$(GO) test -race -count=1 -timeout 30m ./...

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

lint: vet
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime=1s ./pkg/...
