// Package memory is the embedded backend.Store: the state of every key lives
// in this process, in a bounded otter cache.
package memory

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Defaults of New.
const (
	// DefaultMaxKeys is the number of keys a Store holds unless WithMaxKeys
	// says otherwise.
	DefaultMaxKeys = 1_000_000
	// DefaultSweepInterval is how often a Store drops fresh entries unless
	// WithSweepInterval says otherwise.
	DefaultSweepInterval = 10 * time.Second
)

// inlineItems is the number of items Apply handles with scratch space on its
// stack. Most requests have one to three items; Go zeroes the whole scratch
// on every call, so a larger one costs every request (16 items: about 13 ns
// more per single-item call in BenchmarkMemoryApplyHotKey). Requests of up
// to pooledItems items borrow a scratch from a pool; larger ones allocate.
const (
	inlineItems = 4
	pooledItems = 64
)

// scratchPool holds scratch space for requests of more than inlineItems
// and up to pooledItems items.
var scratchPool = sync.Pool{New: func() any { return new(bigScratch) }}

// bigScratch is scratch for up to pooledItems items.
type bigScratch struct {
	order   [pooledItems]int
	slot    [pooledItems]int
	ents    [pooledItems]*entry
	stored  [pooledItems]*algorithms.State
	work    [pooledItems]algorithms.State
	reset   [pooledItems]time.Duration
	charged [pooledItems]bool
}

// Store is the embedded backend.Store: the state of every key lives in this
// process, in a bounded cache. It is exact for the keys it holds (see Store),
// and it decides a whole request all or nothing.
//
// Bounded: a Store holds at most the configured number of keys (WithMaxKeys)
// and at most the configured estimate of bytes (WithMaxMemory; see
// EntryBytes for the estimate), whichever binds first, apart from the few
// that the cache's asynchronous maintenance has yet to evict. When it is
// full, the cache evicts the keys that are least likely to be used again
// (otter's W-TinyLFU policy), and Stats counts them.
//
// What eviction costs: an entry whose state is already fresh (its limit is
// back to full capacity) is worth nothing, and a background sweeper drops
// such entries every sweep interval. An entry evicted under size pressure
// before it is fresh loses its state: the key starts again from a full limit,
// so that key may allow more than its limit until the window it was in has
// passed. Keys are kept from that: the state of a live key evicted moves to
// the remembered table (WithRememberedKeys; see remembered), or, when it
// does not pack there, to the penalty set (WithPenaltyKeys; see penalties),
// so a flood of new keys cannot buy back a key's quota. Stats.EvictedLost
// counts the keys that lost their state all the same (the tables full).
//
// All or nothing: a request is either allowed, and then every item whose own
// decision allows is charged, or denied, and then nothing at all is charged.
// This deliberately differs from envoyproxy/ratelimit, which charges the
// hits of a denied request to the limits it did not exceed.
//
// Time and locking: Apply reads the clock once and decides every item at
// that instant (or at the instant of a later sweep that dropped one of its
// keys: see Sweep). It locks only the entries of its own keys, in key order,
// and holds no lock while it calls the cache, so requests on different keys
// never wait for each other's locks.
//
// A Store must be created with New and released with Close.
type Store struct {
	cache    *otter.Cache[string, *entry]
	clock    backend.Clock
	remember *remembered // nil when disabled
	penalty  *penalties  // nil when disabled

	closed    atomic.Bool
	closeOnce sync.Once
	stop      chan struct{} // closed by Close to stop the sweeper
	done      chan struct{} // closed by the sweeper when it returns

	// horizon is the latest instant (µs) at which the sweeper found entries
	// fresh. An entry created later is never decided before it: see entry.floor.
	horizon atomic.Int64
	sweepMu sync.Mutex // serializes sweeps

	evicted                                        atomic.Uint64
	evictedLive                                    atomic.Uint64
	evictedRemembered, evictedPenalty, evictedLost atomic.Uint64
	swept                                          atomic.Uint64
}

var _ backend.Store = (*Store)(nil)

