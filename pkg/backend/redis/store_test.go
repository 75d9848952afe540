package redis_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// longLimit returns a limit of kind k that lets nothing refill or slide out
// during a test that runs for seconds: L per year (a window boundary falls
// into a given second with a chance of 3e-8).
func longLimit(k algorithms.Kind, l uint64) algorithms.Limit {
	return algorithms.Limit{Algorithm: k, Requests: l, Window: 365 * 24 * time.Hour}
}

// hammer runs clients goroutines that each send attempts requests of items
// (made per attempt by mk) to stores (round robin) and returns how many
// requests were allowed.
func hammer(t *testing.T, stores []backend.Store, clients, attempts int, mk func(client, attempt int) []backend.Item) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := make(chan struct{})
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[c%len(stores)]
			<-start
			for a := 0; a < attempts; a++ {
				items := mk(c, a)
				out := make([]algorithms.Decision, len(items))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				ok, err := s.Apply(ctx, items, out)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if ok {
					allowed.Add(1)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Apply: %v", err)
	}
	return allowed.Load()
}

// TestRedisExactConcurrent: three stores (as three instances) on one
// server, 120 concurrent clients, one key of limit L: exactly L requests
// are allowed, for every algorithm, with and without the local deny cache.
func TestRedisExactConcurrent(t *testing.T) {
	srv := redistest.StartStandalone(t)
	const L, clients, attempts = 100, 120, 3
	for _, cache := range []bool{false, true} {
		for _, k := range algorithms.Kinds() {
			t.Run(fmt.Sprintf("%s/cache=%v", k, cache), func(t *testing.T) {
				var stores []backend.Store
				for i := 0; i < 3; i++ {
					stores = append(stores, newRedisStore(t, redis.Options{
						URL: srv.URL(), KeyPrefix: "exact:", LocalDenyCache: cache, PoolSize: 4,
					}))
				}
				key := fmt.Sprintf("%s:%v", k, cache)
				l := longLimit(k, L)
				got := hammer(t, stores, clients, attempts, func(int, int) []backend.Item {
					return []backend.Item{{Key: key, Limit: l, Hits: 1}}
				})
				if got != L {
					t.Fatalf("allowed %d requests, want exactly %d", got, L)
				}
			})
		}
	}
}

// TestRedisAllOrNothingConcurrent: requests of two keys, one of which
// (shared by all) has the smaller limit. Whatever the interleaving, the key
// of larger limit is charged exactly as often as the shared one allowed.
func TestRedisAllOrNothingConcurrent(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rc := srv.Client()
	stores := []backend.Store{
		newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "aon:"}),
		newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "aon:", BatchWindow: 100 * time.Microsecond}),
	}
	small := longLimit(algorithms.FixedWindow, 40)
	big := longLimit(algorithms.FixedWindow, 1000)
	got := hammer(t, stores, 100, 2, func(int, int) []backend.Item {
		return []backend.Item{{Key: "big", Limit: big, Hits: 1}, {Key: "small", Limit: small, Hits: 1}}
	})
	if got != 40 {
		t.Fatalf("allowed %d, want 40", got)
	}
	v := rc.Get(context.Background(), "aon:big").Val()
	if _, f, err := redis.StateNumbers(v); err != nil || f[1] != 40 { // fixed_window: at, count
		t.Fatalf("state of the big key %x: %v %v, want a count of 40", v, f, err)
	}
}

