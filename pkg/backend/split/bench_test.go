package split_test

import (
	"context"
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/backend/split"
)

// The split store's own cost on memory stores: a request for one store is
// passed through; a mixed one takes a peek and two calls. The deadline
// cases call with a deadline in the context, which each part gets its
// share of.
func BenchmarkSplit(b *testing.B) {
	sec := algorithms.Limit{Requests: 1 << 40, Window: time.Second}
	minute := algorithms.Limit{Requests: 1 << 40, Window: time.Minute}
	one := []backend.Item{{Key: "a", Limit: minute, Hits: 1}, {Key: "b", Limit: minute, Hits: 1}}
	mixed := []backend.Item{{Key: "a", Limit: sec, Hits: 1}, {Key: "b", Limit: minute, Hits: 1}}
	for _, c := range []struct {
		name     string
		items    []backend.Item
		deadline bool
	}{
		{"one_store", one, false},
		{"mixed", mixed, false},
		{"mixed_deadline", mixed, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := split.New(memory.New(), memory.New(), split.Options{})
			defer s.Close()
			out := make([]algorithms.Decision, len(c.items))
			ctx := context.Background()
			if c.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Hour)
				defer cancel()
			}
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := s.Apply(ctx, c.items, out); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// On two real redis-servers: a request for one Redis is one round trip; a
// mixed one takes three when allowed (peek main, charge per-second,
// charge main), two when the per-second part denies.
func BenchmarkRedisSplit(b *testing.B) {
	mainSrv, psSrv := redistest.StartStandalone(b), redistest.StartStandalone(b)
	main, err := redis.New(redis.Options{URL: mainSrv.URL()})
	if err != nil {
		b.Fatal(err)
	}
	ps, err := redis.New(redis.Options{URL: psSrv.URL(), LocalDenyCache: true})
	if err != nil {
		b.Fatal(err)
	}
	s := split.New(main, ps, split.Options{})
	defer s.Close()
	sec := algorithms.Limit{Requests: 1 << 40, Window: time.Second}
	hour := algorithms.Limit{Requests: 1 << 40, Window: time.Hour}
	// Two hits of a bucket of one: the per-second part denies every time
	// (a bucket that refills would let a call through each second).
	full := algorithms.Limit{Algorithm: algorithms.TokenBucket, Requests: 1, Window: time.Second, Burst: 1}
	for _, c := range []struct {
		name    string
		items   []backend.Item
		allowed bool
	}{
		{"one_redis", []backend.Item{{Key: "a", Limit: hour, Hits: 1}, {Key: "b", Limit: hour, Hits: 1}}, true},
		{"mixed_allowed", []backend.Item{{Key: "a", Limit: sec, Hits: 1}, {Key: "b", Limit: hour, Hits: 1}}, true},
		{"mixed_per_second_denies", []backend.Item{{Key: "full", Limit: full, Hits: 2}, {Key: "b", Limit: hour, Hits: 1}}, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			out := make([]algorithms.Decision, len(c.items))
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := s.Apply(context.Background(), c.items, out); ok != c.allowed || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