// entry is the state of one key. Its fields other than floor and freshAt are
// guarded by mu. The cache calls into an entry (eviction, sweeping) while it
// holds a lock of its own, so the cache is never called while an entry's
// mu is held.
type entry struct {
	mu sync.Mutex
	// dead marks an entry that has left the cache (evicted or swept). A
	// request that finds it dead looks the key up again.
	dead bool
	// kind is the algorithm of the key's limit, and limit and left its
	// capacity and what the last decision left of it, scaled to 16 bits
	// (see scaled): what the remembered table needs of an evicted entry
	// (see costOf). In the padding after dead: the entry is no larger.
	kind        algorithms.Kind
	limit, left uint16
	state       algorithms.State
	// exhausted reports that a decision on the key denied, or left it no
	// room for one hit, since its state was last fresh: evicted before it
	// is fresh, its state goes to the penalty set.
	exhausted bool
	// heapBytes is state.HeapBytes() as last written (under mu), and weighed
	// what the cache's weigher last read of it: when they differ, the entry
	// is weighed again.
	heapBytes, weighed atomic.Int64
	// freshAt is the instant (µs) from which state equals a fresh one. It is
	// written under mu and read without it by the sweeper's first look.
	freshAt atomic.Int64
	// floor is the sweeper's horizon when the entry was created: the entry
	// replaces one that may have been swept as fresh at that instant, so no
	// request decides it earlier (an earlier instant would see a fresh state
	// where the swept one was not yet fresh).
	floor int64
}

// New returns an empty memory store. Call Close to stop its
// background goroutines.
func New(opts ...Option) *Store {
	cfg := config{maxKeys: DefaultMaxKeys, maxMemory: DefaultMaxMemory, rememberedKeys: DefaultRememberedKeys, penaltyKeys: DefaultPenaltyKeys, sweepInterval: DefaultSweepInterval}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.clock == nil {
		cfg.clock = backend.MonotonicClock()
	}
	m := &Store{clock: cfg.clock}
	if cfg.rememberedKeys > 0 {
		m.remember = newRemembered(cfg.rememberedKeys)
	}
	if cfg.penaltyKeys > 0 {
		m.penalty = newPenalties(cfg.penaltyKeys)
	}
	w := newWeigher(cfg.maxMemory, cfg.maxKeys)
	m.cache = otter.Must(&otter.Options[string, *entry]{
		MaximumWeight:    cfg.maxMemory,
		Weigher:          w.weigh,
		InitialCapacity:  min(cfg.maxKeys, 1024),
		OnAtomicDeletion: m.onDeletion,
	})
	if cfg.sweepInterval > 0 {
		m.stop = make(chan struct{})
		m.done = make(chan struct{})
		go m.sweepLoop(cfg.sweepInterval)
	}
	return m
}

// Close stops the store's background goroutines. Apply returns backend.ErrClosed
// afterwards. Close is idempotent and always returns nil.
func (m *Store) Close() error {
	m.closeOnce.Do(func() {
		m.closed.Store(true)
		if m.stop != nil {
			close(m.stop)
			<-m.done
		}
		m.cache.StopAllGoroutines()
	})
	return nil
}

// scratch is Apply's working space for up to inlineItems items.
type scratch struct {
	order   [inlineItems]int // item indices by key; then the first item of each key
	slot    [inlineItems]int // per item: index of its key among the distinct keys
	ents    [inlineItems]*entry
	stored  [inlineItems]*algorithms.State
	work    [inlineItems]algorithms.State
	reset   [inlineItems]time.Duration
	charged [inlineItems]bool
}

// ApplyBy implements backend.TakesDeadline: it is Apply, which never waits
// and so needs no deadline.
func (m *Store) ApplyBy(ctx context.Context, _ time.Time, items []backend.Item, out []algorithms.Decision) (bool, error) {
	return m.Apply(ctx, items, out)
}

