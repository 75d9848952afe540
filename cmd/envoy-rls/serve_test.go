package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/schedprobe"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// On shutdown, GET /healthz must fail at once, while calls in flight are
// still finishing, so that a load balancer stops sending traffic; and the
// whole shutdown is bounded by one --shutdown-grace, not one per server.
func TestShutdownFailsHealthzDuringGraceAndIsBoundedByIt(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseServe([]string{"--config", cfg, "--grpc-addr", testutil.FreeAddr(t), "--http-addr", testutil.FreeAddr(t),
		"--watch-config=false", "--shutdown-grace", "1s", "--log-level", "error"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- serve(ctx, o, io.Discard) }()

	healthz := func() (int, error) {
		resp, err := http.Get("http://" + o.Listen.HTTPAddr + "/healthz")
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
	conn, err := grpc.NewClient(o.Listen.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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

	probe := schedprobe.Start()
	start := time.Now()
	cancel()
	if r, err := stream.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after shutdown began: %v %v", r, err)
	}
	code, err := healthz()
	if err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz while shutting down: %d %v, want 503", code, err)
	}
	// The reference's /healthcheck: 500 with an empty body from SIGTERM on.
	resp, err := http.Get("http://" + o.Listen.HTTPAddr + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError || len(body) != 0 {
		t.Fatalf("/healthcheck while shutting down: %d %q, want 500 and no body", resp.StatusCode, body)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return")
	}
	// One grace, plus what the scheduling delays measured meanwhile add;
	// a grace per server would be 2 s or more.
	if took, slack := time.Since(start), probe.Stop(); took > time.Second+slack {
		t.Fatalf("shutdown took %v with a 1s grace (measured scheduling slack %v)", took, slack)
	}
}

// /healthcheck answers 200 OK when serving; with --health-requires-config
// and the config over xDS it answers 500 until a config with a domain
// arrives (here it never does: the control plane is unreachable), and the
// debug listener's /rlconfig is empty.
func TestHealthcheck(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(cfg, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var grpcAddr string
	// run serves with args until /healthz answers want.
	run := func(want int, args ...string) (string, string, func()) {
		httpAddr, debugAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
		grpcAddr = testutil.FreeAddr(t)
		o, err := parseServe(append([]string{"--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--debug-addr", debugAddr, "--log-level", "error"}, args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = serve(ctx, o, io.Discard); close(done) }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if code, _ := get("http://" + httpAddr + "/healthz"); code == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("never serving")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return "http://" + httpAddr, "http://" + debugAddr, func() { cancel(); <-done }
	}
	web, debug, stop := run(http.StatusOK, "--config", cfg)
	if code, body := get(web + "/healthcheck"); code != 200 || body != "OK" {
		t.Fatalf("/healthcheck = %d %q, want 200 OK", code, body)
	}
	if code, body := get(debug + "/rlconfig"); code != 200 || body != "d.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n" {
		t.Fatalf("/rlconfig = %d %q", code, body)
	}
	stop()
	// Not ready without a config: /healthz says 503 too.
	web, debug, stop = run(http.StatusServiceUnavailable, "--config-xds", testutil.FreeAddr(t), "--force-start-without-initial-config", "--health-requires-config")
	defer stop()
	if code, body := get(web + "/healthcheck"); code != http.StatusInternalServerError || body != "" {
		t.Fatalf("/healthcheck without a config = %d %q, want 500 and no body", code, body)
	}
	if code, body := get(debug + "/rlconfig"); code != 200 || body != "" {
		t.Fatalf("/rlconfig without a config = %d %q", code, body)
	}
	// Calls before the first config fail as the reference's do.
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "no rate limit configuration loaded") {
		t.Fatalf("call before the first config: %v, want Unknown: no rate limit configuration loaded", err)
	}
}
