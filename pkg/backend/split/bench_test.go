package split_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
)

// The split store's own cost on memory stores: a request for one store is
// passed through; a mixed one takes a peek and two calls.
func BenchmarkSplit(b *testing.B) {
	sec := algorithms.Limit{Requests: 1 << 40, Window: time.Second}
	minute := algorithms.Limit{Requests: 1 << 40, Window: time.Minute}
	for _, c := range []struct {
		name  string
		items []backend.Item
	}{
		{"one_store", []backend.Item{{Key: "a", Limit: minute, Hits: 1}, {Key: "b", Limit: minute, Hits: 1}}},
		{"mixed", []backend.Item{{Key: "a", Limit: sec, Hits: 1}, {Key: "b", Limit: minute, Hits: 1}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := split.New(memory.New(), memory.New(), split.Options{})
			defer s.Close()
			out := make([]algorithms.Decision, len(c.items))
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := s.Apply(context.Background(), c.items, out); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
