package backend_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// TestRedisParity runs the shared timeline tables, unchanged, against the
// Redis store on a real server, with the tables' instants injected as the
// script's now: the Lua twin must give the decisions the tables require of
// pkg/algorithms and of Memory.
func TestRedisParity(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := newTestClock(algotest.Base)
	r := newRedisStore(t, backend.RedisOptions{URL: srv.URL(), Clock: clock, KeyPrefix: "parity:"})

	t.Run("Cases", func(t *testing.T) {
		for i, c := range algotest.Cases() {
			t.Run(c.Name, func(t *testing.T) {
				key := fmt.Sprintf("case%d", i) // a fresh key per case
				decide := func(at time.Time, hits uint64) algorithms.Decision {
					clock.Set(at)
					ds, _ := redisApply(t, r, backend.Item{Key: key, Limit: c.Limit, Hits: hits})
					return ds[0]
				}
				if !c.Huge {
					algotest.Run(t, c, decide)
					return
				}
				// Counts of 2^53 and more round in Lua's doubles: the table
				// allows a twin to differ there. What the Redis store still
				// guarantees: the exact Limit, and a denial for ever of more
				// hits than the capacity.
				for j, st := range c.Steps {
					got := decide(algotest.Base.Add(st.At), st.Hits)
					if got.Limit != st.Want.Limit {
						t.Errorf("step %d: limit %d, want %d", j, got.Limit, st.Want.Limit)
					}
					if st.Hits > c.Limit.Capacity() && (got.Allowed || got.RetryAfter != algorithms.Never) {
						t.Errorf("step %d: %d hits over a capacity of %d: %s, want denied for ever",
							j, st.Hits, c.Limit.Capacity(), algotest.Format(got))
					}
					if got != st.Want {
						t.Logf("step %d differs as the table allows: got %s, exact %s", j, algotest.Format(got), algotest.Format(st.Want))
					}
				}
			})
		}
	})
	t.Run("StoreCases", func(t *testing.T) {
		for i, c := range algotest.StoreCases() {
			t.Run(c.Name, func(t *testing.T) {
				prefix := fmt.Sprintf("store%d:", i) // fresh keys per case
				algotest.RunStore(t, c, func(at time.Time, items []backend.Item) (bool, []algorithms.Decision) {
					clock.Set(at)
					its := make([]backend.Item, len(items))
					for j, it := range items {
						it.Key = prefix + it.Key
						its[j] = it
					}
					ds, ok := redisApply(t, r, its...)
					return ok, ds
				})
			})
		}
	})
}
