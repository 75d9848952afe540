package backend

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
)

//go:embed lua/apply.lua
var applyLua string

// applyScript is the one script that decides a request's items: see
// lua/apply.lua.
var applyScript = redis.NewScript(applyLua)

// Defaults of RedisOptions.
const (
	// DefaultRedisDialTimeout bounds connecting to a server when
	// RedisOptions.DialTimeout is zero.
	DefaultRedisDialTimeout = 500 * time.Millisecond
	// DefaultRedisIOTimeout bounds a read or a write on a connection when
	// RedisOptions.ReadTimeout or WriteTimeout is zero. Calls with a context
	// deadline (every call of pkg/rls has one) are bounded by it instead.
	DefaultRedisIOTimeout = 500 * time.Millisecond
	// DefaultRedisBatchSize is the most script calls sent in one pipeline
	// when RedisOptions.BatchSize is zero.
	DefaultRedisBatchSize = 64
	// DefaultLocalDenyCacheSize is the most keys the local deny cache holds
	// when RedisOptions.LocalDenyCacheSize is zero.
	DefaultLocalDenyCacheSize = 100_000
)

// RedisOptions configure a Redis store. Exactly one of URL (standalone),
// SentinelAddrs (Sentinel) and ClusterAddrs (Cluster) selects the servers;
// with Sentinel or Cluster, a URL may be given as well for its credentials,
// database and TLS (its host is ignored).
type RedisOptions struct {
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
	// DialTimeout, ReadTimeout and WriteTimeout bound connecting and each
	// read and write; zero selects DefaultRedisDialTimeout and
	// DefaultRedisIOTimeout. A call's context deadline, when earlier, wins.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration

	// KeyPrefix is prepended to every Item.Key to form the Redis key. It
	// must not contain '{' or '}', which would change the keys' hash slots.
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
	// DefaultRedisBatchSize; 1 disables pipelining.
	BatchSize int

	// LocalDenyCache enables the local deny cache: an item that Redis
	// denied for n hits with a RetryAfter of T is remembered, and until T
	// a request is denied without a Redis call when every one of its items
	// is such a remembered denial for at least as many hits (see
	// Redis.Apply).
	LocalDenyCache bool
	// LocalDenyCacheSize bounds the keys the local deny cache holds. Zero
	// selects DefaultLocalDenyCacheSize.
	LocalDenyCacheSize int

	// Clock is for tests only. When nil (production), the script takes now
	// from Redis's own TIME, so instances with skewed clocks agree. When
	// set, Apply reads it once and passes now to the script, so a test can
	// drive Redis along a timeline; state keys then get no TTL, since test
	// time does not pass with real time (fresh states are still deleted).
	Clock Clock
}

// Redis is the Store backed by Redis: standalone, Sentinel or Cluster,
// through go-redis. Each request's items are decided by one Lua script call
// (apply.lua, the twin of pkg/algorithms) that takes now from Redis's TIME,
// so every instance sharing a Redis agrees on time and on counts. Concurrent
// requests share pipelines (see RedisOptions.BatchWindow), so a request
// costs at most one round trip, and less under load.
//
// All or nothing: on a standalone or Sentinel server, and on a Cluster when
// all of a request's keys share one hash slot (see HashTagged), the script
// decides every item and charges nothing when the request is denied,
// exactly like Memory.
//
// A request whose keys fall into several Cluster slots is split into one
// script call per slot, each atomic on its own node and all sent in the same
// pipeline. No call sees the others' decisions, so each charges its allowing
// items unless one of its own Enforced items denies. Then:
//   - when the request is allowed, every item whose decision allows is
//     charged, exactly as on one slot: the limits are never exceeded (the
//     store stays exact);
//   - when the request is denied, the slots where no Enforced item denied
//     are charged anyway: a denied request may be over-charged on those
//     slots (and their Decisions report the charged state). A denial that
//     comes only from Quota groups spread over several slots charges every
//     slot. Nothing is ever under-charged.
//
// Failures: NewRedis does not connect; go-redis connects lazily and
// reconnects by itself, so a Redis that is down at start-up or restarts
// later only makes the calls in between fail. Apply returns ctx's error as
// soon as ctx is done, whatever Redis does. Failure policy (allow or deny)
// is the caller's.
type Redis struct {
	client  redis.UniversalClient
	cluster bool
	prefix  string
	clock   Clock // nil: Redis's TIME

	window    time.Duration
	batchSize int
	queue     chan *call
	sem       chan struct{} // one token per pipeline in flight

	deny      *otter.Cache[string, denial] // nil when disabled
	denyClock Clock

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{}
	wg        sync.WaitGroup

	requests, roundTrips, scriptCalls atomic.Uint64
	localDenials, errs, reloads       atomic.Uint64
}

