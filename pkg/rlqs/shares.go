package rlqs

import (
	"context"
	"math"
	"sync"
	"time"
)

// Shares hold, per bucket, what every subscriber of the bucket (an Envoy's
// stream, on this instance or another) wants and was assigned, so that the
// assignments of all subscribers never sum above the bucket's limit. A
// Reserve is atomic per bucket: whatever runs at the same moment on other
// instances, a subscriber is raised only out of what the others leave free.
//
// NewMemoryShares keeps them in the process (one instance); NewRedisShares
// in Redis, shared by every instance on it.
type Shares interface {
	// Load returns the live and gone entries of each bucket, expired ones
	// dropped.
	Load(ctx context.Context, keys []string) ([][]Entry, error)
	// Reserve commits a new assignment for each reservation and writes the
	// granted tokens per fill interval to out (len(out) >= len(rs)). A
	// reservation is granted its Target when that is no more than its
	// subscriber holds; a raise gets at most what the bucket's other
	// subscribers leave of Cap (each counted at the higher of its new and
	// old rate for loweredGrace after a lowering, and gone ones until
	// their assignment expires).
	Reserve(ctx context.Context, rs []Reservation, out []int64) error
	// Release tells of subscribers that stopped: gone (the stream ended;
	// Envoy keeps enforcing the assignment until its TTL, so the entry
	// holds its rate until it expires) or dropped (the bucket was
	// abandoned or no longer matches: held for loweredGrace only).
	Release(ctx context.Context, rs []Release) error
}

// Entry is one subscriber of a bucket.
type Entry struct {
	// Sub identifies the subscriber (its instance and stream).
	Sub string
	// Host is its stream's peer host, so that an Envoy reconnecting to
	// another instance takes its own assignment over (see Reservation).
	Host string
	// Want is the rate (requests per second) it could use, or -1 when not
	// known yet (a new subscriber).
	Want float64
	// Rate is what it may enforce now (requests per second): its
	// assignment, or the one before for loweredGrace after a lowering.
	Rate float64
	// Gone reports a subscriber whose stream ended, or that has not
	// reserved for longer than its stale time: it holds Rate until it
	// expires and takes no new share.
	Gone bool
}

// Reservation asks for one subscriber's new assignment.
type Reservation struct {
	Key       string // the bucket (its tightest limit's counter key)
	Sub, Host string
	Want      float64 // requests per second, -1 when unknown
	// Target is the rate to assign (tokens per Fill, divided by Fill);
	// Cap the bucket's capacity, which all its subscribers share.
	Target, Cap float64
	// Fill is the fill interval in seconds: the grant is whole tokens per
	// Fill.
	Fill int64
	// TTL is how long the assignment holds at Envoy once sent; the entry
	// expires loweredGrace after it. Stale is how long the entry counts as
	// live without another reservation.
	TTL, Stale time.Duration
	// Takeover names a gone subscriber of the same host whose entry this
	// one replaces (an Envoy that reconnected), or "".
	Takeover string
	// Grace is how long a lowering of this subscriber still counts at its
	// old rate (0: loweredGrace).
	Grace time.Duration
}

// Release is one subscriber that stopped (see Shares.Release).
type Release struct {
	Key, Sub string
	Drop     bool
}

// loweredGrace is the longest a lowered assignment still counts at its
// old rate: the time for the response to reach Envoy and be applied, with
// a wide margin. Until then nobody is raised into what it gave up. A
// subscriber's own grace is half its report period within
// [minGrace, loweredGrace] (graceFor), so that a lowering frees its share
// by the next reports.
const (
	loweredGrace = 2 * time.Second
	minGrace     = 200 * time.Millisecond
)

// graceFor returns the lowered grace of a subscriber reporting every
// period.
func graceFor(period time.Duration) time.Duration {
	return min(max(period/2, minGrace), loweredGrace)
}

// grant computes a reservation's tokens from what the other subscribers
// hold (others, requests per second): its Target, but never more than
// Cap - others.
func grant(r *Reservation, others float64) int64 {
	// A raise gets only what the others leave free; so does a lowering
	// when the bucket is over-committed (its capacity fell, or gone
	// subscribers still hold theirs).
	want := min(r.Target, max(r.Cap-others, 0))
	if !(want > 0) || r.Fill <= 0 {
		return 0
	}
	tokens := math.Floor(want*float64(r.Fill) + 1e-9)
	return int64(min(tokens, math.MaxUint32))
}

