// Package algorithms holds the rate-limiting algorithms of envoy-rls as pure
// functions: each decision is a function of (state, limit, hits, now) that
// returns the new state and a Decision. Nothing here reads a clock, logs,
// allocates on the steady-state path or does I/O, so the same code serves the
// embedded store, tests on a fixed timeline and any Go program that wants an
// in-process limiter.
//
// Time is handled in whole microseconds since the Unix epoch. Every algorithm
// treats a `now` earlier than the latest instant its state has seen as equal to
// that instant, so a clock that steps backwards never grants capacity. All
// arithmetic saturates instead of overflowing: huge hit counts, huge limits and
// years of idle time are safe.
//
// The Redis backend runs Lua twins of these functions; they use the same
// formulas in the same order (float64 where fractions appear), so both
// backends give identical decisions for identical inputs. The formulas scale
// counts by the window in µs so that, while counts and count×window stay
// below 2^53, every intermediate value is an integer held exactly in a
// float64 and decisions are exact; beyond that they are approximate (but a
// request of more hits than a limit's capacity is always denied).
package algorithms

import (
	"fmt"
	"math"
	"time"
)

// Kind names an algorithm.
type Kind uint8

// The algorithms. The zero value is FixedWindow, the reference server's
// behaviour.
const (
	// FixedWindow counts hits in epoch-aligned windows of Limit.Window
	// (floor(now/window)*window), like envoyproxy/ratelimit. It allows up to
	// 2x the limit across a window boundary.
	FixedWindow Kind = iota
	// TokenBucket holds up to Capacity() tokens and refills continuously at
	// Requests per Window. A request of n hits takes n tokens.
	TokenBucket
	// SlidingWindowLog remembers the time of every allowed request and allows
	// a new one only when the hits in the last Window stay within Requests.
	// Exact, but its state grows with the number of requests in a window.
	SlidingWindowLog
	// SlidingWindowCounter approximates a sliding window with two fixed
	// windows: the previous window's count weighted by how much of it still
	// overlaps the sliding window, plus the current window's count.
	SlidingWindowCounter
	// GCRA is the generic cell rate algorithm: a theoretical arrival time per
	// key (kept relative to the last update, for precision), an emission
	// interval of Window/Requests and a burst tolerance of Capacity()
	// requests. It makes the same decisions as TokenBucket with the same
	// Limit; it is offered under its own name for those who know it so.
	GCRA
)

var kindNames = [...]string{
	FixedWindow:          "fixed_window",
	TokenBucket:          "token_bucket",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	GCRA:                 "gcra",
}

// Kinds lists every algorithm, in the order of their values.
func Kinds() []Kind {
	return []Kind{FixedWindow, TokenBucket, SlidingWindowLog, SlidingWindowCounter, GCRA}
}

// String returns the configuration name of k, e.g. "token_bucket".
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(k))
}

// ParseKind returns the algorithm with the given configuration name.
func ParseKind(name string) (Kind, bool) {
	for i, n := range kindNames {
		if n == name {
			return Kind(i), true
		}
	}
	return 0, false
}

// HasBurst reports whether the algorithm takes a burst (a capacity distinct
// from its rate): true for TokenBucket and GCRA.
func (k Kind) HasBurst() bool { return k == TokenBucket || k == GCRA }

// Limit is one rate limit: Requests per Window, decided by Algorithm.
type Limit struct {
	// Algorithm decides how hits are counted. The zero value is FixedWindow.
	Algorithm Kind
	// Requests is the number of hits allowed per Window; for TokenBucket and
	// GCRA it is the refill rate. Zero denies every request with hits > 0.
	Requests uint64
	// Window is the period of the limit. It must be at least a microsecond;
	// finer resolution is ignored.
	Window time.Duration
	// Burst is the capacity of TokenBucket and GCRA (the most hits allowed at
	// once after a long idle time). Zero means Requests. Other algorithms
	// ignore it.
	Burst uint64
}

