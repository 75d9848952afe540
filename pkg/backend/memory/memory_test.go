package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// newTestMemory returns a store on a manual clock at testutil.Base, without the
// background sweeper, closed at the end of the test.
func newTestMemory(t testing.TB, opts ...memory.Option) (*memory.Store, *testutil.Clock) {
	t.Helper()
	clock := testutil.NewClock(testutil.Base)
	m := memory.New(append([]memory.Option{memory.WithClock(clock), memory.WithSweepInterval(0)}, opts...)...)
	t.Cleanup(func() { m.Close() })
	return m, clock
}

// apply runs one request and fails the test on an error.
func apply(t testing.TB, m *memory.Store, items ...backend.Item) ([]algorithms.Decision, bool) {
	t.Helper()
	out := make([]algorithms.Decision, len(items))
	ok, err := m.Apply(context.Background(), items, out)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return out, ok
}

// remaining checks key without charging it and returns its Remaining.
func remaining(t testing.TB, m *memory.Store, key string, l algorithms.Limit) uint64 {
	t.Helper()
	ds, _ := apply(t, m, backend.Item{Key: key, Limit: l})
	return ds[0].Remaining
}

func limitOf(k algorithms.Kind, requests uint64, window time.Duration) algorithms.Limit {
	return algorithms.Limit{Algorithm: k, Requests: requests, Window: window}
}

// TestMemoryExactOneKey hammers one key from many goroutines on a frozen
// clock, while another goroutine sweeps, and counts exactly the limit's
// requests as allowed.
func TestMemoryExactOneKey(t *testing.T) {
	const (
		limit      = 100
		goroutines = 64
		attempts   = 8 // per goroutine: 512 requests in all
	)
	for _, k := range algorithms.Kinds() {
		t.Run(k.String(), func(t *testing.T) {
			m, _ := newTestMemory(t)
			l := limitOf(k, limit, time.Minute)
			var allowed atomic.Int64
			stop := make(chan struct{})
			sweeps := make(chan int)
			go func() { // the entry is fresh until charged: sweeps race with the first requests
				n := 0
				for {
					select {
					case <-stop:
						sweeps <- n
						return
					default:
						n += m.Sweep()
					}
				}
			}()
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					items := []backend.Item{{Key: "hot", Limit: l, Hits: 1}}
					out := make([]algorithms.Decision, 1)
					for range attempts {
						ok, err := m.Apply(context.Background(), items, out)
						if err != nil {
							t.Errorf("goroutine %d: %v", g, err)
							return
						}
						if ok != out[0].Allowed {
							t.Errorf("goroutine %d: verdict %v, decision %v", g, ok, out[0].Allowed)
						}
						if ok {
							allowed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(stop)
			dropped := <-sweeps
			if got := allowed.Load(); got != limit {
				t.Errorf("allowed %d requests, want exactly %d", got, limit)
			}
			if got := remaining(t, m, "hot", l); got != 0 {
				t.Errorf("remaining %d after the limit was used up, want 0", got)
			}
			t.Logf("the sweeper dropped the fresh entry %d times", dropped)
		})
	}
}

// TestMemoryAllOrNothingConcurrent runs requests that touch two keys (in
// either order) against requests that touch one of them, and checks that the
// two keys' remaining capacity accounts exactly for the allowed requests: a
// denied request charged neither key, and neither key was over-charged.
func TestMemoryAllOrNothingConcurrent(t *testing.T) {
	const goroutines = 64
	m, _ := newTestMemory(t)
	la := limitOf(algorithms.FixedWindow, 150, time.Minute)
	lb := limitOf(algorithms.TokenBucket, 200, time.Minute)
	var both, onlyB, onlyA atomic.Uint64 // allowed requests of each shape
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			out := make([]algorithms.Decision, 2)
			ab := []backend.Item{{Key: "a", Limit: la, Hits: 2}, {Key: "b", Limit: lb, Hits: 1}}
			ba := []backend.Item{{Key: "b", Limit: lb, Hits: 1}, {Key: "a", Limit: la, Hits: 2}}
			a := []backend.Item{{Key: "a", Limit: la, Hits: 1}}
			b := []backend.Item{{Key: "b", Limit: lb, Hits: 3}}
			for i := range 20 {
				var items []backend.Item
				var counter *atomic.Uint64
				switch (g + i) % 4 {
				case 0:
					items, counter = ab, &both
				case 1:
					items, counter = ba, &both
				case 2:
					items, counter = a, &onlyA
				default:
					items, counter = b, &onlyB
				}
				ok, err := m.Apply(context.Background(), items, out)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					counter.Add(1)
				}
			}
		})
	}
	wg.Wait()
	usedA := 2*both.Load() + onlyA.Load()
	usedB := both.Load() + 3*onlyB.Load()
	if usedA > la.Requests || usedB > lb.Requests {
		t.Fatalf("over-charged: a used %d of %d, b used %d of %d", usedA, la.Requests, usedB, lb.Requests)
	}
	if got := remaining(t, m, "a", la); got != la.Requests-usedA {
		t.Errorf("a: remaining %d, want %d (allowed: %d both, %d a only)", got, la.Requests-usedA, both.Load(), onlyA.Load())
	}
	if got := remaining(t, m, "b", lb); got != lb.Requests-usedB {
		t.Errorf("b: remaining %d, want %d (allowed: %d both, %d b only)", got, lb.Requests-usedB, both.Load(), onlyB.Load())
	}
	if both.Load() == 0 || both.Load()+onlyA.Load()+onlyB.Load() == goroutines*20 {
		t.Errorf("allowed %d two-key requests of %d requests: the test does not contend", both.Load(), goroutines*20)
	}
}

