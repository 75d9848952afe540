package rls_test

import (
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// usageYAML has one descriptor per usage_accounting value, all fixed
// windows of 10 per hour, and a larger one to see what a denied request
// charged.
const usageYAML = `
domain: u
descriptors:
  - key: auto
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: always
    usage_accounting: always
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: never
    usage_accounting: never
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// used returns the hits counted on d's hour counter (on Redis, the
// 87600-hour counter onBothStores makes of it), read with a check that
// overrides the limit with a larger one of the same window: an override
// shares the descriptor's counter, so what it has left tells the usage.
func used(t *testing.T, h *harness, fake bool, domain string, kv ...string) uint32 {
	t.Helper()
	const probe = 1_000_000
	d := withHits(desc(kv...), 0)
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: probe, Unit: typev3.RateLimitUnit_HOUR}
	if !fake {
		d.Limit.Unit, d.Limit.UnitMultiplier = typev3.RateLimitUnit_YEAR, wrapperspb.UInt32(10)
	}
	r := h.call(t, domain, d)
	return probe - r.Statuses[0].LimitRemaining
}

// TestUsageAccountingAuto is Envoy Gateway's cost.response on a plain
// descriptor: a check with hits_addend 0 on the request path, and the cost
// as the descriptor's hits_addend when the stream is done. The cost is
// counted even when it does not fit, so the next check denies until the
// window ends; ordinary admission (no descriptor hits_addend) still charges
// nothing when denied.
func TestUsageAccountingAuto(t *testing.T) {
	onBothStores(t, usageYAML, rls.Options{}, func(t *testing.T, h *harness, fake bool) {
		check := func() *rlsv3.RateLimitResponse { return h.call(t, "u", withHits(desc("auto", "a"), 0)) }
		if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("first check: %v", r)
		}
		h.call(t, "u", withHits(desc("auto", "a"), 8))
		if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("check with 2 left: %v", r)
		}
		// 5 more than the 2 left: counted anyway (Envoy ignores the answer).
		if r := h.call(t, "u", withHits(desc("auto", "a"), 5)); r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("charge of 5 with 2 left: %v", r)
		}
		if n := used(t, h, fake, "u", "auto", "a"); n != 13 {
			t.Fatalf("usage %d, want 13 (8 + 5)", n)
		}
		r := check()
		if st := r.Statuses[0]; r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 {
			t.Fatalf("check after exhaustion: %v", r)
		}
		if fake {
			// The window (an hour from base, 10 s in) says when.
			if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != time.Hour-10*time.Second {
				t.Fatalf("duration_until_reset %v, want the window's end", got)
			}
			h.clock.Advance(time.Hour - 10*time.Second)
			if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 10 {
				t.Fatalf("check in the next window: %v", r)
			}
		}

		// Ordinary admission: 10 single hits use the limit up; the 11th,
		// with other beside it, is denied and charges neither.
		for i := 0; i < 10; i++ {
			h.call(t, "u", desc("auto", "b"))
		}
		if r := h.call(t, "u", desc("auto", "b"), desc("other", "b")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("11th hit: %v", r)
		}
		// The request's own hits_addend (Envoy's filter state) is ordinary
		// admission too.
		if _, err := h.client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "u", HitsAddend: 5,
			Descriptors: []*commonv3.RateLimitDescriptor{desc("auto", "b"), desc("other", "b")}}); err != nil {
			t.Fatal(err)
		}
		if a, o := used(t, h, fake, "u", "auto", "b"), used(t, h, fake, "u", "other", "b"); a != 10 || o != 0 {
			t.Fatalf("after denied admissions: auto used %d, other %d; want 10 and 0", a, o)
		}
	})
}

// TestUsageAccountingAlwaysAndNever: always counts every charge, a denied
// ordinary request's too (as the reference counts); never counts nothing
// of a denied request, not even hits given on the descriptor.
func TestUsageAccountingAlwaysAndNever(t *testing.T) {
	onBothStores(t, usageYAML, rls.Options{}, func(t *testing.T, h *harness, fake bool) {
		for i := 0; i < 12; i++ {
			h.call(t, "u", desc("always", "a"))
		}
		if n := used(t, h, fake, "u", "always", "a"); n != 12 {
			t.Fatalf("always: usage %d after 12 hits against 10, want 12", n)
		}
		// Beside a denying descriptor, always is still charged; other
		// (auto, ordinary) is not.
		h.call(t, "u", desc("always", "a"), desc("other", "a"))
		if a, o := used(t, h, fake, "u", "always", "a"), used(t, h, fake, "u", "other", "a"); a != 13 || o != 0 {
			t.Fatalf("always used %d, other %d; want 13 and 0", a, o)
		}

		h.call(t, "u", withHits(desc("never", "n"), 8))
		if r := h.call(t, "u", withHits(desc("never", "n"), 5)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("never: 5 with 2 left: %v", r)
		}
		if n := used(t, h, fake, "u", "never", "n"); n != 8 {
			t.Fatalf("never: usage %d, want 8 (the denied 5 charge nothing)", n)
		}
	})
}

// TestUsageAccountingDefaults: the service's default applies to
// descriptors and files that set none (every config over xDS), a file's
// default_usage_accounting to its descriptors and its request overrides,
// and a descriptor's own setting to it and the descriptors nested in it.
func TestUsageAccountingDefaults(t *testing.T) {
	const yaml = `
domain: d
default_usage_accounting: always
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: parent
    usage_accounting: never
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 2}
`
	h := start(t, yaml, rls.Options{UsageAccounting: descriptors.UsageNever})
	for i := 0; i < 3; i++ {
		h.call(t, "d", desc("plain", "p"))
	}
	if n := used(t, h, true, "d", "plain", "p"); n != 3 {
		t.Fatalf("file default always: usage %d after 3 hits against 2, want 3", n)
	}
	for i := 0; i < 3; i++ {
		h.call(t, "d", withHits(desc("parent", "x", "child", "c"), 2))
	}
	r := h.call(t, "d", withHits(desc("parent", "x", "child", "c"), 0))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("never, inherited: %v", r)
	}
	over := desc("plain", "o")
	over.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	for i := 0; i < 3; i++ {
		h.call(t, "d", over)
	}
	if n := used(t, h, true, "d", "plain", "o"); n != 3 {
		t.Fatalf("override under the file default always: usage %d, want 3", n)
	}

	// No file default: the service's never holds for hits on the descriptor.
	h = start(t, usageYAML, rls.Options{UsageAccounting: descriptors.UsageNever})
	h.call(t, "u", withHits(desc("auto", "a"), 8))
	h.call(t, "u", withHits(desc("auto", "a"), 5))
	if n := used(t, h, true, "u", "auto", "a"); n != 8 {
		t.Fatalf("service default never: usage %d, want 8", n)
	}
	// The service's always counts a denied ordinary request.
	h = start(t, usageYAML, rls.Options{UsageAccounting: descriptors.UsageAlways})
	for i := 0; i < 11; i++ {
		h.call(t, "u", desc("auto", "a"))
	}
	if n := used(t, h, true, "u", "auto", "a"); n != 11 {
		t.Fatalf("service default always: usage %d, want 11", n)
	}
}

// TestQuotaModeAccountsWhateverTheDefault: quota_mode descriptors account
// every charge, as before, whatever the service's default says.
func TestQuotaModeAccountsWhateverTheDefault(t *testing.T) {
	h := start(t, quotaYAML, rls.Options{UsageAccounting: descriptors.UsageNever})
	h.call(t, "rl", withHits(desc("service", "service_2"), 5))
	r := h.call(t, "rl", withHits(desc("service", "service_2"), 0))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("check after 5 of 2 charged to a quota_mode descriptor: %v", r)
	}
}

// TestUsageAccountingCompositeAndTier: a cost given on the descriptor is
// counted on every limit of a composite or a tier, past the one it does
// not fit, and a check then denies on that one.
func TestUsageAccountingCompositeAndTier(t *testing.T) {
	const yaml = `
domain: c
tiers:
  llm:
    - {unit: hour, requests_per_unit: 100}
    - {window: 10m, requests_per_unit: 5}
descriptors:
  - key: composite
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {window: 10m, requests_per_unit: 5}
  - key: tiered
    tier: llm
`
	for _, key := range []string{"composite", "tiered"} {
		h := start(t, yaml, rls.Options{})
		h.call(t, "c", withHits(desc(key, "x"), 8))
		if n := used(t, h, true, "c", key, "x"); n != 8 {
			t.Fatalf("%s: the hour limit counted %d of a cost of 8, want 8", key, n)
		}
		r := h.call(t, "c", withHits(desc(key, "x"), 0))
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 {
			t.Fatalf("%s: check after 8 of the 10-minute limit's 5: %v", key, r)
		}
		h.clock.Advance(10 * time.Minute)
		if r := h.call(t, "c", withHits(desc(key, "x"), 0)); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 5 {
			t.Fatalf("%s: check once the 10-minute window is over: %v", key, r)
		}
	}
}
