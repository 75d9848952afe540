// Package xdstest runs a real go-control-plane xDS server for tests, shaped
// like Envoy Gateway's rate limit control plane: ADS over gRPC, a snapshot
// cache keyed by node id, optionally TLS 1.3 requiring client certificates.
package xdstest

import (
	"context"
	"crypto/tls"
	"crypto/x509"

	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// NodeID is the node id Envoy Gateway serves rate limit configs to.
const NodeID = "envoy-ratelimit"

// ControlPlane is a running xDS server. Its methods are safe for concurrent
// use.
type ControlPlane struct {
	// Addr is the server's address, 127.0.0.1:port. It stays the same
	// across Restart.
	Addr  string
	Cache cache.SnapshotCache

	tls *tls.Config

	mu       sync.Mutex
	srv      *grpc.Server
	requests []*discoverygrpc.DiscoveryRequest
	version  int
}

// ServerTLS returns Envoy Gateway's server settings: TLS 1.3 only, the given
// server certificate, and client certificates required and verified
// against the CA file.
func ServerTLS(tb testing.TB, certFile, keyFile, caFile string) *tls.Config {
	tb.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		tb.Fatalf("xdstest: no certificate in %s", caFile)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
}

// Start starts a control plane on a free loopback port, with TLS when
// tlsConf is not nil. It stops when the test ends.
func Start(tb testing.TB, tlsConf *tls.Config) *ControlPlane {
	tb.Helper()
	cp := &ControlPlane{Cache: cache.NewSnapshotCache(false, cache.IDHash{}, quiet{}), tls: tlsConf}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	cp.Addr = lis.Addr().String()
	cp.serve(lis)
	tb.Cleanup(cp.Stop)
	return cp
}

func (cp *ControlPlane) serve(lis net.Listener) {
	var opts []grpc.ServerOption
	if cp.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cp.tls)))
	}
	srv := grpc.NewServer(opts...)
	cb := server.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoverygrpc.DiscoveryRequest) error {
		cp.mu.Lock()
		cp.requests = append(cp.requests, r)
		cp.mu.Unlock()
		return nil
	}}
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(srv, server.NewServer(context.Background(), cp.Cache, cb))
	cp.mu.Lock()
	cp.srv = srv
	cp.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
}

// Stop stops the server at once, closing every stream.
func (cp *ControlPlane) Stop() {
	cp.mu.Lock()
	srv := cp.srv
	cp.srv = nil
	cp.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// Restart starts a stopped server again on the same address, with the same
// snapshots.
func (cp *ControlPlane) Restart(tb testing.TB) {
	tb.Helper()
	var lis net.Listener
	var err error
	for i := 0; i < 100; i++ { // the port may linger briefly after Stop
		if lis, err = net.Listen("tcp", cp.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("xdstest: listening again on %s: %v", cp.Addr, err)
	}
	cp.serve(lis)
}

// Set serves cfgs as the whole state of the world for node NodeID, under a
// new version, which it returns.
func (cp *ControlPlane) Set(tb testing.TB, cfgs ...*rlsconf.RateLimitConfig) string {
	tb.Helper()
	cp.mu.Lock()
	cp.version++
	version := strconv.Itoa(cp.version)
	cp.mu.Unlock()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	if err := cp.Cache.SetSnapshot(context.Background(), NodeID, snap); err != nil {
		tb.Fatalf("xdstest: %v", err)
	}
	return version
}

// Requests returns the discovery requests received so far, in order.
func (cp *ControlPlane) Requests() []*discoverygrpc.DiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*discoverygrpc.DiscoveryRequest(nil), cp.requests...)
}

// WaitRequest polls until a received request satisfies ok, and returns it.
func (cp *ControlPlane) WaitRequest(tb testing.TB, what string, ok func(*discoverygrpc.DiscoveryRequest) bool) *discoverygrpc.DiscoveryRequest {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, r := range cp.Requests() {
			if ok(r) {
				return r
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	tb.Fatalf("xdstest: no %s within 30s; requests: %v", what, cp.Requests())
	return nil
}

// ACKed reports a request acknowledging version.
func ACKed(version string) func(*discoverygrpc.DiscoveryRequest) bool {
	return func(r *discoverygrpc.DiscoveryRequest) bool {
		return r.GetResponseNonce() != "" && r.GetErrorDetail() == nil && r.GetVersionInfo() == version
	}
}

// NACKed reports a request refusing a response.
func NACKed(r *discoverygrpc.DiscoveryRequest) bool {
	return r.GetResponseNonce() != "" && r.GetErrorDetail() != nil
}

// quiet drops the cache's log lines.
type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
