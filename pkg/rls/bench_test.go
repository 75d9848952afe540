package rls_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	splitstore "github.com/envoyrls/envoy-rls/pkg/backend/split"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

const benchYAML = `
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: api
    rate_limits:
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}
      - {window: 10s, requests_per_unit: 1000000000, algorithm: sliding_window_counter}
  - key: attacker
    rate_limit: {unit: hour, requests_per_unit: 1}
`

func benchService(b *testing.B) *rls.Service { return benchServiceOn(b, false) }

// benchServiceOn is benchService on the memory store, or, with split, on a
// split store of two memory stores (per-second limits in one).
func benchServiceOn(b *testing.B, split bool) *rls.Service {
	cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	var store backend.Store = memory.New()
	if split {
		store = splitstore.New(store, memory.New(), splitstore.Options{})
	}
	b.Cleanup(func() { store.Close() })
	return rls.New(store, cfg, rls.Options{})
}

func benchRequests(key string, n int) []*rlsv3.RateLimitRequest {
	reqs := make([]*rlsv3.RateLimitRequest, n)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "v" + strconv.Itoa(i)}},
		}}}
	}
	return reqs
}

// BenchmarkShouldRateLimit measures the service without gRPC: validation,
// matching, key building, the memory store and the response. The
// "deadline" cases call with a deadline, as Envoy does (its filter's
// timeout) and as gRPC passes it on. The split case is the composite on a
// split store (two memory stores): its minute and 10 s limits in one, its
// per-second limit in the other, decided in three calls.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, bc := range []struct {
		name     string
		key      string
		keys     int
		deadline bool
		split    bool
	}{
		{"hot_key", "user", 1, false, false},
		{"10k_keys", "user", 10_000, false, false},
		{"10k_keys_deadline", "user", 10_000, true, false},
		{"composite_3_limits", "api", 10_000, false, false},
		{"composite_split_deadline", "api", 10_000, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			svc := benchServiceOn(b, bc.split)
			reqs := benchRequests(bc.key, bc.keys)
			var next atomic.Int64
			ctx := context.Background()
			if bc.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Hour)
				defer cancel()
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := reqs[int(next.Add(1))%len(reqs)]
					if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkShouldRateLimitDenied is BenchmarkShouldRateLimit's hot key
// denied, with the default options: every call is OVER_LIMIT, with
// Retry-After and the denying rule in dynamic metadata, as under a flood.
func BenchmarkShouldRateLimitDenied(b *testing.B) {
	svc := benchService(b)
	req := benchRequests("attacker", 1)[0]
	ctx := context.Background()
	svc.ShouldRateLimit(ctx, req) // the hour's one request
	b.ReportAllocs()
	for b.Loop() {
		if r, err := svc.ShouldRateLimit(ctx, req); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			b.Fatal(r, err)
		}
	}
}

// BenchmarkGRPC measures whole calls through a real gRPC server and client
// on loopback, on the memory store.
func BenchmarkGRPC(b *testing.B) {
	benchGRPC(b, func(b *testing.B) (*rls.Service, func(b *testing.B)) { return benchService(b), nil })
}

// BenchmarkGRPCRedis is BenchmarkGRPC on the Redis store, against a real
// redis-server started for it. It reports decisions per second and Redis
// round trips per request (below 1 when concurrent requests share
// pipelines).
func BenchmarkGRPCRedis(b *testing.B) {
	srv := redistest.StartStandalone(b)
	benchGRPC(b, func(b *testing.B) (*rls.Service, func(b *testing.B)) {
		cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
		if err != nil {
			b.Fatal(err)
		}
		store, err := redis.New(redis.Options{URL: srv.URL()})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { store.Close() })
		before := store.Stats()
		report := func(b *testing.B) {
			after := store.Stats()
			b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/float64(b.N), "roundtrips/op")
		}
		return rls.New(store, cfg, rls.Options{}), report
	})
}

func benchGRPC(b *testing.B, newService func(b *testing.B) (*rls.Service, func(b *testing.B))) {
	for _, bc := range []struct {
		name string
		keys int
	}{{"hot_key", 1}, {"10k_keys", 10_000}} {
		b.Run(bc.name, func(b *testing.B) {
			svc, report := newService(b)
			srv, _ := rls.NewGRPCServer(svc)
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go srv.Serve(lis)
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			reqs := benchRequests("user", bc.keys)
			var next atomic.Int64
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := reqs[int(next.Add(1))%len(reqs)]
					if _, err := client.ShouldRateLimit(ctx, r); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			if report != nil {
				report(b)
			}
		})
	}
}

// BenchmarkMetrics measures ShouldRateLimit (10k keys, memory store) with
// no metrics, with the envoy_rls_* series, and with the reference's
// ratelimit_service_* series too.
func BenchmarkMetrics(b *testing.B) {
	cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name      string
		metrics   bool
		reference bool
	}{{"none", false, false}, {"envoy_rls", true, false}, {"with_reference", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			store := memory.New()
			b.Cleanup(func() { store.Close() })
			var opts rls.Options
			if bc.metrics {
				reg := prometheus.NewRegistry()
				opts.Metrics = rls.NewMetrics(reg)
				if bc.reference {
					opts.Metrics.EnableReference(reg, 0.8)
				}
			}
			svc := rls.New(store, cfg, opts)
			reqs := benchRequests("user", 10_000)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
