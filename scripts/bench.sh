#!/usr/bin/env bash
# make bench: builds envoy-rls, envoy-rls-floor and envoy-rls-load, then runs
# scripts/bench, which starts the floor, envoy-rls on the embedded store,
# envoy-rls on its own redis-server and, when REF_BIN names a built
# envoyproxy/ratelimit binary, the reference on its own redis-server; drives
# each with the same load in alternating rounds and prints the medians beside
# the floor. Everything listens on 127.0.0.1 and stops at the end.
#   scripts/bench.sh [bench flags]     e.g. --rounds 5 --duration 10s --keys 10000
#   REF_BIN=/path/to/ratelimit scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/envoy-rls" ./cmd/envoy-rls
go build -o "$bin/envoy-rls-floor" ./cmd/envoy-rls-floor
go build -o "$bin/envoy-rls-load" ./cmd/envoy-rls-load
go build -o "$bin/bench" ./scripts/bench
"$bin/bench" --bin-dir "$bin" "$@"
