package algorithms_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

func TestCapacity(t *testing.T) {
	for _, tc := range []struct {
		l    algorithms.Limit
		want uint64
	}{
		{algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 3, Burst: 9}, 9},
		{algorithms.Limit{Algorithm: algorithms.GCRA, Requests: 3, Burst: 9}, 9},
		{algorithms.Limit{Algorithm: algorithms.GCRA, Requests: 3}, 3},
		{algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 3, Burst: 9}, 3},
		{algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Requests: 3}, 3},
	} {
		if got := tc.l.Capacity(); got != tc.want {
			t.Errorf("%+v.Capacity() = %d, want %d", tc.l, got, tc.want)
		}
	}
}

// TestAccountIsDecideWhenItFits: on random timelines, Account gives the
// same state and decision as Decide whenever Decide allows; a check (0 hits)
// is the same in both.
func TestAccountIsDecideWhenItFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, k := range algorithms.Kinds() {
		l := limitOf(k, 5, sec)
		var s algorithms.State
		now := at(0)
		for step := 0; step < 2000; step++ {
			now += rng.Int64N(400_000)
			hits := rng.Uint64N(4)
			ds, dd := algorithms.DecideMicros(l, s, now, hits)
			as, ad := algorithms.AccountMicros(l, s, now, hits)
			if dd.Allowed || hits == 0 {
				if ad != dd {
					t.Fatalf("%s step %d: Account %+v, Decide %+v", k, step, ad, dd)
				}
				// The states must continue alike.
				_, d1 := algorithms.DecideMicros(l, ds, now, 1)
				_, d2 := algorithms.DecideMicros(l, as, now, 1)
				if d1 != d2 {
					t.Fatalf("%s step %d: states differ: %+v vs %+v", k, step, d1, d2)
				}
			} else if ad.Allowed || ad.Remaining != 0 {
				t.Fatalf("%s step %d: accounted charge that did not fit: %+v", k, step, ad)
			}
			s = ds
		}
	}
}

// TestAccountedUsageBlocksChecks is Envoy's quota pattern on one key: a
// check with 0 hits on the request path, the real cost charged with Account
// when the stream is done, including a cost larger than what is left. Each
// algorithm must stop admitting once the usage reaches the limit, and
// remember usage past it (as count or debt) until it has drained.
func TestAccountedUsageBlocksChecks(t *testing.T) {
	const minute = 60 * sec
	check := func(l algorithms.Limit, s algorithms.State, now int64) algorithms.Decision {
		_, d := algorithms.DecideMicros(l, s, now, 0)
		return d
	}
	for _, k := range algorithms.Kinds() {
		l := limitOf(k, 2, minute)
		var s algorithms.State
		now := at(0)
		// Requests of cost 1: the third check is denied (2 per minute).
		for i := 0; i < 2; i++ {
			if d := check(l, s, now); !d.Allowed {
				t.Fatalf("%s: check %d denied: %+v", k, i+1, d)
			}
			var d algorithms.Decision
			s, d = algorithms.AccountMicros(l, s, now, 1)
			if !d.Allowed {
				t.Fatalf("%s: charge %d did not fit: %+v", k, i+1, d)
			}
		}
		if d := check(l, s, now); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("%s: third check after 2 of 2 used: %+v", k, d)
		}
	}
	// A charge of 5 against 2 per minute, right after a passing check.
	for _, k := range algorithms.Kinds() {
		l := limitOf(k, 2, minute)
		now := at(0)
		s, d := algorithms.AccountMicros(l, algorithms.State{}, now, 5)
		if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
			t.Fatalf("%s: charge of 5 of 2: %+v", k, d)
		}
		// The check denies until exactly RetryAfter, and passes then.
		retry := d.RetryAfter.Microseconds()
		if c := check(l, s, now+retry-1); c.Allowed {
			t.Fatalf("%s: check 1µs before RetryAfter %v: %+v", k, d.RetryAfter, c)
		}
		if c := check(l, s, now+retry); !c.Allowed {
			t.Fatalf("%s: check at RetryAfter %v: %+v", k, d.RetryAfter, c)
		}
		var want time.Duration
		switch k {
		case algorithms.FixedWindow:
			want = minute // the window ends
		case algorithms.TokenBucket, algorithms.GCRA:
			// The debt of 5 is capped at 4 (2 below empty, MaxDebt), and
			// drains to 1 token at 2 per minute.
			want = 90 * sec
		case algorithms.SlidingWindowLog:
			want = minute // the entry of 5 slides out
		case algorithms.SlidingWindowCounter:
			// Next window: 5*(w-e) <= 1*w at e = 4/5 w.
			want = minute + 48*sec
		}
		if d.RetryAfter != want {
			t.Errorf("%s: RetryAfter %v, want %v", k, d.RetryAfter, want)
		}
	}
}

// TestAccountedUsageIsBounded: a client that checks with 0 hits and, when
// admitted, charges a random cost with Account at once never gets more than
// the limit plus one charge admitted within any window (a fixed window for
// fixed_window, any window-long interval for sliding_window_log).
func TestAccountedUsageIsBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, k := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindowLog} {
		for round := 0; round < 50; round++ {
			requests := 1 + rng.Uint64N(10)
			w := int64(1_000_000)
			l := algorithms.Limit{Algorithm: k, Requests: requests, Window: time.Duration(w) * time.Microsecond}
			maxCharge := 2 * requests
			var s algorithms.State
			type charge struct {
				at   int64
				hits uint64
			}
			var admitted []charge
			now := at(0)
			for step := 0; step < 300; step++ {
				now += rng.Int64N(w / 4)
				if _, d := algorithms.DecideMicros(l, s, now, 0); !d.Allowed {
					continue
				}
				c := 1 + rng.Uint64N(maxCharge)
				s, _ = algorithms.AccountMicros(l, s, now, c)
				admitted = append(admitted, charge{now, c})
			}
			for i, a := range admitted {
				var sum uint64
				for _, b := range admitted[i:] {
					inWindow := b.at < a.at+w
					if k == algorithms.FixedWindow {
						inWindow = b.at/w == a.at/w
					}
					if inWindow {
						sum += b.hits
					}
				}
				if sum > requests+maxCharge {
					t.Fatalf("%s round %d: %d admitted from %d, limit %d + charge %d", k, round, sum, a.at, requests, maxCharge)
				}
			}
		}
	}
}

