package memory_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// target is a key whose state a flood must not change.
type target struct {
	key   string
	limit algorithms.Limit
	used  int // hits charged before the flood, one per 10 s
}

// floodTargets are, for every algorithm, a key of 10 per hour exhausted
// (10 hits) and one part used (9 hits), and one fresh key.
func floodTargets() []target {
	var ts []target
	for _, k := range algorithms.Kinds() {
		l := limitOf(k, 10, time.Hour)
		ts = append(ts, target{"exhausted/" + k.String(), l, 10}, target{"part/" + k.String(), l, 9})
	}
	return append(ts, target{"fresh", limitOf(algorithms.FixedWindow, 10, time.Hour), 0})
}

// vmHWM returns this process's peak resident set in MiB, or 0 when
// /proc is not there.
func vmHWM() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb uint64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb)
			return kb >> 10
		}
	}
	return 0
}

// floodRun is a store under a flood beside a store that holds only the
// targets, on clocks moved together.
type floodRun struct {
	m, held          *memory.Store
	clock, heldClock *testutil.Clock
	targets          []target
	before           memory.Stats
}

// newFloodRun charges the targets on both stores, one hit every 10 s, and
// evicts them from m, so that its remembered table (or penalty set) holds
// them for the whole flood.
func newFloodRun(t *testing.T, opts ...memory.Option) *floodRun {
	t.Helper()
	r := &floodRun{targets: floodTargets()}
	r.m, r.clock = newTestMemory(t, opts...)
	r.held, r.heldClock = newTestMemory(t)
	for i := range 10 {
		for _, tg := range r.targets {
			if i < tg.used {
				it := backend.Item{Key: tg.key, Limit: tg.limit, Hits: 1}
				got, _ := apply(t, r.m, it)
				if want, _ := apply(t, r.held, it); got[0] != want[0] || !got[0].Allowed {
					t.Fatalf("%s hit %d: %+v, held %+v", tg.key, i, got[0], want[0])
				}
			}
		}
		r.advance(10 * time.Second)
	}
	for _, tg := range r.targets {
		if tg.used > 0 && !r.m.Evict(tg.key) {
			t.Fatalf("%s not held", tg.key)
		}
	}
	r.before = r.m.Stats()
	return r
}

func (r *floodRun) advance(d time.Duration) {
	r.clock.Advance(d)
	r.heldClock.Advance(d)
}

// flood sends n distinct keys through apply, moving the clocks a
// millisecond every 1,000 keys.
func (r *floodRun) flood(n int, apply func(i int)) {
	for i := range n {
		apply(i)
		if i%1000 == 999 {
			r.advance(time.Millisecond)
		}
	}
}

// checkSpent checks that the spent flood's evictions (at least min live
// ones) were all kept, and none dropped.
func (r *floodRun) checkSpent(t *testing.T, min int) memory.Stats {
	t.Helper()
	st := r.m.Stats()
	if live := st.EvictedLive - r.before.EvictedLive; live < uint64(min) || st.EvictedLost != 0 ||
		st.RememberedDroppedPart+st.RememberedDroppedExhausted+st.PenaltyDropped != 0 {
		t.Fatalf("spent flood: %d live evictions, want at least %d, and none lost or dropped: %+v", live, min, st)
	}
	return st
}

// checkFresh checks that the fresh flood (at least min evictions of fresh
// keys) cost nothing: no record lost or dropped for it.
func (r *floodRun) checkFresh(t *testing.T, spent memory.Stats, min int) {
	t.Helper()
	st := r.m.Stats()
	if fresh := (st.Evicted - st.EvictedLive) - (spent.Evicted - spent.EvictedLive); fresh < uint64(min) ||
		st.EvictedLive-spent.EvictedLive != st.EvictedRemembered-spent.EvictedRemembered ||
		st.EvictedLost != 0 || st.RememberedDroppedPart+st.RememberedDroppedExhausted+st.PenaltyDropped != 0 {
		t.Fatalf("fresh flood: %d fresh evictions, want at least %d, and nothing lost: %+v", fresh, min, st)
	}
}

