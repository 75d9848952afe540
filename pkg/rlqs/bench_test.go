package rlqs

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// BenchmarkPeriodicReport measures one periodic report of a stream with
// n buckets (each its own per-user limit), as Envoy sends it every 5 s:
// matching is cached, so a report is the demand update, the ledger
// check, the shares' load and reserve and the encoding of every bucket.
func BenchmarkPeriodicReport(b *testing.B) {
	for _, n := range []int{1, 100, 10_000} {
		b.Run(fmt.Sprintf("buckets=%d", n), func(b *testing.B) {
			cfg, err := descriptors.ParseDocumentsWith([]descriptors.Document{{File: "q.yaml", Data: []byte(perSecond30)}}, descriptors.Options{OrderFree: true})
			if err != nil {
				b.Fatal(err)
			}
			clock := testutil.NewClock(testutil.Base)
			store := memory.New(memory.WithClock(clock))
			defer store.Close()
			s := New(Options{Config: func() *descriptors.Config { return cfg }, Ledger: store, Now: clock.Now, LedgerInterval: -1})
			defer s.Close()
			st := s.newStream(context.Background())
			m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "q"}
			for i := range n {
				m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(bucketID("user", fmt.Sprint("user-", i)), 3))
			}
			ctx := context.Background()
			if _, err := st.handle(ctx, m, clock.Now()); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				clock.Advance(5 * time.Second)
				if _, err := st.handle(ctx, m, clock.Now()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/bucket")
		})
	}
}

// BenchmarkBucketMemory reports the heap a subscribed bucket holds (its
// subscription, shares entry and ledger aggregate, with a short id),
// measured over 20,000 buckets of one stream.
func BenchmarkBucketMemory(b *testing.B) {
	const n = 20_000
	cfg, err := descriptors.ParseDocumentsWith([]descriptors.Document{{File: "q.yaml", Data: []byte(perSecond30)}}, descriptors.Options{OrderFree: true})
	if err != nil {
		b.Fatal(err)
	}
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "q"}
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(bucketID("user", fmt.Sprintf("user-%08d", i)), 1))
	}
	var total float64
	for range b.N {
		clock := testutil.NewClock(testutil.Base)
		s := New(Options{Config: func() *descriptors.Config { return cfg }, Now: clock.Now, LedgerInterval: -1, MaxBucketsPerStream: n})
		st := s.newStream(context.Background())
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if _, err := st.handle(context.Background(), proto.Clone(m).(*rlqsv3.RateLimitQuotaUsageReports), clock.Now()); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		total += float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / n
		runtime.KeepAlive(st)
		s.Close()
	}
	b.ReportMetric(total/float64(b.N), "heap-B/bucket")
}
