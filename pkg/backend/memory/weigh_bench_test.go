package memory_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkEntryBytes measures what one key costs the store: the live heap
// per key of a store filled with charged keys of each length, reported as
// B/key, and beside it the store's estimate (memory.EntryBytes) and the
// overhead beyond the key's bytes (to compare with memory.EntryOverhead).
func BenchmarkEntryBytes(b *testing.B) {
	const keys = 20_000
	l := algorithms.Limit{Algorithm: algorithms.FixedWindow, Requests: 10, Window: time.Hour}
	for _, keyLen := range []int{16, 64, 256, 1024, 4096} {
		b.Run(fmt.Sprintf("key=%d", keyLen), func(b *testing.B) {
			pad := strings.Repeat("k", keyLen-10)
			var perKey float64
			for b.Loop() {
				before := liveHeap()
				m := memory.New(memory.WithSweepInterval(0), memory.WithMaxKeys(4*keys), memory.WithMaxMemory(1<<40))
				out := make([]algorithms.Decision, 1)
				for i := range keys {
					item := backend.Item{Key: fmt.Sprintf("%s%010d", pad, i), Limit: l, Hits: 1}
					if _, err := m.Apply(context.Background(), []backend.Item{item}, out); err != nil {
						b.Fatal(err)
					}
				}
				m.Stats() // settle nothing; the cache holds every key
				after := liveHeap()
				if got := m.Stats().Keys; got != keys {
					b.Fatalf("store holds %d keys, want %d", got, keys)
				}
				perKey = float64(after-before) / keys
				runtime.KeepAlive(m)
				m.Close()
			}
			est := memory.EntryBytes(keyLen, 0)
			b.ReportMetric(perKey, "B/key")
			b.ReportMetric(float64(est), "estimate-B/key")
			b.ReportMetric(perKey-float64(est-memory.EntryOverhead), "overhead-B/key")
		})
	}
}
