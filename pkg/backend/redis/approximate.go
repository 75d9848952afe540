package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Consistency approximate (backend.Approximate): an instance decides on its
// own counters and, every sync interval (Options.ApproximateSyncInterval),
// sends the hits it admitted on every key that saw requests in one script
// call (lua/approximate.lua; on a Cluster one call per slot, all in one
// pipeline), getting back each key's shared count and a share of what
// remains:
//
//   - a key's first decision on an instance is strict, and so is every
//     decision until the key's first sync comes back (asked at once once
//     its demand would use a share: warmHits requests within a hold; a
//     colder key stays strict, without syncs): the
//     sync tells the shared count and how many instances are active on the
//     key (those that synced it within hold);
//   - the share is what remained at the sync, less the live shares of the
//     other instances, divided among the active instances (at least one hit
//     while any remains). Between syncs an instance admits at most its
//     share; a request beyond it asks for an early sync, and is decided
//     strict while the last sync found plenty free beyond the shares (a
//     share more for every active instance), denied locally otherwise. Each instance's field in Redis holds its share until its next
//     sync, so the shares and the counted hits together never exceed the
//     limit: admission exceeds it only by hits decided strict (which do not
//     see the shares) while others held shares, by the unsent hits of an
//     instance that died, and by usage accounting past a share;
//   - a share serves until its window ends (measured from before the sync
//     was sent, so never past the true end) and for at most hold after its
//     sync; a key over its limit (fixed window) stays denied locally until
//     its window ends;
//   - the hits admitted are kept in numbered batches until a sync that
//     counted them answers: a batch sent again after a failure counts once
//     (the field keeps the last batch counted), so no hit is lost or counted
//     twice while Redis is away, and usage accounting (Item.Account) is
//     charged locally and sent the same way;
//   - while plenty remains on a key (at least plenty × instances × the
//     lease's minimum chunk after a strict decision), its decisions come
//     from chunks of consistency lease instead (leasePath.takeFor): one
//     reservation per window or so rather than a sync per hold, for
//     however cold a key. lease.lua sees the key's live shares as taken
//     and approximate.lua counts the chunks as hits, so chunks, shares and
//     counted hits together still never exceed the limit; once a chunk is
//     refused or too little remains, the key goes back to shares;
//   - fixed_window and sliding_window_counter only: other algorithms are
//     decided strict.

// Defaults of consistency approximate.
const (
	DefaultApproximateSyncInterval = 100 * time.Millisecond
	DefaultApproximateKeys         = 100_000
	// approxHold is how long a share serves after its sync (and counts
	// in Redis as another instance's): at least this, or 10 intervals.
	approxHold = 2 * time.Second
	// approxBatchKeys is the most keys in one sync call; approxBatches
	// the most batches a key keeps unanswered (more: the oldest is lost).
	approxBatchKeys = 128
	approxBatches   = 16
)

//go:embed lua/approximate.lua
var approximateLua string

var approximateScript = goredis.NewScript(approximateLua)

// approxPath is the local path of consistency approximate.
type approxPath struct {
	r        *Store
	id       string
	interval time.Duration
	hold     int64 // µs
	maxKeys  int
	clock    backend.Clock
	timeout  time.Duration
	lease    *leasePath // serves keys while plenty remains (nil: never)

	mu sync.RWMutex
	m  map[string]*approxKey // by Item.Key

	kick chan struct{}
	stop chan struct{}
	bg   background // the syncs' context, ended by close
	wg   sync.WaitGroup

	syncs, syncErrs, synced, over, lost, strict, chunked atomic.Uint64
}

// batch is hits admitted in window cs, numbered seq once sent.
type batch struct {
	seq uint64
	cs  int64
	n   uint64
}

