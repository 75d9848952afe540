package rlqs

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetrics: streams, buckets, per-bucket assigned rate and demand
// (request values in the label as detailed_metric says, capped like the
// rule metrics), abandons and assignment changes.
func TestMetrics(t *testing.T) {
	old := maxBucketSeries
	maxBucketSeries = 2
	defer func() { maxBucketSeries = old }()
	reg := prometheus.NewRegistry()
	h := newHarness(t, `
domain: q
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 40}
`, Options{Registerer: reg, AbandonAfter: 2})
	c := h.client("q")
	for _, u := range []string{"a", "b", "c"} {
		h.subscribe(c, bucketID("user", u))
	}
	h.clock.Advance(time.Second)
	offer(c, bucketID("user", "a"), 20)
	h.report(c)
	// a showed a demand of 20/s (a claim of 30); b and c none: one token
	// per fill interval (5 s) each.
	want := `
# HELP envoy_rls_rlqs_bucket_assigned_rate Requests per second this instance assigned to the Envoys of a bucket (with the rates of ended streams until their TTL), by domain and bucket (the descriptor's stats key, with request values where detailed_metric or value_to_metric says).
# TYPE envoy_rls_rlqs_bucket_assigned_rate gauge
envoy_rls_rlqs_bucket_assigned_rate{bucket="__overflow__",domain="q"} 0.2
envoy_rls_rlqs_bucket_assigned_rate{bucket="q.user_a",domain="q"} 30
envoy_rls_rlqs_bucket_assigned_rate{bucket="q.user_b",domain="q"} 0.2
# HELP envoy_rls_rlqs_streams RLQS streams open.
# TYPE envoy_rls_rlqs_streams gauge
envoy_rls_rlqs_streams 1
# HELP envoy_rls_rlqs_buckets RLQS buckets subscribed on all open streams.
# TYPE envoy_rls_rlqs_buckets gauge
envoy_rls_rlqs_buckets 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "envoy_rls_rlqs_bucket_assigned_rate", "envoy_rls_rlqs_streams", "envoy_rls_rlqs_buckets"); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.svc.m.changesV.WithLabelValues("raise")); got != 1 {
		t.Errorf("raises: %v, want 1 (a's, after its demand showed)", got)
	}
	if got := testutil.ToFloat64(h.svc.m.changesV.WithLabelValues("lower")); got != 2 {
		t.Errorf("lowerings: %v, want 2 (b's and c's, idle)", got)
	}
	h.clock.Advance(time.Second)
	h.report(c)
	if got := testutil.ToFloat64(h.svc.m.abandonsV.WithLabelValues("idle")); got != 2 {
		t.Errorf("idle abandons: %v, want 2 (b and c)", got)
	}
}
