package memory_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// benchLimit allows far more than a benchmark asks, so requests are charged.
var benchLimit = algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1 << 40, Window: time.Second}

func benchKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// runMemoryBench runs requests built by next from parallel goroutines against
// a store on the real monotonic clock; next gets a goroutine-local counter.
// The first warm requests run before the timer starts, so that the figures
// are those of a store that already holds its keys.
func runMemoryBench(b *testing.B, size, warm int, next func(i int, items []backend.Item)) {
	m := memory.New()
	defer m.Close()
	items, out := make([]backend.Item, size), make([]algorithms.Decision, size)
	for i := range warm {
		next(i, items)
		if _, err := m.Apply(context.Background(), items, out); err != nil {
			b.Fatal(err)
		}
	}
	var seed atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		items := make([]backend.Item, size)
		out := make([]algorithms.Decision, size)
		i := int(seed.Add(1)) * 7919
		for pb.Next() {
			next(i, items)
			i++
			if _, err := m.Apply(context.Background(), items, out); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkMemoryApplyManyKeys spreads one-item requests over 100k keys.
func BenchmarkMemoryApplyManyKeys(b *testing.B) {
	keys := benchKeys("bench/user/", 100_000)
	runMemoryBench(b, 1, len(keys), func(i int, items []backend.Item) {
		items[0] = backend.Item{Key: keys[i%len(keys)], Limit: benchLimit, Hits: 1}
	})
}

// BenchmarkMemoryApplyHotKey sends every one-item request to the same key.
func BenchmarkMemoryApplyHotKey(b *testing.B) {
	runMemoryBench(b, 1, 1, func(_ int, items []backend.Item) {
		items[0] = backend.Item{Key: "bench/hot", Limit: benchLimit, Hits: 1}
	})
}

// BenchmarkMemoryApplyThreeItems sends requests of three limits on three
// keys (a per-user, a per-route and a global one), the users spread over
// 100k keys.
func BenchmarkMemoryApplyThreeItems(b *testing.B) {
	users := benchKeys("bench/user/", 100_000)
	routes := benchKeys("bench/route/", 100)
	runMemoryBench(b, 3, len(users), func(i int, items []backend.Item) {
		items[0] = backend.Item{Key: users[i%len(users)], Limit: benchLimit, Hits: 1}
		items[1] = backend.Item{Key: routes[i%len(routes)], Limit: benchLimit, Hits: 1}
		items[2] = backend.Item{Key: "global", Limit: benchLimit, Hits: 1}
	})
}

// BenchmarkMemoryApplyFlood sends every one-item request to a new key of a
// full store of 10,000 keys, each left live (one hit of a limit of 10 per
// hour), so that every request evicts a live key: with the remembered
// table (the default) its state is kept, without it (remembered=false) it
// is lost. Keys are built before the timer starts.
func BenchmarkMemoryApplyFlood(b *testing.B) {
	for _, remembered := range []bool{true, false} {
		b.Run(fmt.Sprintf("remembered=%v", remembered), func(b *testing.B) {
			opts := []memory.Option{memory.WithMaxKeys(10_000)}
			if !remembered {
				opts = append(opts, memory.WithRememberedKeys(0))
			}
			m := memory.New(opts...)
			defer m.Close()
			l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 10, Window: time.Hour}
			keys := benchKeys("bench/flood/", 10_000+b.N)
			items, out := make([]backend.Item, 1), make([]algorithms.Decision, 1)
			for _, k := range keys[:10_000] {
				items[0] = backend.Item{Key: k, Limit: l, Hits: 1}
				m.Apply(context.Background(), items, out)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for _, k := range keys[10_000:] {
				items[0] = backend.Item{Key: k, Limit: l, Hits: 1}
				if _, err := m.Apply(context.Background(), items, out); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if st := m.Stats(); remembered && b.N > 100_000 && st.EvictedRemembered < uint64(b.N)/2 {
				b.Fatalf("%d requests, %+v", b.N, st)
			}
		})
	}
}
