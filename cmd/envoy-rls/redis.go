package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// newRedisStore builds the Redis store from the options. It does not
// connect: the service starts while Redis is down and the store reconnects
// by itself.
func newRedisStore(o options, reg prometheus.Registerer, log *slog.Logger) (backend.Store, error) {
	tlsConf, err := redisTLSConfig(o)
	if err != nil {
		return nil, err
	}
	ro := redis.Options{
		URL:              o.RedisURL,
		SentinelAddrs:    splitList(o.RedisSentinel),
		SentinelMaster:   o.RedisSentinelMaster,
		SentinelPassword: o.RedisSentinelPassword,
		ClusterAddrs:     splitList(o.RedisCluster),
		PoolSize:         o.RedisPoolSize,
		Pipelines:        o.RedisPipelines,
		DialTimeout:      o.RedisDialTimeout,
		ReadTimeout:      o.RedisReadTimeout,
		WriteTimeout:     o.RedisWriteTimeout,
		KeyPrefix:        o.KeyPrefix,
		BatchWindow:      o.RedisBatchWindow,
		BatchSize:        o.RedisBatchSize,
		LocalDenyCache:   o.LocalDenyCache,
		TLS:              tlsConf,
	}
	// go-redis logs connection trouble on its own; route it to our logger at
	// debug level, since every failure that matters to a call is already
	// counted and logged (throttled) by the service.
	goredis.SetLogger(redisLogger{log})
	r, err := redis.New(ro)
	if err != nil {
		return nil, err
	}
	mode := "standalone"
	switch {
	case o.RedisSentinel != "":
		mode = "sentinel"
	case o.RedisCluster != "":
		mode = "cluster"
	}
	tlsMode := "off"
	switch {
	case tlsConf != nil && tlsConf.InsecureSkipVerify:
		tlsMode = "unverified"
		log.Warn("redis TLS certificates are not verified (--redis-tls-insecure-skip-verify): for testing only")
	case tlsConf != nil && len(tlsConf.Certificates) > 0:
		tlsMode = "mutual"
	case tlsConf != nil || strings.HasPrefix(strings.ToLower(o.RedisURL), "rediss:"):
		tlsMode = "on"
	}
	log.Info("redis backend", "mode", mode, "tls", tlsMode, "batch_window", o.RedisBatchWindow, "batch_size", o.RedisBatchSize, "pipelines", o.RedisPipelines, "local_deny_cache", o.LocalDenyCache)
	registerRedisMetrics(reg, r)
	return r, nil
}

// redisLogger adapts go-redis's process-wide logger to slog.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}
