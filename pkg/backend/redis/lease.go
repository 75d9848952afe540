package redis

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Consistency lease (backend.Lease): an instance reserves a chunk of a
// limit in Redis (lua/lease.lua: one atomic script call that charges the
// chunk's hits as hits, and never grants more than the limit allows right
// now) and decides admissions from the chunk in memory. Every hit admitted
// from a chunk was charged in Redis before, under the algorithm's own rule,
// so admission never exceeds the limit across any number of instances:
//
//   - fixed_window and sliding_window_counter: a chunk is charged to the
//     window it was granted in and serves until that window ends (measured
//     from before the call was sent, so never past the true end). Unused
//     hits go back when the key goes idle (LeaseIdle), on a count change,
//     at Close, and for a sliding counter at the window's end too (they
//     still weigh as its previous window);
//   - token_bucket and gcra: the chunk's tokens are taken from the bucket
//     when it is granted (debt, which refills at the limit's rate as any
//     debt does); unused ones are credited back when the key goes idle, on
//     a count change and at Close, never below an empty debt;
//   - sliding_window_log is strict (the configuration refuses it), as is
//     any other algorithm.
//
// The chunk wanted is about LeaseHorizon of the instance's own demand on
// the key (at least LeaseMinChunk), never more than the script's fair part
// of what remains, left / (2 × active instances), and nothing below 2: the
// last hits of a window are decided strict, exactly. While plenty remains
// (plentyFor) a window algorithm's chunk covers its demand until the
// window ends, at least LeaseMinChunk however cold the key, and is kept
// while the key is idle: at most 1/plenty of what remains is stranded.
// Consistency approximate's keys take chunks too while plenty remains
// (takeFor, adopt; see approximate.go). Items with usage accounting
// (Item.Account with hits) are charged strict, as they come (an
// approximate key's, to its chunk when they fit); a
// key's first decision on an instance is strict; so is an item whose chunk
// does not hold its hits (a refill is then on its way).

// Defaults of consistency lease.
const (
	DefaultLeaseHorizon  = 100 * time.Millisecond
	DefaultLeaseMinChunk = 8
	DefaultLeaseIdle     = time.Second
	DefaultLeaseKeys     = 100_000
	// leaseSweep is how often chunks are checked for their window's end
	// and idleness; instancesKey is refreshed as often as heartbeat.
	leaseSweep = 250 * time.Millisecond
	heartbeat  = time.Second
)

//go:embed lua/lease.lua
var leaseLua string

var leaseScript = goredis.NewScript(leaseLua)

// The ops of lease.lua.
const (
	opReserve = 1
	opReturn  = 2
)

// leasePath is the local path of consistency lease.
type leasePath struct {
	r        *Store
	id       string // this instance, in instancesKey
	horizon  float64
	minChunk uint64
	idle     int64 // µs
	hold     int64 // µs a bucket's chunk holds its tokens (2 × idle)
	maxKeys  int
	clock    backend.Clock
	// approxHold is the µs a share of consistency approximate lives after
	// its sync (approxPath.hold): lease.lua sees the live shares of a key
	// it reserves for (lease.hkey) as taken.
	approxHold int64
	plenty     uint64 // the plenty factor (const plenty; tests lower it)

	mu sync.RWMutex
	m  map[string]*lease // by Item.Key

	instances atomic.Int64 // active on the Redis (heartbeat); 0: not known
	active    atomic.Bool  // a lease item was seen: heartbeat runs

	work    chan leaseCall // refills (op opReserve, n set by want) and returns
	perCall int            // keys per call of lease.lua (leaseBatchKeys; 1 in tests that compare)
	timeout time.Duration  // of a pipeline of lease calls
	stop    chan struct{}
	bg      background // the background calls' context, ended by close
	wg      sync.WaitGroup

	chunks, granted, returned, stranded, refillErrs, returnErrs atomic.Uint64
}

// lease is one key's chunk on this instance.
type lease struct {
	mu  sync.Mutex
	key string // in Redis
	// hkey is consistency approximate's hash of shares beside the key
	// (<key>:approx), which a window algorithm's reservations see as
	// taken, whichever consistency this instance gives the key (another
	// may give it approximate); "" on a Cluster without a hash tag, where
	// approximate is strict. approx: the key is approximate's here, and
	// gets chunks only while plenty remains (see chunk).
	hkey   string // set when the entry is made, never changed
	approx bool
	limit  algorithms.Limit
	gen    uint64 // changes with each chunk, so holds of an old one are not put back

	avail   uint64 // hits of the chunk not taken
	owned   uint64 // a bucket's: this instance's part of the held tokens in Redis
	start   int64  // the window start (Redis µs) the chunk was granted in
	expires int64  // local µs until which the chunk serves (math.MaxInt64: a bucket's)
	left    uint64 // what Redis said remained beside the chunks, at the last grant
	target  uint64 // the last chunk wanted
	retry   int64  // local µs before which no refill is asked (grant 0)

	demand   uint64  // hits asked since since
	since    int64   // local µs
	rate     float64 // hits per µs, measured at the last refill
	lastUse  int64
	pending  bool // a refill is queued or in flight
	returned bool // removed from the map: no more takes
}