// Apply implements backend.Store. See Store for its guarantees. It returns
// backend.ErrClosed after Close and an error when out is shorter than items.
//
// Apply ignores ctx: it decides in microseconds and never waits on I/O, so
// it always answers. Failing on a deadline that passed while the goroutine
// waited for a CPU would only turn into a fail-open answer upstream, and
// allow more than the limit on a busy machine.
func (m *Store) Apply(_ context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	if m.closed.Load() {
		return false, backend.ErrClosed
	}
	n := len(items)
	if len(out) < n {
		return false, fmt.Errorf("memory: %d decisions for %d items", len(out), n)
	}
	if n == 0 {
		return true, nil
	}
	now := m.clock.Now().UnixMicro()

	var (
		sc      scratch
		order   []int
		slot    []int
		ents    []*entry
		stored  []*algorithms.State
		work    []algorithms.State
		reset   []time.Duration
		charged []bool
	)
	switch {
	case n <= inlineItems:
		order, slot, ents, stored = sc.order[:n], sc.slot[:n], sc.ents[:n], sc.stored[:n]
		work, reset, charged = sc.work[:n], sc.reset[:n], sc.charged[:n]
	case n <= pooledItems:
		big := scratchPool.Get().(*bigScratch)
		defer func() {
			// Drop what would keep entries and logs alive in the pool.
			clear(big.ents[:n])
			clear(big.stored[:n])
			clear(big.work[:n])
			scratchPool.Put(big)
		}()
		order, slot, ents, stored = big.order[:n], big.slot[:n], big.ents[:n], big.stored[:n]
		work, reset, charged = big.work[:n], big.reset[:n], big.charged[:n]
	default:
		order, slot, ents, stored = make([]int, n), make([]int, n), make([]*entry, n), make([]*algorithms.State, n)
		work, reset, charged = make([]algorithms.State, n), make([]time.Duration, n), make([]bool, n)
	}

	// Distinct keys in key order: the order in which their entries are locked.
	d := distinctKeys(items, order, slot)
	ents, stored = ents[:d], stored[:d]
	for j := range ents {
		ents[j] = m.lookup(items[order[j]].Key)
	}
	for {
		j := lockAll(ents)
		if j < 0 {
			break
		}
		// ents[j] left the cache; no lock is held now.
		dead := ents[j]
		ents[j] = m.lookup(items[order[j]].Key)
		if ents[j] == dead { // its removal is still in progress
			runtime.Gosched()
		}
	}

	for j, e := range ents {
		now = max(now, e.floor)
		stored[j] = &e.state
		e.kind = items[order[j]].Limit.Algorithm
	}
	for _, e := range ents {
		if e.freshAt.Load() <= now {
			e.exhausted = false // fresh: it has not run out since
		}
	}
	tx := backend.Txn{KeyOf: slot, Stored: stored, Next: work[:d], Charged: charged[:d], ResetAfter: reset[:d]}
	allowed := backend.Transact(&tx, items, now, backend.WholeRequest, out[:n])
	for j, e := range ents {
		if charged[j] { // when denied, only usage accounting
			e.state = work[j]
			e.freshAt.Store(addMicros(now, reset[j]))
			e.heapBytes.Store(int64(e.state.HeapBytes()))
		}
	}
	for i, d := range out[:n] {
		e := ents[slot[i]]
		if !d.Allowed || d.Remaining == 0 {
			e.exhausted = true
		}
		e.limit, e.left = scaled(d.Limit, d.Remaining) // the last one of the key's items
	}
	for _, e := range ents {
		e.mu.Unlock()
	}
	for j, e := range ents {
		if e.heapBytes.Load() != e.weighed.Load() {
			m.reweigh(items[order[j]].Key, e)
		}
	}
	return allowed, nil
}

// reweigh has the cache weigh e again (its state's log grew or shrank). It
// must not be called with an entry's lock held.
func (m *Store) reweigh(key string, e *entry) {
	m.cache.ComputeIfPresent(key, func(old *entry) (*entry, otter.ComputeOp) {
		if old != e {
			return old, otter.CancelOp
		}
		return e, otter.WriteOp
	})
}

// distinctKeys sorts the indices of items by key (stable, so items of one key
// keep their request order), writes for each item the index of its key among
// the distinct keys into slot, and leaves the first item of each distinct key
// in order[:d]. It returns d.
func distinctKeys(items []backend.Item, order, slot []int) int {
	for i := range order {
		order[i] = i
	}
	if len(order) <= inlineItems {
		for i := 1; i < len(order); i++ {
			for j := i; j > 0 && items[order[j]].Key < items[order[j-1]].Key; j-- {
				order[j], order[j-1] = order[j-1], order[j]
			}
		}
	} else {
		slices.SortStableFunc(order, func(a, b int) int { return strings.Compare(items[a].Key, items[b].Key) })
	}
	d := 0
	for k, i := range order {
		if k == 0 || items[i].Key != items[order[d-1]].Key {
			order[d] = i
			d++
		}
		slot[i] = d - 1
	}
	return d
}

