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
// backends give identical decisions for identical inputs.
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
	// GCRA is the generic cell rate algorithm: one timestamp (the theoretical
	// arrival time) per key, an emission interval of Window/Requests and a
	// burst tolerance of Capacity() requests.
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
	// same request could be allowed, or Never when it never can (hits above
	// the capacity, or a limit of zero requests).
	RetryAfter time.Duration
	// ResetAfter is how long until the limit is back to its full capacity
	// (its state equals a fresh one, so a store may drop it then). Zero when
	// it is full now; Never when it never refills (zero requests).
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
// one. Only one State of a lineage should be carried forward.
type State struct {
	// at is an instant in µs: the window start (fixed_window,
	// sliding_window_counter), the last update (token_bucket) or the newest
	// instant seen (sliding_window_log).
	at int64
	// count is the hits in the current window (fixed_window,
	// sliding_window_counter) or in the log (sliding_window_log).
	count uint64
	// prev is the hits in the previous window (sliding_window_counter).
	prev uint64
	// level is the tokens missing from a full bucket (token_bucket) or the
	// theoretical arrival time in µs (gcra).
	level float64
	// log holds the allowed requests of sliding_window_log, oldest first.
	log ring
}

// Decide decides a request of hits against limit l with state s at instant
// now, and returns the state after it (with the hits charged when allowed).
// hits == 0 checks without charging. The limit must be valid (see
// Limit.Validate).
func Decide(l Limit, s State, now time.Time, hits uint64) (State, Decision) {
	return DecideMicros(l, s, now.UnixMicro(), hits)
}

// DecideMicros is Decide with now given in microseconds since the Unix epoch.
// Instants before the epoch are treated as the epoch.
func DecideMicros(l Limit, s State, now int64, hits uint64) (State, Decision) {
	if now < 0 {
		now = 0
	}
	if l.Requests == 0 {
		return s, blocked(hits)
	}
	w := l.Window.Microseconds()
	if w < 1 {
		w = 1
	}
	switch l.Algorithm {
	case TokenBucket:
		return tokenBucket(l, w, s, now, hits)
	case SlidingWindowLog:
		return slidingLog(l, w, s, now, hits)
	case SlidingWindowCounter:
		return slidingCounter(l, w, s, now, hits)
	case GCRA:
		return gcra(l, w, s, now, hits)
	default:
		return fixedWindow(l, w, s, now, hits)
	}
}

// blocked is the decision of a limit of zero requests: hits are never
// allowed, a check (hits == 0) is.
func blocked(hits uint64) Decision {
	if hits == 0 {
		return Decision{Allowed: true}
	}
	return Decision{RetryAfter: Never}
}

func fixedWindow(l Limit, w int64, s State, now int64, hits uint64) (State, Decision) {
	start := now - now%w
	if start < s.at { // the clock stepped back into an earlier window
		start, now = s.at, max(now, s.at)
	}
	var count uint64
	if start == s.at {
		count = s.count
	}
	limit := l.Requests
	left := sub0(limit, count)
	end := micros(start + w - now)
	if hits > left {
		d := Decision{Limit: limit, Remaining: left, RetryAfter: end, ResetAfter: end}
		if hits > limit {
			d.RetryAfter = Never
		}
		if count == 0 {
			d.ResetAfter = 0
		}
		return s, d
	}
	count += hits
	d := Decision{Allowed: true, Limit: limit, Remaining: limit - count}
	if count > 0 {
		d.ResetAfter = end
	}
	return State{at: start, count: count}, d
}

func slidingCounter(l Limit, w int64, s State, now int64, hits uint64) (State, Decision) {
	start := now - now%w
	if start < s.at {
		start, now = s.at, max(now, s.at)
	}
	var cur, prev uint64
	switch {
	case start == s.at:
		cur, prev = s.count, s.prev
	case start-w == s.at:
		prev = s.count
	}
	elapsed := now - start
	limit := float64(l.Requests)
	used := float64(prev)*float64(w-elapsed)/float64(w) + float64(cur)
	var reset int64
	switch {
	case cur > 0:
		reset = start + 2*w - now
	case prev > 0:
		reset = start + w - now
	}
	if used+float64(hits) > limit {
		d := Decision{Limit: l.Requests, Remaining: floorU(limit - used), ResetAfter: micros(reset)}
		switch {
		case hits > l.Requests:
			d.RetryAfter = Never
		case cur+hits <= l.Requests:
			// Within this window, once enough of the previous one slides out:
			// prev*(w-e)/w <= limit-hits-cur.
			need := limit - float64(hits) - float64(cur)
			e := w - int64(math.Floor(need*float64(w)/float64(prev)))
			d.RetryAfter = micros(start + e - now)
		default:
			// In the next window, where this window's count becomes prev.
			need := limit - float64(hits)
			e := w - int64(math.Floor(need*float64(w)/float64(cur)))
			d.RetryAfter = micros(start + w + e - now)
		}
		return s, d
	}
	cur += hits
	used += float64(hits)
	if hits > 0 {
		reset = start + 2*w - now
	}
	d := Decision{Allowed: true, Limit: l.Requests, Remaining: floorU(limit - used), ResetAfter: micros(reset)}
	return State{at: start, count: cur, prev: prev}, d
}

