package algorithms_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// TestClockStepsBackwardsNeverGrants builds random histories and checks, at
// every step, that deciding at an instant earlier than the latest one seen
// is never more permissive than deciding at the latest one, and that it
// never leaves a state that grants more afterwards.
func TestClockStepsBackwardsNeverGrants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, k := range algorithms.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			l := limitOf(k, 5, sec)
			for round := 0; round < 200; round++ {
				var s algorithms.State
				latest := at(0)
				for step := 0; step < 30; step++ {
					latest += rng.Int64N(400_000)
					hits := rng.Uint64N(3)
					s, _ = algorithms.DecideMicros(l, s, latest, hits)

					back := latest - rng.Int64N(3_000_000) - 1
					h := rng.Uint64N(6)
					sb, db := algorithms.DecideMicros(l, s, back, h)
					_, dl := algorithms.DecideMicros(l, s, latest, h)
					if db.Allowed && !dl.Allowed || before(db, h) > before(dl, h) {
						t.Fatalf("round %d step %d: at %d (latest %d) hits %d: back %+v, latest %+v",
							round, step, back, latest, h, db, dl)
					}
					// Charging hits at a backwards instant never leaves more
					// capacity at the latest instant than there was before.
					_, after := algorithms.DecideMicros(l, sb, latest, 0)
					_, ref := algorithms.DecideMicros(l, s, latest, 0)
					if after.Remaining > ref.Remaining {
						t.Fatalf("round %d step %d: after %d hits at %d, remaining at latest %d is %d, was %d",
							round, step, h, back, latest, after.Remaining, ref.Remaining)
					}
				}
			}
		})
	}
	// The clamping algorithms decide a backwards instant exactly as the
	// latest one seen.
	for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA, algorithms.SlidingWindowLog} {
		l := limitOf(k, 3, sec)
		s, _ := algorithms.DecideMicros(l, algorithms.State{}, at(10*sec), 3)
		for _, back := range []int64{at(10*sec) - 1, at(0), 0, -1, math.MinInt64} {
			_, db := algorithms.DecideMicros(l, s, back, 1)
			_, dl := algorithms.DecideMicros(l, s, at(10*sec), 1)
			if db != dl {
				t.Errorf("%s at %d: %+v, want the decision at the latest instant %+v", k, back, db, dl)
			}
		}
	}
}

// TestHugeHitsNeverOverflow: a request above a limit's capacity is denied
// with RetryAfter Never, however large; a full limit denies another full
// request; counts never wrap around.
func TestHugeHitsNeverOverflow(t *testing.T) {
	for _, k := range algorithms.Kinds() {
		for _, n := range hugeLimits {
			l := limitOf(k, n, sec)
			name := fmt.Sprintf("%s/%d", k, n)
			var s algorithms.State
			now := at(0)
			// Counts times the window (1e6 µs) below 2^53 are exact in every
			// algorithm; fixed_window and sliding_window_log are always exact.
			exact := n <= 9_007_199_254 || k == algorithms.FixedWindow || k == algorithms.SlidingWindowLog
			near := func(r uint64) bool { // r is n, or within float64 rounding of it
				if exact {
					return r == n
				}
				diff := max(r, n) - min(r, n)
				return diff <= n>>40
			}
			if n < math.MaxUint64 {
				_, d := algorithms.DecideMicros(l, s, now, math.MaxUint64)
				if d.Allowed || d.RetryAfter != algorithms.Never || !near(d.Remaining) || d.Limit != n {
					t.Errorf("%s: MaxUint64 hits on a fresh key: %+v", name, d)
				}
				_, d = algorithms.DecideMicros(l, s, now, n+1)
				if d.Allowed || d.RetryAfter != algorithms.Never {
					t.Errorf("%s: capacity+1 hits on a fresh key: %+v", name, d)
				}
			}
			s, d := algorithms.DecideMicros(l, s, now, n)
			if !d.Allowed || d.Remaining != 0 {
				t.Fatalf("%s: capacity hits on a fresh key: %+v", name, d)
			}
			for i := 0; i < 3; i++ {
				var again algorithms.Decision
				s, again = algorithms.DecideMicros(l, s, now, n)
				if again.Allowed || again.Remaining != 0 || again.RetryAfter == 0 {
					t.Fatalf("%s: a second full request at the same instant: %+v", name, again)
				}
				var big algorithms.Decision
				s, big = algorithms.DecideMicros(l, s, now, math.MaxUint64)
				if big.Allowed {
					t.Fatalf("%s: MaxUint64 hits on a full limit: %+v", name, big)
				}
			}
			// Where exact, not even one more hit.
			if exact {
				_, one := algorithms.DecideMicros(l, s, now, 1)
				if one.Allowed {
					t.Errorf("%s: one hit on a full limit: %+v", name, one)
				}
			}
			// Later, the limit is whole again.
			_, d = algorithms.DecideMicros(l, s, now+10_000_000, 0)
			if !d.Allowed || !near(d.Remaining) || d.ResetAfter != 0 {
				t.Errorf("%s: check 10s later: %+v", name, d)
			}
		}
	}
}