var _ Store = (*Redis)(nil)

// NewRedis returns a Redis store for opts. It checks the options but does
// not connect: it succeeds while Redis is down. Call Close to release it.
func NewRedis(opts RedisOptions) (*Redis, error) {
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("backend: redis key prefix %q must not contain '{' or '}'", opts.KeyPrefix)
	}
	if opts.BatchSize < 0 || opts.PoolSize < 0 || opts.LocalDenyCacheSize < 0 {
		return nil, errors.New("backend: redis batch size, pool size and deny cache size must not be negative")
	}
	if opts.BatchWindow < 0 {
		return nil, errors.New("backend: redis batch window must not be negative")
	}
	client, cluster, poolSize, err := newRedisClient(opts)
	if err != nil {
		return nil, err
	}
	r := &Redis{
		client:    client,
		cluster:   cluster,
		prefix:    opts.KeyPrefix,
		clock:     opts.Clock,
		window:    opts.BatchWindow,
		batchSize: opts.BatchSize,
		stop:      make(chan struct{}),
	}
	if r.batchSize == 0 {
		r.batchSize = DefaultRedisBatchSize
	}
	workers := poolSize
	if workers == 0 {
		workers = 10 * runtime.GOMAXPROCS(0) // go-redis's default pool size
	}
	r.sem = make(chan struct{}, workers)
	r.queue = make(chan *call, 4*r.batchSize)
	if opts.LocalDenyCache {
		size := opts.LocalDenyCacheSize
		if size == 0 {
			size = DefaultLocalDenyCacheSize
		}
		r.denyClock = opts.Clock
		if r.denyClock == nil {
			r.denyClock = MonotonicClock()
		}
		r.deny = otter.Must(&otter.Options[string, denial]{
			MaximumSize: size,
			ExpiryCalculator: otter.ExpiryWritingFunc(func(e otter.Entry[string, denial]) time.Duration {
				return e.Value.ttl
			}),
		})
	}
	r.wg.Add(1)
	go r.collect()
	return r, nil
}