func tokenBucket(l Limit, w int64, s State, now int64, hits uint64) (State, Decision) {
	if now < s.at {
		now = s.at
	}
	capacity := l.Capacity()
	rate := float64(l.Requests)
	deficit := s.level - float64(now-s.at)*rate/float64(w)
	if deficit < 0 {
		deficit = 0
	}
	tokens := float64(capacity) - deficit
	if float64(hits) > tokens {
		d := Decision{Limit: capacity, Remaining: floorU(tokens), ResetAfter: ceilMicros(deficit * float64(w) / rate)}
		if hits > capacity {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = ceilMicros((float64(hits) - tokens) * float64(w) / rate)
		}
		return s, d
	}
	deficit += float64(hits)
	d := Decision{
		Allowed:    true,
		Limit:      capacity,
		Remaining:  floorU(tokens - float64(hits)),
		ResetAfter: ceilMicros(deficit * float64(w) / rate),
	}
	return State{at: now, level: deficit}, d
}

func gcra(l Limit, w int64, s State, now int64, hits uint64) (State, Decision) {
	capacity := l.Capacity()
	interval := float64(w) / float64(l.Requests) // µs between two requests
	tolerance := float64(capacity) * interval
	tat := s.level
	if tat < float64(now) {
		tat = float64(now)
	}
	newTat := tat + float64(hits)*interval
	allowAt := newTat - tolerance
	if float64(now) < allowAt {
		d := Decision{
			Limit:      capacity,
			Remaining:  floorU(float64(capacity) - (tat-float64(now))/interval),
			ResetAfter: ceilMicros(tat - float64(now)),
		}
		if hits > capacity {
			d.RetryAfter = Never
		} else {
			d.RetryAfter = ceilMicros(allowAt - float64(now))
		}
		return s, d
	}
	d := Decision{
		Allowed:    true,
		Limit:      capacity,
		Remaining:  floorU(float64(capacity) - (newTat-float64(now))/interval),
		ResetAfter: ceilMicros(newTat - float64(now)),
	}
	return State{level: newTat}, d
}

func slidingLog(l Limit, w int64, s State, now int64, hits uint64) (State, Decision) {
	if now < s.at {
		now = s.at
	}
	log, count := s.log, s.count
	for log.n > 0 && log.oldest().at <= now-w {
		count -= log.oldest().hits
		log = log.dropOldest()
	}
	limit := l.Requests
	left := sub0(limit, count)
	if hits > left {
		d := Decision{Limit: limit, Remaining: left}
		if log.n > 0 {
			d.ResetAfter = micros(log.newest().at + w - now)
		}
		if hits > limit {
			d.RetryAfter = Never
		} else {
			// Wait until enough of the oldest entries have slid out.
			need, freed := hits-left, uint64(0)
			for i := 0; i < log.n; i++ {
				e := log.at(i)
				freed += e.hits
				if freed >= need {
					d.RetryAfter = micros(e.at + w - now)
					break
				}
			}
		}
		return s, d
	}
	if hits > 0 {
		log = log.push(s.log, logEntry{at: now, hits: hits})
		count += hits
	}
	d := Decision{Allowed: true, Limit: limit, Remaining: limit - count}
	if log.n > 0 {
		d.ResetAfter = micros(log.newest().at + w - now)
	}
	return State{at: now, count: count, log: log}, d
}

// sub0 returns a-b, or 0 when b > a.
func sub0(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// floorU returns floor(f) as a uint64, clamped to [0, MaxUint64].
func floorU(f float64) uint64 {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= math.MaxUint64:
		return math.MaxUint64
	}
	return uint64(math.Floor(f))
}

// micros converts µs to a Duration, saturating at Never.
func micros(us int64) time.Duration {
	switch {
	case us <= 0:
		return 0
	case us >= int64(Never/time.Microsecond):
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// ceilMicros converts fractional µs to a Duration, rounding up and
// saturating at Never.
func ceilMicros(us float64) time.Duration {
	switch {
	case !(us > 0):
		return 0
	case us >= float64(Never/time.Microsecond):
		return Never
	}
	return micros(int64(math.Ceil(us)))
}