// TestHugeBurstNeverOverflows covers capacities set by Burst.
func TestHugeBurstNeverOverflows(t *testing.T) {
	for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.GCRA} {
		for _, burst := range hugeLimits {
			l := algorithms.Limit{Algorithm: k, Requests: 1, Window: time.Hour, Burst: burst}
			s, d := algorithms.DecideMicros(l, algorithms.State{}, at(0), burst)
			if !d.Allowed || d.Limit != burst || d.Remaining != 0 {
				t.Fatalf("%s burst %d: %+v", k, burst, d)
			}
			_, d = algorithms.DecideMicros(l, s, at(0), burst)
			if d.Allowed || d.RetryAfter == 0 {
				t.Errorf("%s burst %d: second burst: %+v", k, burst, d)
			}
			if burst < math.MaxUint64 {
				_, d = algorithms.DecideMicros(l, algorithms.State{}, at(0), burst+1)
				if d.Allowed || d.RetryAfter != algorithms.Never {
					t.Errorf("%s burst %d: burst+1 hits: %+v", k, burst, d)
				}
			}
		}
	}
}

// TestYearsOfIdle: after any idle time, up to the far end of int64 µs, a
// limit is whole again and decides sanely; huge windows do not overflow.
func TestYearsOfIdle(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, k := range algorithms.Kinds() {
		for _, w := range []time.Duration{time.Microsecond, time.Second, time.Hour, 100 * year, time.Duration(math.MaxInt64)} {
			l := limitOf(k, 7, w)
			name := fmt.Sprintf("%s/%v", k, w)
			s, d := algorithms.DecideMicros(l, algorithms.State{}, at(0), 7)
			if !d.Allowed || d.ResetAfter <= 0 {
				t.Fatalf("%s: %+v", name, d)
			}
			for _, idle := range []int64{int64(year / time.Microsecond), 250 * int64(year/time.Microsecond)} {
				_, d = algorithms.DecideMicros(l, s, at(0)+idle, 0)
				full := d.Allowed && d.Remaining == 7 && d.ResetAfter == 0
				if w <= time.Hour && !full {
					t.Errorf("%s: after %d µs idle: %+v", name, idle, d)
				}
				if d.Remaining > 7 || d.ResetAfter < 0 || d.RetryAfter < 0 || d.Allowed != (d.Remaining > 0) {
					t.Errorf("%s: after %d µs idle: %+v", name, idle, d)
				}
			}
			// The last representable instant.
			s2, d := algorithms.DecideMicros(l, s, math.MaxInt64, 7)
			if w <= time.Hour && (!d.Allowed || d.Remaining != 0) {
				t.Errorf("%s: at MaxInt64: %+v", name, d)
			}
			if d.ResetAfter < 0 || d.RetryAfter < 0 {
				t.Errorf("%s: at MaxInt64: %+v", name, d)
			}
			_, d = algorithms.DecideMicros(l, s2, math.MaxInt64, 1)
			if d.Allowed && w <= time.Hour {
				t.Errorf("%s: at MaxInt64, one more: %+v", name, d)
			}
		}
	}
}