// newRedisClient builds the go-redis client of opts. It returns whether it
// is a Cluster client and the pool size asked for (0: go-redis's default).
func newRedisClient(opts RedisOptions) (redis.UniversalClient, bool, int, error) {
	modes := 0
	if len(opts.SentinelAddrs) > 0 {
		modes++
	}
	if len(opts.ClusterAddrs) > 0 {
		modes++
	}
	if modes == 0 && opts.URL == "" {
		return nil, false, 0, errors.New("backend: redis needs a URL, Sentinel addresses or Cluster addresses")
	}
	if modes > 1 {
		return nil, false, 0, errors.New("backend: redis Sentinel and Cluster addresses are exclusive")
	}
	if len(opts.SentinelAddrs) > 0 && opts.SentinelMaster == "" {
		return nil, false, 0, errors.New("backend: redis Sentinel needs a master name")
	}
	base := &redis.Options{}
	if opts.URL != "" {
		var err error
		if base, err = redis.ParseURL(opts.URL); err != nil {
			return nil, false, 0, fmt.Errorf("backend: redis URL: %w", err)
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
	base.DialTimeout = pick(opts.DialTimeout, base.DialTimeout, DefaultRedisDialTimeout)
	base.ReadTimeout = pick(opts.ReadTimeout, base.ReadTimeout, DefaultRedisIOTimeout)
	base.WriteTimeout = pick(opts.WriteTimeout, base.WriteTimeout, DefaultRedisIOTimeout)
	// A script call that fails on a broken connection may have run: retrying
	// it could charge twice. Errors go to the caller's failure policy.
	base.MaxRetries = -1
	base.ContextTimeoutEnabled = true
	base.DisableIdentity = true

	switch {
	case len(opts.ClusterAddrs) > 0:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 opts.ClusterAddrs,
			Username:              base.Username,
			Password:              base.Password,
			TLSConfig:             base.TLSConfig,
			PoolSize:              base.PoolSize,
			DialTimeout:           base.DialTimeout,
			ReadTimeout:           base.ReadTimeout,
			WriteTimeout:          base.WriteTimeout,
			MaxRetries:            base.MaxRetries,
			ContextTimeoutEnabled: true,
			DisableIdentity:       true,
		}), true, base.PoolSize, nil
	case len(opts.SentinelAddrs) > 0:
		return redis.NewFailoverClient(&redis.FailoverOptions{
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
			ContextTimeoutEnabled: true,
			DisableIdentity:       true,
		}), false, base.PoolSize, nil
	default:
		return redis.NewClient(base), false, base.PoolSize, nil
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

// RedisStats are counters of a Redis store, for metrics.
type RedisStats struct {
	// Requests counts Apply calls with at least one item.
	Requests uint64
	// RoundTrips counts pipelines sent. On a Cluster one pipeline reaches
	// the nodes of its calls in parallel and counts once.
	RoundTrips uint64
	// ScriptCalls counts script calls (EVALSHA, or EVAL after NOSCRIPT):
	// one per request, or one per slot of a request split across slots.
	ScriptCalls uint64
	// LocalDenials counts requests denied by the local deny cache without
	// a Redis call.
	LocalDenials uint64
	// Errors counts Apply calls that returned an error, including those
	// whose context ended first.
	Errors uint64
	// ScriptReloads counts pipelines re-sent with EVAL because the server
	// did not have the script (NOSCRIPT, e.g. after a restart).
	ScriptReloads uint64
}

// Stats returns the store's counters.
func (r *Redis) Stats() RedisStats {
	return RedisStats{
		Requests:      r.requests.Load(),
		RoundTrips:    r.roundTrips.Load(),
		ScriptCalls:   r.scriptCalls.Load(),
		LocalDenials:  r.localDenials.Load(),
		Errors:        r.errs.Load(),
		ScriptReloads: r.reloads.Load(),
	}
}

// Close stops the store: calls waiting for a pipeline return ErrClosed,
// pipelines in flight finish, and the connections close. Apply returns
// ErrClosed afterwards. Close is idempotent.
func (r *Redis) Close() error {
	var err error
	r.closeOnce.Do(func() {
		r.closed.Store(true)
		close(r.stop)
		r.wg.Wait()
		if r.deny != nil {
			r.deny.StopAllGoroutines()
		}
		err = r.client.Close()
	})
	return err
}

// call is one Apply waiting for its script calls. The worker that runs it
// touches only the call's own fields, never the caller's items or out, so
// a caller may leave at its deadline while the call is in flight.
type call struct {
	ctx    context.Context
	now    string // ARGV[1]
	whole  string // ARGV[2]
	groups []group
	err    error         // set before done is closed when the call was not sent
	done   chan struct{} // closed when every group's cmd has its result
}

// group is the items of one request in one cluster slot (all of them on a
// standalone server): one script call.
type group struct {
	idx  []int    // indices of the items in the request
	keys []string // distinct Redis keys (KEYS)
	args string   // ARGV[3]
	cmd  *redis.Cmd
}

// Apply implements Store. See Redis for the atomicity it guarantees. It
// returns ErrClosed after Close, ctx.Err() when ctx ends first (the script
// may still run), and an error when Redis fails or answers something
// unexpected; then nothing is known about what was charged.
//
// With the local deny cache enabled, a request is answered without Redis
// when every item has hits > 0 and a remembered denial of its key for at
// most as many hits that has not yet passed (until its RetryAfter); its
// Decisions then report what Redis said at that denial (Remaining as of
// then, RetryAfter and ResetAfter counted down), nothing is charged, and
// the verdict is computed as usual. Such a denial stays true until then
// because the key encodes the limit (a per-request override has another
// key) and only time can lower a key's count.
func (r *Redis) Apply(ctx context.Context, items []Item, out []algorithms.Decision) (bool, error) {
	if r.closed.Load() {
		return false, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	n := len(items)
	if len(out) < n {
		return false, fmt.Errorf("backend: %d decisions for %d items", len(out), n)
	}
	if n == 0 {
		return true, nil
	}
	r.requests.Add(1)
	// start is read before the script runs, so a denial remembered as
	// lasting RetryAfter from start never outlives the true one, which
	// counts from the script's later instant.
	var start int64
	if r.deny != nil {
		start = r.denyClock.Now().UnixMicro()
		if allowed, ok := r.fromDenyCache(start, items, out[:n]); ok {
			r.localDenials.Add(1)
			return allowed, nil
		}
	}
	c := r.newCall(ctx, items)
	if err := r.do(c); err != nil {
		r.errs.Add(1)
		return false, err
	}
	for i := range c.groups {
		if err := decodeReply(&c.groups[i], items, out); err != nil {
			r.errs.Add(1)
			return false, err
		}
	}
	if r.deny != nil {
		r.rememberDenials(start, items, out[:n])
	}
	return Verdict(items, out[:n]), nil
}

// do queues c for a pipeline and waits until it has run, ctx ends or the
// store closes.
func (r *Redis) do(c *call) error {
	select {
	case r.queue <- c:
	case <-c.ctx.Done():
		return c.ctx.Err()
	case <-r.stop:
		return ErrClosed
	}
	select {
	case <-c.done:
		return c.err
	case <-c.ctx.Done():
		return c.ctx.Err()
	case <-r.stop:
		return ErrClosed
	}
}

// newCall splits items into script calls: one on a standalone server, one
// per hash slot on a Cluster.
func (r *Redis) newCall(ctx context.Context, items []Item) *call {
	c := &call{ctx: ctx, whole: "1", done: make(chan struct{})}
	if r.clock != nil {
		c.now = strconv.FormatInt(max(r.clock.Now().UnixMicro(), 0), 10)
	}
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = r.prefix + items[i].Key
	}
	if !r.cluster {
		idx := make([]int, len(items))
		for i := range idx {
			idx[i] = i
		}
		c.groups = []group{makeGroup(items, keys, idx)}
		return c
	}
	slots := make([]int, len(items))
	var order []int // distinct slots in order of first appearance
	for i, k := range keys {
		slots[i] = Slot(k)
		seen := false
		for _, s := range order {
			if s == slots[i] {
				seen = true
				break
			}
		}
		if !seen {
			order = append(order, slots[i])
		}
	}
	if len(order) > 1 {
		c.whole = "0"
	}
	c.groups = make([]group, len(order))
	for gi, s := range order {
		var idx []int
		for i := range items {
			if slots[i] == s {
				idx = append(idx, i)
			}
		}
		c.groups[gi] = makeGroup(items, keys, idx)
	}
	return c
}

// makeGroup encodes the items idx (with Redis keys keys) as one script call.
func makeGroup(items []Item, keys []string, idx []int) group {
	g := group{idx: idx, keys: make([]string, 0, len(idx))}
	b := make([]byte, 0, 48*len(idx))
	for _, i := range idx {
		it := &items[i]
		ki := -1
		for j, k := range g.keys {
			if k == keys[i] {
				ki = j
				break
			}
		}
		if ki < 0 {
			ki = len(g.keys)
			g.keys = append(g.keys, keys[i])
		}
		w := it.Limit.Window.Microseconds()
		if w < 1 {
			w = 1
		}
		b = strconv.AppendInt(b, int64(ki+1), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(it.Limit.Algorithm), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, it.Limit.Requests, 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, w, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, it.Limit.Capacity(), 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, it.Hits, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, uint64(it.Mode), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(it.Group), 10)
		if it.Hits > it.Limit.Capacity() || (it.Limit.Requests == 0 && it.Hits > 0) {
			b = append(b, " 1 "...)
		} else {
			b = append(b, " 0 "...)
		}
	}
	g.args = string(b)
	return g
}

// collect forms batches of queued calls and hands each to a worker, as long
// as fewer than cap(sem) pipelines are in flight.
func (r *Redis) collect() {
	defer r.wg.Done()
	var timer *time.Timer
	for {
		var first *call
		select {
		case first = <-r.queue:
		case <-r.stop:
			return
		}
		// Wait for a free connection; calls queue up meanwhile and join
		// this batch.
		select {
		case r.sem <- struct{}{}:
		case <-r.stop:
			return
		}
		batch := []*call{first}
		cmds := len(first.groups)
		if r.window > 0 && cmds < r.batchSize {
			if timer == nil {
				timer = time.NewTimer(r.window)
			} else {
				timer.Reset(r.window)
			}
		wait:
			for cmds < r.batchSize {
				select {
				case c := <-r.queue:
					batch = append(batch, c)
					cmds += len(c.groups)
				case <-timer.C:
					break wait
				case <-r.stop:
					<-r.sem
					return
				}
			}
			timer.Stop()
		}
	drain:
		for cmds < r.batchSize {
			select {
			case c := <-r.queue:
				batch = append(batch, c)
				cmds += len(c.groups)
			default:
				break drain
			}
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.sem }()
			r.run(batch)
		}()
	}
}

// run sends the script calls of batch in one pipeline (and the ones that
// met NOSCRIPT again with EVAL), then releases their callers. Calls whose
// context has ended are not sent.
func (r *Redis) run(batch []*call) {
	live := batch[:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			close(c.done) // its caller has left or is leaving
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()

	sha := applyScript.Hash()
	pipe := r.client.Pipeline()
	n := 0
	for _, c := range live {
		for i := range c.groups {
			g := &c.groups[i]
			g.cmd = pipe.EvalSha(ctx, sha, g.keys, c.now, c.whole, g.args)
			n++
		}
	}
	_, _ = pipe.Exec(ctx) // errors are in the cmds
	r.roundTrips.Add(1)
	r.scriptCalls.Add(uint64(n))

	var again redis.Pipeliner
	n = 0
	for _, c := range live {
		for i := range c.groups {
			g := &c.groups[i]
			if !redis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
				continue
			}
			// The script did not run: send it with its source, which also
			// caches it on the server for the next EVALSHA.
			if again == nil {
				again = r.client.Pipeline()
			}
			g.cmd = again.Eval(ctx, applyLua, g.keys, c.now, c.whole, g.args)
			n++
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
		r.roundTrips.Add(1)
		r.scriptCalls.Add(uint64(n))
		r.reloads.Add(1)
	}
	for _, c := range live {
		close(c.done)
	}
}

// batchContext returns a context for a pipeline that ends at the latest
// deadline of the calls, or has none when one of them has none (go-redis's
// timeouts bound it then). It is not cancelled by the calls' contexts: a
// call sent must not cut the pipeline short for the others.
func batchContext(calls []*call) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// errReply reports a script reply of an unexpected shape.
var errReply = errors.New("backend: unexpected reply from the redis script")

// decodeReply writes the decisions of g's items into out.
func decodeReply(g *group, items []Item, out []algorithms.Decision) error {
	if g.cmd == nil {
		return errReply
	}
	v, err := g.cmd.Result()
	if err != nil {
		return fmt.Errorf("backend: redis: %w", err)
	}
	a, ok := v.([]interface{})
	if !ok || len(a) != 1+4*len(g.idx) {
		return fmt.Errorf("%w: %T of %d values for %d items", errReply, v, len(a), len(g.idx))
	}
	for k, i := range g.idx {
		f := a[1+4*k : 5+4*k]
		allowed, ok1 := f[0].(int64)
		remaining, ok2 := replyCount(f[1])
		retry, ok3 := replyDuration(f[2])
		reset, ok4 := replyDuration(f[3])
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return fmt.Errorf("%w: item %d: %v", errReply, i, f)
		}
		out[i] = algorithms.Decision{
			Allowed:    allowed == 1,
			Limit:      items[i].Limit.Capacity(),
			Remaining:  remaining,
			RetryAfter: retry,
			ResetAfter: reset,
		}
	}
	return nil
}

// replyCount decodes a count: an integer, or a decimal string from 2^53 on.
func replyCount(v interface{}) (uint64, bool) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return 0, false
		}
		return uint64(x), true
	case string:
		if u, err := strconv.ParseUint(x, 10, 64); err == nil {
			return u, true
		}
		f, err := strconv.ParseFloat(x, 64)
		if err != nil || f < 0 {
			return 0, false
		}
		if f >= math.MaxUint64 {
			return math.MaxUint64, true
		}
		return uint64(f), true
	}
	return 0, false
}

