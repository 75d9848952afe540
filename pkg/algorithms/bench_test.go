package algorithms_test

import (
	"testing"
	"time"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
)

// BenchmarkDecide measures one decision per algorithm in a steady state:
// "allowed" is a key charged one hit per µs against 200 per 100µs (so every
// request is allowed, and the sliding log drops one entry and appends one
// per request, about 100 entries live); "denied" is an exhausted key of 10
// per hour asked for one hit per µs.
func BenchmarkDecide(b *testing.B) {
	for _, k := range algorithms.Kinds() {
		b.Run(k.String()+"/allowed", func(b *testing.B) {
			l := algorithms.Limit{Algorithm: k, Requests: 200, Window: 100 * time.Microsecond}
			var s algorithms.State
			now := at(0)
			for i := 0; i < 1000; i++ { // warm up: fill the window, size the log
				now++
				s, _ = algorithms.DecideMicros(l, s, now, 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now++
				var d algorithms.Decision
				s, d = algorithms.DecideMicros(l, s, now, 1)
				if !d.Allowed {
					b.Fatalf("denied at %d: %+v", i, d)
				}
			}
		})
		b.Run(k.String()+"/denied", func(b *testing.B) {
			l := algorithms.Limit{Algorithm: k, Requests: 10, Window: time.Hour}
			now := at(0)
			s, _ := algorithms.DecideMicros(l, algorithms.State{}, now, 10)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now++
				var d algorithms.Decision
				s, d = algorithms.DecideMicros(l, s, now, 1)
				if d.Allowed {
					b.Fatalf("allowed at %d: %+v", i, d)
				}
			}
		})
	}
}
