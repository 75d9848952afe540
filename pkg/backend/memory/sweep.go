package memory

import (
	"math"
	"time"

	"github.com/maypok86/otter/v2"
)

func (m *Store) sweepLoop(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Sweep drops every entry whose state is fresh at the clock's current
// instant, and returns how many it dropped; it also drops the remembered
// and penalty records whose state is fresh. The background sweeper calls it
// every sweep interval; with the sweeper disabled (WithSweepInterval(0)) a
// program may call it on its own schedule. An entry that a request holds at
// that moment is left for the next sweep.
//
// Dropping an entry costs nothing: a later request finds a fresh state and is
// decided no earlier than the sweep's instant, which is exactly what the
// dropped state would have given it then. A request whose clock reading is
// older than the sweep (it read the clock before the sweep did, or the clock
// stepped back) is decided at the sweep's instant for that reason.
func (m *Store) Sweep() int {
	m.sweepMu.Lock()
	defer m.sweepMu.Unlock()
	now := m.clock.Now().UnixMicro()
	if now > m.horizon.Load() {
		// Before any removal, so that every entry created in place of a
		// dropped one has a floor of at least now.
		m.horizon.Store(now)
	}
	dropped := 0
	drop := func(e *entry) (*entry, otter.ComputeOp) {
		// Under the cache's bucket lock: never wait for the entry.
		if !e.mu.TryLock() {
			return e, otter.CancelOp
		}
		defer e.mu.Unlock()
		if e.dead || e.freshAt.Load() > now {
			return e, otter.CancelOp
		}
		e.dead = true
		dropped++
		return e, otter.InvalidateOp
	}
	for key, e := range m.cache.All() {
		if e.freshAt.Load() <= now {
			m.cache.ComputeIfPresent(key, drop)
		}
	}
	m.swept.Add(uint64(dropped))
	if m.remember != nil {
		m.remember.expire(now)
	}
	if m.penalty != nil {
		m.penalty.expire(now)
	}
	return dropped
}

// addMicros returns now plus d in µs, saturating at math.MaxInt64 (Never).
func addMicros(now int64, d time.Duration) int64 {
	us := d.Microseconds()
	if us > math.MaxInt64-now {
		return math.MaxInt64
	}
	return now + us
}
