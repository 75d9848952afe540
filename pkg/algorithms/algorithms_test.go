package algorithms_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/algorithms/algotest"
)

// decider threads a State through Decide for one limit, as a store does.
type decider struct {
	l algorithms.Limit
	s algorithms.State
}

func (d *decider) decide(at time.Time, hits uint64) algorithms.Decision {
	var dec algorithms.Decision
	d.s, dec = algorithms.Decide(d.l, d.s, at, hits)
	return dec
}

func TestCases(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range algotest.Cases() {
		if seen[c.Name] {
			t.Fatalf("duplicate case name %q", c.Name)
		}
		seen[c.Name] = true
		t.Run(c.Name, func(t *testing.T) {
			d := &decider{l: c.Limit}
			algotest.Run(t, c, d.decide)
		})
	}
}

const sec = time.Second

// at returns algotest.Base + d in µs, for DecideMicros.
func at(d time.Duration) int64 { return algotest.Base.Add(d).UnixMicro() }

func limitOf(k algorithms.Kind, requests uint64, window time.Duration) algorithms.Limit {
	return algorithms.Limit{Algorithm: k, Requests: requests, Window: window}
}

// before returns the capacity a decision saw before its request's hits.
func before(d algorithms.Decision, hits uint64) uint64 {
	if d.Allowed {
		return d.Remaining + hits
	}
	return d.Remaining
}

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

var hugeLimits = []uint64{1, 1000, math.MaxUint32, math.MaxUint32 + 1, 1 << 53, 1<<53 + 1, math.MaxUint64 - 1, math.MaxUint64}

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

// TestFixedWindowBoundaryBurst: fixed_window allows twice its limit across a
// window boundary, 1µs apart.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	l := limitOf(algorithms.FixedWindow, 100, time.Minute)
	s, d := algorithms.DecideMicros(l, algorithms.State{}, at(time.Minute-time.Microsecond), 100)
	if !d.Allowed {
		t.Fatalf("end of window: %+v", d)
	}
	allowed := 0
	for i := 0; i < 150; i++ {
		var d algorithms.Decision
		s, d = algorithms.DecideMicros(l, s, at(time.Minute), 1)
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 100 {
		t.Fatalf("allowed %d at the boundary, want 100 (2x the limit within 1µs)", allowed)
	}
}