// approxKey is one key's local state.
type approxKey struct {
	mu    sync.Mutex
	id    string // Item.Key
	key   string // in Redis; hkey the hash of the instances' fields
	hkey  string
	slot  int
	limit algorithms.Limit

	valid   bool   // a share serves (until expires)
	start   int64  // the share's window (Redis µs)
	avail   uint64 // hits the share may still admit
	left    uint64 // free beyond the shares at the last sync
	margin  uint64 // active instances × the share asked, at the last sync
	asked   uint64 // the share asked at the last sync
	full    bool   // the last sync found nothing left (over the limit)
	expires int64  // local µs until which the share serves
	wend    int64  // local µs of its window's end

	cur     batch   // hits admitted since the last roll
	unacked []batch // sent (or to send), not yet answered
	seq     uint64
	rollGen uint64

	touched bool // asked since the last sync
	lastUse int64
	demand  uint64 // hits asked since since (local µs)
	since   int64
	rate    float64 // hits per µs, at the last sync
	gone    bool
	// leased: plenty remained at a strict decision, so chunks of lease
	// serve the key (before any share) until one is refused. Read without
	// mu: a chunk's decision takes only lease's locks.
	leased atomic.Bool
}

// newApproximate returns the local path of consistency approximate.
func (r *Store) newApproximate(opts Options) (localPath, error) {
	if opts.ApproximateSyncInterval < 0 {
		return nil, errors.New("redis: approximate sync interval must not be negative")
	}
	id, timeout, clock := r.localBasics(opts)
	p := &approxPath{
		r: r, id: id, interval: opts.ApproximateSyncInterval,
		maxKeys: DefaultApproximateKeys, clock: clock, timeout: timeout,
		m: map[string]*approxKey{}, kick: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	if p.interval == 0 {
		p.interval = DefaultApproximateSyncInterval
	}
	p.hold = max(approxHold, 10*p.interval).Microseconds()
	p.wg.Add(1)
	go p.syncer()
	return p, nil
}

func (p *approxPath) now() int64 { return p.clock.Now().UnixMicro() }

// approximates reports whether limit l is decided on local counters.
func approximates(l *algorithms.Limit) bool {
	switch l.Algorithm {
	case algorithms.FixedWindow, algorithms.SlidingWindowCounter:
		return l.Requests > 0 && l.Window > 0
	}
	return false
}

func (p *approxPath) take(it *backend.Item, d *algorithms.Decision) (hold, bool) {
	if !approximates(&it.Limit) || (p.r.cluster && it.Partition == 0) {
		// On a Cluster the state and the hash need one slot: a hash
		// tag, which only a partition gives.
		return hold{}, false
	}
	p.mu.RLock()
	e := p.m[it.Key]
	p.mu.RUnlock()
	now := p.now()
	if e == nil {
		p.mu.Lock()
		if e = p.m[it.Key]; e == nil {
			if len(p.m) >= p.maxKeys {
				p.mu.Unlock()
				p.strict.Add(1)
				return hold{}, false
			}
			k := redisKey(p.r.prefix, it)
			// leased: a chunk of lease may serve it already (it was
			// forgotten here while the chunk lives), else takeFor
			// finds that too little is known and it goes to shares.
			e = &approxKey{id: it.Key, key: k, hkey: k + ":approx", slot: slot(k), limit: it.Limit, lastUse: now, since: now}
			e.leased.Store(p.lease != nil)
			p.m[it.Key] = e
		}
		p.mu.Unlock()
	}
	if e.leased.Load() {
		// Chunks first: a share the key may still hold goes unused (and
		// lapses in Redis after its hold). The key's own state is left
		// alone (lease's holds the chunk; a key forgotten here meanwhile
		// finds its chunk again).
		h, ok, plenty := p.lease.takeFor(it, d, true)
		if ok {
			p.chunked.Add(1)
			return h, true
		}
		if plenty {
			// A chunk is on its way: strict meanwhile.
			p.strict.Add(1)
			return hold{}, false
		}
		e.leased.Store(false) // back to shares
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		p.strict.Add(1)
		return hold{}, false
	}
	e.touched, e.lastUse = true, now
	e.demand += max(it.Hits, 1)
	if e.limit != it.Limit {
		// A reload changed the count: the share of the old one ends; the
		// hits admitted stay, as they count on the same key.
		e.limit = it.Limit
		p.void(e, now)
	}
	if e.valid && now >= e.expires {
		p.void(e, now)
	}
	if !e.valid {
		if p.warm(e, now) {
			p.kickSync()
		}
		p.strict.Add(1)
		return hold{}, false
	}
	hits := it.Hits
	*d = algorithms.Decision{Limit: it.Limit.Capacity(), ResetAfter: time.Duration(e.wend-now) * time.Microsecond}
	if it.Limit.Algorithm == algorithms.SlidingWindowCounter {
		d.ResetAfter += it.Limit.Window
	}
	if e.avail >= max(hits, 1) && !e.full {
		e.avail -= hits
		e.cur.n += hits
		d.Allowed, d.Remaining = true, e.left+e.avail
		if it.Account {
			return hold{ref: e}, true // charged whatever the verdict
		}
		return hold{ref: e, n: hits, gen: e.rollGen}, true
	}
	if !e.full && e.left >= hits+e.margin {
		// The share is spent but plenty was free beyond the shares at
		// the last sync (a share more for every active instance): Redis
		// decides until the next one (asked now), exact against the hits
		// counted, and far from the limit.
		p.kickSync()
		p.strict.Add(1)
		return hold{}, false
	}
	// Denied locally: over the limit until its window ends, or the share
	// spent and what remains held by others' shares, until the next sync
	// (asked now).
	d.Remaining = e.left
	if e.full && it.Limit.Algorithm == algorithms.FixedWindow {
		d.RetryAfter = time.Duration(e.wend-now) * time.Microsecond
	} else {
		d.RetryAfter = p.interval
		p.kickSync()
	}
	if it.Account && hits > 0 {
		// Usage that happened: charged, past the share.
		e.cur.n += hits
		e.avail -= min(e.avail, hits)
	}
	return hold{ref: e}, true
}

// void ends e's share (e.mu held): its window ended, its hold ran out or
// its limit changed. Hits of an ended window go to a batch of their own.
func (p *approxPath) void(e *approxKey, now int64) {
	e.valid, e.avail, e.full = false, 0, false
	if now >= e.wend {
		p.roll(e)
	}
}

// roll moves the hits admitted since the last roll into a batch to send
// (e.mu held).
func (p *approxPath) roll(e *approxKey) {
	if e.cur.n == 0 {
		return
	}
	if len(e.unacked) >= approxBatches {
		p.lost.Add(e.unacked[0].n)
		e.unacked = append(e.unacked[:0], e.unacked[1:]...)
	}
	e.seq++
	e.unacked = append(e.unacked, batch{seq: e.seq, cs: e.cur.cs, n: e.cur.n})
	e.cur.n = 0
	e.rollGen++
}

func (p *approxPath) kickSync() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *approxPath) settle(it *backend.Item, h hold, commit bool, d *algorithms.Decision) {
	if _, ok := h.ref.(*lease); ok {
		p.lease.settle(it, h, commit, d) // taken from a chunk
		return
	}
	if commit || !d.Allowed || it.Account {
		return // usage accounting stays charged, its Decision as it was
	}
	if h.n > 0 {
		e := h.ref.(*approxKey)
		e.mu.Lock()
		if e.rollGen == h.gen && e.cur.n >= h.n {
			// Not sent yet: taken back. (Sent, they stay counted: on the
			// side of denying.)
			e.cur.n -= h.n
			if e.valid {
				e.avail += h.n
			}
			d.Remaining += h.n
		}
		e.mu.Unlock()
	}
	*d = backend.Report(*d)
}

