// Package split is a backend.Store that keeps the counters of short limits
// (one second or less) in one store and every other counter in another, as
// the reference server does with REDIS_PERSECOND: per-second counters churn
// fast and are often kept on a Redis of their own.
//
// A request whose items all go to one store is passed to it unchanged: one
// call, exactly that store's semantics. A request with items in both stores
// (mixed) cannot be decided in one atomic step; it is decided in up to three
// calls, so that a denied request charges nothing when no other request
// interleaves:
//
//  1. peek: the main part is decided without being charged (its items plus
//     a blocking item per partition, so the store denies and commits
//     nothing; usage accounting is left out);
//  2. the per-second part is decided and charged, committing only when the
//     request can still be allowed given what the peek saw;
//  3. the main part is decided and charged, committing only when the
//     request is allowed given the per-second part's decisions.
//
// A denial seen at step 1 or 2 charges nothing but usage accounting
// (backend.Item.Account), and the other part reports its state as a denied
// request does. Sequentially the store is exact: it passes the conformance
// kit (pkg/backend/storetest) for any routing. The limits are never
// exceeded either: a request is allowed only when both parts committed, each
// atomically in its store.
//
// Over-charging: when a concurrent request takes the main part's last room
// between steps 1 and 3, the main part denies at step 3 after the
// per-second part was charged at step 2 (Stats.OverCharged counts it). Only
// per-second counters are ever over-charged, so the extra hits lapse with
// their window (at most a second for fixed and sliding windows; hits/rate
// for token bucket and GCRA). Such a request must have passed its peek
// before the main counter filled, so per main counter that fills, at most
// the requests in flight at that moment over-charge, once each; a caller
// sending one request at a time over-charges at most once per filled main
// counter. The per-second part goes first for this reason: charging the
// main part first would leave over-charges on minute, hour or day counters
// for the rest of their window.
//
// Partitions (backend.Item.Partition) are split like any items: a
// descriptor with a per-second and a longer limit (5 per second AND 100
// per minute) has them in two stores, decided as a mixed request, exact
// one request at a time and within the bound above under concurrency.
//
// Time: each call of a mixed request but the last may use only part of
// the time the request has left when it starts (2/3 for the peek, 3/4 of the rest
// for the per-second part, the rest for the main part: see share), so one
// frozen store cannot spend the whole budget and leave the other's part
// none.
//
// Cost: a mixed request takes three calls in a row when allowed, two when
// the per-second part denies (the peek's decisions then answer for the main
// part), and the peek is skipped when the main part holds only Shadow items.
package split

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Options configure a split store.
type Options struct {
	// PerSecond reports whether an item's counter belongs to the
	// per-second store. Nil selects PerSecondLimit. Items with the same Key
	// must go to the same store.
	PerSecond func(*backend.Item) bool
	// ContinueOnError keeps deciding the other part of a mixed request
	// when one store fails, for a caller that answers OK when Apply fails
	// (failure mode allow): the healthy store still counts the request's
	// hits, and a failed Redis store writes its own back later. Without it
	// (failure modes deny and local), the first error is returned at once.
	ContinueOnError bool
}

// PerSecondLimit is the default routing: limits whose window is at most a
// second (unit: second), as the reference routes SECOND-unit limits. A
// window of several seconds (a unit_multiplier above 1, or window: 2s)
// stays in the main store.
func PerSecondLimit(it *backend.Item) bool { return it.Limit.Window <= time.Second }

// Store routes items to a main and a per-second store. See the package
// documentation for the semantics of mixed requests.
type Store struct {
	main, perSecond backend.TakesDeadline
	stores          [2]backend.Store // main and perSecond as given
	route           func(*backend.Item) bool
	cont            bool

	mixed, peeks, overCharged atomic.Uint64
	pool                      sync.Pool // *scratch
}

var _ backend.TakesDeadline = (*Store)(nil)

// New returns a store that sends per-second items to perSecond and the rest
// to main. Close closes both.
func New(main, perSecond backend.Store, opts Options) *Store {
	s := &Store{
		main: backend.ByDeadline(main), perSecond: backend.ByDeadline(perSecond),
		stores: [2]backend.Store{main, perSecond},
		route:  opts.PerSecond, cont: opts.ContinueOnError,
	}
	if s.route == nil {
		s.route = PerSecondLimit
	}
	s.pool.New = func() any { return new(scratch) }
	return s
}

// Main returns the main store, as given to New.
func (s *Store) Main() backend.Store { return s.stores[0] }

// Stats are the split store's counters.
type Stats struct {
	// Mixed counts requests with items in both stores.
	Mixed uint64
	// Peeks counts uncharged decisions of a mixed request's main part.
	Peeks uint64
	// OverCharged counts mixed requests whose per-second part was charged
	// and whose main part then denied (a concurrent request took its room
	// after the peek).
	OverCharged uint64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{Mixed: s.mixed.Load(), Peeks: s.peeks.Load(), OverCharged: s.overCharged.Load()}
}

