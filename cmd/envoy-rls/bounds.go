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
	// defaultGRPCMaxConnections bounds the gRPC connections open at once.
	// Envoy keeps one connection per worker thread to each rate limit
	// host (fewer under low load), so 4,096 serves, say, 500 proxies of 8
	// workers on one instance; an idle connection costs about 22 KB and 3
	// goroutines, 90 MB at the limit.
	defaultGRPCMaxConnections = 4096
	// defaultHTTPMaxConnections bounds the connections open at once on the
	// HTTP listener: probes, Prometheus and /json clients need a few; each
	// holds about 12 KB (buffers and a goroutine) for at most
	// --http-idle-timeout, or --http-read-header-timeout until its headers.
	defaultHTTPMaxConnections = 1024
	// defaultGRPCStreamWorkers is the number of goroutines that run gRPC
	// calls, each one call after another. Without them grpc-go starts a
	// goroutine per call, whose stack grows (is copied to a larger one)
	// in every call: about 2.5 us of a call's 16-19 us of server CPU under
	// make bench's load. A call finding every worker busy gets a goroutine
	// of its own, as without workers. Each idle worker holds its stack
	// (a few KB).
	defaultGRPCStreamWorkers = 64
	// defaultGRPCMaxConnectionAge and defaultGRPCMaxConnectionAgeGrace
	// close a gRPC connection gracefully, as the reference's
	// GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE do by
	// default; clients spread again over instances added meanwhile.
	defaultGRPCMaxConnectionAge      = 24 * time.Hour
	defaultGRPCMaxConnectionAgeGrace = time.Hour
	// defaultShutdownGrace bounds the wait for calls in flight at
	// shutdown, and then the write-back of hits allowed while Redis was
	// away.
	defaultShutdownGrace = 5 * time.Second
	// defaultGRPCMaxConnectionIdle closes connections with no call for
	// that long; Envoy opens a new one at its next call.
	defaultGRPCMaxConnectionIdle = 5 * time.Minute
	// grpcStreamWindow is the HTTP/2 flow-control window of each stream,
	// the HTTP/2 default, set explicitly so that grpc-go does not grow it
	// from its bandwidth-delay estimate (up to 16 MiB a stream): what a
	// stream can hold unread is then this window (grpc-go widens it to
	// the size of a message being read, itself at most
	// --grpc-max-recv-msg-size). grpcConnWindow is the connection's
	// window, which grpc-go replenishes as data arrives, whether or not it
	// was read: it bounds no memory, only how much is in transit.
	grpcStreamWindow = 64 << 10
	grpcConnWindow   = 1 << 20
	// defaultFirstRequestTimeout bounds the time from a gRPC connection's
	// accept to its first call: grpc-go's ConnectionTimeout bounds the TLS
	// handshake and HTTP/2 preface by it, the listener the rest. Envoy
	// opens a connection when it has a call to make.
	defaultFirstRequestTimeout = 10 * time.Second
	// defaultHTTPReservedConnections are the HTTP connections beyond
	// --http-max-connections kept for health probes. A connection on them
	// that asks for anything else is answered 503 as soon as its headers
	// are read, and closed, so a flood of slow bodies holds none of them.
	defaultHTTPReservedConnections = 128
	// maxGRPCStreamWorkers bounds --grpc-stream-workers (each holds a
	// goroutine and its stack for the process's life).
	maxGRPCStreamWorkers = 1 << 16
	// The range of --grpc-max-recv-msg-size.
	minGRPCMaxRecvMsgSize = 1 << 10
	maxGRPCMaxRecvMsgSize = 1 << 30
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
	// defaultHTTPReadHeaderTimeout bounds reading an HTTP request's
	// headers (the whole request is bounded by --http-read-timeout); probes,
	// scrapes and /json clients send theirs at once.
	defaultHTTPReadHeaderTimeout = 2 * time.Second
	// defaultHTTPReadTimeout bounds reading a whole HTTP request: /json
	// bodies are small.
	defaultHTTPReadTimeout = 5 * time.Second
)

// grpcServerOptions bounds what one gRPC client can hold: concurrent
// streams per connection (further streams are refused), the size of a
// request (larger ones get RESOURCE_EXHAUSTED), the flow-control window of
// a stream (fixed, not grown), keepalive pings (abusive ones close the
// connection), the time a connection may stay without calls, the time to
// its first frames, and the age of a connection (the
// reference's GRPC_MAX_CONNECTION_AGE and GRPC_MAX_CONNECTION_AGE_GRACE),
// which also spreads clients again after instances are added.
func grpcServerOptions(o listenerOptions) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(o.GRPCMaxConcurrentStreams)),
		grpc.NumStreamWorkers(uint32(o.GRPCStreamWorkers)),
		grpc.MaxRecvMsgSize(int(o.GRPCMaxRecvMsgSize)),
		grpc.InitialWindowSize(grpcStreamWindow),
		grpc.InitialConnWindowSize(grpcConnWindow),
		grpc.ConnectionTimeout(o.FirstRequestTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             grpcKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     o.GRPCMaxConnectionIdle,
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
func newHTTPServer(o listenerOptions, handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: min(o.HTTPReadHeaderTimeout, o.HTTPReadTimeout),
		ReadTimeout:       o.HTTPReadTimeout,
		WriteTimeout:      o.HTTPWriteTimeout,
		IdleTimeout:       o.HTTPIdleTimeout,
		MaxHeaderBytes:    httpMaxHeaderBytes,
	}
}