// TestSlidingAlgorithmsPreventBoundaryBurst: after a full limit just before
// a window boundary, the other algorithms allow nothing right after it, and
// never more than the limit in any window-long span of a steady flood.
func TestSlidingAlgorithmsPreventBoundaryBurst(t *testing.T) {
	for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.SlidingWindowLog, algorithms.SlidingWindowCounter, algorithms.GCRA} {
		l := limitOf(k, 100, time.Minute)
		s, d := algorithms.DecideMicros(l, algorithms.State{}, at(time.Minute-time.Microsecond), 100)
		if !d.Allowed {
			t.Fatalf("%s: end of window: %+v", k, d)
		}
		for i := 0; i < 150; i++ {
			var d algorithms.Decision
			s, d = algorithms.DecideMicros(l, s, at(time.Minute), 1)
			if d.Allowed {
				t.Fatalf("%s: request %d at the boundary allowed: %+v", k, i, d)
			}
		}
	}
	// A flood of one hit every 10ms for 5 minutes against 100/min: count the
	// allowed hits in every 1-minute span ending at an allowed hit. The log is
	// exact; the bucket algorithms allow at most capacity + refill; the
	// counter's estimate allows at most the limit per span in a steady flood
	// (its weighting assumes an even previous window).
	for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.SlidingWindowLog, algorithms.SlidingWindowCounter, algorithms.GCRA} {
		l := limitOf(k, 100, time.Minute)
		var s algorithms.State
		var times []int64
		for now := at(0); now < at(5*time.Minute); now += 10_000 {
			var d algorithms.Decision
			s, d = algorithms.DecideMicros(l, s, now, 1)
			if d.Allowed {
				times = append(times, now)
			}
		}
		limit, from := 100, int64(math.MinInt64)
		if k.HasBurst() {
			// A bucket starts full, so its first minute holds the burst and
			// the refill; once it is empty it allows one hit per 600ms.
			limit, from = 101, at(2*time.Minute)
		}
		first := 0
		for i, t1 := range times {
			for times[first] <= t1-60_000_000 {
				first++
			}
			if t1-60_000_000 < from {
				continue
			}
			if n := i - first + 1; n > limit {
				t.Fatalf("%s: %d hits allowed in the minute up to %d", k, n, t1)
			}
		}
		if len(times) < 400 {
			t.Fatalf("%s: only %d hits allowed in 5 minutes of flood at 100/min", k, len(times))
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

// logModel is a naive sliding window log: every allowed request in a slice,
// everything recomputed on every decision.
type logModel struct {
	entries []struct {
		at   int64
		hits uint64
	}
	latest int64 // the instant of the last allowed request
}

func (m *logModel) decide(requests uint64, w, now int64, hits uint64) algorithms.Decision {
	now = max(now, m.latest, 0)
	type entry = struct {
		at   int64
		hits uint64
	}
	var live []entry
	var count uint64
	for _, e := range m.entries {
		if e.at > now-w {
			live = append(live, e)
			count += e.hits
		}
	}
	d := algorithms.Decision{Limit: requests, Remaining: requests - count}
	probe := max(hits, 1) // a check asks for room for one hit
	switch {
	case probe <= d.Remaining:
		// Allowed: the model moves to now, forgetting what has left.
		d.Allowed = true
		d.Remaining -= hits
		if hits > 0 {
			live = append(live, entry{now, hits})
		}
		m.entries, m.latest = live, now
	case hits > requests:
		d.RetryAfter = algorithms.Never
	default:
		// The earliest instant at which the hits in (t-w, t] leave room.
		for i := range live {
			var after uint64
			for _, e := range live[i+1:] {
				after += e.hits
			}
			if after+probe <= requests {
				d.RetryAfter = time.Duration(live[i].at+w-now) * time.Microsecond
				break
			}
		}
	}
	if n := len(live); n > 0 {
		d.ResetAfter = time.Duration(live[n-1].at+w-now) * time.Microsecond
	}
	return d
}

// TestSlidingLogMatchesNaiveModel compares sliding_window_log with a naive
// model on random timelines, clock steps backwards included.
func TestSlidingLogMatchesNaiveModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for round := 0; round < 300; round++ {
		requests := 1 + rng.Uint64N(12)
		w := 1 + rng.Int64N(2_000)
		l := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Requests: requests, Window: time.Duration(w) * time.Microsecond}
		var s algorithms.State
		var m logModel
		now := at(0)
		for step := 0; step < 200; step++ {
			now += rng.Int64N(w) - w/8
			hits := rng.Uint64N(requests + 2)
			var got algorithms.Decision
			s, got = algorithms.DecideMicros(l, s, now, hits)
			want := m.decide(requests, w, now, hits)
			if got != want {
				t.Fatalf("round %d step %d (requests %d, window %dµs, now %d, hits %d): %+v, model %+v",
					round, step, requests, w, now, hits, got, want)
			}
		}
	}
}

// TestRetryAndResetAreExact: on random timelines with small numbers (where
// every algorithm is exact), a denied request is allowed exactly RetryAfter
// later and not 1µs sooner, and a limit is whole exactly ResetAfter later
// and not 1µs sooner.
func TestRetryAndResetAreExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	windows := []time.Duration{7 * time.Microsecond, time.Millisecond, time.Second, 7 * time.Second, time.Minute}
	for _, k := range algorithms.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			for round := 0; round < 300; round++ {
				l := algorithms.Limit{Algorithm: k, Requests: 1 + rng.Uint64N(9), Window: windows[rng.IntN(len(windows))]}
				if k.HasBurst() && rng.IntN(2) == 0 {
					l.Burst = 1 + rng.Uint64N(9)
				}
				w := l.Window.Microseconds()
				var s algorithms.State
				now := at(0) + rng.Int64N(w)
				for step := 0; step < 60; step++ {
					now += rng.Int64N(w/3 + 1)
					hits := rng.Uint64N(l.Capacity() + 2)
					next, d := algorithms.DecideMicros(l, s, now, hits)
					where := fmt.Sprintf("round %d step %d (%+v, now %d, hits %d): %+v", round, step, l, now, hits, d)
					if !d.Allowed && d.RetryAfter != algorithms.Never {
						r := d.RetryAfter.Microseconds()
						if _, later := algorithms.DecideMicros(l, s, now+r, hits); !later.Allowed {
							t.Fatalf("%s: denied again RetryAfter later: %+v", where, later)
						}
						if _, sooner := algorithms.DecideMicros(l, s, now+r-1, hits); sooner.Allowed && r > 0 {
							t.Fatalf("%s: allowed 1µs before RetryAfter: %+v", where, sooner)
						}
					}
					if d.RetryAfter == algorithms.Never && hits <= l.Capacity() {
						t.Fatalf("%s: Never for a request within capacity", where)
					}
					rs := d.ResetAfter.Microseconds()
					if _, full := algorithms.DecideMicros(l, next, now+rs, 0); full.Remaining != l.Capacity() {
						t.Fatalf("%s: not whole ResetAfter later: %+v", where, full)
					}
					if rs > 0 {
						if _, before := algorithms.DecideMicros(l, next, now+rs-1, 0); before.Remaining == l.Capacity() {
							t.Fatalf("%s: whole 1µs before ResetAfter: %+v", where, before)
						}
					}
					s = next
				}
			}
		})
	}
}

