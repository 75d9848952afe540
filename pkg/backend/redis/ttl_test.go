package redis_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// TestRedisTTL checks, on Redis's own clock, that every state key expires
// no later than its ResetAfter (rounded up to Redis's millisecond), that a
// request leaving a key fresh leaves no key behind, and that keys really
// disappear when their state is fresh again.
func TestRedisTTL(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rc := srv.Client()
	r := newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "ttl:"})
	ctx := context.Background()
	for _, k := range algorithms.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			l := algorithms.Limit{Algorithm: k, Requests: 5, Window: 3 * time.Second}
			key := "a:" + k.String()

			// A check on a fresh key creates nothing.
			if ds, _ := redisApply(t, r, backend.Item{Key: key, Limit: l}); ds[0].ResetAfter != 0 {
				t.Fatalf("check on a fresh key: %+v", ds[0])
			}
			if n := rc.Exists(ctx, "ttl:"+key).Val(); n != 0 {
				t.Fatalf("a check on a fresh key left a key behind")
			}
			// A denied request charges nothing and creates nothing.
			deny := backend.Item{Key: "deny", Limit: algorithms.Limit{Requests: 0, Window: time.Second}, Hits: 1}
			if _, ok := redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 2}, deny); ok {
				t.Fatal("a request with a zero limit was allowed")
			}
			if n := rc.Exists(ctx, "ttl:"+key).Val(); n != 0 {
				t.Fatalf("a denied request left a key behind")
			}

			ds, _ := redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 2})
			reset := ds[0].ResetAfter
			if reset <= 0 || reset > l.Window*2 {
				t.Fatalf("ResetAfter %v after 2 hits", reset)
			}
			pttl := rc.PTTL(ctx, "ttl:"+key).Val()
			maxTTL := (reset + time.Millisecond - 1).Truncate(time.Millisecond)
			if pttl <= 0 || pttl > maxTTL {
				t.Fatalf("PTTL %v, want in (0, %v] (ResetAfter %v)", pttl, maxTTL, reset)
			}

			// A second hit in the same window: the TTL follows the new
			// ResetAfter. A fixed window or sliding counter key keeps the
			// TTL its window's first hit set (SET KEEPTTL: the same
			// instant, rounded to the millisecond then), so it may be a
			// millisecond or two above the new ResetAfter rounded up.
			ds, _ = redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 1})
			reset = ds[0].ResetAfter
			pttl = rc.PTTL(ctx, "ttl:"+key).Val()
			maxTTL = (reset + time.Millisecond - 1).Truncate(time.Millisecond)
			if k == algorithms.FixedWindow || k == algorithms.SlidingWindowCounter {
				maxTTL += 2 * time.Millisecond
			}
			if pttl <= 0 || pttl > maxTTL {
				t.Fatalf("after a second hit: PTTL %v, want in (0, %v] (ResetAfter %v)", pttl, maxTTL, reset)
			}
		})
	}

	// A state that becomes fresh disappears with it: 2 hits of a 2-per-30ms
	// limit are fresh again 30ms (one window or a full refill) later.
	for _, k := range algorithms.Kinds() {
		l := algorithms.Limit{Algorithm: k, Requests: 2, Window: 30 * time.Millisecond}
		key := "short:" + k.String()
		redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 2})
		testutil.WaitFor(t, 3*time.Second, "key "+key+" expires", func() bool {
			return rc.Exists(ctx, "ttl:"+key).Val() == 0
		})
	}
}

// TestRedisTTLOnTestClock: under a test's clock the script sets TTLs with
// the same commands as on Redis's clock, an hour longer (a TTL counts real
// time, which a test's clock need not keep pace with), and a state that
// never becomes fresh (ResetAfter Never) gets none.
func TestRedisTTLOnTestClock(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rc := srv.Client()
	ctx := context.Background()
	clock := &steppingClock{}
	clock.Set(testutil.Base)
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: "tc:"})
	for _, k := range algorithms.Kinds() {
		l := algorithms.Limit{Algorithm: k, Requests: 5, Window: time.Hour}
		key := "a:" + k.String()
		for hit := 1; hit <= 2; hit++ { // the second: KEEPTTL for fixed windows and counters
			ds, _ := redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 1})
			reset := ds[0].ResetAfter
			pttl := rc.PTTL(ctx, "tc:"+key).Val()
			maxTTL := time.Hour + (reset + time.Millisecond - 1).Truncate(time.Millisecond)
			// reset is at least 12 minutes: the lower bound leaves the
			// test that long to read the TTL.
			if reset < 12*time.Minute || pttl <= time.Hour || pttl > maxTTL {
				t.Fatalf("%s, hit %d: PTTL %v, want in (1h, %v] (ResetAfter %v)", k, hit, pttl, maxTTL, reset)
			}
		}
	}
	never := algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1, Burst: 5, Window: math.MaxInt64}
	if ds, _ := redisApply(t, r, backend.Item{Key: "never", Limit: never, Hits: 2}); ds[0].ResetAfter != algorithms.Never {
		t.Fatalf("ResetAfter %v, want Never", ds[0].ResetAfter)
	}
	if pttl := rc.PTTL(ctx, "tc:never").Val(); pttl != -1 {
		t.Fatalf("a state that is never fresh has PTTL %v, want none (-1)", pttl)
	}
}
