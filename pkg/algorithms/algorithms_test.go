package algorithms_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
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

var hugeLimits = []uint64{1, 1000, math.MaxUint32, math.MaxUint32 + 1, 1 << 53, 1<<53 + 1, math.MaxUint64 - 1, math.MaxUint64}

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

// TestInPlaceMatchesValues: DecideInPlace and AccountInPlace decide as
// DecideMicros and AccountMicros on random timelines (clock steps back
// included, checks, requests larger than the limit, accounting), leave the
// state as it is when they deny (accounting aside), and otherwise leave the
// state the value functions return.
func TestInPlaceMatchesValues(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, k := range algorithms.Kinds() {
		for _, requests := range []uint64{0, 1, 3, 10} {
			l := limitOf(k, requests, 10*time.Second)
			var byValue, inPlace algorithms.State
			now := algotest.Base.UnixMicro()
			for step := range 2000 {
				now += rng.Int64N(3_000_000) - 500_000
				hits := rng.Uint64N(requests + 3)
				account := rng.IntN(4) == 0
				was := inPlace
				var next algorithms.State
				var want, got algorithms.Decision
				if account {
					next, want = algorithms.AccountMicros(l, byValue, now, hits)
					got = algorithms.AccountInPlace(&l, &inPlace, now, hits)
				} else {
					next, want = algorithms.DecideMicros(l, byValue, now, hits)
					got = algorithms.DecideInPlace(&l, &inPlace, now, hits)
				}
				if got != want {
					t.Fatalf("%v limit %d step %d: in place %+v, by value %+v", k, requests, step, got, want)
				}
				if !got.Allowed && !(account && hits > 0) && !reflect.DeepEqual(inPlace, was) {
					t.Fatalf("%v limit %d step %d: a denial changed the state in place", k, requests, step)
				}
				byValue = next
				if !reflect.DeepEqual(inPlace, byValue) {
					t.Fatalf("%v limit %d step %d: in place %+v, by value %+v", k, requests, step, inPlace, byValue)
				}
			}
		}
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
