package memory_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
)

// fill charges n keys of keyLen bytes once each.
func fill(t *testing.T, m *memory.Store, prefix string, n, keyLen int) {
	t.Helper()
	pad := strings.Repeat("v", keyLen-len(prefix)-8)
	l := limitOf(algorithms.FixedWindow, 10, time.Hour)
	for i := range n {
		apply(t, m, backend.Item{Key: fmt.Sprintf("%s%s%08d", prefix, pad, i), Limit: l, Hits: 1})
	}
}

// TestMemoryByteBound fills stores with keys until one bound or the other
// binds: long keys reach the byte bound first, short keys the key bound.
func TestMemoryByteBound(t *testing.T) {
	t.Run("bytes bind", func(t *testing.T) {
		const maxMemory = 1 << 20
		m, _ := newTestMemory(t, memory.WithMaxKeys(1_000_000), memory.WithMaxMemory(maxMemory))
		fill(t, m, "long", 5000, 1000)
		perKey := memory.EntryBytes(1000, 0)
		testutil.WaitFor(t, 5*time.Second, "the store to shrink to its byte bound", func() bool {
			st := m.Stats()
			return st.Bytes <= maxMemory && uint64(st.Keys) <= maxMemory/perKey
		})
		if st := m.Stats(); st.Keys < maxMemory/int(perKey)/2 || st.Bytes != uint64(st.Keys)*perKey {
			t.Fatalf("stats %+v: want about %d keys of %d bytes", st, maxMemory/perKey, perKey)
		}
	})
	t.Run("keys bind", func(t *testing.T) {
		m, _ := newTestMemory(t, memory.WithMaxKeys(100), memory.WithMaxMemory(1<<30))
		fill(t, m, "short", 5000, 32)
		testutil.WaitFor(t, 5*time.Second, "the store to shrink to its key bound", func() bool {
			return m.Stats().Keys <= 100
		})
	})
	t.Run("one key weighs its estimate or its share", func(t *testing.T) {
		m, _ := newTestMemory(t, memory.WithMaxKeys(1000), memory.WithMaxMemory(1_000_000)) // a share of 1,000 bytes
		// (The cache counts weights as its maintenance catches up.)
		fill(t, m, "k", 1, 100)
		testutil.WaitFor(t, 5*time.Second, "a 100-byte key to weigh its share of 1,000 bytes", func() bool {
			return m.Stats().Bytes == 1000
		})
		fill(t, m, "long", 1, 2000)
		want := 1000 + memory.EntryBytes(2000, 0)
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("a 2,000-byte key to add its estimate (%d bytes)", want), func() bool {
			return m.Stats().Bytes == want
		})
	})
	t.Run("a growing log is weighed again", func(t *testing.T) {
		m, clock := newTestMemory(t, memory.WithMaxKeys(1_000_000), memory.WithMaxMemory(1<<30))
		l := limitOf(algorithms.SlidingWindowLog, 10_000, time.Hour)
		it := backend.Item{Key: "log", Limit: l, Hits: 1}
		for range 1000 {
			apply(t, m, it) // one log entry each
			clock.Advance(time.Millisecond)
		}
		// 1,000 entries of 16 bytes, in a buffer of 1,024 or more.
		want := memory.EntryBytes(3, 1024*16)
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("the log's key to weigh at least %d bytes", want), func() bool {
			return m.Stats().Bytes >= want
		})
	})
}