func (r *Store) newLease(opts Options) (localPath, error) {
	if opts.LeaseHorizon < 0 || opts.LeaseIdle < 0 || opts.LeaseKeys < 0 {
		return nil, errors.New("redis: lease horizon, idle time and keys must not be negative")
	}
	id, timeout, clock := r.localBasics(opts)
	p := &leasePath{
		r: r, id: id,
		horizon: float64(opts.LeaseHorizon.Microseconds()), minChunk: opts.LeaseMinChunk,
		idle: opts.LeaseIdle.Microseconds(), maxKeys: opts.LeaseKeys,
		m: map[string]*lease{}, work: make(chan leaseCall, 4096), stop: make(chan struct{}),
		timeout: timeout,
		clock:   clock,
		perCall: leaseBatchKeys,
		plenty:  plenty,
	}
	if p.horizon == 0 {
		p.horizon = float64(DefaultLeaseHorizon.Microseconds())
	}
	if p.minChunk == 0 {
		p.minChunk = DefaultLeaseMinChunk
	}
	if p.idle == 0 {
		p.idle = DefaultLeaseIdle.Microseconds()
	}
	p.hold = 2 * p.idle
	if p.maxKeys == 0 {
		p.maxKeys = DefaultLeaseKeys
	}
	p.wg.Add(3)
	go p.refiller()
	go p.refiller()
	go p.sweeper()
	return p, nil
}

// background is the context of a local path's background calls (refills,
// returns, syncs, heartbeats): close ends it, so that Close does not wait
// out such a call to a Redis that stopped answering, and spends its grace
// on the last returns and syncs instead. A call ended so is one that
// failed (a refill: the key strict; a return: its hits stranded; a sync:
// its batches sent again, counted once). The zero value never ends.
type background struct {
	once   sync.Once
	c      context.Context
	cancel context.CancelFunc
}

func (b *background) init() {
	b.once.Do(func() { b.c, b.cancel = context.WithCancel(context.Background()) })
}

func (b *background) ctx() context.Context {
	b.init()
	return b.c
}

func (b *background) end() {
	b.init()
	b.cancel()
}

// localBasics returns what a local path (lease, approximate) starts
// with: this instance's id in Redis (random), the bound of its own calls
// (twice the read timeout) and its clock.
func (r *Store) localBasics(opts Options) (id string, timeout time.Duration, clock backend.Clock) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	timeout = 2 * DefaultIOTimeout
	if opts.ReadTimeout > 0 {
		timeout = 2 * opts.ReadTimeout
	}
	clock = r.clock
	if clock == nil {
		clock = backend.MonotonicClock()
	}
	return hex.EncodeToString(b[:]), timeout, clock
}

func (p *leasePath) now() int64 { return p.clock.Now().UnixMicro() }

// leases reports whether a chunk can serve limit l.
func leases(l *algorithms.Limit) bool {
	switch l.Algorithm {
	case algorithms.FixedWindow, algorithms.SlidingWindowCounter, algorithms.TokenBucket, algorithms.GCRA:
		return l.Requests > 0
	}
	return false
}

func (p *leasePath) take(it *backend.Item, d *algorithms.Decision) (hold, bool) {
	h, ok, _ := p.takeFor(it, d, false)
	return h, ok
}

