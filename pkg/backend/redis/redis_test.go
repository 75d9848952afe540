package redis_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// newRedisStore returns a store on addr (a redis:// URL unless opts says
// otherwise), closed when the test ends.
func newRedisStore(t testing.TB, opts redis.Options) *redis.Store {
	t.Helper()
	r, err := redis.New(opts)
	if err != nil {
		t.Fatalf("NewRedis: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// newClockedRedisStore is newRedisStore with the script's instant read from
// clock (a test's timeline) instead of Redis's TIME.
func newClockedRedisStore(t testing.TB, clock backend.Clock, opts redis.Options) *redis.Store {
	t.Helper()
	r, err := redis.NewWithClock(opts, clock)
	if err != nil {
		t.Fatalf("NewWithClock: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func redisApply(t testing.TB, s backend.Store, items ...backend.Item) ([]algorithms.Decision, bool) {
	t.Helper()
	out := make([]algorithms.Decision, len(items))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	allowed, err := s.Apply(ctx, items, out)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return out, allowed
}

func TestRedisSmoke(t *testing.T) {
	srv := redistest.StartStandalone(t)
	clock := testutil.NewClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	r := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL()})
	for _, k := range algorithms.Kinds() {
		l := algorithms.Limit{Algorithm: k, Requests: 3, Window: time.Second}
		key := "smoke:" + k.String()
		for i := 0; i < 3; i++ {
			ds, ok := redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 1})
			if !ok || !ds[0].Allowed || ds[0].Remaining != uint64(2-i) || ds[0].Limit != 3 {
				t.Fatalf("%s: hit %d: %+v allowed=%v", k, i, ds[0], ok)
			}
		}
		ds, ok := redisApply(t, r, backend.Item{Key: key, Limit: l, Hits: 1})
		if ok || ds[0].Allowed || ds[0].RetryAfter <= 0 {
			t.Fatalf("%s: 4th hit: %+v allowed=%v; want denied", k, ds[0], ok)
		}
	}
}

// redisModel is the Redis store's contract written plainly on top of
// pkg/algorithms: the Store contract (as memModel), plus the one thing the
// Redis store does differently from Memory: a key whose state is fresh after
// a request (the ResetAfter of its last allowing item is zero) is deleted,
// so it starts again from a zero State.
type redisModel map[string]algorithms.State

func (md redisModel) apply(items []backend.Item, now time.Time) ([]algorithms.Decision, bool) {
	ds := md.applyPart(items, now, true)
	return ds, backend.Verdict(items, ds)
}

// applyPart decides items as one script call does. With whole set they are
// the whole request, committed when it is allowed; otherwise they are one
// cluster slot of a split request, committed unless an Enforced item among
// them denies.
func (md redisModel) applyPart(items []backend.Item, now time.Time, whole bool) []algorithms.Decision {
	tx, keys := storetest.NewTxn(items, func(key string) algorithms.State { return md[key] })
	c := backend.WholeRequest
	if !whole {
		c = backend.PartOfRequest
	}
	ds := make([]algorithms.Decision, len(items))
	backend.Transact(tx, items, now.UnixMicro(), c, ds)
	for j, k := range keys {
		switch {
		case !tx.Charged[j]:
		case tx.ResetAfter[j] == 0:
			delete(md, k)
		default:
			md[k] = tx.Next[j]
		}
	}
	return ds
}

// applySplit decides items as the store does on a Cluster: one part per
// hash slot of the items' Redis keys, in the order of the slots' first
// items. When a request of several slots is denied, the admission charges
// of the parts that committed are refunded: each key charged by admission
// only is as before the request, and the allowing items of such keys
// report their state as it stays. A key also charged by usage accounting
// in the request keeps every charge (the accounting's own outcome may
// depend on the charge before it: a full log, a bucket's debt cap).
func (md redisModel) applySplit(items []backend.Item, now time.Time, prefix string) ([]algorithms.Decision, bool) {
	var slots []int
	bySlot := map[int][]int{}
	for i, it := range items {
		s := redis.Slot(redis.RedisKey(prefix, it))
		if _, ok := bySlot[s]; !ok {
			slots = append(slots, s)
		}
		bySlot[s] = append(bySlot[s], i)
	}
	before := maps.Clone(md)
	ds := make([]algorithms.Decision, len(items))
	for _, s := range slots {
		var part []backend.Item
		for _, i := range bySlot[s] {
			part = append(part, items[i])
		}
		pd := md.applyPart(part, now, len(slots) == 1)
		for k, i := range bySlot[s] {
			ds[i] = pd[k]
		}
	}
	ok := backend.Verdict(items, ds)
	if ok || len(slots) == 1 {
		return ds, ok
	}
	for _, s := range slots {
		accounted, refunded := map[string]bool{}, map[string]bool{}
		committed := true
		for _, i := range bySlot[s] {
			it := items[i]
			if it.Account && it.Hits > 0 {
				accounted[it.Key] = true
			}
			if it.Mode == backend.Enforced && !ds[i].Allowed {
				committed = false
			}
		}
		if !committed {
			continue
		}
		for _, i := range bySlot[s] {
			if it := items[i]; ds[i].Allowed && it.Hits > 0 && it.Limit.Requests > 0 && !it.Account && !accounted[it.Key] {
				refunded[it.Key] = true
			}
		}
		if len(refunded) == 0 {
			continue
		}
		for k := range refunded {
			if st, ok := before[k]; ok {
				md[k] = st
			} else {
				delete(md, k)
			}
		}
		for _, i := range bySlot[s] {
			if it := items[i]; ds[i].Allowed && it.Limit.Requests > 0 && !(it.Account && it.Hits > 0) && !accounted[it.Key] {
				_, d := algorithms.DecideMicros(it.Limit, md[it.Key], now.UnixMicro(), 0)
				ds[i] = backend.Report(d)
			}
		}
	}
	return ds, ok
}

// randomLimits returns n keys with random limits of kind k (or of every
// kind when mixed), with windows from 1ms to a minute.
func randomLimits(rng *rand.Rand, k algorithms.Kind, mixed bool, n int) map[string]algorithms.Limit {
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 3 * time.Second, 7 * time.Second, time.Minute}
	limits := map[string]algorithms.Limit{}
	for i := 0; i < n; i++ {
		kind := k
		if mixed {
			kind = algorithms.Kinds()[rng.IntN(len(algorithms.Kinds()))]
		}
		l := algorithms.Limit{Algorithm: kind, Requests: uint64(rng.IntN(9)), Window: windows[rng.IntN(len(windows))]}
		if kind.HasBurst() && rng.IntN(2) == 0 {
			l.Burst = uint64(rng.IntN(12) + 1)
		}
		limits[fmt.Sprintf("k%d", i)] = l
	}
	return limits
}

