package main

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// redisConn is how to reach one Redis deployment and talk to it: the main
// one (the --redis-* flags, embedded in options) or the per-second one
// (the --redis-persecond-* flags, options.PerSecond). Both are read,
// checked and built by the same code; the settings of the counters
// themselves (--key-prefix, --local-deny-cache, --failure-mode) are shared.
type redisConn struct {
	// prefix is the flags' name prefix, "redis-" (the default) or
	// "redis-persecond-".
	prefix string

	RedisURL              redisURLFlag
	RedisSentinel         addrList
	RedisSentinelMaster   string
	RedisSentinelPassword string
	RedisCluster          addrList
	RedisPoolSize         int
	RedisPipelines        int
	RedisDialTimeout      time.Duration
	RedisReadTimeout      time.Duration
	RedisWriteTimeout     time.Duration
	RedisBatchWindow      time.Duration
	RedisBatchSize        int

	RedisTLSCAFile             string
	RedisTLSCertFile           string
	RedisTLSKeyFile            string
	RedisTLSServerName         string
	RedisTLSInsecureSkipVerify bool
}

// perSecondPrefix names the per-second Redis's flags.
const perSecondPrefix = "redis-persecond-"

// flag returns the name of one of c's flags with its dashes, e.g.
// flag("url") is "--redis-url" or "--redis-persecond-url".
func (c redisConn) flag(name string) string {
	p := c.prefix
	if p == "" {
		p = "redis-"
	}
	return "--" + p + name
}

// enabled reports whether c names a server.
func (c redisConn) enabled() bool {
	return c.RedisURL.set() || len(c.RedisSentinel) > 0 || len(c.RedisCluster) > 0
}

// mode is "standalone", "sentinel" or "cluster".
func (c redisConn) mode() string {
	switch {
	case len(c.RedisSentinel) > 0:
		return "sentinel"
	case len(c.RedisCluster) > 0:
		return "cluster"
	}
	return "standalone"
}

// addRedisFlags defines the flags of one Redis connection under prefix
// ("redis-" or perSecondPrefix): the same flags, defaults and checks for
// both Redis deployments.
func addRedisFlags(fs *flag.FlagSet, c *redisConn, prefix string) {
	c.prefix = prefix
	name := func(n string) string { return prefix + n }
	doc := func(s string) string {
		if prefix == "redis-" {
			return s
		}
		return "per-second Redis (counters of limits of a second or less): " + strings.ReplaceAll(s, "--redis-", "--"+prefix)
	}
	fs.TextVar(&c.RedisURL, name("url"), redisURLFlag{}, doc("standalone Redis: redis://[user:pass@]host:port/db or rediss:// for TLS"))
	fs.TextVar(&c.RedisSentinel, name("sentinel"), addrList(nil), doc("Sentinel addresses ADDR[,ADDR...] (with --redis-sentinel-master); a --redis-url then only gives credentials, db and TLS"))
	fs.StringVar(&c.RedisSentinelMaster, name("sentinel-master"), "", doc("Sentinel master name"))
	fs.StringVar(&c.RedisSentinelPassword, name("sentinel-password"), "", doc("password of the Sentinels (not of the master)"))
	fs.TextVar(&c.RedisCluster, name("cluster"), addrList(nil), doc("Redis Cluster seed addresses ADDR[,ADDR...]; a --redis-url then only gives credentials and TLS"))
	fs.IntVar(&c.RedisPoolSize, name("pool-size"), 0, doc("connections per Redis node (0: go-redis default, 10 per CPU)"))
	fs.IntVar(&c.RedisPipelines, name("pipelines"), redis.DefaultPipelines, doc("most pipelines in flight; requests arriving meanwhile go together in the next one, as one script call (fewer: larger batches, less Redis CPU per decision)"))
	fs.DurationVar(&c.RedisDialTimeout, name("dial-timeout"), redis.DefaultDialTimeout, doc("Redis connect timeout"))
	fs.DurationVar(&c.RedisReadTimeout, name("read-timeout"), redis.DefaultIOTimeout, doc("Redis read timeout: how long a pipeline may wait for its replies before its connection is given up (callers leave at their own deadline earlier without closing it)"))
	fs.DurationVar(&c.RedisWriteTimeout, name("write-timeout"), redis.DefaultIOTimeout, doc("Redis write timeout"))
	fs.DurationVar(&c.RedisBatchWindow, name("batch-window"), 0, doc("collect concurrent requests for up to this long and send them as one pipeline (0: send as soon as the connection is free)"))
	fs.IntVar(&c.RedisBatchSize, name("batch-size"), redis.DefaultBatchSize, doc("most requests in one pipeline"))
	fs.StringVar(&c.RedisTLSCAFile, name("tls-ca-file"), "", doc("PEM CA bundle that verifies the Redis servers' certificates instead of the system roots; turns TLS on"))
	fs.StringVar(&c.RedisTLSCertFile, name("tls-cert-file"), "", doc("PEM client certificate for Redis (mTLS), with --redis-tls-key-file; turns TLS on"))
	fs.StringVar(&c.RedisTLSKeyFile, name("tls-key-file"), "", doc("PEM private key of --redis-tls-cert-file"))
	fs.StringVar(&c.RedisTLSServerName, name("tls-server-name"), "", doc("name verified in the Redis servers' certificates (default: the --redis-url host, else each dialed host); turns TLS on"))
	fs.BoolVar(&c.RedisTLSInsecureSkipVerify, name("tls-insecure-skip-verify"), false, doc("do not verify the Redis servers' certificates (for testing only); turns TLS on"))
}

// validate checks one Redis connection's settings together, without
// reading any file.
func (c redisConn) validate() []error {
	var errs []error
	switch {
	case !c.enabled():
		errs = append(errs, fmt.Errorf("--backend redis needs %s, %s or %s", c.flag("url"), c.flag("sentinel"), c.flag("cluster")))
	case len(c.RedisSentinel) > 0 && len(c.RedisCluster) > 0:
		errs = append(errs, fmt.Errorf("%s and %s exclude each other", c.flag("sentinel"), c.flag("cluster")))
	}
	if (len(c.RedisSentinel) > 0) != (c.RedisSentinelMaster != "") {
		errs = append(errs, fmt.Errorf("%s and %s go together", c.flag("sentinel"), c.flag("sentinel-master")))
	}
	errs = append(errs, c.validateRedisTLS()...)
	if c.RedisBatchSize < 1 {
		errs = append(errs, fmt.Errorf("%s must be at least 1", c.flag("batch-size")))
	}
	if c.RedisPipelines < 1 {
		errs = append(errs, fmt.Errorf("%s must be at least 1", c.flag("pipelines")))
	}
	if c.RedisBatchWindow < 0 {
		errs = append(errs, fmt.Errorf("%s must not be negative", c.flag("batch-window")))
	}
	return errs
}

// validatePerSecond checks the --redis-persecond-* flags: none of them
// without a per-second server, and a per-second server only next to a main
// one (selectBackend already refused them on the memory backend).
func (o *options) validatePerSecond() []error {
	ps := o.PerSecond
	if ps.enabled() {
		return ps.validate()
	}
	var err error
	o.cmd.fs.VisitAll(func(f *flag.Flag) {
		if err == nil && strings.HasPrefix(f.Name, perSecondPrefix) && o.cmd.given(f.Name) {
			err = fmt.Errorf("%s applies to the per-second Redis, which needs %s, %s or %s",
				o.cmd.source(f.Name), ps.flag("url"), ps.flag("sentinel"), ps.flag("cluster"))
		}
	})
	if err != nil {
		return []error{err}
	}
	return nil
}
