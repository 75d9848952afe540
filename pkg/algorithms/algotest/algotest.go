// Package algotest holds the timeline tables that every implementation of
// the rate-limiting algorithms must pass: the pure functions of
// pkg/algorithms, the memory store and the Redis store (whose Lua twins must
// give identical decisions). It is a normal package so that the tests of
// other packages can import it; it imports nothing above pkg/algorithms (the
// multi-item store tables are in pkg/backend/storetest, which runs these
// tables too).
//
// Every expected value was worked out by hand from the documented semantics
// of pkg/algorithms (the comments next to the tricky steps
// show the arithmetic), never by running the code under test. All instants
// and durations are whole microseconds.
//
// A backend runs the tables with a few lines:
//
//	for _, c := range algotest.Cases() {
//		t.Run(c.Name, func(t *testing.T) {
//			var s algorithms.State
//			algotest.Run(t, c, func(at time.Time, hits uint64) algorithms.Decision {
//				var d algorithms.Decision
//				s, d = algorithms.Decide(c.Limit, s, at, hits)
//				return d
//			})
//		})
//	}
package algotest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// Base is the instant every table starts from: 2027-01-15T08:00:00Z, Unix
// second 1_800_000_000, aligned to every window that divides an hour (see
// internal/testutil, which holds the one copy).
var Base = testutil.Base

// Step is one request on a timeline: at Base+At, Hits hits, and the decision
// it must get. At may go backwards (a clock that steps back) and before the
// Unix epoch.
type Step struct {
	At   time.Duration
	Hits uint64
	Want algorithms.Decision
}

// Case is a timeline of requests against one key with one limit, starting
// from a fresh key.
type Case struct {
	Name  string
	Limit algorithms.Limit
	// Huge marks cases whose counts reach 2^53 in an algorithm that Go
	// decides with exact integers (fixed_window, sliding_window_log). A twin
	// that works in float64, like the Redis Lua, rounds there, so it may
	// differ; every other case must match exactly.
	Huge  bool
	Steps []Step
}

// Run plays c against decide, which must decide one request of hits at the
// given instant against the key's state so far and return the decision.
// Failures are reported as "step %d".
func Run(t testing.TB, c Case, decide func(at time.Time, hits uint64) algorithms.Decision) {
	t.Helper()
	for i, st := range c.Steps {
		got := decide(Base.Add(st.At), st.Hits)
		if got != st.Want {
			t.Errorf("%s: step %d (at %v, hits %d):\n got  %s\n want %s",
				c.Name, i, st.At, st.Hits, Format(got), Format(st.Want))
		}
	}
}

// Format renders a decision compactly, with durations in µs and Never as
// "never".
func Format(d algorithms.Decision) string {
	var b strings.Builder
	if d.Allowed {
		b.WriteString("allowed")
	} else {
		b.WriteString("denied")
	}
	fmt.Fprintf(&b, " limit=%d remaining=%d retry=%s reset=%s", d.Limit, d.Remaining, dur(d.RetryAfter), dur(d.ResetAfter))
	return b.String()
}

func dur(d time.Duration) string {
	if d == algorithms.Never {
		return "never"
	}
	if d%time.Microsecond != 0 {
		return d.String() // not whole µs: show it all
	}
	return fmt.Sprintf("%dµs", d/time.Microsecond)
}

// Shorthands for the tables.
const (
	us     = time.Microsecond
	ms     = time.Millisecond
	sec    = time.Second
	minute = time.Minute
	hour   = time.Hour
	year   = 365 * 24 * time.Hour
	never  = algorithms.Never
)

// allow is a step that must be allowed.
func allow(at time.Duration, hits, limit, remaining uint64, reset time.Duration) Step {
	return Step{At: at, Hits: hits, Want: ok(limit, remaining, reset)}
}

// deny is a step that must be denied.
func deny(at time.Duration, hits, limit, remaining uint64, retry, reset time.Duration) Step {
	return Step{At: at, Hits: hits, Want: no(limit, remaining, retry, reset)}
}

func ok(limit, remaining uint64, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func no(limit, remaining uint64, retry, reset time.Duration) algorithms.Decision {
	return algorithms.Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}