// TestRedisNoScript: after the server loses its function library
// (FUNCTION FLUSH, as after a restart), Apply still works, loading the
// library once; a store on a server without functions (forced here, as on
// Redis before 7.0) does the same with its script after SCRIPT FLUSH.
func TestRedisNoScript(t *testing.T) {
	for _, eval := range []bool{false, true} {
		t.Run(fmt.Sprintf("eval=%v", eval), func(t *testing.T) {
			srv := redistest.StartStandalone(t)
			rc := srv.Client()
			r := newRedisStore(t, redis.Options{URL: srv.URL()})
			if eval {
				redis.ForceEval(r)
			}
			l := longLimit(algorithms.TokenBucket, 10)
			redisApply(t, r, backend.Item{Key: "k", Limit: l, Hits: 1})
			before := r.Stats()
			flush := rc.FunctionFlush(context.Background()).Err()
			if eval {
				flush = rc.ScriptFlush(context.Background()).Err()
			}
			if err := flush; err != nil {
				t.Fatal(err)
			}
			ds, ok := redisApply(t, r, backend.Item{Key: "k", Limit: l, Hits: 1})
			if !ok || ds[0].Remaining != 8 {
				t.Fatalf("after the flush: %+v %v; want allowed with 8 remaining", ds[0], ok)
			}
			after := r.Stats()
			if after.ScriptReloads != before.ScriptReloads+1 {
				t.Fatalf("ScriptReloads %d -> %d, want one more", before.ScriptReloads, after.ScriptReloads)
			}
			redisApply(t, r, backend.Item{Key: "k", Limit: l, Hits: 1})
			if r.Stats().ScriptReloads != after.ScriptReloads {
				t.Fatal("the script was re-sent again: it was not kept")
			}
			fns := rc.FunctionList(context.Background(), goredis.FunctionListQuery{}).Val()
			if eval != (len(fns) == 0) {
				t.Fatalf("function libraries on the server: %v (eval mode %v)", fns, eval)
			}
		})
	}
}

// TestRedisLocalDenyCache: a denial is remembered until its RetryAfter and
// answers requests of at least as many hits on the same key without Redis,
// with honest numbers; anything else still goes to Redis.
func TestRedisLocalDenyCache(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(testutil.Base)
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), LocalDenyCache: true})
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 3, Window: time.Second}
	item := func(key string, hits uint64) backend.Item { return backend.Item{Key: key, Limit: l, Hits: hits} }

	redisApply(t, r, item("k", 2))
	clock.Advance(100 * time.Millisecond)
	ds, ok := redisApply(t, r, item("k", 2)) // Redis denies: 1 left, 900ms to go
	want := algorithms.Decision{Limit: 3, Remaining: 1, RetryAfter: 900 * time.Millisecond, ResetAfter: 900 * time.Millisecond}
	if ok || ds[0] != want {
		t.Fatalf("denial from Redis: %+v %v, want %+v", ds[0], ok, want)
	}
	trips := r.Stats().RoundTrips

	clock.Advance(400 * time.Millisecond)
	ds, ok = redisApply(t, r, item("k", 5)) // more hits: from the cache
	want = algorithms.Decision{Limit: 3, Remaining: 1, RetryAfter: 500 * time.Millisecond, ResetAfter: 500 * time.Millisecond}
	if ok || ds[0] != want {
		t.Fatalf("denial from the cache: %+v %v, want %+v", ds[0], ok, want)
	}
	st := r.Stats()
	if st.RoundTrips != trips || st.LocalDenials != 1 {
		t.Fatalf("stats %+v: want no new round trip and 1 local denial", st)
	}

	// Fewer hits, a check, or another key (a per-request override has its
	// own key) go to Redis, and so does a request with an unknown key.
	for _, items := range [][]backend.Item{
		{item("k", 1)},
		{item("k", 0)},
		{item("other", 2)},
		{item("k", 2), item("fresh", 1)},
	} {
		ds, _ := redisApply(t, r, items...)
		if items[0].Key == "k" && items[0].Hits == 1 && !ds[0].Allowed {
			t.Fatalf("1 hit with 1 remaining was denied: %+v", ds[0])
		}
	}
	if got := r.Stats().RoundTrips; got != trips+4 {
		t.Fatalf("round trips %d, want %d: requests the cache cannot answer must reach Redis", got, trips+4)
	}

	// After RetryAfter the key goes to Redis again, which allows.
	clock.Advance(500 * time.Millisecond)
	if ds, ok := redisApply(t, r, item("k", 2)); !ok || !ds[0].Allowed {
		t.Fatalf("after RetryAfter: %+v %v; want allowed", ds[0], ok)
	}
}

