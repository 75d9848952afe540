package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// redisBackend is what the redis backend's stores are made of: the Redis
// settings, the failure policy, the bounds of the local fallback store and
// how long Close writes back.
type redisBackend struct {
	Redis          redisOptions
	Failure        failureOptions
	Fallback       memoryOptions
	CloseWriteBack time.Duration
}

// newOneRedisStore builds the store of one Redis deployment: c says how to
// reach it, o holds what both deployments share. It does not connect: the
// service starts while Redis is down and the store reconnects by itself.
// Its metrics are registered on reg.
func newOneRedisStore(o redisBackend, c redisConn, reg prometheus.Registerer, log *slog.Logger, onFallback func(error)) (backend.Store, error) {
	tlsConf, err := redisTLSConfig(c)
	if err != nil {
		return nil, err
	}
	ro := redis.Options{
		URL:              c.RedisURL.String(),
		SentinelAddrs:    c.RedisSentinel,
		SentinelMaster:   c.RedisSentinelMaster,
		SentinelPassword: c.RedisSentinelPassword,
		ClusterAddrs:     c.RedisCluster,
		PoolSize:         c.RedisPoolSize,
		Pipelines:        c.RedisPipelines,
		DialTimeout:      c.RedisDialTimeout,
		ReadTimeout:      c.RedisReadTimeout,
		WriteTimeout:     c.RedisWriteTimeout,
		KeyPrefix:        o.Redis.KeyPrefix,
		BatchWindow:      c.RedisBatchWindow,
		BatchSize:        c.RedisBatchSize,
		LocalDenyCache:   o.Redis.LocalDenyCache,
		TLS:              tlsConf,
	}
	// At shutdown, the hits allowed while Redis was away are written back
	// for up to --shutdown-grace (a second period, after the calls in
	// flight drained); none with a grace of 0.
	ro.CloseWriteBack = o.CloseWriteBack
	if ro.CloseWriteBack <= 0 {
		ro.CloseWriteBack = -1
	}
	// The failure mode decides what a call does when Redis cannot answer
	// in time: decide on an embedded store (local), or answer OK (allow);
	// either way the hits allowed are written back to Redis later.
	var fallback *memory.Store
	switch o.Failure.Mode {
	case rls.FailLocal:
		fallback = o.Fallback.newStore(reg)
		ro.Fallback, ro.FallbackShare, ro.OnFallback = fallback, o.Failure.LocalShare, onFallback
	case rls.FailOpen:
		ro.CountFailedOpen = true
	}
	// Redis's memory limit and policy, read on every new connection: a
	// policy that evicts counters lets a flood of new keys buy back the
	// quota of exhausted ones.
	ro.OnServerLimits = func(l redis.ServerLimits) {
		switch {
		case l.EvictsCounters():
			log.Warn("redis evicts rate limit counters under memory pressure: a flood of new keys can reset exhausted limits; use maxmemory-policy noeviction (calls then fail at maxmemory and follow --failure-mode) or no maxmemory",
				"addr", l.Addr, "maxmemory", l.MaxMemory, "maxmemory_policy", l.Policy)
		case l.MaxMemory > 0:
			log.Info("redis memory limit: at maxmemory the script's writes fail (OOM) and calls follow --failure-mode",
				"addr", l.Addr, "maxmemory", l.MaxMemory, "maxmemory_policy", l.Policy)
		}
	}
	r, err := redis.New(ro)
	if err != nil {
		if fallback != nil {
			fallback.Close()
		}
		return nil, err
	}
	tlsMode := "off"
	switch {
	case tlsConf != nil && tlsConf.InsecureSkipVerify:
		tlsMode = "unverified"
		log.Warn("redis TLS certificates are not verified (" + c.flag("tls-insecure-skip-verify") + "): for testing only")
	case tlsConf != nil && len(tlsConf.Certificates) > 0:
		tlsMode = "mutual"
	case tlsConf != nil || c.RedisURL.tls():
		tlsMode = "on"
	}
	log.Info("redis backend", "mode", c.mode(), "tls", tlsMode, "batch_window", c.RedisBatchWindow, "batch_size", c.RedisBatchSize, "pipelines", c.RedisPipelines, "local_deny_cache", o.Redis.LocalDenyCache, "failure_mode", o.Failure.Mode.String())
	registerRedisMetrics(reg, r)
	stat := func(name, help string, f func(redis.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(r.Stats())) })
	}
	dropped := func(reason string, f func(redis.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "envoy_rls_redis_write_back_dropped_total",
			Help:        "Hits allowed without Redis that were not written back: the write-back buffer was full (reason buffer_full), or Redis did not take them within --shutdown-grace after shutdown (reason shutdown).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(f(r.Stats())) })
	}
	reg.MustRegister(
		stat("envoy_rls_redis_not_sent_total", "Calls not sent because their deadline had passed or was nearer than a round trip (nothing charged).", func(s redis.Stats) uint64 { return s.NotSent }),
		stat("envoy_rls_redis_oom_errors_total", "Script calls refused by Redis at maxmemory (OOM), also counted as errors.", func(s redis.Stats) uint64 { return s.OOM }),
		stat("envoy_rls_redis_late_charged_total", "Requests answered without Redis's decision (failure mode, or denied by the local fallback) that Redis ran and charged after the caller left.", func(s redis.Stats) uint64 { return s.LateCharged }),
		stat("envoy_rls_redis_late_unsure_total", "Requests answered without Redis's decision and not written back whose pipeline failed in a way that may have let Redis run and charge them (a timeout, a lost connection).", func(s redis.Stats) uint64 { return s.LateUnsure }),
		stat("envoy_rls_redis_write_back_hits_total", "Hits allowed without Redis (local fallback, or failed open) later charged to Redis.", func(s redis.Stats) uint64 { return s.WriteBackHits }),
		stat("envoy_rls_redis_write_back_over_limit_total", "Written-back hits in write-backs that did not fit whole in their limit: charged anyway, past the limit or as bucket debt (a full sliding window log keeps no more than its limit).", func(s redis.Stats) uint64 { return s.WriteBackOverLimit }),
		stat("envoy_rls_redis_write_back_retried_total", "Written-back hits sent again after a failure that may have let the first send run (a timeout, a lost connection): they may be counted twice.", func(s redis.Stats) uint64 { return s.WriteBackRetried }),
		stat("envoy_rls_redis_write_back_unsure_total", "Hits written back of calls whose pipeline failed in a way that may have let Redis run it (a timeout, a lost connection): they may be counted twice.", func(s redis.Stats) uint64 { return s.WriteBackUnsure }),
		dropped("buffer_full", func(s redis.Stats) uint64 { return s.WriteBackDropped }),
		dropped("shutdown", func(s redis.Stats) uint64 { return s.WriteBackDroppedAtClose }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "envoy_rls_redis_write_back_pending", Help: "Keys whose hits wait to be written back to Redis, or are being written."},
			func() float64 { return float64(r.Stats().WriteBackPending) }),
	)
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "envoy_rls_redis_evicting_servers",
			Help: "Redis servers whose maxmemory-policy can evict live counters (maxmemory set, policy not noeviction), as they said on the last connection.",
		}, func() float64 {
			n := 0
			for _, l := range r.ServerLimits() {
				if l.EvictsCounters() {
					n++
				}
			}
			return float64(n)
		}),
	)
	path := func(p string, f func(redis.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "envoy_rls_redis_decisions_total",
			Help:        "Requests by who decided them: redis, deny_cache (the local deny cache), local_fallback (the embedded store, failure mode local), failed (answered by the failure mode: see envoy_rls_requests_total's failed_open and unavailable).",
			ConstLabels: prometheus.Labels{"path": p},
		}, func() float64 { return float64(f(r.Stats())) })
	}
	reg.MustRegister(
		path("redis", func(s redis.Stats) uint64 { return s.Decided }),
		path("deny_cache", func(s redis.Stats) uint64 { return s.LocalDenials }),
		path("local_fallback", func(s redis.Stats) uint64 { return s.LocalFallbacks }),
		path("failed", func(s redis.Stats) uint64 { return s.Errors }),
	)
	if fallback != nil {
		return withFallback{r, fallback}, nil
	}
	return r, nil
}

// withFallback is the Redis store with its fallback store, closed together.
type withFallback struct {
	*redis.Store
	fallback *memory.Store
}

func (s withFallback) Close() error {
	err := s.Store.Close()
	s.fallback.Close()
	return err
}

// redisLogger adapts go-redis's process-wide logger to slog.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
