// Package testutil holds the helpers the tests of this module share, and
// the only copies of them: the one fake they use (a manual clock), polling
// waits, the instant the timelines start from, free ports (ports.go), a
// buffer safe for concurrent writers, and metric readers (metrics.go). It
// imports nothing of this module.
package testutil

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Base is the instant every timeline starts from: 2027-01-15T08:00:00Z, Unix
// second 1_800_000_000 = 2^9·3^2·5^8, so it is aligned to every window that
// divides an hour (1s, 10s, 1m, 1h) but lies 1s into a 7s window and 8h
// into a day.
var Base = time.Unix(1_800_000_000, 0).UTC()

// Clock is the tests' manual clock (the only fake they use): it moves only
// when a test moves it, and is safe for concurrent use.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock standing at t.
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now returns the clock's instant, in UTC.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// Advance moves the clock by d, which may be negative.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// WaitFor polls cond every millisecond until it holds, failing the test
// when it still does not hold after timeout. what names the condition in
// the failure.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	WaitEvery(t, time.Millisecond, timeout, what, cond)
}

// WaitEvery is WaitFor polling every interval: for a cond that asks another
// process (an HTTP or gRPC call), which a millisecond's polling would keep
// busy.
func WaitEvery(t testing.TB, interval, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}

// hourMargin is how long after ClearOfHourEnd returns a test may still count
// on the hour it runs in: longer than any one test of this module takes.
const hourMargin = time.Minute

// ClearOfHourEnd waits, when the next hour of the clock begins within
// hourMargin, until it has begun. Fixed windows of an hour or longer (a day,
// a week, 30 or 365 days) start at a full hour, UTC, counted from the Unix
// epoch: a test that counts hits in one on the real clock (Redis's TIME, or
// envoy-rls's own clock) and runs across a full hour sees its counts start
// again halfway (a third request allowed under a limit of 2 an hour) and
// fails for no fault of the code. A package that runs for minutes crosses a
// full hour in several runs in a hundred. The wait, at most hourMargin,
// comes in one run in 60, once (the tests after it start early in the
// hour). Tests on a manual Clock need none of this.
func ClearOfHourEnd(tb testing.TB) {
	tb.Helper()
	if wait := hourEndWait(time.Now()); wait > 0 {
		tb.Logf("waiting %v for the next hour to begin: the test's windows of an hour or longer must not end while it runs", wait.Round(time.Millisecond))
		time.Sleep(wait)
	}
}

// hourEndWait returns how long ClearOfHourEnd waits at now: until just
// past the next full hour when it is less than hourMargin away, else 0.
func hourEndWait(now time.Time) time.Duration {
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < hourMargin {
		return left + 10*time.Millisecond
	}
	return 0
}

// SyncBuffer is a bytes.Buffer that goroutines may write while a test
// reads it (a log handler's output, a child process's stderr).
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Bytes returns a copy of what was written so far.
func (b *SyncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