// randomItems returns a request of 1 to 4 items (sometimes up to 40) on the
// keys of limits, with repeated keys, every mode, two quota groups and
// usage accounting, sometimes of more hits than any limit holds.
func randomItems(rng *rand.Rand, limits map[string]algorithms.Limit) []backend.Item {
	n := 1 + rng.IntN(4)
	if rng.IntN(20) == 0 {
		n = 17 + rng.IntN(24)
	}
	items := make([]backend.Item, n)
	for i := range items {
		k := fmt.Sprintf("k%d", rng.IntN(len(limits)))
		hits := uint64(rng.IntN(5))
		if rng.IntN(10) == 0 {
			// Past capacity and past a bucket's debt cap
			// (algorithms.MaxDebt), for accounting.
			hits = uint64(10 + rng.IntN(50))
		}
		items[i] = backend.Item{Key: k, Limit: limits[k], Hits: hits, Mode: backend.Mode(rng.IntN(3)), Group: rng.IntN(2), Account: rng.IntN(4) == 0}
	}
	return items
}

func sameDecisions(t *testing.T, step int, items []backend.Item, got []algorithms.Decision, gotOK bool, want []algorithms.Decision, wantOK bool) {
	t.Helper()
	if gotOK != wantOK {
		t.Fatalf("step %d: items %+v: allowed %v, want %v", step, items, gotOK, wantOK)
	}
	for i := range items {
		if got[i] != want[i] {
			t.Fatalf("step %d item %d (%+v) of %+v:\ngot  %+v\nwant %+v", step, i, items[i], items, got[i], want[i])
		}
	}
}

