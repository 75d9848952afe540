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

		ApproximateSyncInterval: o.Redis.ApproximateSyncInterval,
		TLS:                     tlsConf,
		StallTimeout:            c.RedisStallTimeout,
	}
	if ro.StallTimeout == 0 {
		ro.StallTimeout = -1 // --redis-stall-timeout 0: off
	}
	// A node found down, or answering again: once each, not per call.
	ro.OnNodeHealth = func(h redis.NodeHealth) {
		addr := h.Addr
		if addr == "" {
			addr = c.mode()
		}
		if h.Down {
			log.Warn("redis not answering: calls for its keys answer by the failure mode at once, until it answers a PING again",
				"addr", addr, "stall_timeout", c.RedisStallTimeout, "failure_mode", o.Failure.Mode.String(), "error", h.Err)
			return
		}
		log.Info("redis answers again", "addr", addr, "down_for", h.For.Round(time.Millisecond))
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
