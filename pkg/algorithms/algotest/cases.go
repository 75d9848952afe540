package algotest

import (
	"math"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

const maxU64 = math.MaxUint64

// Cases returns the single-key timelines for every algorithm. Each call
// returns fresh slices.
func Cases() []Case {
	var cs []Case
	cs = append(cs, fixedWindowCases()...)
	cs = append(cs, bucketCases(algorithms.TokenBucket)...)
	cs = append(cs, bucketCases(algorithms.GCRA)...)
	cs = append(cs, slidingLogCases()...)
	cs = append(cs, slidingCounterCases()...)
	for _, k := range algorithms.Kinds() {
		cs = append(cs, zeroRequests(k), boundary(k))
	}
	cs = append(cs, zeroRateWithBurst(algorithms.TokenBucket), zeroRateWithBurst(algorithms.GCRA))
	return cs
}

func lim(k algorithms.Kind, requests uint64, window time.Duration) algorithms.Limit {
	return algorithms.Limit{Algorithm: k, Requests: requests, Window: window}
}

func fixedWindowCases() []Case {
	fw := algorithms.FixedWindow
	return []Case{{
		Name:  "fixed_window/basic",
		Limit: lim(fw, 3, sec),
		Steps: []Step{
			allow(0, 1, 3, 2, sec), // fresh key: window [0, 1s)
			allow(100*ms, 1, 3, 1, 900*ms),
			allow(200*ms, 1, 3, 0, 800*ms), // exhausted
			deny(300*ms, 1, 3, 0, 700*ms, 700*ms),
			deny(300*ms, 0, 3, 0, 700*ms, 700*ms), // a check denies: no room for one hit
			deny(999999*us, 1, 3, 0, us, us),
			allow(sec, 1, 3, 2, sec), // recovered: next window
			allow(sec+us, 2, 3, 0, 999999*us),
			deny(1500*ms, 4, 3, 0, never, 500*ms), // above the limit
			deny(1500*ms, 1, 3, 0, 500*ms, 500*ms),
			allow(5*sec, 0, 3, 3, 0),       // idle: fresh again
			deny(5*sec, 4, 3, 3, never, 0), // nothing counted: reset 0
			deny(5*sec, maxU64, 3, 3, never, 0),
			allow(5250*ms, 3, 3, 0, 750*ms),
		},
	}, {
		Name:  "fixed_window/mid_window_start",
		Limit: lim(fw, 10, minute),
		Steps: []Step{
			allow(45*sec, 4, 10, 6, 15*sec),
			allow(60*sec-us, 6, 10, 0, us),
			allow(60*sec, 10, 10, 0, 60*sec), // 20 hits within 15s
			deny(60*sec, 1, 10, 0, 60*sec, 60*sec),
		},
	}, {
		// Base is 1s into a 7s window: windows are [-1s, 6s), [6s, 13s), ...
		Name:  "fixed_window/unaligned_window",
		Limit: lim(fw, 2, 7*sec),
		Steps: []Step{
			allow(0, 1, 2, 1, 6*sec),
			allow(6*sec-us, 1, 2, 0, us),
			deny(6*sec-us, 1, 2, 0, us, us),
			allow(6*sec, 2, 2, 0, 7*sec),
			deny(12900*ms, 1, 2, 0, 100*ms, 100*ms),
			allow(13*sec, 1, 2, 1, 7*sec),
		},
	}, {
		Name:  "fixed_window/clock_steps_backwards",
		Limit: lim(fw, 2, sec),
		Steps: []Step{
			allow(1500*ms, 2, 2, 0, 500*ms), // window [1s, 2s)
			// Back within the window: same count; the window still ends at 2s.
			deny(1200*ms, 1, 2, 0, 800*ms, 800*ms),
			allow(2500*ms, 2, 2, 0, 500*ms), // window [2s, 3s)
			// Back into an earlier window: treated as the start of [2s, 3s).
			deny(1900*ms, 1, 2, 0, sec, sec),
			deny(500*ms, 0, 2, 0, sec, sec), // a check, like one hit
			deny(-hour, 1, 2, 0, sec, sec),
			deny(-60*year, 1, 2, 0, sec, sec), // before the Unix epoch
			allow(3*sec, 1, 2, 1, sec),
		},
	}, {
		Name:  "fixed_window/years_idle",
		Limit: lim(fw, 3, hour),
		Steps: []Step{
			allow(0, 3, 3, 0, hour),
			deny(0, 1, 3, 0, hour, hour),
			allow(10*year, 1, 3, 2, hour),
			allow(200*year, 3, 3, 0, hour),
		},
	}, {
		Name:  "fixed_window/huge_limit_maxuint32",
		Limit: lim(fw, math.MaxUint32, sec),
		Steps: []Step{
			deny(0, maxU64, math.MaxUint32, math.MaxUint32, never, 0),
			allow(0, math.MaxUint32-1, math.MaxUint32, 1, sec),
			deny(0, 2, math.MaxUint32, 1, sec, sec),
			allow(500*ms, 1, math.MaxUint32, 0, 500*ms),
			deny(500*ms, 1, math.MaxUint32, 0, 500*ms, 500*ms),
			allow(sec, math.MaxUint32, math.MaxUint32, 0, sec),
		},
	}, {
		Name:  "fixed_window/huge_limit_maxuint64",
		Limit: lim(fw, maxU64, sec),
		Huge:  true,
		Steps: []Step{
			allow(0, maxU64, maxU64, 0, sec),
			deny(0, 1, maxU64, 0, sec, sec),
			allow(sec, 1, maxU64, maxU64-1, sec),
			deny(sec, maxU64, maxU64, maxU64-1, sec, sec),
			allow(sec, 0, maxU64, maxU64-1, sec),
		},
	}}
}

// bucketCases are the timelines of TokenBucket and GCRA, which decide alike.
// In the comments, "debt" is in token·µs (tokens missing × window µs): a hit
// adds w, every µs takes Requests off, and a request fits while the debt
// stays within capacity×w. RetryAfter = ceil((debt+hits×w-capacity×w)/Requests),
// ResetAfter = ceil(debt/Requests), Remaining = floor((capacity×w-debt)/w).
func bucketCases(k algorithms.Kind) []Case {
	name := k.String() + "/"
	burst := func(requests uint64, window time.Duration, burst uint64) algorithms.Limit {
		return algorithms.Limit{Algorithm: k, Requests: requests, Window: window, Burst: burst}
	}
	u32 := uint64(math.MaxUint32)
	return []Case{{
		// 4/s: w = 1e6, full = 4e6, refill 4 per µs (a token per 250ms).
		Name:  name + "basic",
		Limit: lim(k, 4, sec),
		Steps: []Step{
			allow(0, 1, 4, 3, 250*ms), // fresh: debt 1e6
			allow(0, 3, 4, 0, sec),    // debt 4e6: empty
			deny(0, 1, 4, 0, 250*ms, sec),
			// debt 4e6-1e5*4 = 3.6e6; 0.4 tokens; retry 0.6e6/4, reset 3.6e6/4.
			deny(100*ms, 1, 4, 0, 150*ms, 900*ms),
			deny(100*ms, 0, 4, 0, 150*ms, 900*ms), // a check waits for one token
			allow(250*ms, 1, 4, 0, sec),           // exactly when promised: debt 3e6+1e6
			deny(250*ms, 5, 4, 0, never, sec),
			deny(250*ms, maxU64, 4, 0, never, sec),
			allow(750*ms, 2, 4, 0, sec), // debt 4e6-5e5*4 = 2e6, +2e6
			// debt 4e6-4.5e5*4 = 2.2e6: 1.8 tokens; retry 1.2e6/4, reset 2.2e6/4.
			deny(1200*ms, 3, 4, 1, 300*ms, 550*ms),
			allow(1500*ms, 3, 4, 0, sec), // debt 4e6-7.5e5*4 = 1e6, +3e6
			allow(10*sec, 0, 4, 4, 0),    // full again
			allow(10*sec, 4, 4, 0, sec),
		},
	}, {
		// 2/s with a burst of 5: full = 5e6, refill 2 per µs.
		Name:  name + "burst_above_rate",
		Limit: burst(2, sec, 5),
		Steps: []Step{
			allow(0, 5, 5, 0, 2500*ms), // the whole burst at once
			deny(0, 1, 5, 0, 500*ms, 2500*ms),
			allow(500*ms, 1, 5, 0, 2500*ms), // debt 5e6-1e6+1e6
			allow(1500*ms, 2, 5, 0, 2500*ms),
			deny(1500*ms, 6, 5, 0, never, 2500*ms), // above the burst
			allow(4*sec, 0, 5, 5, 0),
			allow(4*sec, 3, 5, 2, 1500*ms),
			// debt 3e6-2.5e5*2 = 2.5e6; retry (2.5e6+3e6-5e6)/2, reset 2.5e6/2.
			deny(4250*ms, 3, 5, 2, 250*ms, 1250*ms),
		},
	}, {
		// 10/s with a burst of 2: full = 2e6, refill 10 per µs.
		Name:  name + "burst_below_rate",
		Limit: burst(10, sec, 2),
		Steps: []Step{
			allow(0, 2, 2, 0, 200*ms),
			// debt 2e6-5e4*10 = 1.5e6: retry 0.5e6/10, reset 1.5e6/10.
			deny(50*ms, 1, 2, 0, 50*ms, 150*ms),
			allow(100*ms, 1, 2, 0, 200*ms),
			deny(100*ms, 3, 2, 0, never, 200*ms),
			allow(sec, 2, 2, 0, 200*ms), // never more than the burst at once
			deny(sec, 1, 2, 0, 100*ms, 200*ms),
		},
	}, {
		// 7/min: an emission interval of 60e6/7 = 8571428.57µs. w = 6e7,
		// full = 4.2e8, refill 7 per µs.
		Name:  name + "fractional_interval",
		Limit: lim(k, 7, minute),
		Steps: []Step{
			allow(0, 7, 7, 0, minute),
			deny(0, 1, 7, 0, 8571429*us, minute), // ceil(6e7/7)
			// debt 4.2e8-8571428*7 = 360000004: 4 token·µs short.
			deny(8571428*us, 1, 7, 0, us, 51428572*us),
			// debt 4.2e8-60000003 = 359999997, +6e7 = 419999997;
			// reset ceil(419999997/7) = 60000000.
			allow(8571429*us, 1, 7, 0, minute),
			// debt 419999997-21428571*7 = 2.7e8, +6e7 = 3.3e8: 1.5 tokens left;
			// reset ceil(3.3e8/7) = 47142858.
			allow(30*sec, 1, 7, 1, 47142858*us),
			// 3.3e8+1.2e8 = 4.5e8: retry ceil(3e7/7) = 4285715.
			deny(30*sec, 2, 7, 1, 4285715*us, 47142858*us),
			// debt 3.3e8-4285715*7 = 299999995, +1.2e8 = 419999995.
			allow(34285715*us, 2, 7, 0, minute),
		},
	}, {
		Name:  name + "clock_steps_backwards",
		Limit: lim(k, 2, sec),
		Steps: []Step{
			allow(10*sec, 2, 2, 0, sec),
			deny(9*sec, 1, 2, 0, 500*ms, sec), // decided at 10s
			deny(-hour, 0, 2, 0, 500*ms, sec), // a check, decided at 10s
			allow(10500*ms, 1, 2, 0, sec),
			deny(10400*ms, 1, 2, 0, 500*ms, sec), // decided at 10.5s
			deny(-60*year, 1, 2, 0, 500*ms, sec), // before the Unix epoch
			allow(11*sec, 1, 2, 0, sec),
		},
	}, {
		// 3/h: w = 3.6e9, full = 1.08e10.
		Name:  name + "years_idle",
		Limit: lim(k, 3, hour),
		Steps: []Step{
			allow(0, 3, 3, 0, hour),
			deny(0, 1, 3, 0, 20*minute, hour),
			allow(10*year, 3, 3, 0, hour),
			allow(200*year, 1, 3, 2, 20*minute),
		},
	}, {
		// full = 4294967295e6 < 2^53: exact.
		Name:  name + "huge_limit_maxuint32",
		Limit: lim(k, u32, sec),
		Steps: []Step{
			deny(0, maxU64, u32, u32, never, 0),
			allow(0, u32, u32, 0, sec),
			deny(0, 1, u32, 0, us, sec), // ceil(1e6/4294967295)
			// debt full-4294967295 (1µs of refill), +1e6: full-need =
			// 4293967295, so 4293 whole tokens; reset ceil(need/R) = 1e6.
			allow(us, 1, u32, 4293, sec),
			// Refill over 999999µs leaves a debt of exactly 1e6 (one token).
			deny(sec, u32, u32, u32-1, us, us),
			allow(sec+us, u32, u32, 0, sec),
		},
	}, {
		// Beyond 2^53 the float64 debt is approximate; these steps are exact
		// either way: float64(MaxUint64) = 2^64 and full = 2^64×1e6.
		Name:  name + "huge_limit_maxuint64",
		Limit: lim(k, maxU64, sec),
		Steps: []Step{
			allow(0, maxU64, maxU64, 0, sec),
			deny(0, maxU64, maxU64, 0, sec, sec),
			allow(3*sec, 0, maxU64, maxU64, 0),
			allow(3*sec, maxU64, maxU64, 0, sec),
		},
	}}
}

func slidingLogCases() []Case {
	swl := algorithms.SlidingWindowLog
	u32 := uint64(math.MaxUint32)
	cs := []Case{{
		// RetryAfter: when enough of the oldest entries leave the window
		// (an entry at t counts until t+w). ResetAfter: when the newest does.
		Name:  "sliding_window_log/basic",
		Limit: lim(swl, 3, sec),
		Steps: []Step{
			allow(0, 1, 3, 2, sec),
			allow(200*ms, 1, 3, 1, sec),
			allow(400*ms, 1, 3, 0, sec),
			deny(500*ms, 1, 3, 0, 500*ms, 900*ms),
			deny(500*ms, 0, 3, 0, 500*ms, 900*ms), // a check waits for one hit's room
			deny(999999*us, 1, 3, 0, us, 400001*us),
			allow(sec, 1, 3, 0, sec), // the entry at 0 left
			// Entries 200ms, 400ms, 1s: two must leave, the second at 1.4s.
			deny(1100*ms, 2, 3, 0, 300*ms, 900*ms),
			deny(1100*ms, 4, 3, 0, never, 900*ms),
			allow(1400*ms, 2, 3, 0, sec),
			allow(5*sec, 0, 3, 3, 0),
			deny(5*sec, maxU64, 3, 3, never, 0),
			allow(5*sec, 3, 3, 0, sec),
			// One entry of 3 hits frees all three at once.
			deny(5500*ms, 1, 3, 0, 500*ms, 500*ms),
			allow(6*sec, 2, 3, 1, sec),
		},
	}, {
		Name:  "sliding_window_log/clock_steps_backwards",
		Limit: lim(swl, 2, sec),
		Steps: []Step{
			allow(10*sec, 1, 2, 1, sec),
			allow(10500*ms, 1, 2, 0, sec),
			deny(10200*ms, 1, 2, 0, 500*ms, sec), // decided at 10.5s
			allow(11200*ms, 1, 2, 0, sec),        // the entry at 10s left
			deny(9*sec, 0, 2, 0, 300*ms, sec),    // a check, decided at 11.2s
			deny(-hour, 1, 2, 0, 300*ms, sec),
			deny(-60*year, 1, 2, 0, 300*ms, sec),
			allow(11500*ms, 1, 2, 0, sec),
		},
	}, {
		Name:  "sliding_window_log/years_idle",
		Limit: lim(swl, 3, hour),
		Steps: []Step{
			allow(0, 3, 3, 0, hour),
			deny(0, 1, 3, 0, hour, hour),
			allow(10*year, 2, 3, 1, hour),
			allow(200*year, 2, 3, 1, hour),
		},
	}, {
		Name:  "sliding_window_log/huge_limit_maxuint32",
		Limit: lim(swl, u32, sec),
		Steps: []Step{
			deny(0, maxU64, u32, u32, never, 0),
			allow(0, u32-1, u32, 1, sec),
			deny(0, 2, u32, 1, sec, sec),
			allow(500*ms, 1, u32, 0, sec),
			deny(500*ms, 1, u32, 0, 500*ms, sec),
			allow(sec, 1, u32, u32-2, sec),
		},
	}, {
		Name:  "sliding_window_log/huge_limit_maxuint64",
		Limit: lim(swl, maxU64, sec),
		Huge:  true,
		Steps: []Step{
			allow(0, maxU64, maxU64, 0, sec),
			deny(0, 1, maxU64, 0, sec, sec),
			deny(500*ms, 1, maxU64, 0, 500*ms, 500*ms),
			allow(sec, maxU64, maxU64, 0, sec),
		},
	}}
	return append(cs, slidingLogRing())
}

// slidingLogRing runs a 10/s log through growth (one entry every 100ms) and
// then a steady state in which every request drops the oldest entry and
// appends one, so that the log's storage wraps around many times; then a
// burst of two entries of 5 hits.
func slidingLogRing() Case {
	c := Case{Name: "sliding_window_log/ring_growth_and_wrap", Limit: lim(algorithms.SlidingWindowLog, 10, sec)}
	for k := 0; k < 10; k++ {
		c.Steps = append(c.Steps, allow(time.Duration(k)*100*ms, 1, 10, uint64(9-k), sec))
	}
	for k := 10; k < 40; k++ {
		at := time.Duration(k) * 100 * ms
		// Full: entries at (k-10)*100ms .. (k-1)*100ms. The oldest leaves at
		// (k-10)*100ms+1s = at, 50ms after this request; the newest 950ms.
		c.Steps = append(c.Steps,
			deny(at-50*ms, 1, 10, 0, 50*ms, 950*ms),
			allow(at, 1, 10, 0, sec))
	}
	c.Steps = append(c.Steps,
		allow(10*sec, 5, 10, 5, sec),
		allow(10*sec, 5, 10, 0, sec),
		deny(10500*ms, 1, 10, 0, 500*ms, 500*ms),
		deny(10500*ms, 6, 10, 0, 500*ms, 500*ms), // needs both entries gone
		allow(11*sec, 10, 10, 0, sec),
	)
	return c
}

// slidingCounterCases: in the comments, counts are scaled by the window w
// (hit·µs): used = prev×(w-e) + cur×w at e µs into the current window,
// against full = Requests×w. Denied, the request fits at e' = w -
// floor((Requests-cur-hits)×w/prev) in this window when cur+hits <=
// Requests, else at e' = w - floor((Requests-hits)×w/cur) in the next one.
// ResetAfter is 2w-e while the current window has hits, w-e while only the
// previous one has.
func slidingCounterCases() []Case {
	swc := algorithms.SlidingWindowCounter
	u32 := uint64(math.MaxUint32)
	return []Case{{
		// w = 1e6, full = 4e6.
		Name:  "sliding_window_counter/basic",
		Limit: lim(swc, 4, sec),
		Steps: []Step{
			allow(0, 1, 4, 3, 2*sec),
			allow(0, 3, 4, 0, 2*sec),
			// cur 4: next window, e' = 1e6-floor(3e6/4) = 250000;
			// retry = w+e'-e = 750ms.
			deny(500*ms, 1, 4, 0, 750*ms, 1500*ms),
			deny(500*ms, 0, 4, 0, 750*ms, 1500*ms), // a check waits for one hit's room
			// prev 4 at e = 249999: used 4*750001 = 3000004 > 3e6.
			deny(1249999*us, 1, 4, 0, us, 750001*us),
			allow(1250*ms, 1, 4, 0, 1750*ms), // used 3e6+1e6
			allow(1500*ms, 1, 4, 0, 1500*ms), // used 2e6+1e6+1e6
			// cur 2 + 3 > 4: next window, e' = 1e6-floor(1e6/2) = 5e5.
			deny(1500*ms, 3, 4, 0, sec, 1500*ms),
			deny(1500*ms, 5, 4, 0, never, 1500*ms),
			allow(2500*ms, 3, 4, 0, 1500*ms), // used 2*5e5 + 3e6
			// used 2*2.5e5 + 3e6 = 3.5e6: no room for one hit; e' = 1e6-floor(0/2).
			deny(2750*ms, 0, 4, 0, 250*ms, 1250*ms),
			allow(3*sec, 0, 4, 1, sec),       // prev 3 at e = 0
			allow(3900*ms, 1, 4, 2, 1100*ms), // used 3*1e5 + 1e6
			allow(10*sec, 0, 4, 4, 0),
			deny(10*sec, maxU64, 4, 4, never, 0),
		},
	}, {
		// Windows [-1s, 6s), [6s, 13s), ...; w = 7e6, full = 4.2e7.
		Name:  "sliding_window_counter/unaligned_window",
		Limit: lim(swc, 6, 7*sec),
		Steps: []Step{
			allow(0, 3, 6, 3, 13*sec), // e = 1e6: reset 14e6-1e6
			allow(5*sec, 3, 6, 0, 8*sec),
			// prev 6 at e 0: e' = 7e6-floor(3.5e7/6) = 7e6-5833333.
			deny(6*sec, 1, 6, 0, 1166667*us, 7*sec),
			// used 6*5833333 + 7e6 = 41999998.
			allow(7166667*us, 1, 6, 0, 12833333*us),
			allow(9500*ms, 2, 6, 0, 10500*ms), // 6*3.5e6 + 7e6 + 1.4e7
			// e' = 7e6-floor(1.4e7/6) = 4666667, e = 3.5e6.
			deny(9500*ms, 1, 6, 0, 1166667*us, 10500*ms),
			allow(13*sec, 0, 6, 3, 7*sec), // prev 3 at e 0
		},
	}, {
		// 7/min: w = 6e7, full = 4.2e8.
		Name:  "sliding_window_counter/fractional_interval",
		Limit: lim(swc, 7, minute),
		Steps: []Step{
			allow(0, 7, 7, 0, 2*minute),
			// prev 7 at e 0: e' = 6e7-floor(3.6e8/7) = 6e7-51428571.
			deny(minute, 1, 7, 0, 8571429*us, minute),
			// used 7*51428572 = 360000004, +6e7 > 4.2e8.
			deny(minute+8571428*us, 1, 7, 0, us, 51428572*us),
			allow(minute+8571429*us, 1, 7, 0, 111428571*us),
			allow(90*sec, 1, 7, 1, 90*sec), // 7*3e7 + 6e7 + 6e7 = 3.3e8
			// e' = 6e7-floor(1.8e8/7) = 34285715, e = 3e7.
			deny(90*sec, 2, 7, 1, 4285715*us, 90*sec),
			// 7*25714285 + 1.2e8 + 1.2e8 = 419999995.
			allow(90*sec+4285715*us, 2, 7, 0, 85714285*us),
		},
	}, {
		Name:  "sliding_window_counter/clock_steps_backwards",
		Limit: lim(swc, 4, sec),
		Steps: []Step{
			allow(10500*ms, 2, 4, 2, 1500*ms),
			allow(11500*ms, 2, 4, 1, 1500*ms), // 2*5e5 + 2e6
			// Back within the window: e = 1e5, used 2*9e5 + 2e6 = 3.8e6;
			// e' = 1e6-floor(1e6/2) = 5e5.
			deny(11100*ms, 1, 4, 0, 400*ms, 1900*ms),
			// Back into an earlier window: decided at 11s (e = 0).
			deny(10900*ms, 1, 4, 0, 500*ms, 2*sec),
			deny(-hour, 0, 4, 0, 500*ms, 2*sec), // a check, decided at 11s
			deny(-60*year, 1, 4, 0, 500*ms, 2*sec),
			allow(11500*ms, 1, 4, 0, 1500*ms),
		},
	}, {
		// w = 3.6e9.
		Name:  "sliding_window_counter/years_idle",
		Limit: lim(swc, 3, hour),
		Steps: []Step{
			allow(0, 3, 3, 0, 2*hour),
			// next window: e' = 3.6e9-floor(7.2e9/3) = 1.2e9.
			deny(0, 1, 3, 0, 80*minute, 2*hour),
			allow(10*year, 2, 3, 1, 2*hour),
			allow(200*year, 3, 3, 0, 2*hour),
		},
	}, {
		// full = 4294967295e6 < 2^53: exact.
		Name:  "sliding_window_counter/huge_limit_maxuint32",
		Limit: lim(swc, u32, sec),
		Steps: []Step{
			deny(0, maxU64, u32, u32, never, 0),
			allow(0, u32, u32, 0, 2*sec),
			// next window: e' = 1e6-floor((R-1)*1e6/R) = 1e6-999999.
			deny(0, 1, u32, 0, sec+us, 2*sec),
			// used R*999999 + 1e6; full-used = R-1e6 = 4293967295.
			allow(sec+us, 1, u32, 4293, 2*sec-us),
		},
	}, {
		// float64(MaxUint64) = 2^64; these steps are exact either way.
		Name:  "sliding_window_counter/huge_limit_maxuint64",
		Limit: lim(swc, maxU64, sec),
		Steps: []Step{
			allow(0, maxU64, maxU64, 0, 2*sec),
			// next window: e' = w-floor(0/cur) = w: retry = 2w.
			deny(0, maxU64, maxU64, 0, 2*sec, 2*sec),
			allow(sec, 0, maxU64, 0, sec), // prev MaxUint64 at e 0
			allow(2*sec, maxU64, maxU64, 0, 2*sec),
		},
	}}
}

// zeroRequests: a limit of zero requests denies every hit, forever.
func zeroRequests(k algorithms.Kind) Case {
	return Case{
		Name:  k.String() + "/zero_requests",
		Limit: lim(k, 0, sec),
		Steps: []Step{
			deny(0, 1, 0, 0, never, 0),
			deny(0, 0, 0, 0, never, 0), // not even a check: no room for one hit
			deny(hour, maxU64, 0, 0, never, 0),
			deny(10*year, 1, 0, 0, never, 0),
		},
	}
}

// zeroRateWithBurst: a bucket that never refills denies every hit; it
// reports its capacity as the limit.
func zeroRateWithBurst(k algorithms.Kind) Case {
	return Case{
		Name:  k.String() + "/zero_rate_with_burst",
		Limit: algorithms.Limit{Algorithm: k, Window: sec, Burst: 5},
		Steps: []Step{
			deny(0, 1, 5, 0, never, 0),
			deny(0, 0, 5, 0, never, 0),
		},
	}
}

// boundary is the same timeline for every algorithm, 5 per 10s: a full limit
// 1ms before a window boundary, then another full limit at the boundary.
// Only fixed_window allows the second (2x the limit within 1ms).
func boundary(k algorithms.Kind) Case {
	c := Case{Name: k.String() + "/boundary_burst", Limit: lim(k, 5, 10*sec)}
	switch k {
	case algorithms.FixedWindow:
		c.Steps = []Step{
			allow(9999*ms, 5, 5, 0, ms),
			allow(10*sec, 5, 5, 0, 10*sec),
			deny(10*sec, 1, 5, 0, 10*sec, 10*sec),
		}
	case algorithms.TokenBucket, algorithms.GCRA:
		// full = 5e7; at 10s the debt is 5e7-1000*5 = 49995000.
		c.Steps = []Step{
			allow(9999*ms, 5, 5, 0, 10*sec),
			deny(10*sec, 5, 5, 0, 9999*ms, 9999*ms), // ceil(49995000/5)
			deny(10*sec, 1, 5, 0, 1999*ms, 9999*ms), // ceil(9995000/5)
			allow(19999*ms, 5, 5, 0, 10*sec),
		}
	case algorithms.SlidingWindowLog:
		c.Steps = []Step{
			allow(9999*ms, 5, 5, 0, 10*sec),
			deny(10*sec, 5, 5, 0, 9999*ms, 9999*ms),
			deny(10*sec, 1, 5, 0, 9999*ms, 9999*ms),
			allow(19999*ms, 5, 5, 0, 10*sec),
		}
	case algorithms.SlidingWindowCounter:
		// At 10s: prev 5 with full weight. e' = 1e7-floor(0/5) = 1e7 for 5
		// hits; 1e7-floor(4e7/5) = 2e6 for one.
		c.Steps = []Step{
			allow(9999*ms, 5, 5, 0, 10001*ms),
			deny(10*sec, 5, 5, 0, 10*sec, 10*sec),
			deny(10*sec, 1, 5, 0, 2*sec, 10*sec),
			allow(12*sec, 1, 5, 0, 18*sec),     // used 5*8e6 + 1e7
			allow(15*sec, 1, 5, 0, 15*sec),     // used 5*5e6 + 1e7 + 1e7 = 4.5e7
			deny(15*sec, 1, 5, 0, sec, 15*sec), // e' = 1e7-floor(2e7/5) = 6e6
		}
	}
	return c
}