// TestRedisClockSkew shows that the instances' own clocks do not matter:
// two stores in TIME mode (as two instances whose clocks differ) share a
// 1-second fixed window exactly, and their ResetAfter is the end of the
// window on Redis's clock; while two stores that used their own clocks,
// half a window apart, would count into different windows and together
// allow twice the limit.
func TestRedisClockSkew(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rc := srv.Client()
	ctx := context.Background()
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 4, Window: time.Second}

	// Own clocks half a window apart: each store counts in its own window.
	now := time.Now()
	skewA := testutil.NewClock(now.Truncate(time.Second).Add(200 * time.Millisecond))
	skewB := testutil.NewClock(now.Truncate(time.Second).Add(700 * time.Millisecond))
	a := newClockedRedisStore(t, skewA, redis.Options{URL: srv.URL(), KeyPrefix: "skew:"})
	b := newClockedRedisStore(t, skewB, redis.Options{URL: srv.URL(), KeyPrefix: "skew:"})
	var allowed int
	for i := 0; i < 4; i++ {
		skewA.Advance(100 * time.Millisecond) // A reaches 600ms; B 1100ms, the next window
		skewB.Advance(100 * time.Millisecond)
		for _, s := range []backend.Store{a, b} {
			if _, ok := redisApply(t, s, backend.Item{Key: "own-clocks", Limit: l, Hits: 1}); ok {
				allowed++
			}
		}
	}
	if allowed <= 4 {
		t.Fatalf("stores on skewed own clocks allowed %d; the scenario must show their disagreement (> 4)", allowed)
	}

	// TIME mode: whatever the instances' clocks, Redis's decides.
	x := newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "skew:"})
	y := newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "skew:"})
	// The 8 requests below must fall into one window of Redis's clock:
	// start in the first half of a second, and begin again with a new key
	// when they straddled a window's end all the same (a stall of half a
	// second on a busy machine; the second window then allows again).
	for attempt := 1; ; attempt++ {
		if attempt > 20 {
			t.Fatalf("20 attempts of 8 requests each straddled a second of Redis's clock")
		}
		testutil.WaitFor(t, 3*time.Second, "the first half of a second on Redis's clock", func() bool {
			tm := rc.Time(ctx).Val()
			return tm.Sub(tm.Truncate(time.Second)) < 500*time.Millisecond
		})
		key := fmt.Sprintf("redis-clock-%d", attempt)
		var first, last time.Time
		allowed = 0
		for i := 0; i < 4; i++ {
			for _, s := range []backend.Store{x, y} {
				before := rc.Time(ctx).Val()
				ds, ok := redisApply(t, s, backend.Item{Key: key, Limit: l, Hits: 1})
				after := rc.Time(ctx).Val()
				if first.IsZero() {
					first = before
				}
				last = after
				if ok {
					allowed++
				}
				// ResetAfter is the time to the end of the window on Redis's
				// clock, as seen between the TIME calls around the request.
				if before.Truncate(time.Second) == after.Truncate(time.Second) {
					end := before.Truncate(time.Second).Add(time.Second)
					lo, hi := end.Sub(after), end.Sub(before)
					if ds[0].ResetAfter < lo || ds[0].ResetAfter > hi {
						t.Fatalf("ResetAfter %v not within [%v, %v] of Redis's window end", ds[0].ResetAfter, lo, hi)
					}
				}
			}
		}
		if !first.Truncate(time.Second).Equal(last.Truncate(time.Second)) {
			t.Logf("attempt %d: the requests ran from %v to %v on Redis's clock, across a window's end; again", attempt, first, last)
			continue
		}
		if allowed != 4 {
			t.Fatalf("stores on Redis's clock allowed %d in one window, want 4", allowed)
		}
		return
	}
}

// TestRedisHugeValues: limits and hits beyond 2^53 are approximate in Lua,
// but never panic or misreport: more hits than the capacity are denied for
// ever, and a huge remaining saturates.
func TestRedisHugeValues(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(testutil.Base)
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL()})
	for _, k := range algorithms.Kinds() {
		l := algorithms.Limit{Algorithm: k, Requests: 1000, Window: time.Second}
		ds, ok := redisApply(t, r, backend.Item{Key: "huge-hits:" + k.String(), Limit: l, Hits: math.MaxUint64})
		if ok || ds[0].RetryAfter != algorithms.Never || ds[0].Remaining != 1000 {
			t.Fatalf("%s: MaxUint64 hits: %+v %v", k, ds[0], ok)
		}
		l.Requests = math.MaxUint64
		ds, ok = redisApply(t, r, backend.Item{Key: "huge-limit:" + k.String(), Limit: l, Hits: 1})
		if !ok || ds[0].Remaining < 1<<63 {
			t.Fatalf("%s: huge limit: %+v %v", k, ds[0], ok)
		}
	}
}