// replyDuration decodes a duration in µs, -1 meaning algorithms.Never.
func replyDuration(v interface{}) (time.Duration, bool) {
	x, ok := v.(int64)
	switch {
	case !ok || x < -1:
		return 0, false
	case x == -1 || x >= int64(algorithms.Never/time.Microsecond):
		return algorithms.Never, true
	}
	return time.Duration(x) * time.Microsecond, true
}

// denial is what the local deny cache remembers of a key that Redis denied.
type denial struct {
	until     int64  // µs on denyClock: until then, hits >= hits are denied
	hits      uint64 // the hits that were denied
	limit     uint64
	remaining uint64
	resetAt   int64         // µs on denyClock, math.MaxInt64 for never
	ttl       time.Duration // the entry's lifetime in the cache
}

// fromDenyCache answers the request from the local deny cache at instant
// now (µs on denyClock) if every item is a remembered denial (see Apply).
func (r *Redis) fromDenyCache(now int64, items []Item, out []algorithms.Decision) (bool, bool) {
	for i := range items {
		it := &items[i]
		if it.Hits == 0 {
			return false, false
		}
		d, ok := r.deny.GetIfPresent(it.Key)
		if !ok || now >= d.until || it.Hits < d.hits {
			return false, false
		}
		reset := algorithms.Never
		if d.resetAt != math.MaxInt64 {
			reset = time.Duration(max(d.resetAt-now, 0)) * time.Microsecond
		}
		out[i] = algorithms.Decision{
			Limit:      d.limit,
			Remaining:  d.remaining,
			RetryAfter: time.Duration(d.until-now) * time.Microsecond,
			ResetAfter: reset,
		}
	}
	return Verdict(items, out), true
}

