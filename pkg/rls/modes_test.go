package rls_test

import (
	"context"
	"math"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

func TestShadowModeNeverDenies(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	for i := 0; i < 3; i++ {
		r := h.call(t, "f", desc("shadow", "x"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow %d: %v", i, r)
		}
		if i > 0 && r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("shadow %d should report 0 remaining: %v", i, r)
		}
	}
}

func TestQuotaModeDeniesOnlyWhenAllQuotasAreOver(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	// q1 allows 1, q2 allows 2.
	r := h.call(t, "f", desc("q1", "x"), desc("q2", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	r = h.call(t, "f", desc("q1", "x"), desc("q2", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("q1 over alone must not deny: %v", r)
	}
	r = h.call(t, "f", desc("q1", "x"), desc("q2", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("both over must deny: %v", r)
	}
}

// TestGlobalQuotaMode: the reference's QUOTA_MODE makes every descriptor
// quota_mode: small (1/min) and big (10/min) are not quota_mode in the
// config, yet small over alone no longer denies; both over deny.
func TestGlobalQuotaMode(t *testing.T) {
	plain := start(t, featuresYAML, rls.Options{})
	plain.call(t, "f", desc("small", "x"), desc("q1", "x"))
	if r := plain.call(t, "f", desc("small", "x"), desc("q2", "x")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("without quota mode small over must deny: %v", r)
	}
	h := start(t, featuresYAML, rls.Options{QuotaMode: true})
	if r := h.call(t, "f", desc("small", "x"), desc("big", "x")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	r := h.call(t, "f", desc("small", "x"), desc("big", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("small over alone must not deny under quota mode: %v", r)
	}
	if r := h.call(t, "f", desc("small", "x")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("every quota descriptor over must deny: %v", r)
	}
}

func TestUnlimitedReplacesWhitelist(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	for i := 0; i < 3; i++ {
		r := h.call(t, "f", desc("vip", "x"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != math.MaxUint32 || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unlimited: %v", r)
		}
		r = h.call(t, "f", desc("internal", "yes"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("whitelist: %v", r)
		}
		// trusted replaces login: login is never counted with it.
		r = h.call(t, "f", desc("login", "u"), desc("trusted", "u"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("replaced: %v", r)
		}
	}
	if r := h.call(t, "f", desc("login", "u")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("login was charged while replaced: %v", r)
	}
	if r := h.call(t, "f", desc("login", "u")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("login limit 1 allowed twice: %v", r)
	}
}

func TestShareThresholdSharesOneCounter(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	h.call(t, "f", desc("bucket", "img-a"))
	h.call(t, "f", desc("bucket", "img-b"))
	if r := h.call(t, "f", desc("bucket", "img-c")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("shared counter of 2 allowed a 3rd: %v", r)
	}
}

func TestLimitOverride(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	d := desc("small", "o")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	for i := 0; i < 2; i++ {
		r := h.call(t, "f", d)
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Fatalf("override %d: %v", i, r)
		}
	}
	if r := h.call(t, "f", d); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("override of 2 allowed a 3rd: %v", r)
	}
}

func TestFailureMode(t *testing.T) {
	for _, mode := range []rls.FailureMode{rls.FailOpen, rls.FailClosed} {
		h := start(t, basicYAML, rls.Options{FailureMode: mode})
		h.store.Close() // a real store that now fails every call
		resp, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
			Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "a")},
		})
		switch mode {
		case rls.FailOpen:
			if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("fail open: %v %v", resp, err)
			}
		case rls.FailClosed:
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("fail closed: %v %v", resp, err)
			}
		}
	}
}

// TestLargeOverrideDoesNotUseTheLog: a request override above the
// sliding_window_log bound counts with the sliding window counter, so a
// request cannot grow one key's log without bound.
func TestLargeOverrideDoesNotUseTheLog(t *testing.T) {
	h := start(t, `
domain: log
default_algorithm: sliding_window_log
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`, rls.Options{})
	call := func(rpu uint32, hits uint64) *rlsv3.RateLimitResponse {
		d := desc("k", "v")
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_HOUR}
		d.HitsAddend = wrapperspb.UInt64(hits)
		return h.call(t, "log", d)
	}
	small, big := uint32(1000), uint32(200_000)
	if r := call(small, uint64(small)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	if r := call(big, uint64(big)); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	// One hour later the log has forgotten everything; the counter still
	// weighs the previous hour's hits (the hour began before base).
	h.clock.Advance(time.Hour)
	if r := call(small, 0); r.Statuses[0].LimitRemaining != small {
		t.Fatalf("log-based override after an hour: %v", r)
	}
	if r := call(big, 0); r.Statuses[0].LimitRemaining >= big {
		t.Fatalf("large override should count with the sliding counter: %v", r)
	}
}

func TestGlobalShadowMode(t *testing.T) {
	h := start(t, basicYAML, rls.Options{ShadowMode: true})
	for i := 0; i < 3; i++ {
		h.call(t, "d", desc("user", "s"))
	}
	r := h.call(t, "d", desc("user", "s"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("global shadow mode: %v", r)
	}
}