func TestRedisOptionsErrors(t *testing.T) {
	for _, o := range []redis.Options{
		{},
		{URL: "http://localhost"},
		{URL: "redis://localhost", KeyPrefix: "a{b"},
		{SentinelAddrs: []string{"127.0.0.1:1"}},
		{SentinelAddrs: []string{"127.0.0.1:1"}, SentinelMaster: "m", ClusterAddrs: []string{"127.0.0.1:2"}},
		{URL: "redis://localhost", BatchSize: -1},
		{URL: "redis://localhost", BatchWindow: -time.Second},
	} {
		if r, err := redis.New(o); err == nil {
			r.Close()
			t.Errorf("NewRedis(%+v) succeeded", o)
		}
	}
}

func TestRedisClosed(t *testing.T) {
	srv := redistest.StartStandalone(t)
	r, err := redis.New(redis.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	redisApply(t, r, backend.Item{Key: "k", Limit: longLimit(algorithms.FixedWindow, 1), Hits: 1})
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	out := make([]algorithms.Decision, 1)
	if _, err := r.Apply(context.Background(), []backend.Item{{Key: "k", Limit: longLimit(algorithms.FixedWindow, 1)}}, out); err != backend.ErrClosed {
		t.Fatalf("Apply after Close: %v, want ErrClosed", err)
	}
}

// TestRedisSentinel: the store finds the master through a Sentinel.
func TestRedisSentinel(t *testing.T) {
	m := redistest.StartStandalone(t)
	s := redistest.StartSentinel(t, m, "rls-master")
	r := newRedisStore(t, redis.Options{SentinelAddrs: []string{s.Addr()}, SentinelMaster: "rls-master", KeyPrefix: "sentinel:"})
	l := longLimit(algorithms.FixedWindow, 2)
	for i, want := range []bool{true, true, false} {
		if _, ok := redisApply(t, r, backend.Item{Key: "k", Limit: l, Hits: 1}); ok != want {
			t.Fatalf("request %d: allowed %v, want %v", i, ok, want)
		}
	}
	if n := m.Client().Exists(context.Background(), "sentinel:k").Val(); n != 1 {
		t.Fatal("the master holds no state for the key")
	}
}

// TestRedisUnreadableStateStartsFresh: a key holding what this version
// cannot read (another type, or another version's format) is deleted and
// starts fresh, and the other requests of the same script call are decided
// as usual.
func TestRedisUnreadableStateStartsFresh(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rc := srv.Client()
	ctx := context.Background()
	r := newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "u:"})
	for _, k := range algorithms.Kinds() {
		l := algorithms.Limit{Algorithm: k, Requests: 3, Window: time.Hour}
		bad := map[string]func(key string) error{
			"old format": func(key string) error { return rc.Set(ctx, key, "1 2 3 4 5", 0).Err() },
			"text state": func(key string) error { return rc.Set(ctx, key, "1700000000000000 1234567", 0).Err() },
			"garbage":    func(key string) error { return rc.Set(ctx, key, "x y z", 0).Err() },
			"list":       func(key string) error { return rc.RPush(ctx, key, "a b", "c").Err() },
			"hash":       func(key string) error { return rc.HSet(ctx, key, "f", "v").Err() },
		}
		for name, set := range bad {
			key := fmt.Sprintf("%s:%s", k, strings.ReplaceAll(name, " ", "_"))
			if err := set("u:" + key); err != nil {
				t.Fatal(err)
			}
			// Concurrent requests share a script call with the bad key's.
			var wg sync.WaitGroup
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					redisApply(t, r, backend.Item{Key: fmt.Sprintf("%s:good%d", key, i), Limit: l, Hits: 1})
				}(i)
			}
			ds, ok := redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 1})
			wg.Wait()
			if !ok || ds[0].Remaining != 2 {
				t.Fatalf("%s, %s: %+v allowed=%v; want a fresh key with 2 remaining", k, name, ds[0], ok)
			}
			ds, _ = redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 1})
			if ds[0].Remaining != 1 {
				t.Fatalf("%s, %s: second hit: %+v; want 1 remaining (the state was rewritten)", k, name, ds[0])
			}
		}
	}
}
