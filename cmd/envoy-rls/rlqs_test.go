package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/rlqstest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlqs"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// TestRLQSFlags: --rlqs takes its bounds from flags, refuses a report
// size under 4 MiB, and makes the loader refuse two-way buckets.
func TestRLQSFlags(t *testing.T) {
	o, err := parseServe([]string{"--config", "x.yaml"}, io.Discard)
	if err != nil || o.Source.Load.RLQS || o.Source.Load.descriptorOptions().OrderFree {
		t.Fatalf("defaults: %v %+v", err, o.RLQS)
	}
	o, err = parseServe([]string{"--config", "x.yaml", "--rlqs", "--rlqs-max-streams", "7", "--rlqs-unmatched", "deny_all", "--rlqs-abandon-after", "0"}, io.Discard)
	if err != nil || !o.Source.Load.RLQS || o.RLQS.RLQSMaxStreams != 7 || o.RLQS.RLQSUnmatched != "deny_all" || o.RLQS.RLQSAbandonAfter != 0 || !o.Source.Load.descriptorOptions().OrderFree || o.RLQS.RLQSMaxReportSize != rlqs.MinReportSize {
		t.Fatalf("--rlqs: %v %+v", err, o.RLQS)
	}
	for _, args := range [][]string{
		{"--rlqs-max-report-size", "1MiB"},
		{"--rlqs-max-streams", "0"},
		{"--rlqs-unmatched", "maybe"},
		{"--rlqs-hysteresis", "-1"},
	} {
		if _, err := parseServe(append([]string{"--config", "x.yaml", "--rlqs"}, args...), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	// check-config --rlqs refuses a config in which a bucket matches two
	// ways, with both lines; without it the config is fine.
	cfg := filepath.Join(t.TempDir(), "q.yaml")
	if err := os.WriteFile(cfg, []byte("domain: q\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    descriptors:\n      - key: a\n        rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"check-config", "--config", cfg}, &out, &errOut); code != 0 {
		t.Fatalf("without --rlqs: exit %d: %s", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"check-config", "--config", cfg, "--rlqs"}, &out, &errOut); code != 1 || !strings.Contains(out.String()+errOut.String(), "q.yaml:9:") || !strings.Contains(out.String()+errOut.String(), "q.yaml:5 ") {
		t.Fatalf("with --rlqs: exit %d: %s%s", code, out.String(), errOut.String())
	}
}

// onWorker reports whether the calling goroutine is one of gRPC's stream
// workers.
func onWorker() bool {
	buf := make([]byte, 64<<10)
	return bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("grpc.(*Server).serverWorker"))
}

// TestRLQSStreamsDoNotTakeRLSWorkers: with --rlqs, the server has a stream
// worker for every RLQS stream it admits beside the RLS ones, so RLS calls
// still run on workers while every RLQS stream is open (each holds one
// for its life). Without the extra workers they would not.
//
// grpc-go hands a stream to a worker only if one is waiting at that
// instant (else to a goroutine of its own), and a server just started may
// not have its workers waiting yet: a round whose RLQS streams did not all
// land on workers shows nothing, and runs again.
func TestRLQSStreamsDoNotTakeRLSWorkers(t *testing.T) {
	cfg, err := descriptors.Parse("q.yaml", []byte("domain: q\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		t.Fatal(err)
	}
	const streams, workers, calls = 3, 2, 20
	// round returns how many RLQS streams and RLS calls ran on a worker.
	round := func(extra bool) (onStreams, onCalls int64) {
		o, err := parseServe([]string{"--config", "x.yaml", "--rlqs", "--grpc-stream-workers", fmt.Sprint(workers), "--rlqs-max-streams", fmt.Sprint(streams)}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		opts := append(grpcServerOptions(o.Listen), o.RLQS.serverOptions(o.Listen)...)
		if !extra {
			opts = append(opts, grpc.NumStreamWorkers(workers))
		}
		var streamsOn, callsOn atomic.Int64
		opts = append(opts, grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if onWorker() {
				callsOn.Add(1)
			}
			return h(ctx, req)
		}), grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if onWorker() {
				streamsOn.Add(1)
			}
			return h(srv, ss)
		}))
		store := memory.New()
		svc := rls.New(store, cfg, rls.Options{})
		srv, _ := rls.NewGRPCServer(svc, opts...)
		q := rlqs.New(rlqs.Options{Config: svc.Config, Ledger: store})
		q.Register(srv)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(lis) }()
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		for i := range streams {
			st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "q", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"k": fmt.Sprint(i)}}}}}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
		for range calls {
			if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		q.Shutdown()
		srv.Stop()
		q.Close()
		cc.Close()
		store.Close()
		return streamsOn.Load(), callsOn.Load()
	}
	for _, extra := range []bool{true, false} {
		// The streams that can hold a worker: all of them with the
		// extra workers, the workers' number without.
		held := int64(streams)
		if !extra {
			held = workers
		}
		var onStreams, onCalls int64
		for attempt := 0; ; attempt++ {
			if onStreams, onCalls = round(extra); onStreams == held {
				break
			}
			if attempt == 20 {
				t.Fatalf("extra workers %v: in 20 rounds the RLQS streams never held %d workers (last: %d)", extra, held, onStreams)
			}
		}
		if extra && onCalls != calls {
			t.Errorf("with a worker per RLQS stream: %d of %d RLS calls ran on a worker", onCalls, calls)
		}
		if !extra && onCalls != 0 {
			t.Errorf("without extra workers, with the workers held by RLQS streams, %d of %d RLS calls still found one: the test proves nothing", onCalls, calls)
		}
	}
}

