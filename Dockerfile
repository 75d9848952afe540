# syntax=docker/dockerfile:1
#
# envoy-rls container image.
#
#   docker build --build-arg VERSION=v0.1.0 -t envoy-rls:v0.1.0 .
#
# Two stages: a Go toolchain builds one static binary; the final image is
# `scratch` with only that binary (at /usr/local/bin/envoy-rls and at
# /bin/ratelimit, the path Envoy Gateway runs), the CA certificates and
# nothing else: no shell, no package manager, no writable path. It runs as
# uid/gid 65534 ("nobody") and writes nothing, so a read-only root file
# system works. deploy/dockerfile_test.go checks this file and runs its
# build command.

# The Go release go.mod asks for, pinned (never `latest`).
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
# Modules first, so a code change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The version printed by `envoy-rls version`.
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/envoy-rls ./cmd/envoy-rls

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/envoy-rls /usr/local/bin/envoy-rls
# Envoy Gateway's rate limit Deployment runs `/bin/ratelimit` with no
# arguments and configures it with envoyproxy/ratelimit's environment.
COPY --from=build /out/envoy-rls /bin/ratelimit
USER 65534:65534
# 8081: gRPC (RateLimitService, grpc.health.v1). 8080: HTTP (/healthz, /json,
# /metrics).
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/envoy-rls"]
# The config directory; mount a ConfigMap there (deploy/kubernetes).
CMD ["serve", "--config", "/etc/envoy-rls"]
