package redis

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Defaults of Options.
const (
	// DefaultDialTimeout bounds connecting to a server when
	// Options.DialTimeout is zero.
	DefaultDialTimeout = time.Second
	// DefaultIOTimeout bounds a read or a write on a connection when
	// Options.ReadTimeout or WriteTimeout is zero. Calls with a context
	// deadline (every call of pkg/rls has one) are bounded by it instead.
	DefaultIOTimeout = time.Second
	// DefaultBatchSize is the most script calls sent in one pipeline
	// when Options.BatchSize is zero.
	DefaultBatchSize = 64
	// DefaultPipelines is the most pipelines in flight when
	// Options.Pipelines is zero: one, so that every request that arrives
	// during a round trip goes in the next one (under make bench's load,
	// 0.08 round trips per request against 0.14 with two, and less CPU
	// per request in Redis and in the server).
	DefaultPipelines = 1
	// DefaultLocalDenyCacheSize is the most keys the local deny cache holds
	// when Options.LocalDenyCacheSize is zero.
	DefaultLocalDenyCacheSize = 100_000
)

// Options configure a Redis store. Exactly one of URL (standalone),
// SentinelAddrs (Sentinel) and ClusterAddrs (Cluster) selects the servers;
// with Sentinel or Cluster, a URL may be given as well for its credentials,
// database and TLS (its host is ignored).
type Options struct {
	// URL is redis://[user:pass@]host:port/db, or rediss:// for TLS, in the
	// format of go-redis ParseURL (query parameters such as dial_timeout
	// are honoured, but the fields below win when set).
	URL string
	// SentinelAddrs are the Sentinels' host:port addresses; SentinelMaster
	// names the monitored master. SentinelPassword authenticates to the
	// Sentinels (not to the master).
	SentinelAddrs    []string
	SentinelMaster   string
	SentinelPassword string
	// ClusterAddrs are some of a Redis Cluster's nodes, host:port.
	ClusterAddrs []string
	// Username and Password override the URL's credentials when set.
	Username, Password string
	// TLS, when set, is used for the connections to the servers (URL's
	// rediss:// scheme sets it for a standalone server).
	TLS *tls.Config

	// PoolSize is the most connections per server; it also bounds the
	// pipelines in flight. Zero selects go-redis's default, 10 per CPU.
	PoolSize int
	// Pipelines is the most pipelines in flight at once (at most PoolSize).
	// Requests that arrive meanwhile queue up and go together in the next
	// pipeline, as one script call (per slot), so fewer pipelines in flight
	// make larger batches and cost Redis less per decision; Redis runs one
	// script at a time anyway. Zero selects DefaultPipelines.
	Pipelines int
	// DialTimeout, ReadTimeout and WriteTimeout bound connecting and each
	// read and write; zero selects DefaultDialTimeout and
	// DefaultIOTimeout. A call's context deadline, when earlier, wins.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration

	// LeaseHorizon, LeaseMinChunk, LeaseIdle and LeaseKeys tune
	// consistency lease (see lease.go): a chunk is about LeaseHorizon of
	// the instance's demand on its key, at least LeaseMinChunk hits; a
	// key's unused chunk goes back once the key saw no request for
	// LeaseIdle; at most LeaseKeys keys hold chunks (others are strict).
	// Zero selects DefaultLeaseHorizon, DefaultLeaseMinChunk,
	// DefaultLeaseIdle and DefaultLeaseKeys.
	LeaseHorizon  time.Duration
	LeaseMinChunk uint64
	LeaseIdle     time.Duration
	LeaseKeys     int

	// ApproximateSyncInterval is how often consistency approximate sends
	// the hits admitted locally and learns the shared counts (see
	// approximate.go); zero selects DefaultApproximateSyncInterval.
	ApproximateSyncInterval time.Duration

	// KeyPrefix starts every Redis key, before the hash tag of the item's
	// Partition and the item's Key. It must not contain '{' or '}', which
	// would change the keys' hash slots.
	KeyPrefix string

	// BatchWindow is how long the first of several concurrent requests
	// waits for others to join its pipeline. Zero (the default) never waits:
	// requests that arrive while every connection is busy with a pipeline
	// queue up and are sent together in the next one, so batches form
	// exactly when the round trip is the bottleneck, and an idle store adds
	// no latency. A positive window trades that latency for fewer, larger
	// pipelines at moderate load.
	BatchWindow time.Duration
	// BatchSize is the most script calls in one pipeline. Zero selects
	// DefaultBatchSize; 1 disables pipelining.
	BatchSize int

	// LocalDenyCache enables the local deny cache: an item that Redis
	// denied for n hits with a RetryAfter of T is remembered, and until T
	// a request is denied without a Redis call when every one of its items
	// is such a remembered denial for at least as many hits (see
	// Store.Apply).
	LocalDenyCache bool
	// LocalDenyCacheSize bounds the keys the local deny cache holds. Zero
	// selects DefaultLocalDenyCacheSize.
	LocalDenyCacheSize int

	// Fallback, when set, decides the requests that Redis cannot answer in
	// time or fails on (failure mode local): each limit scaled by
	// FallbackShare (zero means 1, the whole limit), and the hits it allows
	// are written back to Redis once it answers again. Apply then answers
	// without an error. The store does not close Fallback.
	Fallback      backend.Store
	FallbackShare float64
	// OnFallback, when set, is called with Redis's error each time
	// Fallback decided a request, so that the caller can report the outage
	// (Apply returns no error then). It runs on the request's goroutine and
	// must be quick.
	OnFallback func(err error)
	// CountFailedOpen writes back the hits of the requests that fail (the
	// caller answers OK by its failure mode allow), so that they are
	// counted in Redis once it answers again.
	CountFailedOpen bool
	// WriteBackKeys bounds the keys whose hits wait to be written back;
	// zero selects DefaultWriteBackKeys.
	WriteBackKeys int
	// CloseWriteBack bounds how long Close takes: the local paths of lease
	// and approximate return and sync what they hold within half of it,
	// the pipelines in flight get until three quarters of it (then their
	// reads end; without the stall check they take up to ReadTimeout),
	// and the hits still waiting are written back within the rest (Redis
	// may be away when the store closes); zero selects DefaultCloseWriteBack,
	// a negative value drops them at once. Hits not written back by then
	// are counted (Stats.WriteBackDroppedAtClose) and named in Close's
	// error.
	CloseWriteBack time.Duration

	// StallTimeout is how long a server (a Cluster: a master) may send no
	// reply byte while pipelines wait for it before a PING on a connection
	// of its own, with the same timeout, checks it; when that fails too,
	// the server is down: calls for its keys answer by the failure mode at
	// once (their error wraps ErrNodeDown), without waiting out their
	// deadlines, and a PING every StallTimeout brings it back as soon as it
	// answers. A failed connection (refused, reset) is checked at once. A
	// busy server is not down: its replies keep coming, or it answers the
	// PING. Zero selects DefaultStallTimeout; a negative value turns the
	// check off (every call then waits for Redis until its deadline).
	StallTimeout time.Duration
	// OnNodeHealth, when set, is called when a node is found down and when
	// it answers again (for a log line).
	OnNodeHealth func(NodeHealth)

	// OnServerLimits, when set, is called with a server's maxmemory and
	// maxmemory-policy when a connection to it is made and they differ from
	// what it said before (so at start-up, and on a reconnect after they
	// changed). See ServerLimits.EvictsCounters.
	OnServerLimits func(ServerLimits)
}

