#!/usr/bin/env bash
# Load test of the built binary over gRPC on loopback: the memory store and the
# Redis store (a private redis-server on a free port), one hot key and 10,000
# keys. Bounded: each run stops after DURATION. Prints envoy-rls-load's figures
# and the Redis round trips per request.
#   scripts/loadtest.sh            (DURATION=10s CONCURRENCY=64 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/envoy-rls" ./cmd/envoy-rls
go build -o "$work/envoy-rls-load" ./cmd/envoy-rls-load
cat > "$work/load.yaml" <<'YAML'
domain: load
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
YAML

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

wait_http() {
  for _ in $(seq 100); do
    curl -fs "http://$1/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "envoy-rls did not start" >&2; exit 1
}

run() { # name, extra serve args...
  local name=$1; shift
  local grpc http
  grpc=127.0.0.1:$(free_port); http=127.0.0.1:$(free_port)
  "$work/envoy-rls" serve --config "$work/load.yaml" --grpc-addr "$grpc" --http-addr "$http" \
    --backend-timeout 100ms "$@" 2>"$work/$name.log" &
  local pid=$!
  pids+=("$pid")
  wait_http "$http"
  for keys in 1 10000; do
    echo "== $name, keys=$keys"
    "$work/envoy-rls-load" --addr "$grpc" --domain load --key user --keys "$keys" \
      --concurrency "$CONCURRENCY" --duration "$DURATION"
  done
  if [ "$name" = redis ]; then
    curl -fs "http://$http/metrics" | awk '
      /^envoy_rls_redis_requests_total/ {r=$2}
      /^envoy_rls_redis_round_trips_total/ {t=$2}
      END { if (r > 0) printf "redis round trips per request: %.3f (%d / %d)\n", t/r, t, r }'
  fi
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

run memory

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=("$!")
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
run redis --backend redis --redis-url "redis://127.0.0.1:$rport/0"
