package redis_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// redisCost is what a redis-server has spent so far, from INFO: the
// time of every command (commandstats usec, nested script commands
// included only inside their script's figure) and its process CPU.
type redisCost struct{ cmdUsec, cpuUsec float64 }

func readRedisCost(tb testing.TB, rc *goredis.Client) redisCost {
	tb.Helper()
	txt, err := rc.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var c redisCost
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "cmdstat_fcall" || k == "cmdstat_evalsha" || k == "cmdstat_eval":
			for _, kv := range strings.Split(v, ",") {
				if a, b, _ := strings.Cut(kv, "="); a == "usec" {
					f, _ := strconv.ParseFloat(b, 64)
					c.cmdUsec += f
				}
			}
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			c.cpuUsec += f * 1e6
		}
	}
	return c
}

// benchRedis runs Apply of one item of limit l on key(i) from 64
// goroutines per CPU (as many concurrent gRPC calls would) and reports,
// per request: Redis round trips, script calls, the script's time in Redis
// (INFO commandstats: redis-µs/op) and the redis-server process's CPU
// (redis-cpu-µs/op, which adds reading and answering the connections), and
// this process's CPU (cpu-µs/op: the store, go-redis and the goroutines'
// wake-ups).
func benchRedis(b *testing.B, opts redis.Options, l algorithms.Limit, key func(i uint64) string) {
	benchRedisConsistency(b, opts, l, key, backend.Strict)
}

// benchRedisConsistency is benchRedis with items of consistency c.
// benchLeasePlenty, when not 0, is the plenty factor of the store of
// benchRedisConsistency (redis.SetLeasePlenty).
var benchLeasePlenty uint64

func benchRedisConsistency(b *testing.B, opts redis.Options, l algorithms.Limit, key func(i uint64) string, c backend.Consistency) {
	srv := redistest.StartStandalone(b)
	rc := srv.Client()
	opts.URL = srv.URL()
	r := newRedisStore(b, opts)
	if benchLeasePlenty != 0 {
		redis.SetLeasePlenty(r, benchLeasePlenty)
	}
	var next atomic.Uint64
	var failed, denied atomic.Int64
	// One call first: the function library loads outside the measurement.
	redisApply(b, r, backend.Item{Key: "warm", Limit: l, Hits: 1})
	b.ReportAllocs()
	b.SetParallelism(64)
	before, cost0, cpu0 := r.Stats(), readRedisCost(b, rc), processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		items := []backend.Item{{Limit: l, Hits: 1, Partition: 1, Consistency: c}}
		out := make([]algorithms.Decision, 1)
		ctx := context.Background()
		for pb.Next() {
			items[0].Key = key(next.Add(1))
			switch ok, err := r.Apply(ctx, items, out); {
			case err != nil:
				failed.Add(1)
			case !ok:
				denied.Add(1)
			}
		}
	})
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d requests failed", n)
	}
	st, cost1, cpu1 := r.Stats(), readRedisCost(b, rc), processCPU(b)
	reqs := float64(st.Requests - before.Requests)
	b.ReportMetric((cpu1-cpu0)/reqs, "cpu-µs/op")
	b.ReportMetric(float64(st.RoundTrips-before.RoundTrips)/reqs, "roundtrips/op")
	b.ReportMetric(float64(st.ScriptCalls-before.ScriptCalls)/reqs, "scripts/op")
	b.ReportMetric((cost1.cmdUsec-cost0.cmdUsec)/reqs, "redis-µs/op")
	b.ReportMetric((cost1.cpuUsec-cost0.cpuUsec)/reqs, "redis-cpu-µs/op")
	if c == backend.Lease {
		b.ReportMetric(float64(st.Decided-before.Decided)/reqs, "strict/op")
		b.ReportMetric(float64(st.Lease.Chunks-before.Lease.Chunks)/reqs, "chunks/op")
	}
	if l.Algorithm == algorithms.SlidingWindowLog {
		b.ReportMetric(float64(denied.Load())/reqs, "denied/op")
	} else if denied.Load() > 0 {
		b.Fatalf("%d requests denied by a limit no run reaches", denied.Load())
	}
}

// processCPU is the CPU time (user and system) this process has used, in
// µs: the store's cost per request, apart from Redis's, when divided by the
// requests (the benchmark's own loop adds little).
func processCPU(tb testing.TB) float64 {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// bigLimit never denies in a benchmark.
func bigLimit(k algorithms.Kind) algorithms.Limit {
	return algorithms.Limit{Algorithm: k, Requests: 1 << 40, Window: time.Second}
}

func tenThousandKeys() func(uint64) string {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%d", i)
	}
	return func(i uint64) string { return keys[i%uint64(len(keys))] }
}

func BenchmarkRedisApplyHotKey(b *testing.B) {
	hot := func(uint64) string { return "hot" }
	for _, w := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("window=%v", w), func(b *testing.B) {
			benchRedis(b, redis.Options{BatchWindow: w}, bigLimit(algorithms.TokenBucket), hot)
		})
	}
	b.Run("unbatched", func(b *testing.B) {
		benchRedis(b, redis.Options{BatchSize: 1}, bigLimit(algorithms.TokenBucket), hot)
	})
}

