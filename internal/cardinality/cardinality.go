// Package cardinality bounds the number of distinct values a metric label
// takes. A Cap admits the first Max distinct values it sees; every later new
// value is replaced by one overflow value, so a flood of distinct request
// values (a detailed_metric rule, a client inventing domains or cluster
// names) adds one series, not one per value. The overflow series counts what
// fell into it, and Overflowed says how many observations did.
//
// Use one Cap per metric (or per label that can grow), created at start-up
// and kept for the life of the registry: series are never deleted, so
// forgetting admitted values would let the series grow past the cap.
//
//	rules := cardinality.New(1000, cardinality.Overflow)
//	hits.WithLabelValues(domain, rules.Value(rule)).Add(n)
package cardinality

import (
	"strings"
	"sync"
	"sync/atomic"
)

// Overflow is the conventional overflow value.
const Overflow = "__overflow__"

// Cap admits at most a fixed number of distinct label values. It is safe
// for concurrent use; admitted values are looked up without a lock.
type Cap struct {
	max      int
	overflow string
	seen     sync.Map // string -> struct{}
	mu       sync.Mutex
	n        atomic.Int64 // admitted values
	over     atomic.Uint64
}

// New returns a Cap admitting limit distinct values (at least 1) and mapping
// the rest to overflow.
func New(limit int, overflow string) *Cap {
	return &Cap{max: max(limit, 1), overflow: overflow}
}

// Admit reports whether v is (or now becomes) one of the admitted values.
// A false answer is counted in Overflowed.
func (c *Cap) Admit(v string) bool {
	if _, ok := c.seen.Load(v); ok {
		return true
	}
	if c.n.Load() >= int64(c.max) {
		c.over.Add(1)
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen.Load(v); ok {
		return true
	}
	if c.n.Load() >= int64(c.max) {
		c.over.Add(1)
		return false
	}
	// Keep a copy: v may point into a large request buffer.
	c.seen.Store(strings.Clone(v), struct{}{})
	c.n.Add(1)
	return true
}

// Value returns v when it is admitted, else the overflow value.
func (c *Cap) Value(v string) string {
	if c.Admit(v) {
		return v
	}
	return c.overflow
}

// Len returns the number of admitted values.
func (c *Cap) Len() int { return int(c.n.Load()) }

// Max returns the most values the Cap admits.
func (c *Cap) Max() int { return c.max }

// Overflowed returns how many calls were answered with the overflow value.
func (c *Cap) Overflowed() uint64 { return c.over.Load() }