// TestMemoryDeniedRequestChargesNothing checks the all-or-nothing rule and
// what the decisions of a denied request report.
func TestMemoryDeniedRequestChargesNothing(t *testing.T) {
	m, _ := newTestMemory(t)
	la := limitOf(algorithms.TokenBucket, 5, time.Minute)
	lb := limitOf(algorithms.FixedWindow, 1, time.Minute)

	ds, ok := apply(t, m, backend.Item{Key: "a", Limit: la, Hits: 2}, backend.Item{Key: "b", Limit: lb, Hits: 2})
	if ok {
		t.Fatal("request allowed although b denies")
	}
	if !ds[0].Allowed || ds[0].Remaining != 5 {
		t.Errorf("a: %+v, want allowed with its 5 remaining (this request's hits not charged)", ds[0])
	}
	if ds[1].Allowed || ds[1].RetryAfter != algorithms.Never {
		t.Errorf("b: %+v, want denied for ever (2 hits above a limit of 1)", ds[1])
	}
	if got := remaining(t, m, "a", la); got != 5 {
		t.Errorf("a: remaining %d after a denied request, want 5", got)
	}

	// A denying Shadow item does not deny; the allowing items are charged,
	// the shadow one is not.
	ds, ok = apply(t, m,
		backend.Item{Key: "a", Limit: la, Hits: 2},
		backend.Item{Key: "b", Limit: lb, Hits: 2, Mode: backend.Shadow})
	if !ok || !ds[0].Allowed || ds[0].Remaining != 3 || ds[1].Allowed {
		t.Errorf("shadow: allowed=%v decisions %+v", ok, ds)
	}
	if got := remaining(t, m, "b", lb); got != 1 {
		t.Errorf("b: remaining %d, want 1 (the shadow item denied, so nothing was charged)", got)
	}

	// Quota: denied only when every quota group has a denying item.
	lq := limitOf(algorithms.FixedWindow, 1, time.Minute)
	apply(t, m, backend.Item{Key: "q1", Limit: lq, Hits: 1})
	ds, ok = apply(t, m,
		backend.Item{Key: "q1", Limit: lq, Hits: 1, Mode: backend.Quota, Group: 0},
		backend.Item{Key: "q2", Limit: lq, Hits: 1, Mode: backend.Quota, Group: 1})
	if !ok || ds[0].Allowed || !ds[1].Allowed {
		t.Errorf("one of two quota groups denies: allowed=%v decisions %+v", ok, ds)
	}
	ds, ok = apply(t, m,
		backend.Item{Key: "q1", Limit: lq, Hits: 1, Mode: backend.Quota, Group: 0},
		backend.Item{Key: "q2", Limit: lq, Hits: 1, Mode: backend.Quota, Group: 1},
		backend.Item{Key: "a", Limit: la, Hits: 1})
	if ok || ds[0].Allowed || ds[1].Allowed || !ds[2].Allowed || ds[2].Remaining != 3 {
		t.Errorf("every quota group denies: allowed=%v decisions %+v", ok, ds)
	}
	if got := remaining(t, m, "a", la); got != 3 {
		t.Errorf("a: remaining %d, want 3", got)
	}
}

