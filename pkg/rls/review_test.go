package rls_test

import (
	"context"
	"math"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// An override whose unit times unit_multiplier does not fit a time.Duration
// (about 292 years) must not wrap around into a tiny or negative window,
// which would let every request through.
func TestOverrideWindowOverflowIsInvalid(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	for _, c := range []struct {
		unit typev3.RateLimitUnit
		mult uint32
	}{
		{typev3.RateLimitUnit_YEAR, 1000},
		{typev3.RateLimitUnit_MINUTE, math.MaxUint32},
		{typev3.RateLimitUnit_DAY, 200_000},
	} {
		d := desc("small", "o")
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: c.unit, UnitMultiplier: wrapperspb.UInt32(c.mult)}
		_, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "f", Descriptors: []*commonv3.RateLimitDescriptor{d}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "too long") {
			t.Errorf("%v x %d: got %v, want InvalidArgument (window too long)", c.unit, c.mult, err)
		}
	}
	// The longest windows that fit still work.
	d := desc("small", "o")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(200)}
	if r := h.call(t, "f", d); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("200 years: %v", r)
	}
	if r := h.call(t, "f", d); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("1 per 200 years allowed twice: %v", r)
	}
}

// The domain label of envoy_rls_requests_total must not take arbitrary
// request bytes: an invalid request's domain (of any length) or a domain
// the config does not know would otherwise create one series each, forever.
func TestMetricsDomainLabelIsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := start(t, basicYAML, rls.Options{Metrics: rls.NewMetrics(reg)})
	long := strings.Repeat("x", rls.MaxFieldBytes+1)
	for _, domain := range []string{long, "unknown-1", "unknown-2"} {
		h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "a")}})
	}
	h.call(t, "d", desc("user", "a"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	domains := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "envoy_rls_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "domain" {
					domains[l.GetValue()] = true
				}
			}
		}
	}
	if !domains["d"] {
		t.Errorf("known domain missing from labels: %v", domains)
	}
	for d := range domains {
		if d == long || strings.HasPrefix(d, "unknown-") {
			t.Errorf("request-supplied domain %.20q became a label", d)
		}
	}
}

// Failing open keeps what is known without the store: an unlimited
// descriptor still reports the most a uint32 holds, as when the store works.
func TestFailOpenKeepsUnlimitedStatus(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{FailureMode: rls.FailOpen})
	h.store.Close()
	r := h.call(t, "f", desc("vip", "a"), desc("small", "a"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("fail open: %v", r)
	}
	if got := r.Statuses[0].LimitRemaining; got != math.MaxUint32 || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unlimited while failing open: %v", r.Statuses[0])
	}
	if r.Statuses[1].CurrentLimit == nil {
		t.Fatalf("limited descriptor lost its current_limit: %v", r.Statuses[1])
	}
}