// TestDecideDoesNotModifyInput: Decide returns new state and leaves the one
// it was given usable. For sliding_window_log, whose log storage is shared
// between old and new State, a random walk derives chains of States at one
// instant (like a store deciding items of one key), then either carries the
// last one forward or goes back to the State before the chain (like a store
// whose request was denied). The States carried forward must decide exactly
// as a lineage that replays only the carried-forward requests on storage of
// its own. The walk grows the log, wraps it around, and shrinks it.
func TestDecideDoesNotModifyInput(t *testing.T) {
	for _, k := range algorithms.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(k)))
			for _, requests := range []uint64{1, 3, 7, 20} {
				l := limitOf(k, requests, 100*time.Millisecond)
				var kept, ref algorithms.State
				now := at(0)
				for step := 0; step < 3000; step++ {
					if rng.IntN(3) > 0 {
						now += rng.Int64N(30_000)
					}
					// Probe the kept State before and after the chain.
					h := rng.Uint64N(requests + 2)
					_, before := algorithms.DecideMicros(l, kept, now, h)

					chain := []algorithms.State{kept}
					var hits []uint64
					for n := 1 + rng.IntN(4); n > 0; n-- {
						h := rng.Uint64N(3)
						s, _ := algorithms.DecideMicros(l, chain[len(chain)-1], now, h)
						chain = append(chain, s)
						hits = append(hits, h)
					}
					// Keep a prefix of the chain: none of it, part or all.
					keep := rng.IntN(len(chain))
					if keep == 0 {
						// Going back: the kept State decides as before the chain.
						if _, after := algorithms.DecideMicros(l, kept, now, h); after != before {
							t.Fatalf("requests %d step %d: deriving a chain changed the kept State's decision: %+v, then %+v",
								requests, step, before, after)
						}
					}
					for _, h := range hits[:keep] {
						ref, _ = algorithms.DecideMicros(l, ref, now, h)
					}
					kept = chain[keep]
					for _, probe := range []uint64{0, 1, requests} {
						_, got := algorithms.DecideMicros(l, kept, now, probe)
						_, want := algorithms.DecideMicros(l, ref, now, probe)
						if got != want {
							t.Fatalf("requests %d step %d: kept %d of %d derivations; probe %d: %+v, replayed lineage %+v",
								requests, step, keep, len(hits), probe, got, want)
						}
					}
				}
			}
		})
	}
}

// TestDecideKeepsParentAcrossInstants: the documented guarantee across
// instants — a caller may keep the State it gave to Decide and discard the
// result, however the log storage grows or wraps.
func TestDecideKeepsParentAcrossInstants(t *testing.T) {
	l := limitOf(algorithms.SlidingWindowLog, 6, time.Second)
	rng := rand.New(rand.NewPCG(5, 6))
	var kept, ref algorithms.State
	now := at(0)
	for step := 0; step < 5000; step++ {
		now += rng.Int64N(300_000)
		h := rng.Uint64N(3)
		next, d := algorithms.DecideMicros(l, kept, now, h)
		if rng.IntN(2) == 0 && d.Allowed {
			continue // discard next and decide the next request from kept
		}
		kept = next
		ref, _ = algorithms.DecideMicros(l, ref, now, h)
		for _, probe := range []uint64{0, 1, 6} {
			_, got := algorithms.DecideMicros(l, kept, now, probe)
			_, want := algorithms.DecideMicros(l, ref, now, probe)
			if got != want {
				t.Fatalf("step %d probe %d: %+v, replayed lineage %+v", step, probe, got, want)
			}
		}
	}
}
