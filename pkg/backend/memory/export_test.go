package memory

import (
	"github.com/maypok86/otter/v2"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// Evict removes key's entry as the cache does when it evicts it for size
// (tests cannot count on a flood evicting a key in frequent use: the cache
// keeps the keys likeliest to be used again). It reports whether the key
// was held.
func (m *Store) Evict(key string) bool {
	held := false
	m.cache.ComputeIfPresent(key, func(e *entry) (*entry, otter.ComputeOp) {
		held = true
		m.onDeletion(otter.DeletionEvent[string, *entry]{Key: key, Value: e, Cause: otter.CauseOverflow})
		return e, otter.InvalidateOp
	})
	return held
}

// EvictDecided creates key's entry as a request would (from its remembered
// or penalty record, if any), decides hits against l on it at the clock's
// instant as Apply does, and evicts it as the cache does when it is full:
// the eviction path alone, without the cache, so that tests can drive it at
// the default capacities where millions of Apply calls would take minutes
// under -race. It returns the decision.
func (m *Store) EvictDecided(key string, l algorithms.Limit, hits uint64) algorithms.Decision {
	e := m.newEntry(key)
	now := max(m.clock.Now().UnixMicro(), e.floor)
	e.mu.Lock()
	if e.freshAt.Load() <= now {
		e.exhausted = false
	}
	d := algorithms.DecideInPlace(&l, &e.state, now, hits)
	if d.Allowed {
		e.freshAt.Store(addMicros(now, d.ResetAfter))
	}
	e.kind = l.Algorithm
	e.limit, e.left = scaled(d.Limit, d.Remaining)
	if !d.Allowed || d.Remaining == 0 {
		e.exhausted = true
	}
	e.mu.Unlock()
	m.onDeletion(otter.DeletionEvent[string, *entry]{Key: key, Value: e, Cause: otter.CauseOverflow})
	return d
}
