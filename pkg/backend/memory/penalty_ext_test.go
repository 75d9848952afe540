package memory_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// flooder charges fresh keys, once each, against a store until the victim's
// entry is evicted (the penalty set holds it).
type flooder struct {
	m    *memory.Store
	next int
}

// floodLimit is the flood keys' limit: one hit leaves room, so they are
// live but not exhausted, and never enter the penalty set.
var floodLimit = limitOf(algorithms.FixedWindow, 10, time.Hour)

// floodUntil floods in up to rounds rounds of 64 keys until done holds, and
// reports whether it did.
func (f *flooder) floodUntil(t *testing.T, rounds int, done func(memory.Stats) bool) bool {
	t.Helper()
	for range rounds {
		for range 64 {
			apply(t, f.m, backend.Item{Key: fmt.Sprintf("flood-%d", f.next), Limit: floodLimit, Hits: 1})
			f.next++
		}
		if done(f.m.Stats()) {
			return true
		}
	}
	return false
}

// TestPenaltyKeepsExhaustedKeys runs one key through a timeline on two
// stores: one that holds it all along, and one that evicts it. Every
// decision must be the same: the remembered table gives the evicted key back
// its exact state whenever it is evicted (part used or exhausted), and the
// penalty set (alone, or for a sliding_window_log's states, which do not
// pack) whenever it is evicted exhausted: fixed windows stay denied until
// they end, buckets refill one hit at a time, accounted debt is still owed.
func TestPenaltyKeepsExhaustedKeys(t *testing.T) {
	const victim = "victim"
	for _, tier := range []string{"remembered", "penalty"} {
		for _, k := range algorithms.Kinds() {
			for _, account := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/account=%v", tier, k, account), func(t *testing.T) {
					var opts []memory.Option
					if tier == "penalty" {
						opts = append(opts, memory.WithRememberedKeys(0))
					}
					remembered := tier == "remembered" && k != algorithms.SlidingWindowLog
					l := limitOf(k, 5, time.Minute)
					evicting, evictingClock := newTestMemory(t, opts...)
					held, heldClock := newTestMemory(t)
					evictions := 0
					for step := range 120 { // every 2s for 4 windows
						at := testutil.Base.Add(time.Duration(step) * 2 * time.Second)
						evictingClock.Set(at)
						heldClock.Set(at)
						it := backend.Item{Key: victim, Limit: l, Hits: 1}
						if account && step%7 == 3 {
							it.Hits, it.Account = 3, true // usage that already happened
						}
						got, _ := apply(t, evicting, it)
						want, _ := apply(t, held, it)
						if got[0] != want[0] {
							t.Fatalf("step %d: evicted key decided %+v, held key %+v (%+v)", step, got[0], want[0], evicting.Stats())
						}
						// The remembered table keeps part-used keys too:
						// evict at every step whose state is not fresh.
						if !want[0].Allowed || want[0].Remaining == 0 || remembered && want[0].ResetAfter > 0 {
							if !evicting.Evict(victim) {
								t.Fatalf("step %d: victim not held", step)
							}
							evictions++
						}
					}
					st := evicting.Stats()
					saved, restored := st.PenaltySaved, st.PenaltyRestored
					if remembered {
						saved, restored = st.RememberedSaved, st.RememberedRestored
					}
					// Restored each time but the last, and those at which
					// a window had passed (a fresh state: nothing to
					// restore), up to one a window.
					if evictions < 10 || saved != uint64(evictions) || restored+5 < uint64(evictions) || st.EvictedLost != 0 {
						t.Fatalf("%d evictions: %+v", evictions, st)
					}
				})
			}
		}
	}
}

// TestPenaltyFlood exhausts a key, then floods the store with fresh keys
// until the cache evicts it: with the penalty set alone (no remembered
// table), it stays denied until its window ends. With neither, the flood
// buys its quota back.
func TestPenaltyFlood(t *testing.T) {
	const victim = "victim"
	l := limitOf(algorithms.FixedWindow, 5, time.Hour)
	for _, penalty := range []bool{true, false} {
		t.Run(fmt.Sprintf("penalty=%v", penalty), func(t *testing.T) {
			opts := []memory.Option{memory.WithMaxKeys(32), memory.WithRememberedKeys(0)}
			if !penalty {
				opts = append(opts, memory.WithPenaltyKeys(0))
			}
			m, clock := newTestMemory(t, opts...)
			if ds, _ := apply(t, m, backend.Item{Key: victim, Limit: l, Hits: 5}); !ds[0].Allowed || ds[0].Remaining != 0 {
				t.Fatalf("first 5 hits: %+v", ds[0])
			}
			// Flood until the victim is evicted: the penalty set holds it,
			// or (without one) it has room again. Look seldom: each look
			// makes the cache likelier to keep it.
			f := flooder{m: m}
			evicted := func(memory.Stats) bool {
				if penalty { // and at least 5 x --max-keys
					return f.next >= 5*32 && m.Stats().PenaltyKeys > 0
				}
				return f.next%4096 == 0 && remaining(t, m, victim, l) == 5
			}
			if !f.floodUntil(t, 2000, evicted) {
				t.Fatalf("128,000 fresh keys did not evict the victim: %+v", m.Stats())
			}
			if !penalty {
				return // the quota was bought back
			}
			clock.Advance(59 * time.Minute)
			ds, _ := apply(t, m, backend.Item{Key: victim, Limit: l, Hits: 1})
			// (Restored at least once: the cache, still over its bound
			// while its maintenance catches up, may evict it again.)
			if ds[0].Allowed || m.Stats().PenaltyRestored < 1 {
				t.Fatalf("evicted exhausted key: %+v, %+v", ds[0], m.Stats())
			}
			clock.Advance(time.Minute) // the window ends
			if ds, _ := apply(t, m, backend.Item{Key: victim, Limit: l, Hits: 5}); !ds[0].Allowed {
				t.Fatalf("next window: %+v", ds[0])
			}
		})
	}
}

// TestPenaltySetFull fills a small penalty set with more exhausted keys than
// it holds: the ones whose buckets are full again soonest are dropped (and
// counted), and the others stay denied.
func TestPenaltySetFull(t *testing.T) {
	m, clock := newTestMemory(t, memory.WithPenaltyKeys(4), memory.WithRememberedKeys(0))
	// Buckets of 1 per 1..8 hours, exhausted and evicted in turn.
	for h := 1; h <= 8; h++ {
		l := limitOf(algorithms.TokenBucket, 1, time.Duration(h)*time.Hour)
		key := fmt.Sprintf("k%d", h)
		apply(t, m, backend.Item{Key: key, Limit: l, Hits: 1})
		if !m.Evict(key) {
			t.Fatalf("%s not held", key)
		}
	}
	st := m.Stats()
	if st.PenaltyKeys != 4 || st.PenaltyDropped != 4 {
		t.Fatalf("stats %+v: want 4 records held, 4 dropped", st)
	}
	// The four soonest were dropped (their keys start full); the others
	// are restored, empty.
	clock.Advance(time.Minute)
	for h := 1; h <= 8; h++ {
		l := limitOf(algorithms.TokenBucket, 1, time.Duration(h)*time.Hour)
		ds, _ := apply(t, m, backend.Item{Key: fmt.Sprintf("k%d", h), Limit: l, Hits: 1})
		if want := h <= 4; ds[0].Allowed != want {
			t.Errorf("k%d (window %dh) allowed %v, want %v", h, h, ds[0].Allowed, want)
		}
	}
}
