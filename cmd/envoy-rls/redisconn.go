package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
)

// redisOptions are the redis backend's: the main Redis, the per-second one
// and what the counters on both share.
type redisOptions struct {
	// Main is the main Redis (--redis-*).
	Main redisConn
	// PerSecond is the Redis of the counters of limits of a second or
	// less, when it names a server (--redis-persecond-url, -sentinel or
	// -cluster): the main Redis's settings with its own overrides, made
	// by settle.
	PerSecond      redisConn
	KeyPrefix      string
	LocalDenyCache bool
	// ApproximateSyncInterval: see redis.Options.
	ApproximateSyncInterval time.Duration

	// perSecond holds the --redis-persecond-* flags as given.
	perSecond redisConn
}

func (o *redisOptions) addFlags(fs, perSecond, deprecated *flagSet) {
	o.Main.prefix = "redis-"
	o.Main.addFlags(func(string) *flagSet { return fs }, nil)
	fs.StringVar(&o.KeyPrefix, "key-prefix", "", "prefix of every counter key (redis backend), to share one Redis between deployments")
	fs.BoolVar(&o.LocalDenyCache, "local-deny-cache", true, "deny keys known to be over limit until their retry time without asking Redis")
	fs.DurationVar(&o.ApproximateSyncInterval, "approximate-sync-interval", redis.DefaultApproximateSyncInterval, "how often limits of consistency approximate send the hits admitted on local counters to Redis, many keys in one script call, and learn the shared counts and their share of what remains; see docs/consistency.md")
	o.perSecond.prefix = perSecondPrefix
	o.perSecond.addFlags(func(name string) *flagSet {
		switch perSecondFlags[name] {
		case psOwn, psOverride:
			return perSecond
		case psDeprecated:
			return deprecated
		}
		return nil
	}, func(name, doc string) string {
		doc = strings.ReplaceAll(doc, "--redis-", "--"+perSecondPrefix)
		if name == "url" {
			doc = "a per-second Redis (counters of limits of a second or less), as the reference's REDIS_PERSECOND; the other counters stay on the main Redis: " + doc
		} else {
			doc = "per-second Redis: " + doc
		}
		switch perSecondFlags[name] {
		case psOverride:
			doc += "; default: --redis-" + name + "'s value"
		case psDeprecated:
			doc += "; deprecated: " + perSecondAdvice(name)
		}
		return doc
	})
	// The per-second Redis takes the main one's values: its flags show
	// no defaults of their own.
	for name, role := range perSecondFlags {
		if role != psOwn {
			perSecond.Lookup(perSecondPrefix + name).DefValue = ""
		}
		if role == psDeprecated {
			deprecated.deprecate(perSecondPrefix+name, perSecondAdvice(name))
		}
	}
}

// perSecondAdvice says what replaces the deprecated per-second flag of
// setting name.
func perSecondAdvice(name string) string {
	if name == "tls-server-name" {
		return "the name verified is the --redis-persecond-url host, else each dialed host"
	}
	return "the per-second Redis takes --redis-" + name + "'s value"
}

// perSecondPrefix names the per-second Redis's flags.
const perSecondPrefix = "redis-persecond-"

// perSecondRole is how the per-second Redis takes one setting.
type perSecondRole int

const (
	// psOwn: its own (the server it names), never the main Redis's.
	psOwn perSecondRole = iota + 1
	// psOverride: the main Redis's unless its flag is given, as the
	// reference's REDIS_PERSECOND_* variables carry it (type, auth, TLS
	// on or off in the URL's scheme, pool size, timeout, pipelining).
	psOverride
	// psDeprecated: the same, with a flag kept for the deployments that
	// set it (see docs/stores.md).
	psDeprecated
)

// perSecondFlags are the --redis-persecond-* flags, by the name of the
// --redis-* flag they override. Every other setting of the per-second
// Redis is the main Redis's.
var perSecondFlags = map[string]perSecondRole{
	"url": psOwn, "sentinel": psOwn, "sentinel-master": psOwn, "cluster": psOwn,
	"sentinel-password": psOverride, "pool-size": psOverride,
	"dial-timeout": psOverride, "read-timeout": psOverride, "write-timeout": psOverride,
	"batch-window": psOverride, "batch-size": psOverride,
	"pipelines": psDeprecated, "tls-ca-file": psDeprecated, "tls-cert-file": psDeprecated, "tls-key-file": psDeprecated,
	"tls-server-name": psDeprecated, "tls-insecure-skip-verify": psDeprecated,
}