// entry returns the chunk of it on this instance, new if none, or nil when
// LeaseKeys are held.
func (p *leasePath) entry(it *backend.Item, now int64) *lease {
	p.active.Store(true)
	p.mu.RLock()
	e := p.m[it.Key]
	p.mu.RUnlock()
	if e != nil {
		return e
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e = p.m[it.Key]; e == nil {
		if len(p.m) >= p.maxKeys {
			return nil
		}
		e = &lease{key: redisKey(p.r.prefix, it), limit: it.Limit, since: now, lastUse: now}
		if !p.r.cluster || it.Partition != 0 {
			e.hkey = e.key + ":approx"
		}
		p.m[it.Key] = e
	}
	return e
}

// takeFor is take for an item of consistency lease or (approx) of
// consistency approximate while plenty remains on it; plenty reports
// whether chunks may still serve it (a chunk held its hits, or one is on
// its way). An approximate key's usage accounting is charged to its chunk
// when it fits (the chunk's hits are charged in Redis already), kept
// whatever the verdict; strict otherwise.
func (p *leasePath) takeFor(it *backend.Item, d *algorithms.Decision, approx bool) (h hold, ok, plenty bool) {
	if (it.Account && it.Hits > 0 && !approx) || !leases(&it.Limit) || (it.Limit.Algorithm.HasBurst() && (it.Partition == 0 || approx)) {
		// A bucket's chunks need a hash of the instances' parts in its
		// key's slot: a hash tag, which only a partition gives.
		return hold{}, false, approx
	}
	now := p.now()
	e := p.entry(it, now)
	if e == nil {
		return hold{}, false, false
	}
	hits := it.Hits
	e.mu.Lock()
	if e.returned {
		e.mu.Unlock()
		return hold{}, false, false
	}
	e.approx = approx
	if e.limit != it.Limit {
		// A reload changed the count: the chunk granted under the old one
		// is revoked (given back), and the key starts again.
		p.giveBack(e)
		e.limit, e.target, e.retry = it.Limit, 0, 0
	}
	e.lastUse = now
	e.demand += max(hits, 1)
	if e.avail > 0 && now >= e.expires {
		p.expire(e)
	}
	if e.avail < max(hits, 1) {
		if p.chunk(e, now) >= 2 {
			p.ask(e, now)
		}
		// Chunks still serve it while one is on its way; a residue
		// smaller than the request's hits, with none wanted (too
		// little remains), does not.
		plenty = e.pending
		e.mu.Unlock()
		return hold{}, false, plenty
	}
	e.avail -= hits
	*d = algorithms.Decision{Allowed: true, Limit: it.Limit.Capacity(), Remaining: e.left + e.avail}
	if !e.limit.Algorithm.HasBurst() {
		d.ResetAfter = time.Duration(e.expires-now) * time.Microsecond
		if it.Limit.Algorithm == algorithms.SlidingWindowCounter {
			d.ResetAfter += it.Limit.Window
		}
	} else {
		d.ResetAfter = time.Duration(float64(it.Limit.Capacity()-min(d.Remaining, it.Limit.Capacity())) / float64(it.Limit.Requests) * float64(it.Limit.Window))
	}
	if 2*e.avail < e.target || (e.limit.Algorithm.HasBurst() && e.expires-now < p.hold/2) {
		// Low, or a bucket's tokens soon no longer held: a refill
		// holds them longer.
		p.ask(e, now)
	}
	h = hold{ref: e, n: hits, gen: e.gen}
	if it.Account {
		h.n = 0 // usage that happened: not put back
	}
	e.mu.Unlock()
	return h, true, true
}

// adopt starts chunks for an item of consistency approximate that Redis
// just allowed with plenty remaining (d): its chunk is asked for now. It
// reports false when no chunk can serve it (no room for its key: LeaseKeys
// are held; or closing).
func (p *leasePath) adopt(it *backend.Item, d *algorithms.Decision) bool {
	if !leases(&it.Limit) || it.Limit.Algorithm.HasBurst() {
		return false
	}
	now := p.now()
	e := p.entry(it, now)
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.returned {
		return false
	}
	if e.limit == it.Limit {
		e.approx, e.left, e.lastUse = true, d.Remaining, now
		e.demand += max(it.Hits, 1)
		if e.avail == 0 && p.chunk(e, now) >= 2 {
			p.ask(e, now)
		}
	}
	return true
}

// plentyLeft reports whether left hits remaining on a window limit are
// plenty for chunks of approximate keys (plentyFor, for a chunk of
// minChunk).
func (p *leasePath) plentyLeft(left uint64) bool { return p.plentyCap(left) >= p.minChunk }

func (p *leasePath) settle(it *backend.Item, h hold, commit bool, d *algorithms.Decision) {
	if commit || h.n == 0 {
		if !commit {
			*d = backend.Report(*d)
		}
		return
	}
	e := h.ref.(*lease)
	e.mu.Lock()
	if e.gen == h.gen && !e.returned {
		e.avail += h.n
	}
	e.mu.Unlock()
	d.Remaining += h.n
	*d = backend.Report(*d)
}

func (p *leasePath) observe(it *backend.Item, d *algorithms.Decision) {
	if !leases(&it.Limit) {
		return
	}
	p.mu.RLock()
	e := p.m[it.Key]
	p.mu.RUnlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	if e.limit == it.Limit {
		e.left = d.Remaining
		if e.avail == 0 && d.Allowed {
			// A strict decision told what remains: when plenty does, a
			// cold key's minimum chunk is asked for now.
			if now := p.now(); p.chunk(e, now) >= 2 {
				p.ask(e, now)
			}
		}
	}
	e.mu.Unlock()
}

// Rates: a key's demand is measured over at least rateSpan µs, and a cold
// key's chunk covers at most coldSpan µs of it, unless plenty remains:
// at least plenty (leasePath.plenty) × active instances × the chunk.
const (
	rateSpan = 10_000
	coldSpan = 10_000_000
	plenty   = 1000
)

// plentyFor reports whether what remained on e at its last decision or
// grant (e.mu held) is plenty beside n hits held by each instance: then a
// cold key gets a chunk of minChunk anyway, and a chunk of window
// algorithms is kept while the key is idle, until its window ends. Those
// hits may be stranded: at most n per instance, no more than 1/plenty of
// what remains.
func (p *leasePath) plentyFor(e *lease, n uint64) bool {
	return !e.limit.Algorithm.HasBurst() && p.plentyCap(e.left) >= n
}

// plentyCap is the largest chunk per instance for which left hits
// remaining are plenty: left / (plenty × active instances).
func (p *leasePath) plentyCap(left uint64) uint64 {
	return left / p.plenty / uint64(max(p.instances.Load(), 1))
}

// chunk returns the chunk e wants now (e.mu held): about horizon of its
// demand, at least minChunk, but no more than it would use in coldSpan or
// before its window ends, so that a cold key asks for none (less than 2)
// rather than for hits it would strand. When plenty remains (plentyFor)
// it is the demand until the window ends, at least minChunk however cold
// the key: fewer reservations for what may be stranded.
func (p *leasePath) chunk(e *lease, now int64) uint64 {
	rate := max(e.rate, float64(e.demand)/float64(max(now-e.since, coldSpan)))
	span := int64(coldSpan)
	end := int64(-1) // µs to the window's end, for window algorithms
	if e.limit.Algorithm.HasBurst() {
		span = p.hold / 2 // a bucket's tokens are held that long
	} else if w := e.limit.Window.Microseconds(); w > 0 {
		end = w - now%w // the local clock's idea of the window's end
		span = min(span, end)
	}
	if end > 0 {
		// Plenty remains: the demand until the window ends, at least
		// minChunk.
		t := uint64(max(rate*float64(end), float64(p.minChunk)))
		if t >= 2 && p.plentyFor(e, t) {
			return min(t, e.limit.Capacity())
		}
		if e.approx {
			// An approximate key: no more than plenty allows, and no
			// chunk once that is less than minChunk or than its demand
			// over a share's hold (its shares then: a hot key would
			// reserve many small chunks, and go strict between them).
			if c := p.plentyCap(e.left); c >= max(p.minChunk, 2) && float64(c) >= rate*float64(p.approxHold) {
				return min(c, t, e.limit.Capacity())
			}
			return 0
		}
	}
	if e.approx {
		return 0
	}
	t := min(max(rate*p.horizon, float64(p.minChunk)), rate*float64(span))
	if t < 2 {
		return 0
	}
	return min(uint64(t), e.limit.Capacity())
}

// ask queues a refill of e (e.mu held), unless one is on its way or the
// last one was refused a moment ago.
func (p *leasePath) ask(e *lease, now int64) {
	if e.pending || now < e.retry {
		return
	}
	select {
	case p.work <- leaseCall{e: e, op: opReserve}:
		e.pending = true
	default: // the queue is full: the next take asks again
	}
}

// expire ends a chunk whose window ended (e.mu held): a sliding counter's
// unused hits are given back (they weigh in its next window), a fixed
// window's are counted stranded (the window's end freed them).
func (p *leasePath) expire(e *lease) { p.expireTo(e, nil) }

// expireTo is expire, the return appended to *out when out is not nil
// (the sweeper sends its own) rather than queued.
func (p *leasePath) expireTo(e *lease, out *[]leaseCall) {
	if e.limit.Algorithm != algorithms.FixedWindow {
		p.giveBackTo(e, out)
		return
	}
	if e.avail > 0 {
		p.stranded.Add(e.avail)
	}
	e.avail = 0
	e.gen++
}

// giveBack takes e's unused hits (e.mu held) and sends them back to Redis
// in the background.
func (p *leasePath) giveBack(e *lease) { p.giveBackTo(e, nil) }

// giveBackTo is giveBack, the return appended to *out when out is not nil.
func (p *leasePath) giveBackTo(e *lease, out *[]leaseCall) {
	if e.avail == 0 && e.owned == 0 {
		e.gen++
		return
	}
	c := leaseCall{e: e, op: opReturn, n: e.avail, used: e.owned - min(e.avail, e.owned), cs: e.start, limit: e.limit}
	if out != nil {
		*out = append(*out, c)
	} else {
		p.queueReturn(c)
	}
	e.avail, e.owned = 0, 0
	e.gen++
}

// queueReturn queues the return of unused hits; when the queue is full
// they are stranded (charged until their window ends, or a bucket's debt
// refills).
func (p *leasePath) queueReturn(c leaseCall) {
	select {
	case p.work <- c:
	default:
		p.stranded.Add(c.n)
	}
}

// leaseCall is one key's reserve or return, a part of a call of lease.lua.
type leaseCall struct {
	e     *lease
	op    int
	n     uint64
	used  uint64 // a bucket's: tokens of this instance's part used since it last said
	cs    int64
	limit algorithms.Limit
	gen   uint64
	sent  int64 // local µs before sending
}

// leaseBatchKeys is the most keys of one call of lease.lua: a call costs
// Redis about 30 µs besides its keys' work, so a batch's keys share calls.
const leaseBatchKeys = 128

// leaseLinger is how long a refiller gathers refills and returns before it
// sends them; leasePipelineKeys the most keys it sends in one pipeline (so
// do the sweeper and close).
const (
	leaseLinger       = 2 * time.Millisecond
	leasePipelineKeys = 256
)

// refiller sends the refills asked for, many keys per pipeline.
func (p *leasePath) refiller() {
	defer p.wg.Done()
	var batch []leaseCall
	for {
		batch = batch[:0]
		select {
		case <-p.stop:
			return
		case c := <-p.work:
			batch = p.want(batch, c)
		}
		// Gather what comes within leaseLinger: a call costs Redis a
		// wake-up and its fixed part whatever it carries.
		linger := time.NewTimer(leaseLinger)
	more:
		for len(batch) < leasePipelineKeys {
			select {
			case c := <-p.work:
				batch = p.want(batch, c)
			case <-linger.C:
				break more
			case <-p.stop:
				break more
			}
		}
		linger.Stop()
		if len(batch) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(p.bg.ctx(), p.timeout)
		p.send(ctx, batch)
		cancel()
	}
}

// want adds c to batch: a return as it is, a refill as the reservation
// its key needs, about horizon of its demand less what it holds.
func (p *leasePath) want(batch []leaseCall, c leaseCall) []leaseCall {
	if c.op == opReturn {
		return append(batch, c)
	}
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	now := p.now()
	if e.returned {
		e.pending = false
		return batch
	}
	if el := now - e.since; el >= rateSpan {
		e.rate, e.demand, e.since = float64(e.demand)/float64(el), 0, now
	}
	target := p.chunk(e, now)
	e.target = target
	if e.avail > 0 && now >= e.expires {
		p.expire(e)
	}
	if target < 2 || (e.avail >= target && !(e.limit.Algorithm.HasBurst() && e.expires-now < p.hold/2)) {
		e.pending = false
		return batch
	}
	c = leaseCall{e: e, op: opReserve, n: target - e.avail, limit: e.limit, gen: e.gen, sent: now}
	if e.limit.Algorithm.HasBurst() {
		c.used = e.owned - min(e.avail, e.owned)
	}
	return append(batch, c)
}

// send runs the reserves and returns of calls in calls of lease.lua of up
// to leaseBatchKeys keys each (on a Cluster, of one slot each), all in one
// pipeline, outside the degraded mode (they are not decisions: a failed
// reservation leaves the key strict, a failed return leaves the hits
// charged), and applies each key's reply.
func (p *leasePath) send(ctx context.Context, calls []leaseCall) {
	groups := leaseGroups(calls, p.r.cluster, max(p.perCall, 1))
	inst := max(p.instances.Load(), 1)
	var nowArg int64 = -1
	if p.r.clock != nil {
		nowArg = p.r.clock.Now().UnixMicro()
	}
	keys := make([][]string, len(groups))
	args := make([][]any, len(groups))
	cmds := make([]*goredis.Cmd, len(groups))
	pipe := p.r.client.Pipeline()
	for i, g := range groups {
		keys[i], args[i] = p.leaseKeys(calls, g), p.leaseArgs(calls, g, nowArg, inst)
		cmds[i] = leaseScript.EvalSha(ctx, pipe, keys[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx)
	var again []int
	for i := range cmds {
		if err := cmds[i].Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		// Not run: sent again with the script's source.
		pipe := p.r.client.Pipeline()
		for _, i := range again {
			cmds[i] = leaseScript.Eval(ctx, pipe, keys[i], args[i]...)
		}
		_, _ = pipe.Exec(ctx)
	}
	for i, g := range groups {
		v, err := cmds[i].Int64Slice()
		if err == nil && len(v) != 5*len(g) {
			err = fmt.Errorf("redis: lease reply of %d values for %d keys", len(v), len(g))
		}
		for j, ci := range g {
			if err != nil {
				p.apply(&calls[ci], nil, err)
			} else if r := v[5*j : 5*j+5]; r[0] < 0 {
				p.apply(&calls[ci], nil, errLeaseKey)
			} else {
				p.apply(&calls[ci], r, nil)
			}
		}
	}
}

// errLeaseKey is the error of a key whose commands failed in a call of
// lease.lua that served the others (its reply's first value is -1).
var errLeaseKey = errors.New("redis: lease call failed on its key")

// leaseGroups splits calls into the calls of lease.lua, as indices into
// calls in their order: at most per each, and on a Cluster of
// one slot each (a script's keys must share a slot), slots in order of
// first appearance. Calls on one key stay in order, in one group or in
// groups that follow each other.
func leaseGroups(calls []leaseCall, cluster bool, per int) [][]int {
	var groups [][]int
	if !cluster {
		for i := 0; i < len(calls); i += per {
			g := make([]int, 0, min(per, len(calls)-i))
			for j := i; j < min(i+per, len(calls)); j++ {
				g = append(g, j)
			}
			groups = append(groups, g)
		}
		return groups
	}
	open := map[int]int{} // slot: its group being filled, in groups
	for i := range calls {
		s := slot(calls[i].e.key)
		gi, ok := open[s]
		if !ok || len(groups[gi]) == per {
			gi = len(groups)
			open[s] = gi
			groups = append(groups, nil)
		}
		groups[gi] = append(groups[gi], i)
	}
	return groups
}

// leaseArgs are a call's ARGV: now, instances, this instance, hold and the
// number of keys, then 9 fields per key (see lua/lease.lua).
func (p *leasePath) leaseArgs(calls []leaseCall, g []int, now, inst int64) []any {
	args := make([]any, 0, 5+9*len(g))
	args = append(args, now, inst, p.id, p.hold, len(g))
	for _, i := range g {
		c := &calls[i]
		w := max(c.limit.Window.Microseconds(), 1)
		var used uint64
		if c.limit.Algorithm.HasBurst() {
			used = c.used
		}
		var ah int64
		if c.shares() {
			ah = max(p.approxHold, 1)
		}
		args = append(args, c.op, uint8(c.limit.Algorithm), c.limit.Requests, w, c.limit.Capacity(), c.n, c.cs, used, ah)
	}
	return args
}

// shares reports whether c is a reserve that sees an approximate key's
// shares (its hash goes beside its key).
func (c *leaseCall) shares() bool {
	return c.op == opReserve && c.e.hkey != "" && !c.limit.Algorithm.HasBurst()
}

// leaseKeys are a call's KEYS: per key its state, and for a bucket the
// hash of the instances' parts, for an approximate key's reserve its hash
// of shares (in the same slot: the key has a hash tag, or the store is
// not a Cluster).
func (p *leasePath) leaseKeys(calls []leaseCall, g []int) []string {
	keys := make([]string, 0, 2*len(g))
	for _, i := range g {
		c := &calls[i]
		keys = append(keys, c.e.key)
		if c.limit.Algorithm.HasBurst() {
			keys = append(keys, c.e.key+":lease")
		} else if c.shares() {
			keys = append(keys, c.e.hkey)
		}
	}
	return keys
}

// apply applies a key's reply v (5 values) or its error to the key.
func (p *leasePath) apply(c *leaseCall, v []int64, err error) {
	e := c.e
	if c.op == opReturn {
		if err == nil {
			p.returned.Add(uint64(v[0]))
			p.stranded.Add(c.n - min(uint64(v[0]), c.n)) // already freed by the window's end
			return
		}
		// Never sent again (a return that may have run and is sent twice
		// would free hits admitted): they stay charged until their window
		// ends, or a bucket's debt refills.
		p.returnErrs.Add(1)
		p.stranded.Add(c.n)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending = false
	if err != nil {
		p.refillErrs.Add(1)
		e.retry = p.now() + int64(p.horizon)
		return
	}
	g := uint64(v[0])
	bucket := c.limit.Algorithm.HasBurst()
	if bucket && e.limit == c.limit {
		e.owned = e.owned - min(c.used, e.owned) + g
	}
	p.chunks.Add(1)
	p.granted.Add(g)
	if e.returned || e.limit != c.limit {
		// Revoked or replaced meanwhile: straight back.
		if g > 0 {
			p.queueReturn(leaseCall{e: e, op: opReturn, n: g, cs: v[2], limit: c.limit})
		}
		return
	}
	e.left = uint64(v[1])
	if g == 0 {
		// Little remains: strict until the window ends (a bucket: a
		// horizon later, when it may have refilled).
		e.retry = c.sent + int64(p.horizon)
		if v[3] > 0 && !bucket {
			e.retry = c.sent + v[3]
		}
		if bucket && e.avail > 0 {
			e.expires = c.sent + v[3] // the held part, held longer
		}
		return
	}
	expires := c.sent + v[3]
	if !bucket && e.start != v[2] {
		// A new window: the held chunk (of an earlier one) ends, and no
		// hold of it is put back into this one.
		p.expire(e)
	}
	e.avail += g
	e.start, e.expires = v[2], expires
}

// sweeper ends chunks whose window ended, gives back those of idle keys
// and forgets keys idle long, every leaseSweep; and keeps this instance
// in instancesKey while lease is used.
func (p *leasePath) sweeper() {
	defer p.wg.Done()
	t := time.NewTicker(leaseSweep)
	defer t.Stop()
	// wake fires just after the soonest window end before the next tick:
	// chunks in use are renewed then rather than up to leaseSweep later.
	wake := time.NewTimer(leaseSweep)
	defer wake.Stop()
	var beat time.Time
	var idle []*lease
	var out []leaseCall // the sweep's returns and renewals
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		case <-wake.C:
		}
		if p.active.Load() && time.Since(beat) >= heartbeat {
			beat = time.Now()
			p.beat()
		}
		now := p.now()
		idle = idle[:0]
		soonest := now + leaseSweep.Microseconds()
		forgetAfter := max(4*p.idle, 2*coldSpan)
		p.mu.RLock()
		crowded := len(p.m) >= p.maxKeys-p.maxKeys/10
		for _, e := range p.m {
			e.mu.Lock()
			if e.avail > 0 && now < e.expires && e.expires < soonest && !e.limit.Algorithm.HasBurst() {
				soonest = e.expires
			}
			switch {
			case e.avail > 0 && now >= e.expires:
				p.expireTo(e, &out)
				if !e.limit.Algorithm.HasBurst() && now-e.lastUse < max(p.idleFor(e), e.limit.Window.Microseconds()) &&
					!e.pending && now >= e.retry && p.chunk(e, now) >= 2 {
					// A key seen in the window that ended: its next
					// window's chunk now, before its next request would
					// go strict for it.
					e.pending = true
					out = append(out, leaseCall{e: e, op: opReserve})
				}
			case (e.avail > 0 || e.owned > 0) && now-e.lastUse >= p.idleFor(e) &&
				(!p.plentyFor(e, e.avail) || (crowded && now-e.lastUse >= forgetAfter)):
				// Idle: back, even while plenty remains once LeaseKeys are
				// nearly all held (the key is then forgotten, making room
				// for keys in use).
				p.giveBackTo(e, &out)
			case e.avail == 0 && e.owned == 0 && !e.pending && now-e.lastUse >= forgetAfter:
				idle = append(idle, e)
			}
			e.mu.Unlock()
		}
		p.mu.RUnlock()
		if len(idle) > 0 {
			p.mu.Lock()
			for _, e := range idle {
				e.mu.Lock()
				if e.avail == 0 && e.owned == 0 && !e.pending && now-e.lastUse >= forgetAfter {
					e.returned = true
					delete(p.m, mapKey(p.m, e))
				}
				e.mu.Unlock()
			}
			p.mu.Unlock()
		}
		out = p.sendSwept(out)
		wake.Reset(time.Duration(soonest-now)*time.Microsecond + time.Millisecond)
	}
}

// sendSwept sends the returns and renewals of a sweep itself,
// leasePipelineKeys per pipeline, rather than through the work queue, which a window's end of
// thousands of keys would overflow (returns dropped to stranded, renewals
// lost). All within one call's timeout, and given up at Close: what is
// not sent then is counted stranded (returns) or left to the next take
// (renewals). It returns out emptied, for the next sweep.
func (p *leasePath) sendSwept(out []leaseCall) []leaseCall {
	if len(out) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(p.bg.ctx(), p.timeout)
	defer cancel()
	var batch []leaseCall
	rest := out
	for len(rest) > 0 && ctx.Err() == nil { // close ends p.bg, so ctx
		n := min(len(rest), leasePipelineKeys)
		batch = batch[:0]
		for _, c := range rest[:n] {
			batch = p.want(batch, c)
		}
		if len(batch) > 0 {
			p.send(ctx, batch)
		}
		rest = rest[n:]
	}
	for _, c := range rest {
		if c.op == opReturn {
			p.stranded.Add(c.n)
			continue
		}
		c.e.mu.Lock()
		c.e.pending = false
		c.e.mu.Unlock()
	}
	clear(out)
	return out[:0]
}

// idleFor is how long e may see no request before its chunk goes back:
// LeaseIdle, or for a cold key three of its intervals between requests
// (at most coldSpan, and for a bucket less than its tokens are held).
func (p *leasePath) idleFor(e *lease) int64 {
	d := p.idle
	if e.rate > 0 {
		d = max(d, min(int64(3/e.rate), coldSpan))
	}
	if e.limit.Algorithm.HasBurst() {
		d = min(d, p.hold/2)
	}
	return d
}

// mapKey finds e's key in m (only for keys being forgotten).
func mapKey(m map[string]*lease, e *lease) string {
	for k, v := range m {
		if v == e {
			return k
		}
	}
	return ""
}

// instancesKey holds the instances using lease on a Redis, with the time
// each was last seen: the fair part of a chunk divides by their number.
const instancesKey = "envoy-rls:lease-instances"

func (p *leasePath) beat() {
	ctx, cancel := context.WithTimeout(p.bg.ctx(), p.timeout)
	defer cancel()
	k := p.r.prefix + instancesKey
	ms := time.Now().UnixMilli()
	pipe := p.r.client.TxPipeline()
	pipe.ZAdd(ctx, k, goredis.Z{Score: float64(ms), Member: p.id})
	pipe.ZRemRangeByScore(ctx, k, "-inf", fmt.Sprint(ms-3*heartbeat.Milliseconds()))
	card := pipe.ZCard(ctx, k)
	pipe.PExpire(ctx, k, 3*heartbeat)
	if _, err := pipe.Exec(ctx); err == nil {
		p.instances.Store(card.Val())
	}
}

// close gives every chunk back, by ctx's deadline.
func (p *leasePath) close(ctx context.Context) error {
	close(p.stop)
	p.bg.end()
	p.r.waitCut(ctx, &p.wg, true) // a call to a Redis that stopped answering is not waited out
	var calls []leaseCall
	for len(p.work) > 0 {
		if c := <-p.work; c.op == opReturn {
			calls = append(calls, c)
		}
	}
	p.mu.Lock()
	for _, e := range p.m {
		e.mu.Lock()
		e.returned = true
		if e.avail > 0 || e.owned > 0 {
			if p.now() >= e.expires && e.limit.Algorithm == algorithms.FixedWindow {
				p.stranded.Add(e.avail)
			} else {
				calls = append(calls, leaseCall{e: e, op: opReturn, n: e.avail, used: e.owned - min(e.avail, e.owned), cs: e.start, limit: e.limit})
			}
			e.avail, e.owned = 0, 0
			e.gen++
		}
		e.mu.Unlock()
	}
	p.mu.Unlock()
	for len(calls) > 0 {
		n := min(len(calls), leasePipelineKeys)
		p.send(ctx, calls[:n])
		calls = calls[n:]
	}
	if p.active.Load() {
		_ = p.r.client.ZRem(ctx, p.r.prefix+instancesKey, p.id).Err()
	}
	return nil
}

// LeaseStats are the counters of consistency lease.
type LeaseStats struct {
	// Chunks counts chunks reserved (granted or not); Granted the hits
	// they granted; Returned the unused hits given back; Stranded the
	// unused hits not given back before their window ended (its end freed
	// them), or whose return failed (they stay charged until then).
	Chunks, Granted, Returned, Stranded uint64
	// RefillErrors counts reservations that failed (the key is decided
	// strict meanwhile), ReturnErrors returns that failed (their hits are
	// counted stranded).
	RefillErrors, ReturnErrors uint64
}

func (p *leasePath) stats() LeaseStats {
	return LeaseStats{Chunks: p.chunks.Load(), Granted: p.granted.Load(), Returned: p.returned.Load(),
		Stranded: p.stranded.Load(), RefillErrors: p.refillErrs.Load(), ReturnErrors: p.returnErrs.Load()}
}