// TestAccountSaturates: huge charges never overflow, and a full sliding log
// does not grow.
func TestAccountSaturates(t *testing.T) {
	for _, k := range algorithms.Kinds() {
		l := limitOf(k, 3, sec)
		var s algorithms.State
		now := at(0)
		for i := 0; i < 5; i++ {
			var d algorithms.Decision
			s, d = algorithms.AccountMicros(l, s, now, math.MaxUint64)
			if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.ResetAfter <= 0 {
				t.Fatalf("%s: huge charge %d: %+v", k, i, d)
			}
		}
		if _, d := algorithms.DecideMicros(l, s, now, 0); d.Allowed {
			t.Fatalf("%s: check after huge charges: %+v", k, d)
		}
	}
	// Zero requests: nothing is counted, nothing is allowed.
	zero := limitOf(algorithms.FixedWindow, 0, sec)
	s, d := algorithms.AccountMicros(zero, algorithms.State{}, at(0), 3)
	if d.Allowed || d.RetryAfter != algorithms.Never {
		t.Fatalf("zero requests: %+v", d)
	}
	// The state is still fresh: with a limit of 1 it allows one hit.
	if _, d := algorithms.DecideMicros(limitOf(algorithms.FixedWindow, 1, sec), s, at(0), 1); !d.Allowed {
		t.Fatalf("zero requests counted something: %+v", d)
	}
}

// TestAccountDebtIsCapped: a token_bucket or gcra charge, however large,
// leaves at most MaxDebt (one window's worth of the limit) below empty, so
// checks deny for one window and one emission interval and the state is
// fresh (Capacity()+Requests)/Requests windows later; for every algorithm
// a huge charge leaves the key exhausted for a bounded time that the
// Decision states, and checks deny until exactly RetryAfter.
func TestAccountDebtIsCapped(t *testing.T) {
	const hour = 60 * 60 * sec
	for _, k := range algorithms.Kinds() {
		for _, burst := range []uint64{0, 30} {
			if burst > 0 && !k.HasBurst() {
				continue
			}
			l := limitOf(k, 10, hour)
			l.Burst = burst
			for _, hits := range []uint64{l.Capacity() + 5, 1e9, 1e12, math.MaxUint64} {
				now := at(0)
				s, d := algorithms.AccountMicros(l, algorithms.State{}, now, hits)
				var retry, reset time.Duration
				switch k {
				case algorithms.TokenBucket, algorithms.GCRA:
					if got := algorithms.MaxDebt(l); got != 10 {
						t.Fatalf("%s: MaxDebt %d, want 10", k, got)
					}
					owed := float64(hits) - float64(l.Capacity()) // tokens below empty
					owed = min(owed, 10)
					retry = time.Duration((owed + 1) * float64(hour) / 10)
					reset = time.Duration((float64(l.Capacity()) + owed) * float64(hour) / 10)
				case algorithms.FixedWindow:
					retry, reset = hour, hour
				case algorithms.SlidingWindowLog:
					retry, reset = hour, hour
				case algorithms.SlidingWindowCounter:
					reset = 2 * hour
					// Next window: hits*(w-e) <= 9*w.
					retry = hour + hour - time.Duration(math.Floor(9*float64(hour/time.Microsecond)/float64(hits)))*time.Microsecond
				}
				if d.Allowed || d.RetryAfter != retry || d.ResetAfter != reset {
					t.Fatalf("%s burst %d, charge %d: %+v, want RetryAfter %v, ResetAfter %v", k, burst, hits, d, retry, reset)
				}
				r := d.RetryAfter.Microseconds()
				if _, c := algorithms.DecideMicros(l, s, now+r-1, 0); c.Allowed {
					t.Fatalf("%s burst %d, charge %d: check 1µs before RetryAfter: %+v", k, burst, hits, c)
				}
				if _, c := algorithms.DecideMicros(l, s, now+r, 0); !c.Allowed {
					t.Fatalf("%s burst %d, charge %d: check at RetryAfter: %+v", k, burst, hits, c)
				}
				if _, c := algorithms.DecideMicros(l, s, now+d.ResetAfter.Microseconds(), 0); !c.Allowed || c.Remaining != l.Capacity() || c.ResetAfter != 0 {
					t.Fatalf("%s burst %d, charge %d: at ResetAfter the state is not fresh: %+v", k, burst, hits, c)
				}
			}
		}
	}
	// The cap holds against debt already owed: another huge charge leaves
	// it where it is.
	l := limitOf(algorithms.GCRA, 10, hour)
	s, d1 := algorithms.AccountMicros(l, algorithms.State{}, at(0), 1e12)
	_, d2 := algorithms.AccountMicros(l, s, at(0), 1e12)
	if d1 != d2 {
		t.Fatalf("a second huge charge moved the capped debt: %+v then %+v", d1, d2)
	}
}