// newClient builds the go-redis client of opts. It returns whether it
// is a Cluster client and the pool size asked for (0: go-redis's default).
//
// With h (stall detection on), the client's connections report to h their
// reads, and h gets its probes' clients (see health).
func newClient(opts Options, onConnect func(context.Context, *goredis.Conn) error, h *health) (goredis.UniversalClient, bool, int, error) {
	modes := 0
	if len(opts.SentinelAddrs) > 0 {
		modes++
	}
	if len(opts.ClusterAddrs) > 0 {
		modes++
	}
	if modes == 0 && opts.URL == "" {
		return nil, false, 0, errors.New("redis: needs a URL, Sentinel addresses or Cluster addresses")
	}
	if modes > 1 {
		return nil, false, 0, errors.New("redis: Sentinel and Cluster addresses are exclusive")
	}
	if len(opts.SentinelAddrs) > 0 && opts.SentinelMaster == "" {
		return nil, false, 0, errors.New("redis: Sentinel needs a master name")
	}
	base := &goredis.Options{}
	if opts.URL != "" {
		var err error
		if base, err = goredis.ParseURL(opts.URL); err != nil {
			return nil, false, 0, fmt.Errorf("redis: URL: %w", err)
		}
	}
	if opts.Username != "" {
		base.Username = opts.Username
	}
	if opts.Password != "" {
		base.Password = opts.Password
	}
	if opts.TLS != nil {
		base.TLSConfig = opts.TLS
	}
	if opts.PoolSize > 0 {
		base.PoolSize = opts.PoolSize
	}
	base.DialTimeout = pick(opts.DialTimeout, base.DialTimeout, DefaultDialTimeout)
	base.ReadTimeout = pick(opts.ReadTimeout, base.ReadTimeout, DefaultIOTimeout)
	base.WriteTimeout = pick(opts.WriteTimeout, base.WriteTimeout, DefaultIOTimeout)
	// A script call that fails on a broken connection may have run: retrying
	// it could charge twice. Errors go to the caller's failure policy.
	base.MaxRetries = -1
	base.ContextTimeoutEnabled = true
	base.DisableIdentity = true
	base.OnConnect = onConnect
	// Pipelines on the main pool, not on go-redis's extra pipeline pool:
	// the store bounds its pipelines in flight by the pool size, so the
	// connections stay within it.
	base.PipelinePoolSize = -1
	// One dial per connection: go-redis's default, five with 100 ms
	// between, held every pipeline to a dead server for half a second,
	// each of its callers until its deadline.
	base.DialerRetries = 1
	if h != nil {
		base.Dialer = h.dialer(base.DialTimeout, base.TLSConfig)
		h.newProbe = probeClient(opts, base)
		h.downProbe = base.ReadTimeout
	}

	switch {
	case len(opts.ClusterAddrs) > 0:
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:                 opts.ClusterAddrs,
			Username:              base.Username,
			Password:              base.Password,
			TLSConfig:             base.TLSConfig,
			PoolSize:              base.PoolSize,
			DialTimeout:           base.DialTimeout,
			ReadTimeout:           base.ReadTimeout,
			WriteTimeout:          base.WriteTimeout,
			MaxRetries:            base.MaxRetries,
			DialerRetries:         base.DialerRetries,
			Dialer:                base.Dialer,
			ContextTimeoutEnabled: true,
			DisableIdentity:       true,
			OnConnect:             onConnect,
		}), true, base.PoolSize, nil
	case len(opts.SentinelAddrs) > 0:
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName:            opts.SentinelMaster,
			SentinelAddrs:         opts.SentinelAddrs,
			SentinelPassword:      opts.SentinelPassword,
			Username:              base.Username,
			Password:              base.Password,
			DB:                    base.DB,
			TLSConfig:             base.TLSConfig,
			PoolSize:              base.PoolSize,
			DialTimeout:           base.DialTimeout,
			ReadTimeout:           base.ReadTimeout,
			WriteTimeout:          base.WriteTimeout,
			MaxRetries:            base.MaxRetries,
			DialerRetries:         base.DialerRetries,
			Dialer:                base.Dialer,
			ContextTimeoutEnabled: true,
			DisableIdentity:       true,
			OnConnect:             onConnect,
			PipelinePoolSize:      -1,
		}), false, base.PoolSize, nil
	default:
		return goredis.NewClient(base), false, base.PoolSize, nil
	}
}

