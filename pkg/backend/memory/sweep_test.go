package memory_test

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// TestMemoryExactWhileSweeping charges many keys from many goroutines,
// mixing checks (which leave an entry fresh) with charges, while a sweeper
// keeps dropping fresh entries that requests are about to charge: each key
// still allows exactly its limit.
func TestMemoryExactWhileSweeping(t *testing.T) {
	const (
		keys       = 50
		limit      = 3
		goroutines = 64
	)
	m, _ := newTestMemory(t)
	l := limitOf(algorithms.SlidingWindowLog, limit, time.Minute)
	var allowed [keys]atomic.Int64
	var swept atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			out := make([]algorithms.Decision, 1)
			// Three passes of checks over every key, then one of charges;
			// every goroutine sweeps now and then.
			for i := range 4 * keys {
				if i%8 == g%8 {
					swept.Add(int64(m.Sweep()))
				}
				k := (g*31 + i) % keys
				charge := i >= 3*keys
				items := []backend.Item{{Key: "k" + strconv.Itoa(k), Limit: l}}
				if charge {
					items[0].Hits = 1
				}
				ok, err := m.Apply(context.Background(), items, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok && charge {
					allowed[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for k := range allowed {
		if got := allowed[k].Load(); got != limit {
			t.Errorf("key %d: allowed %d, want exactly %d", k, got, limit)
		}
	}
	if swept.Load() == 0 {
		t.Error("the sweeps dropped no entry while requests ran")
	}
	t.Logf("the sweeps dropped %d fresh entries", swept.Load())
}

// TestMemorySweepDropsFreshEntries checks that the sweeper drops exactly the
// entries whose state is fresh, and that a dropped key starts fresh.
func TestMemorySweepDropsFreshEntries(t *testing.T) {
	m, clock := newTestMemory(t)
	fw := limitOf(algorithms.FixedWindow, 10, time.Minute) // fresh at the next minute
	tb := limitOf(algorithms.TokenBucket, 10, time.Hour)   // 1 hit refills in 6 minutes
	apply(t, m, backend.Item{Key: "fw", Limit: fw, Hits: 1}, backend.Item{Key: "tb", Limit: tb, Hits: 1})
	apply(t, m, backend.Item{Key: "checked", Limit: fw}) // a check leaves a fresh entry

	if got := m.Stats().Keys; got != 3 {
		t.Fatalf("keys %d, want 3", got)
	}
	if got := m.Sweep(); got != 1 {
		t.Errorf("sweep at t0 dropped %d entries, want 1 (the checked key)", got)
	}
	clock.Advance(59 * time.Second)
	if got := m.Sweep(); got != 0 {
		t.Errorf("sweep at 59s dropped %d entries, want 0", got)
	}
	clock.Advance(time.Second)
	if got := m.Sweep(); got != 1 {
		t.Errorf("sweep at 60s dropped %d entries, want 1", got)
	}
	if st := m.Stats(); st.Keys != 1 || st.Swept != 2 || st.Evicted != 0 {
		t.Errorf("stats %+v, want 1 key, 2 swept, none evicted", st)
	}
	if got := remaining(t, m, "fw", fw); got != 10 {
		t.Errorf("fw: remaining %d after it was dropped, want 10", got)
	}
	clock.Advance(5*time.Minute - time.Second)
	if got := m.Sweep(); got != 1 { // fw's check left it fresh again; tb is not full yet
		t.Errorf("sweep at 5m59s dropped %d entries, want 1", got)
	}
	clock.Advance(time.Second)
	if got := m.Sweep(); got != 1 {
		t.Errorf("sweep at 6m dropped %d entries, want 1", got)
	}
	if st := m.Stats(); st.Keys != 0 || st.Swept != 4 {
		t.Errorf("stats %+v, want no keys, 4 swept", st)
	}
}

// TestMemorySweepThenEarlierClock checks that a request whose clock reading is
// older than a sweep that dropped its key is decided as at the sweep's
// instant, where the dropped state was fresh, so a sweep never grants more
// than the dropped state would have.
func TestMemorySweepThenEarlierClock(t *testing.T) {
	for _, k := range algorithms.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			m, clock := newTestMemory(t)
			l := limitOf(k, 4, time.Minute)
			item := backend.Item{Key: "k", Limit: l, Hits: 3}
			ds, _ := apply(t, m, item)
			old, want := algorithms.Decide(l, algorithms.State{}, testutil.Base, 3)
			if ds[0] != want {
				t.Fatalf("first request %+v, want %+v", ds[0], want)
			}
			sweptAt := testutil.Base.Add(ds[0].ResetAfter)
			clock.Set(sweptAt)
			if got := m.Sweep(); got != 1 {
				t.Fatalf("sweep at the reset instant dropped %d entries, want 1", got)
			}
			earlier := testutil.Base.Add(ds[0].ResetAfter / 2)
			clock.Set(earlier)
			ds, _ = apply(t, m, item)
			_, want = algorithms.Decide(l, old, sweptAt, 3)
			if ds[0] != want {
				t.Errorf("request at %v after a sweep at %v: %+v, want %+v (as at the sweep)", earlier, sweptAt, ds[0], want)
			}
		})
	}
}

// TestMemoryEveryEntryExpires is TestEveryKeyHasATTL of the Redis store:
// whatever the charge, admitted or accounted, every entry is swept once
// its bound has passed (a window, two for the sliding counter, a full
// refill from algorithms.MaxDebt below empty for token_bucket and gcra),
// and none before the first of them.
func TestMemoryEveryEntryExpires(t *testing.T) {
	m, clock := newTestMemory(t)
	const w = time.Hour
	var longest time.Duration
	n := 0
	for _, k := range algorithms.Kinds() {
		l := limitOf(k, 10, w)
		bound := w
		switch k {
		case algorithms.SlidingWindowCounter:
			bound = 2 * w
		case algorithms.TokenBucket, algorithms.GCRA:
			l.Burst = 30
			bound = time.Duration(l.Capacity()+algorithms.MaxDebt(l)) * w / time.Duration(l.Requests)
		}
		longest = max(longest, bound)
		for _, hits := range []uint64{l.Capacity() + 1, 1e9, 1e12, 1e18, math.MaxUint64} {
			n++
			apply(t, m, backend.Item{Key: strconv.Itoa(n), Limit: l, Hits: hits, Account: true})
		}
	}
	m.Sweep()
	if got := m.Stats().Keys; got != n {
		t.Fatalf("%d keys held after the charges, want %d", got, n)
	}
	clock.Advance(longest)
	m.Sweep()
	if got := m.Stats().Keys; got != 0 {
		t.Fatalf("%d keys held %v after the charges, want none", got, longest)
	}
}
