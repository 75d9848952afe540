package split_test

import (
	"hash/crc32"
	"sync/atomic"
	"testing"

	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
	"github.com/envoyrls/envoy-rls/pkg/backend/storetest"
)

// The conformance kit on two memory stores, under several routings: by
// window (the default: the kit's composite case is mixed), and by a hash of
// the key, which splits most multi-item cases (all-or-nothing, shadow,
// quota groups spread over both stores, usage accounting) between the
// stores. Played one request at a time, a split store is exact.
func TestConformance(t *testing.T) {
	parity := func(want uint32) func(*backend.Item) bool {
		return func(it *backend.Item) bool { return crc32.ChecksumIEEE([]byte(it.Key))%2 == want }
	}
	for _, r := range []struct {
		name  string
		route func(*backend.Item) bool
	}{
		{"by_window", nil},
		{"key_hash_even", parity(0)},
		{"key_hash_odd", parity(1)},
	} {
		t.Run(r.name, func(t *testing.T) {
			var mixed, peeks, over atomic.Uint64
			storetest.Run(t, func(t *testing.T, clock backend.Clock) backend.Store {
				s := split.New(memory.New(memory.WithClock(clock)), memory.New(memory.WithClock(clock)), split.Options{PerSecond: r.route})
				t.Cleanup(func() {
					st := s.Stats()
					mixed.Add(st.Mixed)
					peeks.Add(st.Peeks)
					over.Add(st.OverCharged)
				})
				return s
			})
			if mixed.Load() == 0 || peeks.Load() == 0 {
				t.Errorf("%d mixed requests, %d peeks: the routing split no request", mixed.Load(), peeks.Load())
			}
			if over.Load() != 0 {
				t.Errorf("%d requests over-charged with no concurrency", over.Load())
			}
			t.Logf("%d mixed requests, %d peeks", mixed.Load(), peeks.Load())
		})
	}
}
