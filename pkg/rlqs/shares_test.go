package rlqs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// sharesImpls runs a test against the memory Shares and the Redis ones
// (a real redis-server), both on real time.
func sharesImpls(t *testing.T, test func(t *testing.T, sh Shares)) {
	t.Run("memory", func(t *testing.T) { test(t, NewMemoryShares(time.Now)) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.StartStandalone(t)
		c := srv.Client()
		t.Cleanup(func() { c.Close() })
		test(t, NewRedisShares(c, "test:"))
	})
}

func reserve(t *testing.T, sh Shares, r Reservation) int64 {
	t.Helper()
	out := make([]int64, 1)
	if err := sh.Reserve(context.Background(), []Reservation{r}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func loadShares(t *testing.T, sh Shares, key string) map[string]Entry {
	t.Helper()
	es, err := sh.Load(context.Background(), []string{key})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]Entry{}
	for _, e := range es[0] {
		m[e.Sub] = e
	}
	return m
}

// TestSharesReserve: a raise gets only what the others leave; a lowering
// is granted, and the old rate keeps counting for loweredGrace; released
// entries are gone, dropped ones free after the grace, and every entry
// expires after its TTL and the grace.
func TestSharesReserve(t *testing.T) {
	sharesImpls(t, func(t *testing.T, sh Shares) {
		r := func(sub string, target float64, ttl time.Duration) Reservation {
			return Reservation{Key: "b", Sub: sub, Host: "h-" + sub, Want: target, Target: target, Cap: 10, Fill: 10, TTL: ttl, Stale: time.Minute}
		}
		if g := reserve(t, sh, r("a", 8, time.Minute)); g != 80 {
			t.Fatalf("a alone: %d tokens, want 80", g)
		}
		if g := reserve(t, sh, r("b", 5, time.Minute)); g != 20 {
			t.Fatalf("b beside a's 8: %d tokens, want 20 (2 of 10 left)", g)
		}
		if g := reserve(t, sh, r("a", 4, time.Minute)); g != 40 {
			t.Fatalf("a lowered to 4: %d", g)
		}
		if g := reserve(t, sh, r("b", 5, time.Minute)); g != 20 {
			t.Fatalf("b raised within a's grace: %d tokens, want 20", g)
		}
		if e := loadShares(t, sh, "b")["a"]; e.Rate != 8 || e.Gone || e.Want != 4 || e.Host != "h-a" {
			t.Fatalf("a within its grace: %+v", e)
		}
		testutil.WaitFor(t, 10*time.Second, "a's grace to end", func() bool { return loadShares(t, sh, "b")["a"].Rate == 4 })
		if g := reserve(t, sh, r("b", 5, time.Minute)); g != 50 {
			t.Fatalf("b after a's grace: %d tokens, want 50", g)
		}
		// a leaves: gone, it still holds its 4 until it expires.
		if err := sh.Release(context.Background(), []Release{{Key: "b", Sub: "a"}}); err != nil {
			t.Fatal(err)
		}
		if e := loadShares(t, sh, "b")["a"]; !e.Gone || e.Rate != 4 {
			t.Fatalf("a released: %+v", e)
		}
		if g := reserve(t, sh, r("b", 10, time.Minute)); g != 60 {
			t.Fatalf("b while gone a holds 4: %d, want 60", g)
		}
		// A takeover from the same host takes a's entry over.
		c := r("c", 4, time.Minute)
		c.Host, c.Takeover = "h-a", "a"
		if g := reserve(t, sh, c); g != 40 {
			t.Fatalf("c taking a over: %d tokens, want 40", g)
		}
		if es := loadShares(t, sh, "b"); len(es) != 2 || es["a"].Sub != "" {
			t.Fatalf("after the takeover: %+v", es)
		}
		// Dropped: free after the grace; a short TTL expires.
		if err := sh.Release(context.Background(), []Release{{Key: "b", Sub: "c", Drop: true}}); err != nil {
			t.Fatal(err)
		}
		reserve(t, sh, r("d", 0.5, 200*time.Millisecond))
		testutil.WaitFor(t, 10*time.Second, "c and d to expire", func() bool {
			es := loadShares(t, sh, "b")
			return len(es) == 1 && es["b"].Rate == 6
		})
	})
}

// TestSharesConcurrentReservesNeverOvercommit: instances reserving at once
// for many subscribers of one bucket never hold more than its capacity
// together.
func TestSharesConcurrentReservesNeverOvercommit(t *testing.T) {
	sharesImpls(t, func(t *testing.T, sh Shares) {
		const subs, rounds, capacity = 8, 40, 100.0
		var mu sync.Mutex
		granted := map[string]float64{}
		var wg sync.WaitGroup
		errs := make(chan error, subs)
		for i := range subs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				sub := fmt.Sprint("s", i)
				out := make([]int64, 1)
				for range rounds {
					target := rng.Float64() * capacity
					if err := sh.Reserve(context.Background(), []Reservation{{Key: "hot", Sub: sub, Want: target, Target: target, Cap: capacity, Fill: 7, TTL: time.Minute, Stale: time.Minute}}, out); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					granted[sub] = float64(out[0]) / 7
					total := 0.0
					for _, g := range granted {
						total += g
					}
					mu.Unlock()
					if total > capacity+1e-9 {
						errs <- fmt.Errorf("grants sum to %v of %v", total, capacity)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	})
}
