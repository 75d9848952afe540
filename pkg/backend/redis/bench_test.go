package redis_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// benchRedis runs Apply of one item on key(i) from 64 goroutines per CPU
// (as many concurrent gRPC calls would) and reports Redis round trips and
// script calls per request.
func benchRedis(b *testing.B, opts redis.Options, key func(i uint64) string) {
	srv := redistest.StartStandalone(b)
	opts.URL = srv.URL()
	r := newRedisStore(b, opts)
	l := algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1 << 40, Window: time.Second}
	var next atomic.Uint64
	var failed atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(64)
	before := r.Stats()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		items := []backend.Item{{Limit: l, Hits: 1}}
		out := make([]algorithms.Decision, 1)
		ctx := context.Background()
		for pb.Next() {
			items[0].Key = key(next.Add(1))
			if ok, err := r.Apply(ctx, items, out); err != nil || !ok {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d requests failed or were denied", n)
	}
	st := r.Stats()
	reqs := float64(st.Requests - before.Requests)
	b.ReportMetric(float64(st.RoundTrips-before.RoundTrips)/reqs, "roundtrips/op")
	b.ReportMetric(float64(st.ScriptCalls-before.ScriptCalls)/reqs, "scripts/op")
}

func BenchmarkRedisApplyHotKey(b *testing.B) {
	for _, w := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("window=%v", w), func(b *testing.B) {
			benchRedis(b, redis.Options{BatchWindow: w}, func(uint64) string { return "hot" })
		})
	}
	b.Run("unbatched", func(b *testing.B) {
		benchRedis(b, redis.Options{BatchSize: 1}, func(uint64) string { return "hot" })
	})
}

func BenchmarkRedisApply10kKeys(b *testing.B) {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
	}
	for _, w := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("window=%v", w), func(b *testing.B) {
			benchRedis(b, redis.Options{BatchWindow: w}, func(i uint64) string { return keys[i%uint64(len(keys))] })
		})
	}
}

// BenchmarkRedisApplyLocalDeny: a hot key that is over its limit, answered
// by the local deny cache.
func BenchmarkRedisApplyLocalDeny(b *testing.B) {
	srv := redistest.StartStandalone(b)
	r := newRedisStore(b, redis.Options{URL: srv.URL(), LocalDenyCache: true})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1, Window: 24 * time.Hour}
	items := []backend.Item{{Key: "over", Limit: l, Hits: 1}}
	redisApply(b, r, items...)
	redisApply(b, r, items...) // denied: remembered
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		out := make([]algorithms.Decision, 1)
		for pb.Next() {
			if ok, err := r.Apply(context.Background(), items, out); err != nil || ok {
				b.Error("not denied")
				return
			}
		}
	})
	b.StopTimer()
	st := r.Stats()
	b.ReportMetric(float64(st.RoundTrips)/float64(st.Requests), "roundtrips/op")
}