func TestDecideMatchesDecideMicros(t *testing.T) {
	l := limitOf(algorithms.TokenBucket, 3, time.Second)
	now := algotest.Base.Add(1234567 * time.Nanosecond) // finer than µs is ignored
	s1, d1 := algorithms.Decide(l, algorithms.State{}, now, 2)
	s2, d2 := algorithms.DecideMicros(l, algorithms.State{}, now.UnixMicro(), 2)
	if d1 != d2 {
		t.Fatalf("Decide %+v, DecideMicros %+v", d1, d2)
	}
	_, d1 = algorithms.Decide(l, s1, now.Add(time.Second), 3)
	_, d2 = algorithms.DecideMicros(l, s2, now.Add(time.Second).UnixMicro(), 3)
	if d1 != d2 || !d1.Allowed {
		t.Fatalf("Decide %+v, DecideMicros %+v", d1, d2)
	}
}

func TestKindNames(t *testing.T) {
	want := []string{"fixed_window", "token_bucket", "sliding_window_log", "sliding_window_counter", "gcra"}
	kinds := algorithms.Kinds()
	if len(kinds) != len(want) {
		t.Fatalf("Kinds() = %v", kinds)
	}
	for i, k := range kinds {
		if int(k) != i || k.String() != want[i] {
			t.Errorf("Kinds()[%d] = %d %q, want %d %q", i, k, k, i, want[i])
		}
		got, ok := algorithms.ParseKind(k.String())
		if !ok || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), got, ok)
		}
		if k.HasBurst() != (k == algorithms.TokenBucket || k == algorithms.GCRA) {
			t.Errorf("%s.HasBurst() = %v", k, k.HasBurst())
		}
	}
	if s := algorithms.Kind(9).String(); s != "algorithm(9)" {
		t.Errorf("Kind(9).String() = %q", s)
	}
	for _, bad := range []string{"", "Fixed_Window", "token-bucket", "gcra ", "algorithm(9)"} {
		if k, ok := algorithms.ParseKind(bad); ok {
			t.Errorf("ParseKind(%q) = %v, true", bad, k)
		}
	}
	var zero algorithms.Kind
	if zero != algorithms.FixedWindow {
		t.Errorf("the zero Kind is %s, want fixed_window", zero)
	}
}

func TestLimitValidate(t *testing.T) {
	valid := []algorithms.Limit{
		{Requests: 10, Window: time.Second},
		{Algorithm: algorithms.SlidingWindowLog, Requests: 0, Window: time.Microsecond},
		{Algorithm: algorithms.TokenBucket, Requests: 1, Window: time.Hour, Burst: 10},
		{Algorithm: algorithms.GCRA, Requests: math.MaxUint64, Window: time.Duration(math.MaxInt64), Burst: math.MaxUint64},
		{Algorithm: algorithms.SlidingWindowCounter, Requests: 5, Window: 1500 * time.Nanosecond},
	}
	for _, l := range valid {
		if err := l.Validate(); err != nil {
			t.Errorf("%+v: %v", l, err)
		}
	}
	invalid := []algorithms.Limit{
		{Algorithm: 5, Requests: 1, Window: time.Second},
		{Algorithm: 255, Requests: 1, Window: time.Second},
		{Requests: 1},
		{Requests: 1, Window: 999 * time.Nanosecond},
		{Requests: 1, Window: -time.Second},
		{Algorithm: algorithms.FixedWindow, Requests: 1, Window: time.Second, Burst: 2},
		{Algorithm: algorithms.SlidingWindowLog, Requests: 1, Window: time.Second, Burst: 2},
		{Algorithm: algorithms.SlidingWindowCounter, Requests: 1, Window: time.Second, Burst: 2},
	}
	for _, l := range invalid {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", l)
		}
	}
}

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
			want = 2 * minute // the debt of 5 drains to 1 token at 2 per minute
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