// checkTargets decides every target as on the store that held it, minute
// by minute (hits and checks in turn) past its hour: exhausted keys stay
// denied until their own reset, part-used keys lose nothing.
func (r *floodRun) checkTargets(t *testing.T) {
	t.Helper()
	for minute := range 71 {
		for _, tg := range r.targets {
			it := backend.Item{Key: tg.key, Limit: tg.limit, Hits: 1}
			if minute%2 == 1 {
				it.Hits = 0 // a check
			}
			got, _ := apply(t, r.m, it)
			want, _ := apply(t, r.held, it)
			if got[0] != want[0] {
				t.Fatalf("minute %d: %s decided %+v, held %+v", minute, tg.key, got[0], want[0])
			}
			if minute == 0 && strings.HasPrefix(tg.key, "exhausted/") && got[0].Allowed {
				t.Fatalf("%s allowed after the flood", tg.key)
			}
		}
		r.advance(time.Minute)
	}
	st := r.m.Stats()
	if restored := st.RememberedRestored + st.PenaltyRestored; restored < uint64(len(r.targets)-1) {
		t.Fatalf("%d targets restored, want %d: %+v", restored, len(r.targets)-1, st)
	}
}

var (
	spentLimit = limitOf(algorithms.TokenBucket, 10, time.Hour)
	freshLimit = limitOf(algorithms.FixedWindow, 10, time.Hour)
)

// TestFloodDefaults floods a store of the default bounds (DefaultMaxKeys,
// DefaultMaxMemory, DefaultRememberedKeys, DefaultPenaltyKeys) through Apply
// with 2 million distinct keys, each of which runs out at once (10 hits on
// a token bucket of 10 per hour: every key the cache evicts is live, the
// worst case for what keeps evicted state), then with 2 million fresh keys
// (a check of 0 hits, which leaves a key's state fresh). The targets,
// exhausted or part used before the floods for every algorithm, are then
// decided exactly as on a store that held them all along (see checkTargets),
// and the fresh flood cost nothing. Under -race, where 2 million Apply calls
// take minutes, and with -short, the floods are of 40,000 keys against a
// store of a fiftieth of the default bounds; TestFloodDefaultsEvictionPath drives the eviction
// path at the default bounds in every build.
func TestFloodDefaults(t *testing.T) {
	n, opts := 2_000_000, []memory.Option(nil)
	if raceEnabled || testing.Short() {
		const scale = 50
		n = 2_000_000 / scale
		opts = []memory.Option{
			memory.WithMaxKeys(memory.DefaultMaxKeys / scale),
			memory.WithMaxMemory(memory.DefaultMaxMemory / scale),
			memory.WithRememberedKeys(memory.DefaultRememberedKeys / scale),
			memory.WithPenaltyKeys(memory.DefaultPenaltyKeys / scale),
		}
	}
	r := newFloodRun(t, opts...)
	start := time.Now()
	items, out := make([]backend.Item, 1), make([]algorithms.Decision, 1)
	flood := func(prefix string, l algorithms.Limit, hits uint64) func(int) {
		return func(i int) {
			items[0] = backend.Item{Key: prefix + strconv.Itoa(i), Limit: l, Hits: hits}
			if _, err := r.m.Apply(t.Context(), items, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.flood(n, flood("spent/", spentLimit, 10))
	spent := r.checkSpent(t, n/3)
	r.flood(n, flood("fresh/", freshLimit, 0))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("%d + %d keys in %v; heap in use %d MiB, peak RSS %d MiB; %+v",
		n, n, time.Since(start).Round(time.Millisecond), ms.HeapInuse>>20, vmHWM(), r.m.Stats())
	r.checkFresh(t, spent, n/2)
	r.checkTargets(t)
}

// TestFloodDefaultsEvictionPath is TestFloodDefaults at the default bounds
// in every build, -race included: the floods' keys go straight through the
// eviction path (Store.EvictDecided: each key's entry is created, decided
// and evicted as the full cache would evict it). Of a flood of 2 million
// spent keys the cache holds DefaultMaxKeys, so the other million are
// evicted live; then 200,000 fresh keys are evicted.
func TestFloodDefaultsEvictionPath(t *testing.T) {
	r := newFloodRun(t)
	start := time.Now()
	n := 2_000_000 - memory.DefaultMaxKeys
	r.flood(n, func(i int) {
		if d := r.m.EvictDecided("spent/"+strconv.Itoa(i), spentLimit, 10); !d.Allowed {
			t.Fatalf("spent key %d: %+v", i, d)
		}
	})
	spent := r.checkSpent(t, n)
	const fresh = 200_000
	r.flood(fresh, func(i int) { r.m.EvictDecided("fresh/"+strconv.Itoa(i), freshLimit, 0) })
	t.Logf("%d + %d keys in %v; %+v", n, fresh, time.Since(start).Round(time.Millisecond), r.m.Stats())
	r.checkFresh(t, spent, fresh)
	r.checkTargets(t)
}
