package redis_test

import (
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// TestConsistencyMixedRequestAllOrNothing: a request whose limits mix
// consistencies is decided together, all or nothing, like the memory
// store's (where every mode is strict).
func TestConsistencyMixedRequestAllOrNothing(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL()})
	m := memory.New(memory.WithClock(clock))
	defer m.Close()
	l := func(n uint64) algorithms.Limit {
		return algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: n, Window: time.Hour}
	}
	req := []backend.Item{
		{Key: "strict", Limit: l(5), Hits: 1, Partition: 1},
		{Key: "lease", Limit: l(100), Hits: 1, Partition: 1, Consistency: backend.Lease},
		{Key: "approx", Limit: l(100), Hits: 1, Partition: 1, Consistency: backend.Approximate},
	}
	for i := range 8 {
		got, gotOK := redisApply(t, r, req...)
		want, wantOK := redisApply(t, m, req...)
		if gotOK != wantOK {
			t.Fatalf("request %d: Redis allowed %v, memory %v", i, gotOK, wantOK)
		}
		for k := range req {
			// A lease item reports what its chunk and Redis's last word
			// leave, not the shared count of this instant.
			if got[k].Allowed != want[k].Allowed || (req[k].Consistency == backend.Strict && got[k].Remaining != want[k].Remaining) {
				t.Fatalf("request %d, %s: Redis %+v, memory %+v", i, req[k].Key, got[k], want[k])
			}
		}
	}
}
