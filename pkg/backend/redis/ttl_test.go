package redis_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
// time, which a test's clock need not keep pace with), and a state fresh
// only after more than algorithms.Never (ResetAfter Never) gets that much.
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
	// PTTL in ms, read raw: the TTL is beyond what a Duration holds.
	want := int64(algorithms.Never/time.Millisecond) + testTTLSlack.Milliseconds()
	if pttl, err := rc.Do(ctx, "PTTL", "tc:never").Int64(); err != nil || pttl <= want-60_000 || pttl > want {
		t.Fatalf("a state fresh after more than Never has PTTL %d ms (%v), want about %d", pttl, err, want)
	}
}

// testTTLSlack is the script's TEST_TTL_SLACK_MS.
const testTTLSlack = time.Hour

// TestEveryKeyHasATTL: whatever the charge (one hit, just past the
// capacity, 10^9 as Envoy allows, 10^12, 10^18, the most a uint64 holds),
// admitted or accounted, on every algorithm, every key the script writes
// expires (on Redis's clock), no later than the algorithm's bound: a fixed
// window or a log's window, two windows for the sliding counter, and for
// token_bucket and gcra a full refill from MaxDebt below empty,
// (Capacity()+Requests)/Requests windows. Before the debt cap a charge of
// 10^12 to a 10 per hour bucket left a key with no TTL at all. On a
// Cluster the same, and so for the keys that refunds of denied requests
// across slots write.
func TestEveryKeyHasATTL(t *testing.T) {
	srv := redistest.StartStandalone(t)
	rc := srv.Client()
	r := newRedisStore(t, redis.Options{URL: srv.URL(), KeyPrefix: "every:"})
	testEveryKeyHasATTL(t, r, rc, func(ctx context.Context) []string { return rc.Keys(ctx, "every:*").Val() }, 0)
}

// testClusterEveryKeyHasATTL is TestEveryKeyHasATTL on a Cluster (see
// TestRedisCluster).
func testClusterEveryKeyHasATTL(t *testing.T, cl *redistest.Cluster) {
	cc := cl.Client(t)
	r := newRedisStore(t, redis.Options{ClusterAddrs: cl.Addrs(), KeyPrefix: "every:"})
	keys := func(ctx context.Context) []string {
		var mu sync.Mutex
		var all []string
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			ks, err := c.Keys(ctx, "every:*").Result()
			mu.Lock()
			all = append(all, ks...)
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return all
	}
	a, b := partitionsOnTwoNodes(t)
	testEveryKeyHasATTL(t, r, cc, keys, a)

	// Refunds: an item admitted in b's slot and refunded because a's slot
	// denies, beside a huge usage charge in b's slot that stays (in a quota
	// group of its own: the request is denied by a's slot alone).
	ctx := context.Background()
	deny := backend.Item{Key: "deny", Limit: algorithms.Limit{Requests: 0, Window: time.Second}, Hits: 1, Partition: a}
	before := r.Stats().Refunds
	for _, k := range algorithms.Kinds() {
		l := algorithms.Limit{Algorithm: k, Requests: 10, Window: time.Hour}
		if k.HasBurst() {
			l.Burst = 30
		}
		for i, hits := range []uint64{1e12, math.MaxUint64} {
			kept := backend.Item{Key: fmt.Sprintf("kept:%s", k), Limit: l, Hits: 1, Partition: b}
			// Quota: an Enforced usage charge that does not fit would deny
			// in b's slot too, leaving nothing to refund.
			usage := backend.Item{Key: fmt.Sprintf("usage%d:%s", i, k), Limit: l, Hits: hits, Partition: b, Account: true, Mode: backend.Quota}
			redisApply(t, r, backend.Item{Key: kept.Key, Limit: l, Hits: 2, Partition: b}) // a state to refund into
			if _, ok := redisApply(t, r, kept, usage, deny); ok {
				t.Fatalf("%s: a request with a zero limit was allowed", k)
			}
			for _, key := range []string{kept.Key, usage.Key} {
				rk := redis.RedisKey("every:", backend.Item{Key: key, Partition: b})
				if pttl, err := cc.Do(ctx, "PTTL", rk).Int64(); err != nil || pttl <= 0 {
					t.Fatalf("%s: key %s after a refund: PTTL %d (%v), want > 0", k, key, pttl, err)
				}
			}
		}
	}
	if got := r.Stats().Refunds - before; got != uint64(2*len(algorithms.Kinds())) {
		t.Fatalf("%d refunds, want %d", got, 2*len(algorithms.Kinds()))
	}
	for _, key := range keys(ctx) {
		// -1: no TTL; -2: expired since it was listed.
		if pttl, err := cc.Do(ctx, "PTTL", key).Int64(); err != nil || pttl == -1 {
			t.Errorf("key %s has PTTL %d (%v)", key, pttl, err)
		}
	}
}

// pttlDoer reads a key's PTTL raw (a TTL may be beyond what a Duration
// holds): a standalone or a Cluster client.
type pttlDoer interface {
	Do(ctx context.Context, args ...interface{}) *goredis.Cmd
}

// testEveryKeyHasATTL is TestEveryKeyHasATTL's body on store r, whose keys
// (prefix "every:") rc reads and keys lists; partition places the keys.
func testEveryKeyHasATTL(t *testing.T, r *redis.Store, rc pttlDoer, keys func(context.Context) []string, partition uint64) {
	ctx := context.Background()
	n := 0
	for _, k := range algorithms.Kinds() {
		// Windows of an hour or more: a fixed window's key may expire
		// within a millisecond of its charge at a window's end, and a
		// short window's often would before PTTL reads it.
		for _, w := range []time.Duration{time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
			l := algorithms.Limit{Algorithm: k, Requests: 10, Window: w}
			if k.HasBurst() {
				l.Burst = 30
			}
			bound := w
			switch k {
			case algorithms.SlidingWindowCounter:
				bound = 2 * w
			case algorithms.TokenBucket, algorithms.GCRA:
				bound = time.Duration(l.Capacity()+algorithms.MaxDebt(l)) * w / time.Duration(l.Requests)
			}
			for _, hits := range []uint64{1, l.Capacity() + 1, 1e9, 1e12, 1e18, math.MaxUint64} {
				for _, account := range []bool{false, true} {
					for _, mode := range []backend.Mode{backend.Enforced, backend.Quota} {
						n++
						key := fmt.Sprintf("k%d", n)
						it := backend.Item{Key: key, Limit: l, Hits: hits, Account: account, Mode: mode, Partition: partition}
						redisApply(t, r, it)
						pttl, err := rc.Do(ctx, "PTTL", redis.RedisKey("every:", it)).Int64()
						if err != nil {
							t.Fatal(err)
						}
						written := hits <= l.Capacity() || account
						switch {
						case !written && pttl != -2:
							t.Fatalf("%s/%v: a refused charge of %d left a key (PTTL %d)", k, w, hits, pttl)
						case written && (pttl <= 0 || time.Duration(pttl)*time.Millisecond > bound+time.Millisecond):
							t.Fatalf("%s/%v: charge of %d (account %t, %s): PTTL %d ms, want in (0, %v]", k, w, hits, account, mode, pttl, bound)
						}
					}
				}
			}
		}
	}
	// Nothing written without a TTL, whatever it is (-1: no TTL; -2:
	// expired since it was listed).
	for _, key := range keys(ctx) {
		if pttl, err := rc.Do(ctx, "PTTL", key).Int64(); err != nil || pttl == -1 {
			t.Errorf("key %s has PTTL %d (%v)", key, pttl, err)
		}
	}
}