func BenchmarkRedisApply10kKeys(b *testing.B) {
	for _, w := range []time.Duration{0, 50 * time.Microsecond} {
		b.Run(fmt.Sprintf("window=%v", w), func(b *testing.B) {
			benchRedis(b, redis.Options{BatchWindow: w}, bigLimit(algorithms.TokenBucket), tenThousandKeys())
		})
	}
}

// BenchmarkRedisDecision: one single-descriptor decision per request on
// 10,000 keys for every algorithm, unbatched (one script call per request)
// and batched (the default: concurrent requests share a script call). The
// sliding log runs at a limit of 1,000 per second on 16 keys, so each key
// holds hundreds of entries and a decision drops the oldest and pushes
// one (denied/op says how many hit the limit).
func BenchmarkRedisDecision(b *testing.B) {
	for _, k := range algorithms.Kinds() {
		l := bigLimit(k)
		keys := tenThousandKeys()
		if k == algorithms.SlidingWindowLog {
			l = algorithms.Limit{Algorithm: k, Requests: 1000, Window: time.Second}
			keys = func(i uint64) string { return "log:" + strconv.Itoa(int(i%16)) }
		}
		for _, batch := range []int{1, 0} {
			name := fmt.Sprintf("%s/batched", k)
			if batch == 1 {
				name = fmt.Sprintf("%s/unbatched", k)
			}
			b.Run(name, func(b *testing.B) {
				benchRedis(b, redis.Options{BatchSize: batch}, l, keys)
			})
		}
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

// BenchmarkRedisItems: requests of 1 to 8 items (descriptors, or limits of
// one descriptor: each is a key), fixed window on 10,000 keys, batched.
// redis-µs/op is per request: divide by the items for a decision.
func BenchmarkRedisItems(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("items=%d", n), func(b *testing.B) {
			benchRedisItems(b, n)
		})
	}
}

func benchRedisItems(b *testing.B, n int) {
	srv := redistest.StartStandalone(b)
	rc := srv.Client()
	r := newRedisStore(b, redis.Options{URL: srv.URL()})
	l := bigLimit(algorithms.FixedWindow)
	keys := tenThousandKeys()
	redisApply(b, r, backend.Item{Key: "warm", Limit: l, Hits: 1})
	var next atomic.Uint64
	var failed atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(64)
	before, cost0, cpu0 := r.Stats(), readRedisCost(b, rc), processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		items := make([]backend.Item, n)
		out := make([]algorithms.Decision, n)
		ctx := context.Background()
		for pb.Next() {
			i := next.Add(1)
			for j := range items {
				items[j] = backend.Item{Key: keys(i*uint64(n) + uint64(j)), Limit: l, Hits: 1}
			}
			if ok, err := r.Apply(ctx, items, out); err != nil || !ok {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if f := failed.Load(); f > 0 {
		b.Fatalf("%d requests failed or were denied", f)
	}
	st, cost1, cpu1 := r.Stats(), readRedisCost(b, rc), processCPU(b)
	reqs := float64(st.Requests - before.Requests)
	b.ReportMetric((cpu1-cpu0)/reqs, "cpu-µs/op")
	b.ReportMetric(float64(st.ScriptCalls-before.ScriptCalls)/reqs, "scripts/op")
	b.ReportMetric((cost1.cmdUsec-cost0.cmdUsec)/reqs, "redis-µs/op")
	b.ReportMetric((cost1.cpuUsec-cost0.cpuUsec)/reqs, "redis-cpu-µs/op")
}

// BenchmarkRedisMemoryUsage reports Redis's MEMORY USAGE of one key of each
// algorithm (bytes/key, with a 64-byte key name), after one hit, and for a
// sliding log also full at 100 per window (100 entries).
func BenchmarkRedisMemoryUsage(b *testing.B) {
	srv := redistest.StartStandalone(b)
	rc := srv.Client()
	r := newRedisStore(b, redis.Options{URL: srv.URL()})
	name := strings.Repeat("k", 64-len("log100:")-8)
	type run struct {
		label string
		limit algorithms.Limit
		hits  int
	}
	var runs []run
	for _, k := range algorithms.Kinds() {
		runs = append(runs, run{k.String(), algorithms.Limit{Algorithm: k, Requests: 100, Window: time.Hour}, 1})
	}
	runs = append(runs, run{"sliding_window_log_100_entries",
		algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Requests: 100, Window: time.Hour}, 100})
	for ri, ru := range runs {
		b.Run(ru.label, func(b *testing.B) {
			var bytes int64
			for i := 0; i < b.N; i++ {
				key := fmt.Sprintf("log%03d:%s%08d", ri, name, i)
				for h := 0; h < ru.hits; h++ {
					redisApply(b, r, backend.Item{Key: key, Limit: ru.limit, Hits: 1})
				}
				n, err := rc.MemoryUsage(context.Background(), key).Result()
				if err != nil {
					b.Fatal(err)
				}
				bytes = n
			}
			b.ReportMetric(float64(bytes), "bytes/key")
		})
	}
}

// BenchmarkRedisPool: fewer pipelines in flight make larger batches, so
// fewer script calls per decision.
func BenchmarkRedisPool(b *testing.B) {
	for _, n := range []int{1, 2, 4, 20} {
		b.Run(fmt.Sprintf("pool=%d", n), func(b *testing.B) {
			benchRedis(b, redis.Options{PoolSize: n}, bigLimit(algorithms.FixedWindow), tenThousandKeys())
		})
	}
}