// rememberDenials records the denials of a decided request in the local
// deny cache. Only an item decided on the stored state counts: the first
// of its key in the request (a later one saw the earlier ones' hits, which
// a denied request does not charge). Denials that can never pass (Never)
// are not remembered: they depend on the hits alone. now (µs on denyClock)
// was read before the request was sent, so no earlier than the instant the
// script decided at minus the time since.
func (r *Redis) rememberDenials(now int64, items []Item, out []algorithms.Decision) {
	for i := range items {
		d := &out[i]
		if d.Allowed || items[i].Hits == 0 || d.RetryAfter <= 0 || d.RetryAfter == algorithms.Never {
			continue
		}
		first := true
		for j := 0; j < i; j++ {
			if items[j].Key == items[i].Key {
				first = false
				break
			}
		}
		if !first {
			continue
		}
		resetAt := int64(math.MaxInt64)
		if d.ResetAfter != algorithms.Never {
			resetAt = now + d.ResetAfter.Microseconds()
		}
		r.deny.Set(items[i].Key, denial{
			until:     now + d.RetryAfter.Microseconds(),
			hits:      items[i].Hits,
			limit:     d.Limit,
			remaining: d.Remaining,
			resetAt:   resetAt,
			ttl:       d.RetryAfter,
		})
	}
}

// HashTagged returns the counter key rest prefixed with the Redis Cluster
// hash tag of tag, "{tag}rest", so that all keys made with one tag share a
// cluster slot (and one atomic script call). Braces and '%' in tag are
// percent-encoded and an empty tag becomes "%", so the result is a distinct
// key for every distinct (tag, rest) and its hash tag is never empty. Give
// the limits that must be decided together (those of one descriptor, or of
// one request when that is possible) one tag.
func HashTagged(tag, rest string) string {
	var b strings.Builder
	b.Grow(len(tag) + len(rest) + 3)
	b.WriteByte('{')
	if tag == "" {
		b.WriteByte('%')
	}
	for i := 0; i < len(tag); i++ {
		switch c := tag[i]; c {
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		case '%':
			b.WriteString("%25")
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('}')
	b.WriteString(rest)
	return b.String()
}

// Slot returns the Redis Cluster hash slot of key: CRC16 of its hash tag
// (the bytes between the first '{' and the next '}', if not empty) or of
// the whole key, modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the hash of
// Redis Cluster.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
