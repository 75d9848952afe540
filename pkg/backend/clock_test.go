package backend_test

import (
	"sync/atomic"
	"time"
)

// testClock is the tests' manual clock (the only fake they use): it moves
// only when a test moves it, and is safe for concurrent use.
type testClock struct{ ns atomic.Int64 }

func newTestClock(t time.Time) *testClock {
	c := &testClock{}
	c.Set(t)
	return c
}

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *testClock) Set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