// observe starts chunks of lease for a key that Redis allowed with plenty
// remaining (a share it may hold goes unused from then on).
func (p *approxPath) observe(it *backend.Item, d *algorithms.Decision) {
	if p.lease == nil || !d.Allowed || !approximates(&it.Limit) || !p.lease.plentyLeft(d.Remaining) {
		return
	}
	p.mu.RLock()
	e := p.m[it.Key]
	p.mu.RUnlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	if !e.leased.Load() && !e.gone && e.limit == it.Limit && p.lease.adopt(it, d) {
		e.leased.Store(true)
	}
	e.mu.Unlock()
}

// syncer syncs every interval, and sooner when a key asks (at most every
// interval / 8).
func (p *approxPath) syncer() {
	defer p.wg.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	gap := p.interval / 8
	var last time.Time
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		case <-p.kick:
			if d := gap - time.Since(last); d > 0 {
				select {
				case <-p.stop:
					return
				case <-time.After(d):
				}
			}
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(p.bg.ctx(), p.timeout)
		p.sync(ctx, false)
		cancel()
	}
}

// due reports whether e is synced now (e.mu held): it has batches to
// send (a window ended, or a sync failed); it saw requests and has no
// share, or its share runs low (half the share asked for) and its limit
// is not used up (a fixed window over its limit stays denied until it
// ends); or its share's hold is half gone while it saw requests or holds
// hits not sent (its field in Redis must outlive them). A key far from
// its limit thus sends its hits at least every hold / 2, a hot one every
// interval or so.
func (p *approxPath) due(e *approxKey, now int64) bool {
	switch {
	case len(e.unacked) > 0:
		return true
	case e.leased.Load():
		return e.cur.n > 0 // chunks serve it
	case !e.valid:
		return (e.touched && p.warm(e, now)) || e.cur.n > 0
	case e.touched && !e.full && 2*e.avail < e.asked:
		return true
	case e.touched && e.full && e.limit.Algorithm != algorithms.FixedWindow:
		return true
	}
	return (e.touched || e.cur.n > 0) && e.expires-now < p.hold/2
}

