package memory

import (
	"time"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Option configures a Store.
type Option func(*config)

type config struct {
	maxKeys        int
	maxMemory      uint64
	penaltyKeys    int
	rememberedKeys int
	clock          backend.Clock
	sweepInterval  time.Duration
}

// WithMaxKeys bounds the number of keys the store holds. Non-positive values
// select DefaultMaxKeys.
func WithMaxKeys(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxKeys = n
		}
	}
}

// WithMaxMemory bounds the estimated bytes of the keys the store holds (see
// EntryBytes). Zero selects DefaultMaxMemory.
func WithMaxMemory(bytes uint64) Option {
	return func(c *config) {
		if bytes > 0 {
			c.maxMemory = bytes
		}
	}
}

// WithPenaltyKeys sizes the penalty set: the most evicted exhausted keys
// whose state it keeps (see penalties). Zero disables it; a negative value
// selects DefaultPenaltyKeys.
func WithPenaltyKeys(n int) Option {
	return func(c *config) {
		if n < 0 {
			n = DefaultPenaltyKeys
		}
		c.penaltyKeys = n
	}
}

// WithRememberedKeys sizes the remembered table: the most evicted live keys
// whose state it keeps (see remembered), 32 bytes each. Zero disables it; a
// negative value selects DefaultRememberedKeys.
func WithRememberedKeys(n int) Option {
	return func(c *config) {
		if n < 0 {
			n = DefaultRememberedKeys
		}
		c.rememberedKeys = n
	}
}

// WithClock sets the clock that Apply reads once per request. The default is
// backend.MonotonicClock(). A nil clock selects the default.
func WithClock(clock backend.Clock) Option {
	return func(c *config) {
		if clock != nil {
			c.clock = clock
		}
	}
}

// WithSweepInterval sets how often a background goroutine drops entries whose
// state is fresh. Zero or a negative value disables the background sweeper:
// fresh entries then stay until they are evicted for size.
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) { c.sweepInterval = d }
}

// Stats are counters of a Store, for metrics.
type Stats struct {
	// Keys is the number of keys held now (an estimate under concurrent
	// change).
	Keys int
	// Bytes is the estimated memory of the keys held now (see EntryBytes),
	// counting each key at least as its share of the key bound.
	Bytes uint64
	// Evicted counts entries evicted because the store was full.
	Evicted uint64
	// EvictedLive counts the entries among Evicted whose state was not yet
	// fresh. Each went to the remembered table (EvictedRemembered), to the
	// penalty set (EvictedPenalty), or was lost (EvictedLost: its key starts
	// again from a full limit); Evicted - EvictedLive cost nothing.
	EvictedLive                                    uint64
	EvictedRemembered, EvictedPenalty, EvictedLost uint64
	// Swept counts fresh entries dropped by the sweeper, which costs nothing.
	Swept uint64
	// RememberedKeys is the number of evicted live keys whose state the
	// remembered table holds now, and RememberedCapacity the most it holds.
	RememberedKeys, RememberedCapacity int
	// RememberedSaved counts states moved to the remembered table,
	// RememberedRestored the keys re-created from it; RememberedDroppedPart
	// and RememberedDroppedExhausted count the records of part-used and of
	// exhausted keys dropped because their buckets were full (an exhausted
	// one moves to the penalty set when it is enabled).
	RememberedSaved, RememberedRestored               uint64
	RememberedDroppedPart, RememberedDroppedExhausted uint64
	// PenaltyKeys is the number of evicted exhausted keys whose state the
	// penalty set holds now.
	PenaltyKeys int
	// PenaltySaved counts states moved to the penalty set, PenaltyRestored
	// the keys re-created from it, and PenaltyDropped the records dropped
	// because the set was full (those keys start again from a full limit).
	PenaltySaved, PenaltyRestored, PenaltyDropped uint64
}

// Stats returns the store's counters.
func (m *Store) Stats() Stats {
	st := Stats{
		Keys:        m.cache.EstimatedSize(),
		Bytes:       m.cache.WeightedSize(),
		Evicted:     m.evicted.Load(),
		EvictedLive: m.evictedLive.Load(),
		Swept:       m.swept.Load(),

		EvictedRemembered: m.evictedRemembered.Load(),
		EvictedPenalty:    m.evictedPenalty.Load(),
		EvictedLost:       m.evictedLost.Load(),
	}
	if r := m.remember; r != nil {
		st.RememberedKeys, st.RememberedCapacity = r.len(), r.capacity()
		st.RememberedSaved, st.RememberedRestored = r.saved.Load(), r.restored.Load()
		st.RememberedDroppedPart, st.RememberedDroppedExhausted = r.droppedPart.Load(), r.droppedSpent.Load()
	}
	if p := m.penalty; p != nil {
		st.PenaltyKeys = p.len()
		st.PenaltySaved, st.PenaltyRestored, st.PenaltyDropped = p.saved.Load(), p.restored.Load(), p.dropped.Load()
	}
	return st
}
