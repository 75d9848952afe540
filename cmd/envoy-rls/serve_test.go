package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// On shutdown, GET /healthz must fail at once, while calls in flight are
// still finishing, so that a load balancer stops sending traffic; and the
// whole shutdown is bounded by one --shutdown-grace, not one per server.
func TestShutdownFailsHealthzDuringGraceAndIsBoundedByIt(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseServe([]string{"--config", cfg, "--grpc-addr", freeAddr(t), "--http-addr", freeAddr(t),
		"--watch-config=false", "--shutdown-grace", "1s", "--log-level", "error"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- serve(ctx, o, io.Discard) }()

	healthz := func() (int, error) {
		resp, err := http.Get("http://" + o.HTTPAddr + "/healthz")
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, err := healthz(); err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never healthy")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A gRPC health Watch stream is a call in flight: it keeps GracefulStop
	// waiting until the grace period ends.
	conn, err := grpc.NewClient(o.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v", r, err)
	}

	start := time.Now()
	cancel()
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after shutdown began: %v %v", r, err)
	}
	code, err := healthz()
	if err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz while shutting down: %d %v, want 503", code, err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("shutdown took %v with a 1s grace", took)
	}
}