// TestMemorySameKeyItems checks that items sharing a key are decided in
// order, each seeing the hits of the ones before it.
func TestMemorySameKeyItems(t *testing.T) {
	m, _ := newTestMemory(t)
	l := limitOf(algorithms.FixedWindow, 5, time.Minute)
	ds, ok := apply(t, m, backend.Item{Key: "k", Limit: l, Hits: 2}, backend.Item{Key: "k", Limit: l, Hits: 2})
	if !ok || ds[0].Remaining != 3 || ds[1].Remaining != 1 {
		t.Fatalf("allowed=%v decisions %+v, want remaining 3 then 1", ok, ds)
	}
	// The second item sees the first's hits and denies; the first then
	// reports the state without them.
	ds, ok = apply(t, m, backend.Item{Key: "k", Limit: l, Hits: 1}, backend.Item{Key: "k", Limit: l, Hits: 1})
	if ok || !ds[0].Allowed || ds[0].Remaining != 1 || ds[1].Allowed || ds[1].Remaining != 0 {
		t.Fatalf("allowed=%v decisions %+v", ok, ds)
	}
	if got := remaining(t, m, "k", l); got != 1 {
		t.Errorf("remaining %d, want 1", got)
	}
}

// TestMemoryMatchesModel runs random requests (up to 40 items, so both the
// inline and the allocated scratch space are used, with repeated keys and
// every mode) against the store and the model on a clock that moves forward,
// sweeping now and then: sweeps must never change a decision.
func TestMemoryMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, clock := newTestMemory(t)
	md := storetest.Model{}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	limits := map[string]algorithms.Limit{}
	for i, k := range keys {
		kind := algorithms.Kinds()[i%len(algorithms.Kinds())]
		l := limitOf(kind, uint64(3+i), time.Duration(1+i)*time.Second)
		if kind.HasBurst() {
			l.Burst = uint64(5 + i)
		}
		limits[k] = l
	}
	swept := 0
	for step := range 3000 {
		n := 1 + rng.IntN(6)
		if step%10 == 0 {
			n = 17 + rng.IntN(24)
		}
		items := make([]backend.Item, n)
		for i := range items {
			k := keys[rng.IntN(len(keys))]
			items[i] = backend.Item{Key: k, Limit: limits[k], Hits: uint64(rng.IntN(4)), Mode: backend.Mode(rng.IntN(3)), Group: rng.IntN(3)}
		}
		clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
		if rng.IntN(20) == 0 {
			swept += m.Sweep()
		}
		got, gotOK := apply(t, m, items...)
		want, wantOK := md.Apply(items, clock.Now())
		if gotOK != wantOK || !slices.Equal(got, want) {
			t.Fatalf("step %d: items %+v\nstore: %v %+v\nmodel: %v %+v", step, items, gotOK, got, wantOK, want)
		}
	}
	if swept == 0 {
		t.Error("no sweep dropped anything: the test does not show that sweeping is free")
	}
}

// TestMemoryEviction fills a small store with many keys and checks that the
// store stays bounded and counts evictions, separating the ones that lost a
// live state.
func TestMemoryEviction(t *testing.T) {
	const maxKeys = 8
	l := limitOf(algorithms.FixedWindow, 10, time.Minute)

	t.Run("live", func(t *testing.T) {
		m, _ := newTestMemory(t, memory.WithMaxKeys(maxKeys))
		for i := range 200 {
			apply(t, m, backend.Item{Key: fmt.Sprintf("key-%d", i), Limit: l, Hits: 1})
		}
		// Every key was charged once on a frozen clock: each charged entry is
		// either still held or was evicted live. (An entry evicted between its
		// creation and its request's lock is evicted fresh, and the request
		// retries with a new one.)
		testutil.WaitFor(t, 5*time.Second, "evictions to be counted", func() bool {
			st := m.Stats()
			return st.Keys <= maxKeys && st.EvictedLive == uint64(200-st.Keys)
		})
		if st := m.Stats(); st.Evicted < st.EvictedLive || st.Swept != 0 {
			t.Errorf("stats %+v", st)
		}
	})
	t.Run("fresh", func(t *testing.T) {
		m, _ := newTestMemory(t, memory.WithMaxKeys(maxKeys))
		for i := range 200 {
			apply(t, m, backend.Item{Key: fmt.Sprintf("key-%d", i), Limit: l}) // checks only
		}
		testutil.WaitFor(t, 5*time.Second, "evictions to be counted", func() bool {
			st := m.Stats()
			return st.Keys <= maxKeys && st.Evicted >= 200-maxKeys
		})
		if st := m.Stats(); st.EvictedLive != 0 {
			t.Errorf("stats %+v: no evicted entry held a live state", st)
		}
	})
	t.Run("request wider than the store", func(t *testing.T) {
		// Every request needs more keys than the store holds: entries are
		// evicted while requests hold them, and requests must still finish.
		m, _ := newTestMemory(t, memory.WithMaxKeys(2))
		items := make([]backend.Item, 6)
		for round := range 200 {
			for i := range items {
				items[i] = backend.Item{Key: fmt.Sprintf("r%d-%d", round%7, i), Limit: l, Hits: 1}
			}
			if _, ok := apply(t, m, items...); !ok && round < 7 {
				t.Fatalf("round %d denied", round)
			}
		}
		testutil.WaitFor(t, 5*time.Second, "the store to shrink to its bound", func() bool { return m.Stats().Keys <= 2 })
	})
}

