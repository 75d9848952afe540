package main

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// newRedisStore builds the redis backend: the main Redis's store, and when
// a per-second Redis is given (--redis-persecond-*, the reference's
// REDIS_PERSECOND), a split store that keeps the counters of limits of a
// second or less there (see pkg/backend/split). Each Redis then has its own
// failure handling (its embedded fallback under --failure-mode local, its
// own write-backs), its metrics carry redis="main" or redis="persecond",
// and readiness waits for both.
func newRedisStore(o redisBackend, reg prometheus.Registerer, log *slog.Logger, onFallback func(error)) (backend.Store, error) {
	// go-redis logs connection trouble on its own, process-wide; route it
	// to our logger at debug level, since every failure that matters to a
	// call is already counted and logged (throttled) by the service.
	goredis.SetLogger(redisLogger{log})
	if !o.Redis.PerSecond.enabled() {
		return newOneRedisStore(o, o.Redis.Main, reg, log, onFallback)
	}
	main, err := newOneRedisStore(o, o.Redis.Main, prometheus.WrapRegistererWith(prometheus.Labels{"redis": "main"}, reg), log.With("redis", "main"), onFallback)
	if err != nil {
		return nil, err
	}
	psFallback := func(err error) { onFallback(fmt.Errorf("per-second redis: %w", err)) }
	ps, err := newOneRedisStore(o, o.Redis.PerSecond, prometheus.WrapRegistererWith(prometheus.Labels{"redis": "persecond"}, reg), log.With("redis", "persecond"), psFallback)
	if err != nil {
		main.Close()
		return nil, fmt.Errorf("per-second redis: %w", err)
	}
	s := split.New(main, ps, split.Options{ContinueOnError: o.Failure.Mode == rls.FailOpen})
	registerSplitMetrics(reg, s)
	return s, nil
}