// settle makes PerSecond: the main Redis's settings, then the server the
// per-second flags name and every per-second flag given (given reports
// whether a flag was). A plain redis:// per-second URL takes none of the
// main Redis's TLS settings, and --redis-tls-server-name, which names the
// main servers, is never taken.
func (o *redisOptions) settle(given func(string) bool) {
	own, ps := o.perSecond, o.Main
	ps.prefix, ps.inherited = perSecondPrefix, map[string]bool{}
	ps.RedisURL, ps.RedisSentinel, ps.RedisSentinelMaster, ps.RedisCluster = own.RedisURL, own.RedisSentinel, own.RedisSentinelMaster, own.RedisCluster
	ps.RedisTLSServerName = own.RedisTLSServerName
	if plain := own.RedisURL.set() && !own.RedisURL.tls(); plain {
		ps.RedisTLSCAFile, ps.RedisTLSCertFile, ps.RedisTLSKeyFile, ps.RedisTLSInsecureSkipVerify = "", "", "", false
	}
	plain := own.RedisURL.set() && !own.RedisURL.tls()
	for name, role := range perSecondFlags {
		switch {
		case given(perSecondPrefix + name):
			copyRedisSetting(&ps, &own, name)
		case role != psOwn && name != "tls-server-name" && !(plain && strings.HasPrefix(name, "tls-")) && given("redis-"+name):
			ps.inherited[name] = true
		}
	}
	o.PerSecond = ps
}

// copyRedisSetting sets the setting of flag name (without its prefix) of
// dst to src's.
func copyRedisSetting(dst, src *redisConn, name string) {
	switch name {
	case "url":
		dst.RedisURL = src.RedisURL
	case "sentinel":
		dst.RedisSentinel = src.RedisSentinel
	case "sentinel-master":
		dst.RedisSentinelMaster = src.RedisSentinelMaster
	case "sentinel-password":
		dst.RedisSentinelPassword = src.RedisSentinelPassword
	case "cluster":
		dst.RedisCluster = src.RedisCluster
	case "pool-size":
		dst.RedisPoolSize = src.RedisPoolSize
	case "pipelines":
		dst.RedisPipelines = src.RedisPipelines
	case "dial-timeout":
		dst.RedisDialTimeout = src.RedisDialTimeout
	case "read-timeout":
		dst.RedisReadTimeout = src.RedisReadTimeout
	case "write-timeout":
		dst.RedisWriteTimeout = src.RedisWriteTimeout
	case "batch-window":
		dst.RedisBatchWindow = src.RedisBatchWindow
	case "batch-size":
		dst.RedisBatchSize = src.RedisBatchSize
	case "tls-ca-file":
		dst.RedisTLSCAFile = src.RedisTLSCAFile
	case "tls-cert-file":
		dst.RedisTLSCertFile = src.RedisTLSCertFile
	case "tls-key-file":
		dst.RedisTLSKeyFile = src.RedisTLSKeyFile
	case "tls-server-name":
		dst.RedisTLSServerName = src.RedisTLSServerName
	case "tls-insecure-skip-verify":
		dst.RedisTLSInsecureSkipVerify = src.RedisTLSInsecureSkipVerify
	default:
		panic("copyRedisSetting: no setting " + name)
	}
}

// validate checks the redis backend's settings (settle made PerSecond):
// the main Redis, and the per-second one when it names a server; without
// one, no per-second flag.
func (o redisOptions) validate(c *command) []error {
	errs := o.Main.validate()
	if o.ApproximateSyncInterval <= 0 {
		errs = append(errs, fmt.Errorf("--approximate-sync-interval must be positive, not %v", o.ApproximateSyncInterval))
	}
	if o.PerSecond.enabled() {
		// A bad setting it took from the main Redis is told once.
		told := map[string]bool{}
		for _, err := range errs {
			told[err.Error()] = true
		}
		for _, err := range o.PerSecond.validate() {
			if !told[err.Error()] {
				errs = append(errs, err)
			}
		}
		return errs
	}
	for name := range perSecondFlags {
		if f := perSecondPrefix + name; c.given(f) {
			ps := o.PerSecond
			return append(errs, fmt.Errorf("%s applies to the per-second Redis, which needs %s, %s or %s",
				c.source(f), ps.flag("url"), ps.flag("sentinel"), ps.flag("cluster")))
		}
	}
	return errs
}

// redisConn is how to reach one Redis deployment and talk to it: the main
// one or the per-second one. Both are checked and built by the same code.
type redisConn struct {
	// prefix is the flags' name prefix, "redis-" or perSecondPrefix.
	prefix string
	// inherited names the settings of the per-second Redis given for the
	// main one (by flag name without the prefix), for messages.
	inherited map[string]bool

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
	RedisStallTimeout     time.Duration

	RedisTLSCAFile             string
	RedisTLSCertFile           string
	RedisTLSKeyFile            string
	RedisTLSServerName         string
	RedisTLSInsecureSkipVerify bool
}

