package rls_test

import (
	"context"
	"math"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
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
