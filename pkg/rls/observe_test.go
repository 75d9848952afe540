package rls_test

import (
	"context"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"

	"github.com/envoyrls/envoy-rls/internal/tracing"
	"github.com/envoyrls/envoy-rls/internal/tracing/otlptest"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

const observeYAML = `
domain: obs
tiers:
  gold:
    - {name: gold-hourly, unit: hour, requests_per_unit: 1000}
    - {name: gold-daily, unit: day, requests_per_unit: 5000}
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 5}
  - key: api
    rate_limits:
      - {name: api-minute, unit: minute, requests_per_unit: 100}
      - {name: api-second, unit: second, requests_per_unit: 2}
  - key: bare
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 20}
  - key: plan
    value: gold
    tier: gold
  - key: slow
    rate_limit: {window: 90s, requests_per_unit: 7}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

type sfPolicy struct {
	name string
	q, w int64
	pk   []byte
}

func TestSpansReachAnOTLPReceiverWithTheCallersParent(t *testing.T) {
	r := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.Endpoint())
	cfg, err := tracing.FromEnv(func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return r.Endpoint()
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracing.Setup(context.Background(), cfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, observeYAML, rls.Options{Tracer: tr.Tracer, Propagator: tr.Propagator})
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := h.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "obs", Descriptors: []*commonv3.RateLimitDescriptor{desc("api", "k")}}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := r.WaitSpans(t, 2, 10*time.Second)
	byName := map[string]int{}
	for i, s := range spans {
		byName[s.Name] = i
	}
	root, ok1 := byName["ShouldRateLimit"]
	be, ok2 := byName["backend.Apply"]
	if !ok1 || !ok2 {
		t.Fatalf("spans %v", byName)
	}
	if got := hex.EncodeToString(spans[root].TraceId); got != traceID {
		t.Errorf("trace id %s, want the caller's %s", got, traceID)
	}
	if got := hex.EncodeToString(spans[root].ParentSpanId); got != parentID {
		t.Errorf("ShouldRateLimit parent %s, want the caller's %s", got, parentID)
	}
	if hex.EncodeToString(spans[be].ParentSpanId) != hex.EncodeToString(spans[root].SpanId) {
		t.Errorf("backend span is not a child of ShouldRateLimit")
	}
	keys := int64(-1)
	for _, a := range spans[be].Attributes {
		if a.Key == "ratelimit.backend.keys" {
			keys = a.Value.GetIntValue()
		}
	}
	if keys != 2 {
		t.Errorf("backend span keys = %d, want 2 (a composite of two limits)", keys)
	}
}

func TestNoAllocationsAddedWhenTracingIsOff(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race (sync.Pool drops items)")
	}
	cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	defer store.Close()
	svc := rls.New(store, cfg, rls.Options{})
	req := benchRequests("user", 1)[0]
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
	// Before tracing, headers and observers existed, one descriptor cost
	// two allocations: the response arena and the store key.
	if allocs > 2 {
		t.Errorf("ShouldRateLimit allocates %v times per call, want at most 2", allocs)
	}
}

type slowObserver struct {
	holding chan struct{} // receives once per event taken, before it blocks
	release chan struct{}
	seen    atomic.Int64
}

func (o *slowObserver) ObserveDecision(*rls.DecisionEvent) {
	select {
	case o.holding <- struct{}{}:
	default:
	}
	<-o.release
	o.seen.Add(1)
}

func TestObserversRunOffTheDecisionPath(t *testing.T) {
	var mu sync.Mutex
	var events []*rls.DecisionEvent
	fast := rls.ObserverFunc(func(e *rls.DecisionEvent) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	slow := &slowObserver{holding: make(chan struct{}, 1), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	h := start(t, observeYAML, rls.Options{Observers: []rls.Observer{fast, slow}, ObserverQueue: 4, Metrics: rls.NewMetrics(reg)})
	const calls = 20
	h.call(t, "obs", desc("api", "k"))
	// The slow observer's goroutine has the first event in hand before the
	// others come (it may not have run yet when the call returns).
	select {
	case <-slow.holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow observer never got the first event")
	}
	for i := 1; i < calls; i++ {
		h.call(t, "obs", desc("api", "k")) // the slow observer blocks; calls must not
	}
	close(slow.release)
	h.svc.Close()
	// The slow observer holds one event and queues 4; the rest are dropped.
	if got := slow.seen.Load(); got != 5 {
		t.Errorf("slow observer saw %d events, want 5 (1 in hand + a queue of 4)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// The fast observer's queue of 4 may also have filled when its
	// goroutine did not run for a while: its drops count too.
	want := float64(calls-5) + float64(calls-len(events))
	if got := h.svc.ObserverDropped(); float64(got) != want {
		t.Errorf("dropped %d, want %v (%d of the slow observer's, %d of the fast one's)", got, want, calls-5, calls-len(events))
	}
	if got := scrape(t, reg).Value("envoy_rls_observer_events_dropped_total"); got != want {
		t.Errorf("dropped metric %v, want %v", got, want)
	}
	// What the fast observer got is complete and in order.
	if len(events) == 0 {
		t.Fatal("fast observer got nothing")
	}
	e := events[0]
	if e.Domain != "obs" || !e.Known || e.Code != "ok" || len(e.Limits) != 2 || e.Limits[1].Rule != "api-second" || !e.Limits[1].Allowed || e.Limits[1].Hits != 1 {
		t.Errorf("first event %+v", e)
	}
	last := events[len(events)-1]
	if last.Code != "over_limit" || last.Limits[1].Allowed || last.Limits[1].RetryAfter <= 0 {
		t.Errorf("last event %+v", last)
	}
}

// BenchmarkShouldRateLimitTold is BenchmarkShouldRateLimit's hot key and
// composite with what the service tells switched on: metrics (per rule, in
// hits) and every header mode; over_limit is a hot key denied, which adds
// Retry-After and the denying rule in dynamic metadata. Compare it with
// BenchmarkShouldRateLimit and BenchmarkShouldRateLimitDenied in the same
// run.
func BenchmarkShouldRateLimitTold(b *testing.B) {
	cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	store := memory.New()
	b.Cleanup(func() { store.Close() })
	svc := rls.New(store, cfg, rls.Options{Metrics: rls.NewMetrics(prometheus.NewRegistry()), ResponseHeaders: rls.HeadersAll})
	for _, bc := range []struct {
		name, key string
		want      rlsv3.RateLimitResponse_Code
	}{
		{"hot_key", "user", rlsv3.RateLimitResponse_OK},
		{"composite_3_limits", "api", rlsv3.RateLimitResponse_OK},
		{"over_limit", "attacker", rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := benchRequests(bc.key, 1)[0]
			ctx := context.Background()
			svc.ShouldRateLimit(ctx, req) // the attacker's one request of the hour
			b.ReportAllocs()
			for b.Loop() {
				if r, err := svc.ShouldRateLimit(ctx, req); err != nil || r.OverallCode != bc.want {
					b.Fatal(r, err)
				}
			}
		})
	}
}