// syncKey is one key of a sync call.
type syncKey struct {
	e       *approxKey
	limit   algorithms.Limit
	r       uint64
	rw      int64
	batches []batch
	want    uint64
	sent    int64 // local µs before sending
}

// sync sends the keys that saw requests or hold hits not yet counted; bye
// (at Close) sends every key and takes this instance's fields away.
func (p *approxPath) sync(ctx context.Context, bye bool) {
	now := p.now()
	var keys []syncKey
	var idle []*approxKey
	p.mu.RLock()
	for _, e := range p.m {
		e.mu.Lock()
		if e.valid && now >= e.expires {
			p.void(e, now)
		}
		if now >= e.wend {
			p.roll(e)
		}
		if p.due(e, now) || (bye && (e.valid || e.cur.n > 0)) {
			if len(e.unacked) < approxBatches || bye {
				p.roll(e)
			}
			sk := syncKey{e: e, limit: e.limit, batches: append([]batch(nil), e.unacked...), sent: now, want: p.want(e, now)}
			if e.valid {
				sk.r, sk.rw = e.avail+e.cur.n, e.start
			}
			e.touched = false
			keys = append(keys, sk)
		} else if !e.valid && now-e.lastUse >= 2*p.hold {
			idle = append(idle, e)
		}
		e.mu.Unlock()
	}
	p.mu.RUnlock()
	if len(idle) > 0 {
		p.forget(idle, now)
	}
	if len(keys) == 0 {
		return
	}
	// Calls of at most approxBatchKeys keys, of one slot each on a Cluster.
	var calls [][]syncKey
	if p.r.cluster {
		bySlot := map[int][]syncKey{}
		for _, k := range keys {
			bySlot[k.e.slot] = append(bySlot[k.e.slot], k)
		}
		for _, ks := range bySlot {
			calls = appendChunks(calls, ks)
		}
	} else {
		calls = appendChunks(calls, keys)
	}
	var nowArg int64 = -1
	if p.r.clock != nil {
		nowArg = p.r.clock.Now().UnixMicro()
	}
	b := 0
	if bye {
		b = 1
	}
	cmds := make([]*goredis.Cmd, len(calls))
	args := make([][]any, len(calls))
	ks := make([][]string, len(calls))
	pipe := p.r.client.Pipeline()
	for i, c := range calls {
		ks[i], args[i] = p.syncArgs(c, nowArg, b)
		cmds[i] = approximateScript.EvalSha(ctx, pipe, ks[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx)
	var again []int
	for i := range cmds {
		if err := cmds[i].Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := p.r.client.Pipeline()
		for _, i := range again {
			cmds[i] = approximateScript.Eval(ctx, pipe, ks[i], args[i]...)
		}
		_, _ = pipe.Exec(ctx)
	}
	for i, c := range calls {
		p.syncs.Add(1)
		p.apply(c, cmds[i])
	}
}

// want returns the share e's demand asks for (e.mu held): two intervals of
// it, or half a hold's for a key that sees few requests per interval (each
// sync then carries several hits), at least minShare; never much more, so
// that a key seen a moment ago on one instance does not take what others
// are about to ask for.
func (p *approxPath) want(e *approxKey, now int64) uint64 {
	iv := float64(p.interval.Microseconds())
	if el := now - e.since; float64(el) >= iv/4 {
		e.rate = float64(e.demand) / max(float64(el), iv)
		e.demand, e.since = 0, now
	}
	return max(uint64(math.Ceil(2*e.rate*max(iv, float64(p.hold)/4))), minShare)
}

// warm reports whether e's demand would use a share (e.mu held): a second
// request, and at least warmHits requests expected within a hold. A colder
// key stays strict, without syncs: a sync costs Redis more than the strict
// decision it would spare.
func (p *approxPath) warm(e *approxKey, now int64) bool {
	if e.rate > 0 {
		return e.rate*float64(p.hold) >= warmHits || float64(e.demand)/max(float64(now-e.since), 1)*float64(p.hold) >= warmHits
	}
	iv := float64(p.interval.Microseconds())
	return e.demand >= 2 && float64(e.demand)/max(float64(now-e.since), iv)*float64(p.hold) >= warmHits
}

const warmHits = 16

// minShare is the least share a key's demand asks for.
const minShare = 4

func appendChunks(calls [][]syncKey, keys []syncKey) [][]syncKey {
	for len(keys) > 0 {
		n := min(len(keys), approxBatchKeys)
		calls = append(calls, keys[:n])
		keys = keys[n:]
	}
	return calls
}

func (p *approxPath) syncArgs(c []syncKey, now int64, bye int) ([]string, []any) {
	keys := make([]string, 0, 2*len(c))
	args := make([]any, 0, 5+9*len(c))
	args = append(args, now, p.id, p.hold, bye, len(c))
	for _, k := range c {
		keys = append(keys, k.e.key, k.e.hkey)
		args = append(args, uint8(k.limit.Algorithm), k.limit.Requests, k.limit.Window.Microseconds(), k.r, k.rw, k.want, len(k.batches))
		for _, b := range k.batches {
			args = append(args, b.seq, b.cs, b.n)
		}
	}
	return keys, args
}

// apply applies a sync call's reply to its keys.
func (p *approxPath) apply(c []syncKey, cmd *goredis.Cmd) {
	v, err := cmd.Slice()
	if err == nil && len(v) != len(c) {
		err = fmt.Errorf("redis: approximate sync reply of %d keys for %d", len(v), len(c))
	}
	if err != nil {
		// The batches stay, sent again with the next sync; the shares
		// serve until their hold runs out.
		p.syncErrs.Add(1)
		return
	}
	for i := range c {
		k := &c[i]
		row, ok := v[i].([]any)
		var n [8]int64
		for j := 0; ok && j < 8 && len(row) == 8; j++ {
			n[j], ok = row[j].(int64)
		}
		if !ok || len(row) != 8 {
			p.syncErrs.Add(1)
			continue
		}
		start, share, free, tte, ack, left, over := n[0], uint64(max(n[1], 0)), uint64(max(n[2], 0)), n[3], uint64(n[5]), n[6], uint64(max(n[7], 0))
		e := k.e
		e.mu.Lock()
		for _, b := range k.batches {
			if b.seq <= ack {
				p.synced.Add(b.n)
			}
		}
		drop := 0
		for drop < len(e.unacked) && e.unacked[drop].seq <= ack {
			drop++
		}
		e.unacked = append(e.unacked[:0], e.unacked[drop:]...)
		p.over.Add(over)
		if e.limit == k.limit && !e.gone {
			if !e.valid || e.start != start || k.rw != start {
				// A new share (of this window): hits admitted since the
				// roll under an old one go to a batch of their own.
				if e.cur.cs != start {
					p.roll(e)
				}
				e.avail = 0
			}
			e.cur.cs = start
			e.valid, e.start = true, start
			e.avail += share
			e.left = free
			e.margin = uint64(max(n[4], 1)) * max(k.want, 1)
			e.asked = k.want
			e.full = left <= 0
			e.wend = k.sent + tte
			e.expires = min(e.wend, k.sent+p.hold)
			if e.full && k.limit.Algorithm == algorithms.FixedWindow {
				e.expires = e.wend // denied until the window ends
			}
		}
		e.mu.Unlock()
	}
}

// forget drops keys idle long with nothing to send.
func (p *approxPath) forget(idle []*approxKey, now int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range idle {
		e.mu.Lock()
		if !e.valid && e.cur.n == 0 && len(e.unacked) == 0 && now-e.lastUse >= 2*p.hold {
			e.gone = true
			delete(p.m, e.id)
		}
		e.mu.Unlock()
	}
}

// close sends the hits not yet counted and takes this instance's fields
// away, by ctx's deadline.
func (p *approxPath) close(ctx context.Context) error {
	close(p.stop)
	p.bg.end()
	p.r.waitCut(ctx, &p.wg, true) // a sync to a Redis that stopped answering is not waited out
	// No more local decisions (a request still on its way goes strict),
	// so the last sync sends every hit.
	p.mu.RLock()
	for _, e := range p.m {
		e.mu.Lock()
		e.gone = true
		e.mu.Unlock()
	}
	p.mu.RUnlock()
	p.sync(ctx, true)
	var lost uint64
	p.mu.Lock()
	for _, e := range p.m {
		e.mu.Lock()
		e.valid = false
		for _, b := range e.unacked {
			lost += b.n
		}
		lost += e.cur.n
		e.mu.Unlock()
	}
	p.mu.Unlock()
	if lost > 0 {
		p.lost.Add(lost)
		return fmt.Errorf("redis: %d hits of consistency approximate not counted in Redis at close", lost)
	}
	return nil
}

// ApproximateStats are the counters of consistency approximate.
type ApproximateStats struct {
	// Syncs counts sync calls (one per slot of a sync on a Cluster),
	// SyncErrors those that failed (their hits are sent again).
	Syncs, SyncErrors uint64
	// SyncedHits counts hits admitted locally and counted in Redis;
	// LostHits those never counted (too many batches unanswered while
	// Redis was away, or still unsent at Close).
	SyncedHits, LostHits uint64
	// OverAdmitted counts hits a sync found over a limit, each once
	// whichever instance saw them.
	OverAdmitted uint64
	// Strict counts items of consistency approximate decided strict (a
	// key's first decisions, until its sync answers); Chunked those
	// decided from chunks of lease while plenty remained.
	Strict, Chunked uint64
}

func (p *approxPath) stats() ApproximateStats {
	return ApproximateStats{Syncs: p.syncs.Load(), SyncErrors: p.syncErrs.Load(), SyncedHits: p.synced.Load(),
		LostHits: p.lost.Load(), OverAdmitted: p.over.Load(), Strict: p.strict.Load(), Chunked: p.chunked.Load()}
}
