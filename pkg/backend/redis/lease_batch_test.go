package redis_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

func TestLeaseBatchStandalone(t *testing.T) {
	srv := redistest.StartStandalone(t)
	testLeaseBatch(t, redis.Options{URL: srv.URL()}, srv.Client(), []*redistest.Server{srv})
}

// leaseScriptCalls counts the calls of lease.lua that ran on servers
// (EVALSHA and EVAL calls that did not fail: a NOSCRIPT one did not run).
func leaseScriptCalls(t *testing.T, servers []*redistest.Server) int64 {
	t.Helper()
	var n int64
	for _, s := range servers {
		txt, err := s.Client().Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(txt, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || (k != "cmdstat_evalsha" && k != "cmdstat_eval") {
				continue
			}
			for _, kv := range strings.Split(v, ",") {
				a, b, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseInt(b, 10, 64)
				switch a {
				case "calls":
					n += f
				case "failed_calls":
					n -= f
				}
			}
		}
	}
	return n
}

// testLeaseBatch: batches of many keys (the four algorithms, on a Cluster
// in several slots, reserves and returns, a key returned and reserved in
// one batch, keys of another type whose commands fail) sent at once give
// each key exactly what one call per key gives, on a second Redis fed one
// call per key: the same chunks, counters and Redis state; a key that
// fails fails alone; the batch takes one script call per leaseBatchKeys
// keys (per slot on a Cluster); and a call that fails as a whole fails
// each of its keys as one call did.
func testLeaseBatch(t *testing.T, opts redis.Options, rc goredis.UniversalClient, servers []*redistest.Server) {
	ref := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 30, 0, time.UTC))
	prefix := fmt.Sprintf("batch-%d:", time.Now().UnixNano())
	opts.KeyPrefix = prefix
	batched := redis.NewLeaseDriver(newClockedRedisStore(t, clock, opts), "inst")
	single := redis.NewLeaseDriver(newClockedRedisStore(t, clock, redis.Options{URL: ref.URL(), KeyPrefix: prefix}), "inst")
	ctx := context.Background()

	const n = 300
	items := make([]backend.Item, n)
	for i := range items {
		alg := leaseAlgorithms[i%len(leaseAlgorithms)]
		l := algorithms.Limit{Algorithm: alg, Requests: 1000, Window: time.Minute}
		part := uint64(i%5 + 1) // five slots, many keys each
		if alg.HasBurst() {
			l.Burst = 1500
		} else if i%3 == 0 {
			part = 0 // placed by its own key
		}
		items[i] = backend.Item{Key: fmt.Sprintf("k%d", i), Limit: l, Hits: 1, Partition: part, Consistency: backend.Lease}
	}
	// Two keys whose state is of another type: their commands fail.
	bad := []int{17, 18} // a sliding counter and a bucket
	for _, c := range []goredis.UniversalClient{rc, ref.Client()} {
		for _, i := range bad {
			if err := c.HSet(ctx, redis.RedisKey(prefix, items[i]), "x", "1").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}

	groups := func(ops []redis.LeaseOp) int64 {
		if opts.URL != "" {
			return int64((len(ops) + redis.LeaseBatchKeys - 1) / redis.LeaseBatchKeys)
		}
		per := map[int]int{}
		for _, op := range ops {
			per[redis.Slot(redis.RedisKey(prefix, op.Item))]++
		}
		var g int64
		for _, k := range per {
			g += int64((k + redis.LeaseBatchKeys - 1) / redis.LeaseBatchKeys)
		}
		if len(per) < 3 {
			t.Fatalf("the batch covers %d slots, want several", len(per))
		}
		return g
	}
	isBad := func(it backend.Item) bool { return it.Key == items[bad[0]].Key || it.Key == items[bad[1]].Key }
	var badReturns uint64 // returns of the keys of another type: each fails
	same := func(round string, ops []redis.LeaseOp) {
		t.Helper()
		for _, op := range ops {
			if op.Return && isBad(op.Item) {
				badReturns++
			}
		}
		before, beforeRef := leaseScriptCalls(t, servers), leaseScriptCalls(t, []*redistest.Server{ref})
		batched.Send(ctx, ops, false)
		single.Send(ctx, ops, true)
		if got, want := leaseScriptCalls(t, servers)-before, groups(ops); got != want {
			t.Fatalf("%s: %d ops took %d script calls, want %d", round, len(ops), got, want)
		}
		if got := leaseScriptCalls(t, []*redistest.Server{ref}) - beforeRef; got != int64(len(ops)) {
			t.Fatalf("%s: one call per key took %d calls for %d ops", round, got, len(ops))
		}
		if a, b := batched.Stats(), single.Stats(); a != b {
			t.Fatalf("%s: counters %+v, one call per key %+v", round, a, b)
		}
		for i, it := range items {
			if a, b := batched.Chunk(it), single.Chunk(it); a != b {
				t.Fatalf("%s: key %d (%s): chunk %+v, one call per key %+v", round, i, it.Limit.Algorithm, a, b)
			}
			for _, k := range []string{redis.RedisKey(prefix, it), redis.RedisKey(prefix, it) + ":lease"} {
				a, errA := rc.Dump(ctx, k).Result()
				b, errB := ref.Client().Dump(ctx, k).Result()
				if a != b || (errA == nil) != (errB == nil) {
					t.Fatalf("%s: key %d (%s): %s is %q (%v), one call per key %q (%v)", round, i, it.Limit.Algorithm, k, a, errA, b, errB)
				}
			}
		}
	}

	// Round 1: a reserve of every key (the buckets' state absent).
	var ops []redis.LeaseOp
	for i, it := range items {
		ops = append(ops, redis.LeaseOp{Item: it, N: uint64(10 + i%13)})
	}
	same("reserve", ops)
	st := batched.Stats()
	if st.Granted == 0 || st.RefillErrors != uint64(len(bad)) {
		t.Fatalf("after the first batch: %+v, want hits granted and %d refill errors (the keys of another type)", st, len(bad))
	}
	for i, it := range items {
		if c := batched.Chunk(it); (c.Avail == 0) != isBad(it) {
			t.Fatalf("key %d (%s): chunk %+v after the first batch, want one unless its state is of another type", i, it.Limit.Algorithm, c)
		}
	}

	// Round 2: admissions, then returns, reserves, and a return and a
	// reserve of one key in one batch.
	for i, it := range items {
		batched.Take(it, uint64(i%7))
		single.Take(it, uint64(i%7))
	}
	clock.Advance(100 * time.Millisecond)
	ops = ops[:0]
	for i, it := range items {
		switch i % 3 {
		case 0:
			ops = append(ops, redis.LeaseOp{Item: it, Return: true})
		case 1:
			ops = append(ops, redis.LeaseOp{Item: it, N: 20})
		default:
			ops = append(ops, redis.LeaseOp{Item: it, Return: true}, redis.LeaseOp{Item: it, N: 5})
		}
	}
	same("mixed", ops)

	// Round 3: the next window; the chunks of the last one go back (a
	// sliding counter's to its previous window), and new ones come.
	clock.Advance(time.Minute)
	ops = ops[:0]
	for i, it := range items {
		ops = append(ops, redis.LeaseOp{Item: it, Return: true})
		if i%2 == 0 {
			ops = append(ops, redis.LeaseOp{Item: it, N: 9})
		}
	}
	same("next window", ops)
	if st := batched.Stats(); st.Returned == 0 || badReturns == 0 || st.ReturnErrors != badReturns {
		t.Fatalf("after the returns: %+v, want hits returned and %d return errors (the keys of another type)", st, badReturns)
	}

	// A call that fails as a whole (its context is done): each reserve a
	// refill error, each return an error whose hits are stranded.
	st = batched.Stats()
	ops = ops[:0]
	var held uint64
	for i, it := range items[:40] {
		if c := batched.Chunk(it); i%2 == 0 && c.Avail > 0 {
			ops = append(ops, redis.LeaseOp{Item: it, Return: true})
			held += c.Avail
		} else {
			ops = append(ops, redis.LeaseOp{Item: it, N: 3})
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	batched.Send(done, ops, false)
	got := batched.Stats()
	returns := uint64(0)
	for _, op := range ops {
		if op.Return {
			returns++
		}
	}
	if returns == 0 || got.RefillErrors-st.RefillErrors != uint64(len(ops))-returns || got.ReturnErrors-st.ReturnErrors != returns || got.Stranded-st.Stranded != held {
		t.Fatalf("a failed call of %d ops (%d returns of %d hits): counters went from %+v to %+v", len(ops), returns, held, st, got)
	}
}

// BenchmarkRedisLeaseCalls: batches of reserves of fixed-window keys
// (10,000 keys in turn, a chunk of 10 hits each) sent as calls of lease.lua
// of one key (as before calls carried many) and of a whole batch of 128.
// redis-µs/key is the script's time in Redis (INFO commandstats) per key,
// redis-cpu-µs/key the redis-server's CPU per key.
func BenchmarkRedisLeaseCalls(b *testing.B) {
	for _, oneByOne := range []bool{true, false} {
		name := "batch128"
		if oneByOne {
			name = "onekey"
		}
		b.Run(name, func(b *testing.B) {
			srv := redistest.StartStandalone(b)
			d := redis.NewLeaseDriver(newRedisStore(b, redis.Options{URL: srv.URL()}), "bench")
			l := bigLimit(algorithms.FixedWindow)
			l.Window = time.Minute
			keys := tenThousandKeys()
			ops := make([]redis.LeaseOp, 128)
			ctx := context.Background()
			d.Send(ctx, ops[:1], true) // the script loads outside the measurement
			cost0 := readRedisCost(b, srv.Client())
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j := range ops {
					ops[j] = redis.LeaseOp{Item: backend.Item{Key: keys(uint64(i*len(ops) + j)), Limit: l, Hits: 1, Consistency: backend.Lease}, N: 10}
				}
				d.Send(ctx, ops, oneByOne)
			}
			b.StopTimer()
			cost1 := readRedisCost(b, srv.Client())
			n := float64(b.N * len(ops))
			b.ReportMetric((cost1.cmdUsec-cost0.cmdUsec)/n, "redis-µs/key")
			b.ReportMetric((cost1.cpuUsec-cost0.cpuUsec)/n, "redis-cpu-µs/key")
			if st := d.Stats(); st.Granted == 0 || st.RefillErrors > 0 {
				b.Fatalf("lease counters %+v: want grants and no errors", st)
			}
		})
	}
}
