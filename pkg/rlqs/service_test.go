package rlqs

import (
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/envoyrls/envoy-rls/internal/rlqstest"
)

const perSecond30 = `
domain: q
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 30}
`

// TestSubscriptionAnsweredAtOnce: a new bucket's first report is answered
// at once with a token bucket (the floor: a quarter of the limit for a
// lone subscriber), and the next report, which shows the demand, raises it.
func TestSubscriptionAnsweredAtOnce(t *testing.T) {
	h := newHarness(t, `
domain: q
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
`, Options{})
	c := h.client("q")
	id := bucketID("user", "a")
	h.subscribe(c, id)
	b := c.Bucket(id)
	if !b.Assigned || !approx(b.Rate, 25, 1e-9) || b.Burst != 25 {
		t.Fatalf("after the subscription: %+v, want a token bucket of 25/s, burst 25", b)
	}
	h.clock.Advance(time.Second)
	if got := offer(c, id, 200); got != 25 {
		t.Fatalf("%d of 200 allowed at once from a full bucket of 25", got)
	}
	h.report(c)
	if b := c.Bucket(id); !approx(b.Rate, 100, 1e-9) || b.Burst != 100 {
		t.Fatalf("after a report of 200/s: %+v, want the whole limit", b)
	}
}

// TestMaxMinSharesAndSumBound: three Envoys wanting 2, 6 and 100
// requests a second of a limit of 30 converge to max-min fair shares of
// their claims (1.5x their demand: 3, 9, and the rest, 18), and at no
// report do the shares in force sum above the limit.
func TestMaxMinSharesAndSumBound(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	id := bucketID("user", "u")
	demand := []int{2, 6, 100}
	cs := []*rlqstest.Client{h.client("q"), h.client("q"), h.client("q")}
	for _, c := range cs {
		h.subscribe(c, id)
		if s := sum(rates(cs, id)); s > 30+1e-9 {
			t.Fatalf("shares %v sum to %v after a subscription", rates(cs, id), s)
		}
	}
	for step := range 8 {
		h.clock.Advance(time.Second)
		for i, c := range cs {
			offer(c, id, demand[i])
		}
		for _, c := range cs {
			h.report(c)
			if s := sum(rates(cs, id)); s > 30+1e-9 {
				t.Fatalf("step %d: shares %v sum to %v", step, rates(cs, id), s)
			}
		}
	}
	got := rates(cs, id)
	for i, want := range []float64{3, 9, 18} {
		if !approx(got[i], want, 0.2) {
			t.Fatalf("shares %v, want about [3 9 18]", got)
		}
	}
}

// TestDemandShiftFollowed: when the light Envoy becomes the heavy one, the
// shares follow within 2 + h report periods (h = 1).
func TestDemandShiftFollowed(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	id := bucketID("user", "u")
	cs := []*rlqstest.Client{h.client("q"), h.client("q")}
	for _, c := range cs {
		h.subscribe(c, id)
	}
	step := func(d0, d1 int) {
		h.clock.Advance(time.Second)
		offer(cs[0], id, d0)
		offer(cs[1], id, d1)
		for _, c := range cs {
			h.report(c)
			if s := sum(rates(cs, id)); s > 30+1e-9 {
				t.Fatalf("shares %v sum to %v", rates(cs, id), s)
			}
		}
	}
	for range 6 {
		step(4, 100)
	}
	if got := rates(cs, id); !approx(got[0], 6, 0.2) || !approx(got[1], 24, 0.2) {
		t.Fatalf("before the shift: %v, want about [6 24]", got)
	}
	for range 3 { // 2 + h periods
		step(100, 4)
	}
	if got := rates(cs, id); !approx(got[0], 24, 0.2) || !approx(got[1], 6, 0.2) {
		t.Fatalf("3 periods after the shift: %v, want about [24 6]", got)
	}
}

// TestGoneStreamReleasesAfterTTL: the share of an Envoy that went away is
// held while its assignment can still be in force (its TTL), then the
// others get it.
func TestGoneStreamReleasesAfterTTL(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	id := bucketID("user", "u")
	a, b := h.client("q"), h.client("q")
	h.subscribe(a, id)
	h.subscribe(b, id)
	for range 6 {
		h.clock.Advance(time.Second)
		offer(a, id, 100)
		offer(b, id, 100)
		h.report(a)
		h.report(b)
	}
	if got := rates([]*rlqstest.Client{a, b}, id); !approx(got[0], 15, 0.2) || !approx(got[1], 15, 0.2) {
		t.Fatalf("shares %v, want 15 each", got)
	}
	a.Close()
	testutil_wait(t, func() bool { return h.svc.Streams() == 1 })
	ttl := ttlFor(time.Second) // the period b and a showed
	gone := h.clock.Now()
	for h.clock.Now().Sub(gone) < ttl+loweredGrace+3*time.Second {
		h.clock.Advance(time.Second)
		offer(b, id, 100)
		h.report(b)
		r := b.Bucket(id).Rate
		if h.clock.Now().Sub(gone) < ttl && r > 15+0.2 {
			t.Fatalf("%v after a left: b has %v while a's assignment may still hold", h.clock.Now().Sub(gone), r)
		}
	}
	if r := b.Bucket(id).Rate; !approx(r, 30, 0.2) {
		t.Fatalf("after a's TTL: b has %v, want the whole 30", r)
	}
}