// TestMemoryClose checks that Close stops the store's goroutines and that
// Apply fails afterwards.
func TestMemoryClose(t *testing.T) {
	before := runtime.NumGoroutine()
	m := memory.New(memory.WithSweepInterval(time.Millisecond), memory.WithMaxKeys(16))
	for i := range 100 {
		out := make([]algorithms.Decision, 1)
		if _, err := m.Apply(context.Background(), []backend.Item{{Key: fmt.Sprint(i), Limit: limitOf(algorithms.GCRA, 5, time.Second), Hits: 1}}, out); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "the background sweeper to drop an entry", func() bool { return m.Stats().Swept > 0 })
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := m.Apply(context.Background(), []backend.Item{{Key: "x", Limit: limitOf(algorithms.GCRA, 5, time.Second), Hits: 1}}, make([]algorithms.Decision, 1))
	if !errors.Is(err, backend.ErrClosed) {
		t.Errorf("Apply after Close: %v, want ErrClosed", err)
	}
	testutil.WaitFor(t, 5*time.Second, "the store's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

func TestMemoryApplyErrors(t *testing.T) {
	m, _ := newTestMemory(t)
	item := backend.Item{Key: "k", Limit: limitOf(algorithms.FixedWindow, 1, time.Minute), Hits: 1}
	if _, err := m.Apply(context.Background(), []backend.Item{item, item}, make([]algorithms.Decision, 1)); err == nil {
		t.Error("Apply with too few decisions: no error")
	}
	if ok, err := m.Apply(context.Background(), nil, nil); !ok || err != nil {
		t.Errorf("Apply of no items: %v, %v; want allowed", ok, err)
	}
	if got := remaining(t, m, "k", item.Limit); got != 1 {
		t.Errorf("remaining %d after failed calls, want 1", got)
	}
	// A context that is already done does not stop the memory store from
	// deciding: it never waits on I/O, and an error here would become a
	// fail-open answer upstream.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, err := m.Apply(ctx, []backend.Item{item}, make([]algorithms.Decision, 1)); !ok || err != nil {
		t.Errorf("Apply with a canceled context: %v, %v; want a decision", ok, err)
	}
	if ok, _ := m.Apply(ctx, []backend.Item{item}, make([]algorithms.Decision, 1)); ok {
		t.Error("the canceled call was not charged: a limit of 1 allowed twice")
	}
}

// TestMemoryRequestSizes: requests on the stack's scratch (up to 4 items),
// on the pooled one (up to 64) and on allocated space (more) decide as the
// model does, with keys repeated within a request, over a sequence in which
// the pool's scratch is reused by requests of other sizes.
func TestMemoryRequestSizes(t *testing.T) {
	m, clock := newTestMemory(t)
	model := storetest.Model{}
	rng := rand.New(rand.NewPCG(7, 11))
	limit := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 40, Window: time.Minute}
	log := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Requests: 30, Window: time.Minute}
	for round := 0; round < 300; round++ {
		n := []int{1, 3, 4, 5, 17, 64, 65, 100}[rng.IntN(8)]
		items := make([]backend.Item, n)
		for i := range items {
			l := limit
			if rng.IntN(2) == 0 {
				l = log
			}
			// Few keys, so that items share keys and requests deny.
			items[i] = backend.Item{Key: fmt.Sprintf("k%d/%s", rng.IntN(12), l.Algorithm), Limit: l, Hits: uint64(rng.IntN(3))}
		}
		want, wantOK := model.Apply(items, clock.Now())
		got, gotOK := apply(t, m, items...)
		if gotOK != wantOK || !slices.Equal(got, want) {
			t.Fatalf("round %d, %d items: got %v %+v, model %v %+v", round, n, gotOK, got, wantOK, want)
		}
		clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
	}
}
