package redis_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// TestRedisParity runs the store conformance kit (the shared timeline
// tables, unchanged) against the Redis store on a real server, with the
// tables' instants injected as the script's now: the Lua twin must give the
// decisions the tables require of pkg/algorithms and of the memory store.
// Each timeline gets a store of its own key prefix, so fresh keys.
func TestRedisParity(t *testing.T) {
	srv := redistest.StartStandalone(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, clock backend.Clock) backend.Store {
		prefix := fmt.Sprintf("parity%d:", n.Add(1))
		return newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: prefix})
	}, storetest.InexactHugeCounts())
}

// TestRedisParityEval runs the same tables through the EVALSHA/EVAL
// wrapping of the script, which servers without functions get.
func TestRedisParityEval(t *testing.T) {
	srv := redistest.StartStandalone(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, clock backend.Clock) backend.Store {
		prefix := fmt.Sprintf("parity%d:", n.Add(1))
		s := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: prefix})
		redis.ForceEval(s)
		return s
	}, storetest.InexactHugeCounts())
}