// TestAbandonIdle: a bucket without requests for AbandonAfter reports is
// abandoned; its next request subscribes again.
func TestAbandonIdle(t *testing.T) {
	h := newHarness(t, perSecond30, Options{AbandonAfter: 3})
	c := h.client("q")
	id := bucketID("user", "u")
	h.subscribe(c, id)
	for i := range 3 {
		if c.Buckets() != 1 {
			t.Fatalf("abandoned after %d empty reports", i)
		}
		h.clock.Advance(time.Second)
		h.report(c)
	}
	if c.Buckets() != 0 || h.svc.Buckets() != 0 {
		t.Fatalf("after 3 empty reports: client holds %d buckets, service %d; want it abandoned", c.Buckets(), h.svc.Buckets())
	}
	h.subscribe(c, id)
	if b := c.Bucket(id); !b.Assigned || h.svc.Buckets() != 1 {
		t.Fatalf("after a new request: %+v", b)
	}
}

// TestShutdownKeepsAssignments: Shutdown ends the streams without
// abandoning any bucket; the assignments hold until their TTL, then the
// fallback applies.
func TestShutdownKeepsAssignments(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	c := rlqstest.New(rlqstest.Options{Conn: h.conn(), Domain: "q", Period: time.Hour, Now: h.clock.Now,
		Fallback:        &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}},
		FallbackTimeout: time.Minute})
	t.Cleanup(c.Close)
	id := bucketID("user", "u")
	h.subscribe(c, id)
	h.svc.Shutdown()
	testutil_wait(t, func() bool { return !c.Connected() && h.svc.Streams() == 0 })
	b := c.Bucket(id)
	if !b.Assigned || b.Rate == 0 || !b.Exists {
		t.Fatalf("after shutdown: %+v, want the assignment still in force", b)
	}
	h.clock.Advance(ttlFor(0))
	if b := c.Bucket(id); b.Assigned || !b.Fallback {
		t.Fatalf("after the TTL: %+v, want the fallback", b)
	}
}

// TestReconnectTakesItsShareOver: an Envoy whose stream dropped reconnects
// (here to the same instance; to another one behind the same address it is
// the same) and resends every bucket: from the same host it takes its old
// share over at once, with the same token bucket (Envoy keeps its limiter),
// and the shares still sum to at most the limit.
func TestReconnectTakesItsShareOver(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	id := bucketID("user", "u")
	a, b := h.client("q"), h.client("q")
	h.subscribe(a, id)
	h.subscribe(b, id)
	for range 6 {
		h.clock.Advance(time.Second)
		offer(a, id, 100)
		offer(b, id, 100)
		h.report(a)
		h.report(b)
	}
	before := a.Actions(id)
	last := before[len(before)-1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	a.Drop()
	testutil_wait(t, func() bool { return h.svc.Streams() == 1 })
	h.clock.Advance(time.Second)
	offer(a, id, 100)
	h.report(a) // opens a new stream with every bucket
	now := a.Actions(id)
	got := now[len(now)-1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if got.GetTokensPerFill().GetValue() != last.GetTokensPerFill().GetValue() || got.GetMaxTokens() != last.GetMaxTokens() || got.GetFillInterval().GetSeconds() != last.GetFillInterval().GetSeconds() {
		t.Fatalf("after the reconnect: %v, before: %v", got, last)
	}
	if s := sum(rates([]*rlqstest.Client{a, b}, id)); s > 30+1e-9 {
		t.Fatalf("shares sum to %v after the reconnect", s)
	}
	h.clock.Advance(time.Second)
	offer(b, id, 100)
	h.report(b)
	if s := sum(rates([]*rlqstest.Client{a, b}, id)); s > 30+1e-9 {
		t.Fatalf("shares sum to %v", s)
	}
}

// TestZeroShareKeepsNoBurst: a subscriber whose share is zero (here a new
// one while another holds the whole limit) gets a token bucket of one token
// that never refills, not DENY_ALL, so that its next real share starts at
// the fill ratio of what it had (empty once that token is spent) instead of
// full: a share that drops to zero and comes back is not handed a burst.
func TestZeroShareKeepsNoBurst(t *testing.T) {
	h := newHarness(t, perSecond30, Options{})
	id := bucketID("user", "u")
	a, b := h.client("q"), h.client("q")
	h.subscribe(a, id)
	for range 3 {
		h.clock.Advance(time.Second)
		offer(a, id, 100)
		h.report(a)
	}
	if r := a.Bucket(id).Rate; !approx(r, 30, 1e-9) {
		t.Fatalf("a alone holds %v, want 30", r)
	}
	h.subscribe(b, id)
	acts := b.Actions(id)
	if tb := acts[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb.GetMaxTokens() != 1 || tb.GetFillInterval().GetSeconds() != maxFillInterval {
		t.Fatalf("b's first assignment beside a full share: %v, want the closed bucket", acts[0])
	}
	for range 4 {
		h.clock.Advance(time.Second)
		offer(a, id, 100)
		offer(b, id, 100)
		h.report(a)
		h.report(b)
		if r := b.Bucket(id).Rate; r > 1 {
			// b was raised: from the closed bucket it starts empty.
			if got := offer(b, id, 100); got > 1 {
				t.Fatalf("b admitted %d at once right after its raise to %v/s", got, r)
			}
			return
		}
	}
	t.Fatalf("b never got a share: %v", b.Bucket(id))
}
