package memory

import "github.com/maypok86/otter/v2"

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
