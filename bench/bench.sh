#!/usr/bin/env bash
# make bench: builds envoy-rls, envoy-rls-floor and envoy-rls-load, then runs
# bench/engine, which starts the floor, envoy-rls on the embedded store,
# envoy-rls on its own redis-server and, when REF_BIN names a built
# envoyproxy/ratelimit binary, the reference on its own redis-server; drives
# each with the same load in alternating rounds and prints the medians beside
# the floor. Everything listens on 127.0.0.1 and stops at the end.
#   bench/bench.sh [bench flags]     e.g. --rounds 5 --duration 10s --keys 10000
#   bench/bench.sh --rounds 1 --systems floor,memory,redis   (a quick run)
#   REF_BIN=/path/to/ratelimit bench/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/envoy-rls" ./cmd/envoy-rls
go build -o "$bin/envoy-rls-floor" ./bench/envoy-rls-floor
go build -o "$bin/envoy-rls-load" ./bench/envoy-rls-load
go build -o "$bin/bench" ./bench/engine
"$bin/bench" --bin-dir "$bin" "$@"
