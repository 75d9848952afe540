package rlqs

import (
	"context"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// rlsFor returns an RLS service on the harness's ledger and config, and a
// function that makes n requests of user=u and returns how many it allowed.
func rlsFor(t *testing.T, h *harness, store *memory.Store) func(n int) int {
	svc := rls.New(store, h.cfg, rls.Options{})
	req := &rlsv3.RateLimitRequest{Domain: "q", Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}}}}
	return func(n int) int {
		ok := 0
		for range n {
			resp, err := svc.ShouldRateLimit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
}

// TestOneLedgerWithRLS: RLS and RLQS traffic on one descriptor of 30 a
// second share its counter: RLS admits what the RLQS shares leave, and the
// two together stay within the limit (plus the burst an Envoy's first
// token bucket starts with), whichever side wants more.
func TestOneLedgerWithRLS(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rlqsD, rlsD    int
		minRLS, maxRLS int // per second, once settled
	}{
		{"rlqs heavy", 100, 100, 0, 1},
		{"rlqs light", 4, 100, 22, 25}, // RLQS holds 1.5 x 4 = 6
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, perSecond30, Options{LedgerInterval: -1})
			store := h.svc.o.Ledger.(*memory.Store)
			rlsReq := rlsFor(t, h, store)
			c := h.client("q")
			id := bucketID("user", "u")
			h.subscribe(c, id)
			total := 0
			for step := range 12 {
				h.clock.Advance(time.Second)
				h.svc.chargeRates(h.clock.Now(), time.Second)
				q := offer(c, id, tc.rlqsD)
				r := rlsReq(tc.rlsD)
				h.report(c)
				total += q + r
				if step >= 4 && (r < tc.minRLS || r > tc.maxRLS) {
					t.Errorf("step %d: RLS admitted %d, want %d to %d (RLQS %d, assigned %.1f/s)", step, r, tc.minRLS, tc.maxRLS, q, c.Bucket(id).Rate)
				}
				if q+r > 30+int(c.Bucket(id).Burst) {
					t.Errorf("step %d: %d+%d admitted in one second of a limit of 30", step, q, r)
				}
			}
			if total > 12*30+30 {
				t.Errorf("%d admitted in 12 s of a limit of 30/s", total)
			}
		})
	}
}

// TestBudget: a limit of a minute or more is a budget: what its counter
// has left, spread over what is left of the window; RLS spends from the
// same counter. The window admits at most its limit, plus one report
// period of the Envoys' rates and their first bursts.
func TestBudget(t *testing.T) {
	h := newHarness(t, `
domain: q
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 120}
`, Options{LedgerInterval: -1})
	store := h.svc.o.Ledger.(*memory.Store)
	rlsReq := rlsFor(t, h, store)
	id := bucketID("user", "u")
	a, b := h.client("q"), h.client("q")
	h.subscribe(a, id)
	h.subscribe(b, id)
	total := 0
	for step := range 60 { // the whole minute from testutil.Base, aligned
		h.clock.Advance(time.Second)
		total += offer(a, id, 5) + offer(b, id, 1)
		if step >= 30 && step%10 == 0 {
			total += rlsReq(5)
		}
		h.report(a)
		h.report(b)
	}
	if total > 120+int(a.Bucket(id).Burst)+int(b.Bucket(id).Burst)+6 {
		t.Fatalf("%d admitted in a minute of a budget of 120", total)
	}
	if total < 100 {
		t.Fatalf("only %d admitted of a budget of 120 with demand for 360", total)
	}
	// The next minute starts a new budget.
	h.clock.Advance(time.Second)
	offer(a, id, 5)
	h.report(a)
	if r := a.Bucket(id).Rate; r < 0.5 {
		t.Fatalf("a new window: a is at %v/s", r)
	}
}