// probeClient returns how to make the client of a node's probe (see
// health): one connection of its own, go-redis's own dialer (its reads are
// not the node's progress). Each probe's context bounds it.
func probeClient(opts Options, base *goredis.Options) func(addr string) goredis.UniversalClient {
	return func(addr string) goredis.UniversalClient {
		switch {
		case len(opts.ClusterAddrs) > 0:
			return goredis.NewClient(&goredis.Options{
				Addr: addr, Username: base.Username, Password: base.Password, TLSConfig: base.TLSConfig,
				PoolSize: 1, DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
				MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
			})
		case len(opts.SentinelAddrs) > 0:
			return goredis.NewFailoverClient(&goredis.FailoverOptions{
				MasterName: opts.SentinelMaster, SentinelAddrs: opts.SentinelAddrs, SentinelPassword: opts.SentinelPassword,
				Username: base.Username, Password: base.Password, DB: base.DB, TLSConfig: base.TLSConfig,
				PoolSize: 1, DialTimeout: base.DialTimeout, ReadTimeout: base.ReadTimeout, WriteTimeout: base.WriteTimeout,
				MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
			})
		}
		po := *base
		po.Dialer, po.OnConnect = nil, nil
		po.PoolSize, po.MinIdleConns, po.MaxIdleConns = 1, 0, 0
		return goredis.NewClient(&po)
	}
}

// pick returns the first positive duration of set, parsed and def.
func pick(set, parsed, def time.Duration) time.Duration {
	switch {
	case set > 0:
		return set
	case parsed > 0:
		return parsed
	}
	return def
}