// TestRedisMatchesMemoryRandom drives the Redis store and the memory store
// with the same random requests on the same forward-moving timeline and
// requires identical decisions: a broad check, on top of the shared tables,
// that the Lua twin follows pkg/algorithms and the Store contract.
func TestRedisMatchesMemoryRandom(t *testing.T) {
	srv := redistest.StartStandalone(t)
	start := time.Date(2031, 3, 4, 5, 6, 7, 891011000, time.UTC)
	forEachKindAndMixed(t, func(t *testing.T, seed int, k algorithms.Kind, mixed bool, name string) {
		rng := rand.New(rand.NewPCG(uint64(seed)+1, 42))
		clock := testutil.NewClock(start)
		mem := memory.New(memory.WithClock(clock), memory.WithSweepInterval(0))
		t.Cleanup(func() { mem.Close() })
		red := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: "mem:" + name + ":"})
		limits := randomLimits(rng, k, mixed, 5)
		for step := 0; step < 400; step++ {
			switch rng.IntN(4) {
			case 0: // same instant
			case 1:
				clock.Advance(time.Duration(rng.IntN(2000)) * time.Microsecond)
			case 2:
				clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			case 3:
				clock.Advance(time.Duration(rng.IntN(5)) * time.Second)
			}
			items := randomItems(rng, limits)
			want, wantOK := redisApply(t, mem, items...)
			got, gotOK := redisApply(t, red, items...)
			sameDecisions(t, step, items, got, gotOK, want, wantOK)
		}
	})
}

// TestRedisMatchesModelClockSteps is TestRedisMatchesMemoryRandom with a
// clock that also steps back, against redisModel: Memory keeps the latest
// instant a fresh key has seen (and decides no earlier than that), while the
// Redis store deletes fresh keys, so after a step back such a key starts
// again from the earlier instant, as any fresh key would.
func TestRedisMatchesModelClockSteps(t *testing.T) {
	srv := redistest.StartStandalone(t)
	start := time.Date(2031, 3, 4, 5, 6, 7, 891011000, time.UTC)
	forEachKindAndMixed(t, func(t *testing.T, seed int, k algorithms.Kind, mixed bool, name string) {
		rng := rand.New(rand.NewPCG(uint64(seed)+7, 43))
		clock := testutil.NewClock(start)
		md := redisModel{}
		red := newClockedRedisStore(t, clock, redis.Options{URL: srv.URL(), KeyPrefix: "model:" + name + ":"})
		limits := randomLimits(rng, k, mixed, 5)
		backs := 0
		for step := 0; step < 400; step++ {
			switch rng.IntN(5) {
			case 0: // same instant
			case 1:
				clock.Advance(time.Duration(rng.IntN(2000)) * time.Microsecond)
			case 2:
				clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			case 3:
				clock.Advance(time.Duration(rng.IntN(5)) * time.Second)
			case 4:
				clock.Advance(-time.Duration(1+rng.IntN(1500)) * time.Millisecond)
				backs++
			}
			items := randomItems(rng, limits)
			want, wantOK := md.apply(items, clock.Now())
			got, gotOK := redisApply(t, red, items...)
			sameDecisions(t, step, items, got, gotOK, want, wantOK)
		}
		if backs == 0 {
			t.Fatal("the clock never stepped back")
		}
	})
}

// forEachKindAndMixed runs f as a subtest for every algorithm, then for a
// mix of all of them (k 255, mixed true, name "mixed"); seed differs per
// subtest.
func forEachKindAndMixed(t *testing.T, f func(t *testing.T, seed int, k algorithms.Kind, mixed bool, name string)) {
	for seed, k := range append(algorithms.Kinds(), 255) {
		name, mixed := k.String(), k == 255
		if mixed {
			name = "mixed"
		}
		t.Run(name, func(t *testing.T) { f(t, seed, k, mixed, name) })
	}
}