// Close closes both stores at once (each may write back what it holds,
// within its own bound).
func (s *Store) Close() error {
	var mainErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		mainErr = s.stores[0].Close()
	}()
	psErr := s.stores[1].Close()
	<-done
	return errors.Join(mainErr, psErr)
}

// WriteBackPending returns the keys whose hits wait to be written back in
// both stores (those that write back: a Redis store).
func (s *Store) WriteBackPending() int {
	n := 0
	for _, st := range s.stores {
		if p, ok := st.(interface{ WriteBackPending() int }); ok {
			n += p.WriteBackPending()
		}
	}
	return n
}

// Ping checks both stores that can be checked (a Redis store's Ping), at
// once; the error names the store that failed.
func (s *Store) Ping(ctx context.Context) error {
	type pinger interface{ Ping(context.Context) error }
	var errs [2]error
	var wg sync.WaitGroup
	for i, st := range s.stores {
		p, ok := st.(pinger)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Ping(ctx)
		}()
	}
	wg.Wait()
	if errs[0] != nil {
		errs[0] = fmt.Errorf("main: %w", errs[0])
	}
	if errs[1] != nil {
		errs[1] = fmt.Errorf("per-second: %w", errs[1])
	}
	return errors.Join(errs[0], errs[1])
}

// Apply implements backend.Store.
func (s *Store) Apply(ctx context.Context, items []backend.Item, out []algorithms.Decision) (bool, error) {
	return s.ApplyBy(ctx, time.Time{}, items, out)
}

// ApplyBy implements backend.TakesDeadline: each store's part is decided by
// ApplyBy, by its share of the time left before the earlier of ctx's
// deadline and until, with no context made per call.
func (s *Store) ApplyBy(ctx context.Context, until time.Time, items []backend.Item, out []algorithms.Decision) (bool, error) {
	n := len(items)
	if len(out) < n {
		return false, fmt.Errorf("split: %d decisions for %d items", len(out), n)
	}
	ps := 0
	for i := range items {
		if s.route(&items[i]) {
			ps++
		}
	}
	switch ps {
	case 0:
		return s.main.ApplyBy(ctx, until, items, out)
	case n:
		return s.perSecond.ApplyBy(ctx, until, items, out)
	}
	s.mixed.Add(1)
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)
	sc.split(items, s.route)
	if d, ok := ctx.Deadline(); ok && (until.IsZero() || d.Before(until)) {
		until = d
	}
	allowed, err := s.decideMixed(ctx, until, sc)
	for k, i := range sc.psIdx {
		out[i] = sc.psOut[k]
	}
	for k, i := range sc.mainIdx {
		out[i] = sc.mainOut[k]
	}
	return allowed, err
}

// decideMixed decides a mixed request split into sc (see the package
// documentation) by end (zero: no deadline), and leaves the decisions in
// sc.psOut and sc.mainOut.
func (s *Store) decideMixed(ctx context.Context, end time.Time, sc *scratch) (bool, error) {
	A, B := sc.ps, sc.main // A is charged first, B is peeked first
	dA, dB := sc.psOut, sc.mainOut

	// 1. Peek the main part, unless it cannot deny (only Shadow items).
	peeked := false
	if canDeny(B) {
		s.peeks.Add(1)
		err := s.peek(ctx, share(end, 3), s.main, B, dB, sc)
		if err != nil {
			if !s.cont || errors.Is(err, backend.ErrClosed) {
				return false, err
			}
			// Failing open: the main store counts the peek's hits itself
			// (a failed Redis store writes them back), so only the
			// per-second part is still charged.
			s.perSecond.ApplyBy(ctx, end, sc.rewrite(A, B, nil), dA)
			return false, err
		}
		peeked = true
	}

	// 2. The per-second part, charged when the request can be allowed.
	var seen []algorithms.Decision // the peek's decisions, if any
	if peeked {
		seen = dB
	}
	A2 := sc.rewrite(A, B, seen)
	aEnd := share(end, 2)
	if sc.knownDenied || (peeked && enforcedDenies(B, dB)) {
		if err := s.deniedCall(ctx, aEnd, s.perSecond, A, dA, sc); err != nil {
			return false, err
		}
		return false, s.finishDenied(ctx, end, B, dB, peeked, sc)
	}
	committed, err := s.perSecond.ApplyBy(ctx, aEnd, A2, dA)
	if err != nil {
		if !s.cont || errors.Is(err, backend.ErrClosed) {
			return false, err
		}
		s.main.ApplyBy(ctx, end, sc.rewrite(B, A, nil), dB)
		return false, err
	}
	if !committed {
		return false, s.finishDenied(ctx, end, B, dB, peeked, sc)
	}

	// 3. The main part, charged when the request is allowed given the
	// per-second part's decisions.
	B2 := sc.rewrite(B, A, dA)
	if sc.knownDenied {
		// Not reached when both parts saw the same states; kept for a
		// store that answers differently on a second look.
		s.overCharged.Add(1)
		return false, s.deniedCall(ctx, end, s.main, B, dB, sc)
	}
	committed, err = s.main.ApplyBy(ctx, end, B2, dB)
	if err != nil {
		return false, err
	}
	if !committed {
		s.overCharged.Add(1)
	}
	return committed, nil
}