// flag returns the name, with its dashes, of the flag that set one of c's
// settings, e.g. flag("url") is "--redis-url" or "--redis-persecond-url":
// the main Redis's flag for a setting the per-second one took from it.
func (c redisConn) flag(name string) string {
	p := c.prefix
	if p == "" || c.inherited[name] {
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

// addFlags defines the flags of c under c.prefix: each in the flag set
// pick returns for its name without the prefix (none when nil), its usage
// rewritten by doc when doc is not nil.
func (c *redisConn) addFlags(pick func(name string) *flagSet, doc func(name, usage string) string) {
	def := func(name, usage string) (*flagSet, string, string) {
		if doc != nil {
			usage = doc(name, usage)
		}
		return pick(name), c.prefix + name, usage
	}
	if fs, n, u := def("url", "standalone Redis: redis://[user:pass@]host:port/db or rediss:// for TLS"); fs != nil {
		fs.TextVar(&c.RedisURL, n, redisURLFlag{}, u)
	}
	if fs, n, u := def("sentinel", "Sentinel addresses ADDR[,ADDR...] (with --redis-sentinel-master); a --redis-url then only gives credentials, db and TLS"); fs != nil {
		fs.TextVar(&c.RedisSentinel, n, addrList(nil), u)
	}
	if fs, n, u := def("sentinel-master", "Sentinel master name"); fs != nil {
		fs.StringVar(&c.RedisSentinelMaster, n, "", u)
	}
	if fs, n, u := def("sentinel-password", "password of the Sentinels (not of the master)"); fs != nil {
		fs.StringVar(&c.RedisSentinelPassword, n, "", u)
	}
	if fs, n, u := def("cluster", "Redis Cluster seed addresses ADDR[,ADDR...]; a --redis-url then only gives credentials and TLS"); fs != nil {
		fs.TextVar(&c.RedisCluster, n, addrList(nil), u)
	}
	if fs, n, u := def("pool-size", "connections per Redis node (0: go-redis default, 10 per CPU)"); fs != nil {
		fs.IntVar(&c.RedisPoolSize, n, 0, u)
	}
	if fs, n, u := def("pipelines", "most pipelines in flight; requests arriving meanwhile go together in the next one, as one script call (fewer: larger batches, less Redis CPU per decision)"); fs != nil {
		fs.IntVar(&c.RedisPipelines, n, redis.DefaultPipelines, u)
	}
	if fs, n, u := def("dial-timeout", "Redis connect timeout"); fs != nil {
		fs.DurationVar(&c.RedisDialTimeout, n, redis.DefaultDialTimeout, u)
	}
	if fs, n, u := def("read-timeout", "Redis read timeout: how long a pipeline may wait for its replies before its connection is given up (callers leave at their own deadline earlier without closing it)"); fs != nil {
		fs.DurationVar(&c.RedisReadTimeout, n, redis.DefaultIOTimeout, u)
	}
	if fs, n, u := def("write-timeout", "Redis write timeout"); fs != nil {
		fs.DurationVar(&c.RedisWriteTimeout, n, redis.DefaultIOTimeout, u)
	}
	if fs, n, u := def("batch-window", "collect concurrent requests for up to this long and send them as one pipeline (0: send as soon as the connection is free)"); fs != nil {
		fs.DurationVar(&c.RedisBatchWindow, n, 0, u)
	}
	if fs, n, u := def("batch-size", "most requests in one pipeline"); fs != nil {
		fs.IntVar(&c.RedisBatchSize, n, redis.DefaultBatchSize, u)
	}
	if fs, n, u := def("stall-timeout", "a Redis server (a Cluster master) that sends no reply byte for this long while calls wait for it, and then fails a PING on a connection of its own within as long, is down: calls for its keys answer by --failure-mode at once, until a PING every as long answers again (a refused connection is checked at once; 0: off)"); fs != nil {
		fs.DurationVar(&c.RedisStallTimeout, n, redis.DefaultStallTimeout, u)
	}
	if fs, n, u := def("tls-ca-file", "PEM CA bundle that verifies the Redis servers' certificates instead of the system roots; turns TLS on"); fs != nil {
		fs.StringVar(&c.RedisTLSCAFile, n, "", u)
	}
	if fs, n, u := def("tls-cert-file", "PEM client certificate for Redis (mTLS), with --redis-tls-key-file; turns TLS on"); fs != nil {
		fs.StringVar(&c.RedisTLSCertFile, n, "", u)
	}
	if fs, n, u := def("tls-key-file", "PEM private key of --redis-tls-cert-file"); fs != nil {
		fs.StringVar(&c.RedisTLSKeyFile, n, "", u)
	}
	if fs, n, u := def("tls-server-name", "name verified in the Redis servers' certificates (default: the --redis-url host, else each dialed host); turns TLS on"); fs != nil {
		fs.StringVar(&c.RedisTLSServerName, n, "", u)
	}
	if fs, n, u := def("tls-insecure-skip-verify", "do not verify the Redis servers' certificates (for testing only); turns TLS on"); fs != nil {
		fs.BoolVar(&c.RedisTLSInsecureSkipVerify, n, false, u)
	}
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
	if c.RedisStallTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s must not be negative", c.flag("stall-timeout")))
	}
	if c.RedisBatchWindow < 0 {
		errs = append(errs, fmt.Errorf("%s must not be negative", c.flag("batch-window")))
	}
	return errs
}
