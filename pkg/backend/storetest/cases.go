package storetest

import (
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Cases returns the multi-item timelines that every Store must pass:
// composite limits, all-or-nothing charging, shadow and quota modes, items
// with the same key and checks. Each call returns fresh slices.
//
// Semantics (see backend.Store): items are decided in order at one instant,
// items with the same key seeing the hits of the ones before them. The
// request is denied when an Enforced item denies or every Quota group has a
// denying item. A denied request charges nothing but its usage accounting
// (Account items, charged whatever the verdict), and each of its items that
// would have allowed reports its key's state as it stays (allowed, with the
// Remaining and ResetAfter of a check); its denying items report their own
// decisions. A check (hits 0) denies when no room is left for one hit.
func Cases() []Case {
	fw, tb, swl, swc, gcra := algorithms.FixedWindow, algorithms.TokenBucket,
		algorithms.SlidingWindowLog, algorithms.SlidingWindowCounter, algorithms.GCRA

	item := func(key string, l algorithms.Limit, hits uint64) backend.Item {
		return backend.Item{Key: key, Limit: l, Hits: hits}
	}
	shadow := func(key string, l algorithms.Limit, hits uint64) backend.Item {
		return backend.Item{Key: key, Limit: l, Hits: hits, Mode: backend.Shadow}
	}
	quota := func(key string, l algorithms.Limit, hits uint64, group int) backend.Item {
		return backend.Item{Key: key, Limit: l, Hits: hits, Mode: backend.Quota, Group: group}
	}
	ds := func(d ...algorithms.Decision) []algorithms.Decision { return d }
	blockedLimit := lim(fw, 0, sec)
	blocked := no(0, 0, never, 0)

	// composite: 5 per minute (fixed window) AND 2 per second (token bucket:
	// debt in token·µs, full 2e6, a hit adds 1e6, refill 2 per µs).
	perMin, perSec := lim(fw, 5, minute), lim(tb, 2, sec)
	both := func(hits uint64) []backend.Item {
		return []backend.Item{item("user/min", perMin, hits), item("user/sec", perSec, hits)}
	}

	x, y, z := lim(swl, 3, sec), lim(swc, 3, sec), lim(fw, 1, sec)
	s, e := lim(fw, 1, sec), lim(fw, 10, sec)
	q0a, q0b, q1, qe := lim(fw, 2, sec), lim(fw, 5, sec), lim(fw, 1, sec), lim(fw, 100, sec)
	quotaAll := func(hits uint64) []backend.Item {
		return []backend.Item{
			quota("q0a", q0a, hits, 0), quota("q0b", q0b, hits, 0),
			quota("q1", q1, hits, 1), item("e", qe, hits),
		}
	}
	k := lim(fw, 3, sec)
	log := lim(swl, 10, sec)
	ca, cb, cc := lim(tb, 5, sec), lim(swl, 5, sec), algorithms.Limit{Algorithm: gcra, Requests: 5, Window: sec, Burst: 10}
	qa, ea, ba := lim(fw, 2, sec), lim(fw, 10, sec), lim(tb, 2, sec)
	acct := func(key string, l algorithms.Limit, hits uint64) backend.Item {
		return backend.Item{Key: key, Limit: l, Hits: hits, Mode: backend.Quota, Account: true}
	}

	return []Case{{
		Name: "composite_minute_and_second",
		Steps: []Step{
			{At: 0, Items: both(1), WantAllowed: true,
				Want: ds(ok(5, 4, minute), ok(2, 1, 500*ms))},
			// sec: debt 1e6-1e5*2 = 8e5, +1e6.
			{At: 100 * ms, Items: both(1), WantAllowed: true,
				Want: ds(ok(5, 3, minute-100*ms), ok(2, 0, 900*ms))},
			// sec: debt 1.8e6-2e5 = 1.6e6, +1e6 > 2e6: denied, so min is not
			// charged and reports a check.
			{At: 200 * ms, Items: both(1), WantAllowed: false,
				Want: ds(ok(5, 3, minute-200*ms), no(2, 0, 300*ms, 800*ms))},
			{At: 500 * ms, Items: both(1), WantAllowed: true,
				Want: ds(ok(5, 2, minute-500*ms), ok(2, 0, sec))},
			{At: 1500 * ms, Items: both(1), WantAllowed: true,
				Want: ds(ok(5, 1, minute-1500*ms), ok(2, 1, 500*ms))},
			{At: 1500 * ms, Items: both(1), WantAllowed: true,
				Want: ds(ok(5, 0, minute-1500*ms), ok(2, 0, sec))},
			// min is exhausted: sec is not charged.
			{At: 10 * sec, Items: both(1), WantAllowed: false,
				Want: ds(no(5, 0, 50*sec, 50*sec), ok(2, 2, 0))},
			{At: 10 * sec, Items: []backend.Item{item("user/sec", perSec, 2)}, WantAllowed: true,
				Want: ds(ok(2, 0, sec))},
			{At: minute, Items: both(1), WantAllowed: true,
				Want: ds(ok(5, 4, minute), ok(2, 1, 500*ms))},
		},
	}, {
		Name: "denial_charges_nothing",
		Steps: []Step{
			{At: 0, WantAllowed: true,
				Items: []backend.Item{item("x", x, 1), item("y", y, 1), item("z", z, 1)},
				Want:  ds(ok(3, 2, sec), ok(3, 2, 2*sec), ok(1, 0, sec))},
			// z denies: x and y report checks (y: used 1e6, reset 2w-e).
			{At: 100 * ms, WantAllowed: false,
				Items: []backend.Item{item("x", x, 1), item("y", y, 1), item("z", z, 1)},
				Want:  ds(ok(3, 2, 900*ms), ok(3, 2, 1900*ms), no(1, 0, 900*ms, 900*ms))},
			{At: 200 * ms, WantAllowed: true,
				Items: []backend.Item{item("x", x, 2), item("y", y, 2)},
				Want:  ds(ok(3, 0, sec), ok(3, 0, 1800*ms))},
			// y: prev 3 at e 0 is full; e' = 1e6-floor(2e6/3) = 333334. x and z
			// would allow, and report checks.
			{At: sec, WantAllowed: false,
				Items: []backend.Item{item("x", x, 1), item("y", y, 1), item("z", z, 1)},
				Want:  ds(ok(3, 1, 200*ms), no(3, 0, 333334*us, sec), ok(1, 1, 0))},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{item("z", z, 1)},
				Want:  ds(ok(1, 0, sec))},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{item("x", x, 1)},
				Want:  ds(ok(3, 0, sec))},
		},
	}, {
		Name: "shadow_never_denies",
		Steps: []Step{
			{At: 0, WantAllowed: true,
				Items: []backend.Item{shadow("s", s, 1), item("e", e, 1)},
				Want:  ds(ok(1, 0, sec), ok(10, 9, sec))},
			{At: 0, WantAllowed: true,
				Items: []backend.Item{shadow("s", s, 1), item("e", e, 1)},
				Want:  ds(no(1, 0, sec, sec), ok(10, 8, sec))},
			// A shadow check denies (no room for one hit), never the request.
			{At: 0, WantAllowed: true,
				Items: []backend.Item{shadow("s", s, 0)},
				Want:  ds(no(1, 0, sec, sec))},
			// A shadow item is not charged when the request is denied.
			{At: sec, WantAllowed: false,
				Items: []backend.Item{shadow("s", s, 1), item("blocked", blockedLimit, 1)},
				Want:  ds(ok(1, 1, 0), blocked)},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{shadow("s", s, 1)},
				Want:  ds(ok(1, 0, sec))},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{shadow("s", s, 1)},
				Want:  ds(no(1, 0, sec, sec))},
		},
	}, {
		Name: "quota_groups",
		Steps: []Step{
			{At: 0, Items: quotaAll(1), WantAllowed: true,
				Want: ds(ok(2, 1, sec), ok(5, 4, sec), ok(1, 0, sec), ok(100, 99, sec))},
			// Group 1 denies, group 0 does not: allowed; q1 is not charged.
			{At: 100 * ms, Items: quotaAll(1), WantAllowed: true,
				Want: ds(ok(2, 0, 900*ms), ok(5, 3, 900*ms), no(1, 0, 900*ms, 900*ms), ok(100, 98, 900*ms))},
			// Both groups have a denying item: denied, nothing charged.
			{At: 200 * ms, Items: quotaAll(1), WantAllowed: false,
				Want: ds(no(2, 0, 800*ms, 800*ms), ok(5, 3, 800*ms), no(1, 0, 800*ms, 800*ms), ok(100, 98, 800*ms))},
			{At: 200 * ms, Items: []backend.Item{item("e", qe, 0)}, WantAllowed: true,
				Want: ds(ok(100, 98, 800*ms))},
			{At: sec, Items: []backend.Item{quota("q0a", q0a, 3, 0)}, WantAllowed: false,
				Want: ds(no(2, 2, never, 0))},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{quota("q0a", q0a, 3, 0), quota("q1", q1, 1, 1)},
				Want:  ds(no(2, 2, never, 0), ok(1, 0, sec))},
			{At: sec, Items: []backend.Item{quota("q1", q1, 1, 1)}, WantAllowed: false,
				Want: ds(no(1, 0, sec, sec))},
			// An enforced denial denies whatever the quota groups say.
			{At: sec, WantAllowed: false,
				Items: []backend.Item{quota("q0a", q0a, 1, 0), item("blocked", blockedLimit, 1)},
				Want:  ds(ok(2, 2, 0), blocked)},
		},
	}, {
		Name: "same_key_in_order",
		Steps: []Step{
			// The second item sees the first's hits and denies; the first then
			// reports a check of the fresh key.
			{At: 0, WantAllowed: false,
				Items: []backend.Item{item("k", k, 2), item("k", k, 2)},
				Want:  ds(ok(3, 3, 0), no(3, 1, sec, sec))},
			{At: 0, WantAllowed: true,
				Items: []backend.Item{item("k", k, 1), item("k", k, 2)},
				Want:  ds(ok(3, 2, sec), ok(3, 0, sec))},
			// Full: a check denies.
			{At: 0, WantAllowed: false,
				Items: []backend.Item{item("k", k, 0)},
				Want:  ds(no(3, 0, sec, sec))},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{item("k", k, 2), item("k", k, 0)},
				Want:  ds(ok(3, 1, sec), ok(3, 1, sec))},
		},
	}, {
		// Two items of one sliding_window_log key at one instant, then the
		// request is denied: the state kept is the one before the request,
		// intact (a store going back two derivations must not find the
		// entry at 0 overwritten by the second item's entry).
		Name: "same_key_log_chain_then_denied",
		Steps: []Step{
			{At: 0, Items: []backend.Item{item("log", log, 1)}, WantAllowed: true, Want: ds(ok(10, 9, sec))},
			{At: ms, Items: []backend.Item{item("log", log, 1)}, WantAllowed: true, Want: ds(ok(10, 8, sec))},
			{At: 2 * ms, Items: []backend.Item{item("log", log, 1)}, WantAllowed: true, Want: ds(ok(10, 7, sec))},
			// At 1s the entry at 0 has left: both log items would allow.
			{At: sec, WantAllowed: false,
				Items: []backend.Item{item("log", log, 1), item("log", log, 1), item("blocked", blockedLimit, 1)},
				Want:  ds(ok(10, 8, 2*ms), ok(10, 8, 2*ms), blocked)},
			{At: sec, Items: []backend.Item{item("log", log, 0)}, WantAllowed: true, Want: ds(ok(10, 8, 2*ms))},
			{At: sec + ms, Items: []backend.Item{item("log", log, 8)}, WantAllowed: true, Want: ds(ok(10, 1, sec))},
			// Entries 2ms (1), 1.001s (8): one more hit needs 2ms to leave.
			{At: sec + ms, Items: []backend.Item{item("log", log, 2)}, WantAllowed: false, Want: ds(no(10, 1, ms, sec))},
		},
	}, {
		Name: "checks_hits_zero",
		Steps: []Step{
			{At: 0, WantAllowed: true,
				Items: []backend.Item{item("a", ca, 0), item("b", cb, 0), item("c", cc, 0)},
				Want:  ds(ok(5, 5, 0), ok(5, 5, 0), ok(10, 10, 0))},
			// c: full 1e7, need 1e7: reset 1e7/5.
			{At: 0, WantAllowed: true,
				Items: []backend.Item{item("a", ca, 5), item("b", cb, 5), item("c", cc, 10)},
				Want:  ds(ok(5, 0, sec), ok(5, 0, sec), ok(10, 0, 2*sec))},
			// No room for one hit: checks deny, and wait for one hit's room.
			// a: (5e6+1e6-5e6)/5; c: (1e7+1e6-1e7)/5.
			{At: 0, WantAllowed: false,
				Items: []backend.Item{item("a", ca, 0), item("b", cb, 0), item("c", cc, 0)},
				Want:  ds(no(5, 0, 200*ms, sec), no(5, 0, sec, sec), no(10, 0, 200*ms, 2*sec))},
			// a: debt 5e6-1e5*5 = 4.5e6, +1e6 fits at (5.5e6-5e6)/5;
			// c: debt 1e7-5e5 = 9.5e6, +1e6 > 1e7.
			{At: 100 * ms, WantAllowed: false,
				Items: []backend.Item{item("a", ca, 0), item("b", cb, 0), item("c", cc, 1)},
				Want:  ds(no(5, 0, 100*ms, 900*ms), no(5, 0, 900*ms, 900*ms), no(10, 0, 100*ms, 1900*ms))},
			{At: 200 * ms, WantAllowed: true,
				Items: []backend.Item{item("c", cc, 1)},
				Want:  ds(ok(10, 0, 2*sec))},
		},
	}, {
		// Envoy's quota pattern: quota descriptors checked with 0 hits on
		// the request path, the real cost charged as usage accounting when
		// the stream is done. q: 2 per second (fixed window); e: 10 per
		// second, an ordinary limit; b: token bucket 2 per second.
		Name: "usage_accounting",
		Steps: []Step{
			{At: 0, WantAllowed: true, Items: []backend.Item{quota("q", qa, 0, 0)}, Want: ds(ok(2, 2, 0))},
			{At: 0, WantAllowed: true, Items: []backend.Item{acct("q", qa, 1)}, Want: ds(ok(2, 1, sec))},
			{At: 0, WantAllowed: true, Items: []backend.Item{quota("q", qa, 0, 0)}, Want: ds(ok(2, 1, sec))},
			// 5 more than fit: charged anyway (count 6 of 2); the quota group
			// is over, so the verdict is denied, which Envoy ignores here.
			{At: 0, WantAllowed: false, Items: []backend.Item{acct("q", qa, 5)}, Want: ds(no(2, 0, sec, sec))},
			{At: 100 * ms, WantAllowed: false, Items: []backend.Item{quota("q", qa, 0, 0)}, Want: ds(no(2, 0, 900*ms, 900*ms))},
			// A new window starts fresh (fixed_window).
			{At: sec, WantAllowed: true, Items: []backend.Item{quota("q", qa, 0, 0)}, Want: ds(ok(2, 2, 0))},
			// A request denied by an ordinary limit still charges its usage
			// accounting, and nothing else.
			{At: sec, WantAllowed: false,
				Items: []backend.Item{acct("q", qa, 1), item("e", ea, 1), item("blocked", blockedLimit, 1)},
				Want:  ds(ok(2, 1, sec), ok(10, 10, 0), blocked)},
			{At: sec, WantAllowed: true,
				Items: []backend.Item{acct("q", qa, 1), item("e", ea, 1)},
				Want:  ds(ok(2, 0, sec), ok(10, 9, sec))},
			// Token bucket: 6 against a capacity of 2 would be debt 6e6
			// token·µs; it is capped at one window's worth below empty
			// (algorithms.MaxDebt: 2 tokens), 4e6. One hit fits again at
			// debt 1e6: (4e6-1e6)/2 µs; full at 4e6/2.
			{At: 0, WantAllowed: false, Items: []backend.Item{acct("b", ba, 6)}, Want: ds(no(2, 0, 1500*ms, 2*sec))},
			{At: 1500*ms - us, WantAllowed: false, Items: []backend.Item{quota("b", ba, 0, 0)}, Want: ds(no(2, 0, us, 500*ms+us))},
			{At: 1500 * ms, WantAllowed: true, Items: []backend.Item{quota("b", ba, 0, 0)}, Want: ds(ok(2, 1, 500*ms))},
		},
	}, {
		Name: "empty_request",
		Steps: []Step{
			{At: 0, WantAllowed: true, Items: nil, Want: ds()},
		},
	}}
}

// Shorthands for the tables.
const (
	us     = time.Microsecond
	ms     = time.Millisecond
	sec    = time.Second
	minute = time.Minute
	never  = algorithms.Never
)

func lim(k algorithms.Kind, requests uint64, window time.Duration) algorithms.Limit {
	return algorithms.Limit{Algorithm: k, Requests: requests, Window: window}
}

func ok(limit, remaining uint64, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func no(limit, remaining uint64, retry, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}