// TestServeRLQS: serve --rlqs answers RLQS on the gRPC port beside RLS,
// with health for it, a report larger than RLS's request limit, RLS
// requests still held to their limit; on shutdown the RLQS streams end
// at once (not after the grace) without abandoning any bucket.
func TestServeRLQS(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "q.yaml")
	if err := os.WriteFile(cfg, []byte("domain: q\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseServe([]string{"--config", cfg, "--grpc-addr", testutil.FreeAddr(t), "--http-addr", "", "--watch-config=false",
		"--shutdown-grace", "20s", "--log-level", "error", "--rlqs"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- serve(ctx, o, io.Discard) }()
	cc, err := grpc.NewClient(o.Listen.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	testutil.WaitFor(t, 10*time.Second, "RLQS health SERVING", func() bool {
		r, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{Service: rlqs.ServiceName})
		return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
	})
	c := rlqstest.New(rlqstest.Options{Conn: cc, Domain: "q", Period: time.Hour})
	defer c.Close()
	id := map[string]string{"user": "a"}
	c.Request(id)
	testutil.WaitFor(t, 10*time.Second, "an assignment", func() bool { return c.Bucket(id).Assigned })
	if b := c.Bucket(id); b.Rate <= 0 || b.Rate > 100 {
		t.Fatalf("assignment %+v", b)
	}

	// A report of 1 MiB of bucket ids is read (RLS requests stop at 64 KiB).
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	big := &rlqsv3.RateLimitQuotaUsageReports{Domain: "q"}
	for i := range 2000 {
		big.BucketQuotaUsages = append(big.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprintf("%0500d", i)}}})
	}
	if err := st.Send(big); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || len(resp.GetBucketAction()) != 2000 {
		t.Fatalf("a 1 MiB report: %v (%d actions)", err, len(resp.GetBucketAction()))
	}
	huge := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: strings.Repeat("x", 100<<10)}}}}}
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(context.Background(), huge); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 100 KiB RLS request: %v, want ResourceExhausted", err)
	}

	start := time.Now()
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("shutdown took %v with RLQS streams open (grace 20s)", took)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the RLQS stream after shutdown: %v, want Unavailable", err)
	}
	b := c.Bucket(id)
	if !b.Exists || !b.Assigned {
		t.Fatalf("after shutdown the client holds %+v, want its assignment (nothing abandoned)", b)
	}
	for _, a := range c.Actions(id) {
		if a.GetAbandonAction() != nil {
			t.Fatal("an abandon was sent")
		}
	}
}