// share returns the deadline of the next of left calls of a mixed request
// still to make, which must end by end (zero: no deadline): (left+1)/(2*left)
// of the time left, so 2/3 for the first of three, 3/4 for the first of
// two, all of it for the last. A store that cannot answer within its share
// (a frozen Redis) then leaves the later calls a quarter of the time at
// least, so a healthy store still decides its part, where the first call
// would otherwise spend the whole budget and leave the others none (a
// Redis store's degraded mode decides a call whose time is up at once,
// without Redis). Equal shares (a third each) left more requests to the
// fallback under overload, when every call waits in a queue.
func share(end time.Time, left int) time.Time {
	if end.IsZero() || left <= 1 {
		return end
	}
	now := time.Now()
	return now.Add(end.Sub(now) * time.Duration(left+1) / time.Duration(2*left))
}

// finishDenied settles the main part of a denied request: its peek already
// holds a denied request's decisions, unless it was not peeked or has usage
// accounting to charge.
func (s *Store) finishDenied(ctx context.Context, end time.Time, B []backend.Item, dB []algorithms.Decision, peeked bool, sc *scratch) error {
	if peeked && !hasAccount(B) {
		return nil
	}
	return s.deniedCall(ctx, end, s.main, B, dB, sc)
}

// peek decides items on st without charging anything: usage accounting is
// decided as an ordinary charge, and blockers make the store deny.
func (s *Store) peek(ctx context.Context, until time.Time, st backend.TakesDeadline, items []backend.Item, out []algorithms.Decision, sc *scratch) error {
	sc.call = append(sc.call[:0], items...)
	for i := range sc.call {
		sc.call[i].Account = false
	}
	return s.blocked(ctx, until, st, out, sc)
}

// deniedCall decides items on st as a denied request: only usage
// accounting is charged, and the other items report as a denied request's.
func (s *Store) deniedCall(ctx context.Context, until time.Time, st backend.TakesDeadline, items []backend.Item, out []algorithms.Decision, sc *scratch) error {
	sc.call = append(sc.call[:0], items...)
	return s.blocked(ctx, until, st, out, sc)
}

// blocked applies sc.call plus its blockers on st and copies the decisions
// of sc.call's items into out.
func (s *Store) blocked(ctx context.Context, until time.Time, st backend.TakesDeadline, out []algorithms.Decision, sc *scratch) error {
	n := len(sc.call)
	sc.call = appendBlockers(sc.call, n)
	sc.callOut = grow(sc.callOut, len(sc.call))
	if _, err := st.ApplyBy(ctx, until, sc.call, sc.callOut); err != nil {
		return err
	}
	copy(out, sc.callOut[:n])
	return nil
}

// appendBlockers appends to items[:n] one blocking item per partition (per
// key for items without one): an Enforced check of a limit of zero
// requests, which denies whatever the state, keeps no counter, and lands
// where its partition's items land (same Key and Partition), so that even a
// store that decides partitions apart (a Redis Cluster) commits none. A
// check is never remembered by a deny cache nor written back by a failed
// Redis store.
func appendBlockers(items []backend.Item, n int) []backend.Item {
	for i := 0; i < n; i++ {
		it := items[i]
		dup := false
		for j := 0; j < i; j++ {
			if o := &items[j]; o.Partition == it.Partition && (it.Partition != 0 || o.Key == it.Key) {
				dup = true
				break
			}
		}
		if dup {
			continue
		}
		items = append(items, backend.Item{
			Key:       it.Key,
			Partition: it.Partition,
			Limit:     algorithms.Limit{Algorithm: it.Limit.Algorithm, Window: it.Limit.Window},
		})
	}
	return items
}

func canDeny(items []backend.Item) bool {
	for i := range items {
		if items[i].Mode != backend.Shadow {
			return true
		}
	}
	return false
}

func hasAccount(items []backend.Item) bool {
	for i := range items {
		if items[i].Account && items[i].Hits > 0 {
			return true
		}
	}
	return false
}

func enforcedDenies(items []backend.Item, ds []algorithms.Decision) bool {
	for i := range items {
		if items[i].Mode == backend.Enforced && !ds[i].Allowed {
			return true
		}
	}
	return false
}

func grow(ds []algorithms.Decision, n int) []algorithms.Decision {
	if cap(ds) < n {
		return make([]algorithms.Decision, n)
	}
	return ds[:n]
}