// lockAll locks ents in order. If it finds a dead entry, it unlocks the ones
// it locked and returns that entry's index; otherwise it returns -1 with all
// of them locked.
func lockAll(ents []*entry) int {
	for j, e := range ents {
		e.mu.Lock()
		if e.dead {
			for _, l := range ents[:j+1] {
				l.mu.Unlock()
			}
			return j
		}
	}
	return -1
}

// lookup returns the entry of key, creating it if needed. It must not be
// called with an entry's lock held.
func (m *Store) lookup(key string) *entry {
	if e, ok := m.cache.GetIfPresent(key); ok {
		return e
	}
	e, _ := m.cache.ComputeIfAbsent(key, func() (*entry, bool) {
		// Under the key's bucket lock: one request creates the entry, so
		// a remembered or penalty record is taken once.
		return m.newEntry(key), false
	})
	return e
}

// newEntry returns a new entry for key: fresh, or, when the remembered table
// or the penalty set holds the key, with the state it had when it was
// evicted.
func (m *Store) newEntry(key string) *entry {
	e := &entry{floor: m.horizon.Load()}
	if m.remember == nil && m.penalty == nil {
		return e
	}
	h := hashKey(key)
	if m.remember != nil && m.remember.len() > 0 {
		if r, ok := m.remember.take(h, m.clock.Now().UnixMicro()); ok {
			e.kind, e.limit, e.left = r.kind, costExhausted-1, uint16(costExhausted-1-min(r.cost, costExhausted-1))
			e.state, e.exhausted = r.state.Unpack(r.kind), r.cost >= costExhausted
			e.freshAt.Store(r.until)
			return e
		}
	}
	if m.penalty == nil {
		return e
	}
	if s, until, ok := m.penalty.take(h); ok {
		e.state, e.exhausted = s, true
		e.freshAt.Store(until)
		e.heapBytes.Store(int64(s.HeapBytes()))
	}
	return e
}

// onDeletion runs under a lock of the cache whenever an entry leaves it. An
// entry evicted for size is marked dead, so that a request holding it looks
// the key up again, and counted; if it is not fresh yet, its state goes to
// the remembered table (or, if its state does not pack, or if it ran out
// and the table is disabled, to the penalty set), before the key's bucket
// lock is released, so the key's next entry finds it.
func (m *Store) onDeletion(ev otter.DeletionEvent[string, *entry]) {
	if ev.Cause != otter.CauseOverflow {
		return // the sweeper marked it dead itself
	}
	e := ev.Value
	now := m.clock.Now().UnixMicro()
	e.mu.Lock()
	e.dead = true
	freshAt := e.freshAt.Load()
	live := freshAt > now
	kept := &m.evictedLost
	if live {
		kept = m.keep(hashKey(ev.Key), e, freshAt, now)
	}
	e.mu.Unlock()
	m.evicted.Add(1)
	if live {
		m.evictedLive.Add(1)
		kept.Add(1)
	}
}

// keep saves the state of the live entry e of key hash h, evicted at now
// (under e's lock), and returns the counter of where it went.
func (m *Store) keep(h uint64, e *entry, freshAt, now int64) *atomic.Uint64 {
	if m.remember != nil {
		if p, ok := e.state.Pack(e.kind); ok {
			r := record{hash: h, until: freshAt, kind: e.kind, cost: costOf(e.limit, e.left), state: p}
			if e.exhausted {
				r.cost = costExhausted
			}
			dropped, full := m.remember.put(r, now)
			if full && dropped.cost >= costExhausted && m.penalty != nil {
				m.penalty.put(dropped.hash, dropped.state.Unpack(dropped.kind), dropped.until, now)
				if dropped.hash == h {
					return &m.evictedPenalty
				}
			}
			if !full || dropped.hash != h {
				return &m.evictedRemembered
			}
			return &m.evictedLost
		}
	}
	// With the remembered table, the penalty set takes the live states that
	// do not pack (a sliding_window_log's), part used or exhausted; without
	// it, the exhausted ones.
	if m.penalty != nil && (e.exhausted || m.remember != nil) {
		m.penalty.put(h, e.state, freshAt, now)
		return &m.evictedPenalty
	}
	return &m.evictedLost
}