// memoryShares are Shares kept in the process.
type memoryShares struct {
	now func() time.Time
	mu  sync.Mutex
	b   map[string]map[string]*memEntry
}

type memEntry struct {
	Entry
	prev      float64 // the rate before the last lowering
	loweredAt time.Time
	grace     time.Duration
	expires   time.Time
	seenUntil time.Time
	closed    bool
}

// NewMemoryShares returns Shares kept in the process, for one instance;
// now reads the clock. Expired entries are dropped as their buckets are
// used and by Sweep.
func NewMemoryShares(now func() time.Time) Shares {
	return &memoryShares{now: now, b: map[string]map[string]*memEntry{}}
}

// rate returns what e holds at t (its old rate within loweredGrace of a
// lowering).
func (e *memEntry) rate(t time.Time) float64 {
	if t.Sub(e.loweredAt) < e.grace {
		return max(e.Rate, e.prev)
	}
	return e.Rate
}

// prune drops the expired entries of a bucket (m.mu held) and the bucket
// when none is left.
func (m *memoryShares) prune(key string, t time.Time) map[string]*memEntry {
	es := m.b[key]
	for sub, e := range es {
		if !t.Before(e.expires) {
			delete(es, sub)
		}
	}
	if len(es) == 0 {
		delete(m.b, key)
		return nil
	}
	return es
}

func (m *memoryShares) Load(_ context.Context, keys []string) ([][]Entry, error) {
	t := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([][]Entry, len(keys))
	for i, k := range keys {
		for _, e := range m.prune(k, t) {
			v := e.Entry
			v.Rate = e.rate(t)
			v.Gone = e.closed || !t.Before(e.seenUntil)
			out[i] = append(out[i], v)
		}
	}
	return out, nil
}

func (m *memoryShares) Reserve(_ context.Context, rs []Reservation, out []int64) error {
	t := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range rs {
		r := &rs[i]
		es := m.prune(r.Key, t)
		if es == nil {
			es = map[string]*memEntry{}
			m.b[r.Key] = es
		}
		me := es[r.Sub]
		held := 0.0
		if me != nil {
			held = me.Rate
		}
		if r.Takeover != "" && r.Takeover != r.Sub {
			if old := es[r.Takeover]; old != nil && (old.closed || !t.Before(old.seenUntil)) && old.Host == r.Host {
				if me == nil {
					held = old.Rate
				}
				delete(es, r.Takeover)
			}
		}
		others := 0.0
		for sub, e := range es {
			if sub != r.Sub {
				others += e.rate(t)
			}
		}
		g := grant(r, others)
		rate := float64(g) / float64(max(r.Fill, 1))
		if me == nil {
			me = &memEntry{Entry: Entry{Sub: r.Sub}}
			es[r.Sub] = me
			if held > rate {
				// Taken over from a gone entry and lowered: the old rate
				// still counts for the grace.
				me.prev, me.loweredAt = held, t
			}
		} else if rate < me.Rate {
			me.prev, me.loweredAt = me.Rate, t
		}
		me.Host, me.Want, me.Rate = r.Host, r.Want, rate
		me.grace = r.Grace
		if me.grace <= 0 {
			me.grace = loweredGrace
		}
		me.expires = t.Add(r.TTL + loweredGrace)
		me.seenUntil = t.Add(r.Stale)
		me.closed = false
		out[i] = g
	}
	return nil
}

func (m *memoryShares) Release(_ context.Context, rs []Release) error {
	t := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rs {
		e := m.b[r.Key][r.Sub]
		if e == nil {
			continue
		}
		e.closed = true
		if r.Drop {
			e.prev, e.loweredAt, e.Rate = e.rate(t), t, 0
			if x := t.Add(e.grace); x.Before(e.expires) {
				e.expires = x
			}
		}
	}
	return nil
}

// Sweep drops every expired entry (the buckets nobody uses any more).
func (m *memoryShares) Sweep() {
	t := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.b {
		m.prune(k, t)
	}
}