// Capacity returns the most hits the limit allows at once: Burst for
// TokenBucket and GCRA when set, otherwise Requests.
func (l Limit) Capacity() uint64 {
	if l.Algorithm.HasBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Validate reports whether the limit can be decided.
func (l Limit) Validate() error {
	if int(l.Algorithm) >= len(kindNames) {
		return fmt.Errorf("unknown algorithm %d", l.Algorithm)
	}
	if l.Window < time.Microsecond {
		return fmt.Errorf("window %v is shorter than a microsecond", l.Window)
	}
	if l.Burst > 0 && !l.Algorithm.HasBurst() {
		return fmt.Errorf("burst has no meaning for %s", l.Algorithm)
	}
	return nil
}

// Never is the RetryAfter (or ResetAfter) of something that cannot happen:
// a request of more hits than the limit's capacity can never succeed.
const Never = time.Duration(math.MaxInt64)

// Decision is the outcome of one request against one limit.
type Decision struct {
	// Allowed reports whether the hits fit within the limit. When true the
	// returned State has them charged.
	Allowed bool
	// Limit is the limit's capacity (see Limit.Capacity).
	Limit uint64
	// Remaining is how many more hits the limit would allow right now: after
	// this request's hits when allowed, before them when denied.
	Remaining uint64
	// RetryAfter is zero when allowed. When denied it is how long until the
	// same request could be allowed (for a check of 0 hits: until one hit
	// could be), or Never when it never can (hits above the capacity, or a
	// limit of zero requests).
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is back to its full capacity
	// (its state equals a fresh one, so a store may drop it then). Zero when
	// it is full now, and for a limit of zero requests, which keeps no state.
	ResetAfter time.Duration
}

// State is the per-key memory of an algorithm. The zero value is a fresh key
// for every algorithm. A State must only be used with the Limit it was made
// with; the fields' meaning depends on the algorithm.
//
// Decide never modifies the State it is given: it returns a new value. For
// SlidingWindowLog the new value may share memory with the old one, but only
// in slots the old one does not use, so a caller may keep the old State (for
// example when another limit of the same request denies) and discard the new
// one. The same holds along a chain of States all decided at one instant (as
// a store does for several items with the same key in one request): the
// caller may go back to any State of the chain and discard the ones derived
// from it. Only one State of a lineage should be carried forward.
type State struct {
	// at is an instant in µs: the window start (fixed_window,
	// sliding_window_counter), the last update (token_bucket, gcra) or the
	// newest instant seen (sliding_window_log).
	at int64
	// count is the hits in the current window (fixed_window,
	// sliding_window_counter) or in the log (sliding_window_log).
	count uint64
	// prev is the hits in the previous window (sliding_window_counter).
	prev uint64
	// level is the debt of token_bucket and gcra at instant at: the tokens
	// missing from a full bucket times the window in µs, which equals
	// (theoretical arrival time - at) times requests.
	level float64
	// log holds the allowed requests of sliding_window_log, oldest first.
	log ring
}

// Decide decides a request of hits against limit l with state s at instant
// now, and returns the state after it (with the hits charged when allowed).
//
// hits == 0 checks without charging: the check is allowed when one more hit
// would be, and denied when the limit has no capacity left for one hit (so
// a check on the request path, as in Envoy's quota pattern, stops admitting
// once the usage charged later has used the limit up). The limit must be
// valid (see Limit.Validate).
func Decide(l Limit, s State, now time.Time, hits uint64) (State, Decision) {
	return DecideMicros(l, s, now.UnixMicro(), hits)
}

// DecideMicros is Decide with now given in microseconds since the Unix epoch.
// Instants before the epoch are treated as the epoch.
func DecideMicros(l Limit, s State, now int64, hits uint64) (State, Decision) {
	d := decideInPlace(&l, &s, now, hits, false)
	return s, d
}

// Account is Decide for usage that already happened and must be counted
// even when it does not fit: the cost a stream reports when it is done
// (Envoy's apply_on_stream_done), which nothing can refuse any more. When
// the hits fit it is exactly Decide. When they do not, the Decision is
// denied (Allowed false) but the returned State has them charged anyway:
//
//   - fixed_window and sliding_window_counter count them in the current
//     window, past the limit: the window stays exhausted until it ends (and
//     for the sliding counter, until enough of it has slid out);
//   - token_bucket and gcra carry them as debt: the bucket refills from
//     below empty, so the excess delays the next admission by its worth,
//     up to MaxDebt;
//   - sliding_window_log records them while the log has room (its count is
//     below the limit), so the log never holds more than requests entries;
//     on a full log they are dropped (saturated): the log is already
//     exhausted until its oldest entries slide out;
//   - a limit of zero requests keeps no state and counts nothing.
//
// Usage past the limit is bounded in time whatever the charge (Envoy allows
// 10^9 hits per descriptor, and Account any uint64): a counting window's
// excess lapses with the window (fixed_window: its end; the sliding
// counter: the end of the next window, through which it slides out), the
// log's entry slides out after one window, and a bucket's debt is capped
// by MaxDebt. So no state stays exhausted longer than about two windows
// plus a full refill (Capacity()/Requests windows), and its ResetAfter
// says when it is fresh.
//
// The denied Decision describes the state after the charge: Remaining 0,
// RetryAfter the time until one hit fits again, ResetAfter the time until the
// state is fresh. So each window admits at most requests plus the one charge
// that crossed the limit: a check (Decide with 0 hits) denies as soon as no
// capacity is left for one hit.
func Account(l Limit, s State, now time.Time, hits uint64) (State, Decision) {
	return AccountMicros(l, s, now.UnixMicro(), hits)
}

// MaxDebt returns the most a token_bucket or gcra limit can be owed after
// Account: Requests hits (one window's worth of the limit) below an empty
// bucket. Usage accounted past it is forgotten. Checks then deny for at
// most one window and one emission interval (Window/Requests) until a hit
// fits again, and the state is fresh after (Capacity()+Requests)/Requests
// windows. Other algorithms carry no debt: it is 0 for them.
func MaxDebt(l Limit) uint64 {
	if !l.Algorithm.HasBurst() {
		return 0
	}
	return l.Requests
}

// AccountMicros is Account with now given in microseconds since the Unix
// epoch.
func AccountMicros(l Limit, s State, now int64, hits uint64) (State, Decision) {
	d := decideInPlace(&l, &s, now, hits, hits > 0)
	return s, d
}

// DecideInPlace is DecideMicros on the state *s, which it overwrites with
// the state after the decision when the hits are allowed and leaves as it is
// when they are not: exactly what DecideMicros returns, without copying the
// state in and out (a store keeping the state of a request's keys in an
// array of its own decides in it). l is only read.
func DecideInPlace(l *Limit, s *State, now int64, hits uint64) Decision {
	return decideInPlace(l, s, now, hits, false)
}

// AccountInPlace is AccountMicros on the state *s, which it overwrites with
// the state after the charge whether or not the hits fit (when hits > 0;
// with 0 hits it is DecideInPlace). l is only read.
func AccountInPlace(l *Limit, s *State, now int64, hits uint64) Decision {
	return decideInPlace(l, s, now, hits, hits > 0)
}

func decideInPlace(l *Limit, s *State, now int64, hits uint64, account bool) Decision {
	if now < 0 {
		now = 0
	}
	if l.Requests == 0 {
		return blocked(*l)
	}
	w := l.Window.Microseconds()
	if w < 1 {
		w = 1
	}
	// Each algorithm overwrites *s only when the request is allowed, or
	// when it is accounted, and only once it has decided.
	switch l.Algorithm {
	case TokenBucket, GCRA:
		return bucket(l, w, s, now, hits, account)
	case SlidingWindowLog:
		return slidingLog(l, w, s, now, hits, account)
	case SlidingWindowCounter:
		return slidingCounter(l, w, s, now, hits, account)
	}
	return fixedWindow(l, w, s, now, hits, account)
}

// blocked is the decision of a limit of zero requests: nothing is ever
// allowed, not even a check (there is never room for one hit).
func blocked(l Limit) Decision {
	return Decision{Limit: l.Capacity(), RetryAfter: Never}
}

// probe is the number of hits whose fit decides a request of hits: the hits
// themselves, or one for a check.
func probe(hits uint64) uint64 { return max(hits, 1) }

// accounted is the Decision of hits that did not fit but were charged
// anyway, leaving state s: a check of s (which denies, as the charge used up
// what was left) with Allowed false.
func accounted(after Decision) Decision {
	after.Allowed = false
	return after
}

// satAdd returns a+b, saturating at math.MaxUint64.
func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
