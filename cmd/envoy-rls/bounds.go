package main

import (
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Defaults of the bounds on what one client can hold.
const (
	// defaultGRPCMaxConcurrentStreams bounds the calls in progress on one
	// gRPC connection. Envoy opens more connections when it needs more.
	defaultGRPCMaxConcurrentStreams = 1024
	// defaultGRPCMaxRecvMsgSize bounds one request. Envoy's rate limit
	// requests carry a domain and a few descriptors built from headers
	// (which Envoy bounds to 60 KiB together by default): a few hundred
	// bytes, a few KB with long values. With the stream bound, what one
	// connection's requests can hold while they are read is bounded by
	// streams x size (64 MiB by default; decoding takes about twice more).
	defaultGRPCMaxRecvMsgSize = 64 << 10
	// The range of --grpc-max-recv-msg-size.
	minGRPCMaxRecvMsgSize = 1 << 10
	maxGRPCMaxRecvMsgSize = 1 << 30
	// minMaxMemory is the least --max-memory.
	minMaxMemory = 1 << 20
	// grpcKeepaliveMinTime is the least interval between a client's
	// keepalive pings; a client that pings more often is disconnected.
	grpcKeepaliveMinTime = 10 * time.Second
	// grpcKeepaliveTime is how long a connection may be silent before the
	// server pings it, and grpcKeepaliveTimeout how long it waits for the
	// answer before it closes the connection: dead peers are found.
	grpcKeepaliveTime    = 2 * time.Minute
	grpcKeepaliveTimeout = 20 * time.Second
	// httpMaxHeaderBytes bounds an HTTP request's headers.
	httpMaxHeaderBytes = 64 << 10
	// httpReadHeaderTimeout bounds reading an HTTP request's headers (the
	// whole request is bounded by --http-read-timeout).
	httpReadHeaderTimeout = 5 * time.Second
)

// grpcServerOptions bounds what one gRPC client can hold: concurrent
// streams per connection (further streams are refused), the size of a
// request (larger ones get RESOURCE_EXHAUSTED), keepalive pings
// (abusive ones close the connection), and the age of a connection (the
// reference's GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE),
// which also spreads clients again after instances are added.
func grpcServerOptions(o options) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(o.GRPCMaxConcurrentStreams)),
		grpc.MaxRecvMsgSize(int(o.GRPCMaxRecvMsgSize)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge:      o.GRPCMaxConnectionAge,
			MaxConnectionAgeGrace: o.GRPCMaxConnectionAgeGrace,
			Time:                  grpcKeepaliveTime,
			Timeout:               grpcKeepaliveTimeout,
		}),
	}
}

// newHTTPServer returns the HTTP server of handler with every phase of a
// connection bounded: headers, the whole request, the response, and idle
// keep-alive connections, so slow or idle clients cannot hold connections
// (and file descriptors) forever.
func newHTTPServer(o options, handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(httpReadHeaderTimeout, o.HTTPReadTimeout),
		ReadTimeout:       o.HTTPReadTimeout,
		WriteTimeout:      o.HTTPWriteTimeout,
		IdleTimeout:       o.HTTPIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
	}
}
