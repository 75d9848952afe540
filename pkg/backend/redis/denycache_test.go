package redis_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// steppingClock moves forward by step after every reading, as real time
// does between the store's readings (the round trip to Redis lies between
// the script's instant and the reply).
type steppingClock struct {
	us   atomic.Int64
	step int64
}

func (c *steppingClock) Now() time.Time          { return time.UnixMicro(c.us.Add(c.step) - c.step) }
func (c *steppingClock) Set(t time.Time)         { c.us.Store(t.UnixMicro()) }
func (c *steppingClock) Advance(d time.Duration) { c.us.Add(d.Microseconds()) }

// TestRedisLocalDenyCacheNeverOutlivesTheDenial: the local deny cache must
// not deny a request that Redis would allow. A denial with RetryAfter R
// decided at the script's instant T ends at T+R; time that passes while the
// reply travels back must not push the local denial past T+R.
func TestRedisLocalDenyCacheNeverOutlivesTheDenial(t *testing.T) {
	srv := redistest.StartStandalone(t)
	base := testutil.Base
	clock := &steppingClock{step: (10 * time.Millisecond).Microseconds()}
	clock.Set(base)
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), LocalDenyCache: true})
	item := backend.Item{Key: "k", Limit: algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 1, Window: time.Second}, Hits: 1}

	if _, ok := redisApply(t, r, item); !ok {
		t.Fatal("first hit denied")
	}
	clock.Set(base.Add(100 * time.Millisecond))
	if ds, ok := redisApply(t, r, item); ok || ds[0].RetryAfter <= 0 {
		t.Fatalf("second hit in the window: %+v %v, want denied", ds[0], ok)
	}
	// At the end of the window Redis allows again; so must the store.
	clock.Set(base.Add(time.Second))
	if ds, ok := redisApply(t, r, item); !ok {
		t.Fatalf("at the window's end: %+v, want allowed (local denials %d)", ds[0], r.Stats().LocalDenials)
	}
}
