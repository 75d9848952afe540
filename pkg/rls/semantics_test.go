package rls_test

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/backend/redis"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// onBothStores runs f against a service on the memory store, on a fake
// clock at base (fake is true), and on the Redis store with a redis-server
// of its own, which counts on Redis's TIME (fake is false: f must not
// advance the clock or expect durations then). For Redis, every minute and
// hour window of yaml becomes a window of ten years, so that no window ends
// while the test runs (the next ten-year boundary is in 2030).
func onBothStores(t *testing.T, yaml string, opts rls.Options, f func(t *testing.T, h *harness, fake bool)) {
	t.Run("memory", func(t *testing.T) {
		clock := testutil.NewClock(base)
		store := memory.New(memory.WithClock(clock))
		t.Cleanup(func() { store.Close() })
		f(t, serve(t, yaml, opts, store, clock), true)
	})
	t.Run("redis", func(t *testing.T) {
		if testing.Short() {
			t.Skip("starts redis-server")
		}
		srv := redistest.StartStandalone(t)
		store, err := redis.New(redis.Options{URL: srv.URL(), LocalDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		long := strings.NewReplacer("unit: minute", "window: 87600h", "unit: hour", "window: 87600h").Replace(yaml)
		f(t, serve(t, long, opts, store, testutil.NewClock(base)), false)
	})
}

func serve(t *testing.T, yaml string, opts rls.Options, store backend.Store, clock *testutil.Clock) *harness {
	t.Helper()
	cfg, err := descriptors.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	svc := rls.New(store, cfg, opts)
	srv, _ := rls.NewGRPCServer(svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &harness{svc: svc, clock: clock, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn}
}

func withHits(d *commonv3.RateLimitDescriptor, n uint64) *commonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// quotaYAML is the reference's Envoy example for the quota pattern: two
// quota_mode services, with metadata naming the service.
const quotaYAML = `
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}}
`

// TestTokenQuotaHoldsTheQuota is Envoy's token-quota flow: the request path
// checks service_2 with 0 hits, and when the stream is done service_2 is
// charged. With 2 per minute exactly 2 requests pass; a charge
// larger than what remains is accounted, so later checks deny until the
// window ends.
func TestTokenQuotaHoldsTheQuota(t *testing.T) {
	onBothStores(t, quotaYAML, rls.Options{}, func(t *testing.T, h *harness, fake bool) {
		check := func() *rlsv3.RateLimitResponse {
			return h.call(t, "rl", withHits(desc("service", "service_2"), 0))
		}
		passed := 0
		for i := 0; i < 6; i++ {
			if check().OverallCode != rlsv3.RateLimitResponse_OK {
				continue
			}
			passed++
			h.call(t, "rl", withHits(desc("service", "service_2"), 1)) // stream done
		}
		if passed != 2 {
			t.Fatalf("%d requests passed, want 2 (2 per minute)", passed)
		}
		r := check()
		if st := r.Statuses[0]; st.Code != rlsv3.RateLimitResponse_OVER_LIMIT || st.LimitRemaining != 0 || (fake && st.DurationUntilReset.AsDuration() != 50*time.Second) {
			t.Fatalf("check after the quota is used: %v", r)
		}
		if !fake {
			// A charge larger than what remains is still counted: 5 more
			// keep the check denied, and usage is now 7 of 2.
			h.call(t, "rl", withHits(desc("service", "service_2"), 5))
			if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("check after a charge of 5 more: %v", r)
			}
			return
		}

		// Next window: one check passes, and its stream reports 5.
		h.clock.Advance(50 * time.Second)
		if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("new window: %v", r)
		}
		if r := h.call(t, "rl", withHits(desc("service", "service_2"), 5)); r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("charge of 5: %v", r)
		}
		for i := 0; i < 3; i++ {
			h.clock.Advance(10 * time.Second)
			if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("%ds after a charge of 5 of 2: %v", 10*(i+1), r)
			}
		}
		h.clock.Advance(30 * time.Second) // the window ends
		if r := check(); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("after the window: %v", r)
		}
	})
}

// TestMultiServiceTokenQuotaHoldsTheQuota is Envoy's multi-service flow:
// the request path checks both services with 0 hits; Envoy routes to the
// service named in the metadata of the passed descriptors and charges that
// service when the stream is done. Each service gets exactly its quota.
func TestMultiServiceTokenQuotaHoldsTheQuota(t *testing.T) {
	onBothStores(t, quotaYAML, rls.Options{ResponseDynamicMetadata: true}, func(t *testing.T, h *harness, fake bool) {
		served := map[string]int{}
		for i := 0; i < 8; i++ {
			r := h.call(t, "rl", withHits(desc("service", "service_1"), 0), withHits(desc("service", "service_2"), 0))
			if r.OverallCode != rlsv3.RateLimitResponse_OK {
				continue
			}
			name := r.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
			if name == "" {
				t.Fatalf("request %d: no service in %v", i, r.DynamicMetadata)
			}
			served[name]++
			h.call(t, "rl", withHits(desc("service", name), 1))
		}
		if served["service_1"] != 1 || served["service_2"] != 2 {
			t.Fatalf("served %v, want service_1 once and service_2 twice", served)
		}
	})
}

const reloadYAML = `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: %d}
`

// TestLoweredLimitAppliesToUsage: a reload that lowers requests_per_unit
// mid-window denies at once when the usage is above the new limit, and one
// that raises it allows what is left of the new one.
func TestLoweredLimitAppliesToUsage(t *testing.T) {
	onBothStores(t, fmt.Sprintf(reloadYAML, 5), rls.Options{}, func(t *testing.T, h *harness, fake bool) {
		cfg := func(n int) *descriptors.Config {
			doc := fmt.Sprintf(reloadYAML, n)
			if !fake { // the same window as onBothStores gives Redis
				doc = strings.ReplaceAll(doc, "unit: minute", "window: 87600h")
			}
			c, err := descriptors.Parse("test.yaml", []byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		for i := 0; i < 3; i++ {
			h.call(t, "d", desc("k", "x"))
		}
		h.svc.SetConfig(cfg(2))
		r := h.call(t, "d", desc("k", "x"))
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
			t.Fatalf("after lowering 5 to 2 with 3 used: %v", r)
		}
		h.svc.SetConfig(cfg(10))
		r = h.call(t, "d", desc("k", "x"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 6 {
			t.Fatalf("after raising to 10 with 3 used: %v", r)
		}
	})
}

// TestOverridesShareTheDescriptorCounter: a request override and then a
// different override on one descriptor count together, with the configured
// limit of the same window, as the reference keeps one counter per
// descriptor and window.
func TestOverridesShareTheDescriptorCounter(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 20}
`
	over := func(n uint32, u typev3.RateLimitUnit) *commonv3.RateLimitDescriptor {
		d := desc("k", "x")
		d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: u}
		return d
	}
	// The counter is chosen in pkg/rls (the key), the same for every store.
	h := start(t, yaml, rls.Options{})
	{
		want := func(d *commonv3.RateLimitDescriptor, code rlsv3.RateLimitResponse_Code, remaining uint32) {
			t.Helper()
			r := h.call(t, "d", d)
			if r.OverallCode != code || r.Statuses[0].LimitRemaining != remaining {
				t.Fatalf("got %v, want %v with %d remaining", r, code, remaining)
			}
		}
		want(over(42, typev3.RateLimitUnit_MINUTE), rlsv3.RateLimitResponse_OK, 41)
		want(over(42, typev3.RateLimitUnit_MINUTE), rlsv3.RateLimitResponse_OK, 40)
		want(over(5, typev3.RateLimitUnit_MINUTE), rlsv3.RateLimitResponse_OK, 2)
		want(desc("k", "x"), rlsv3.RateLimitResponse_OK, 16)
		want(over(4, typev3.RateLimitUnit_MINUTE), rlsv3.RateLimitResponse_OVER_LIMIT, 0)
		// Another window is another counter.
		want(over(4, typev3.RateLimitUnit_HOUR), rlsv3.RateLimitResponse_OK, 3)
	}
}

// TestFixedWindowResetInEveryStatus: a fixed window reports the time to the
// end of its window whether the limit was checked (0 hits, empty window),
// left uncharged because another limit denied, denied, or can never pass.
func TestFixedWindowResetInEveryStatus(t *testing.T) {
	const yaml = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: h
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	clock := testutil.NewClock(base) // 10s into a minute, 10s into an hour
	store := memory.New(memory.WithClock(clock))
	t.Cleanup(func() { store.Close() })
	h := serve(t, yaml, rls.Options{Clock: clock}, store, clock)
	reset := func(r *rlsv3.RateLimitResponse, i int) time.Duration {
		return r.Statuses[i].DurationUntilReset.AsDuration()
	}
	if r := h.call(t, "d", withHits(desc("a", "x"), 0)); reset(r, 0) != 50*time.Second {
		t.Fatalf("check of an empty window: %v", r)
	}
	if r := h.call(t, "d", withHits(desc("a", "x"), 6)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || reset(r, 0) != 50*time.Second {
		t.Fatalf("6 hits of 5, never passing: %v", r)
	}
	if r := h.call(t, "d", desc("h", "x"), desc("b", "x")); reset(r, 0) != time.Hour-10*time.Second || reset(r, 1) != 50*time.Second {
		t.Fatalf("uncharged hour limit and blocked minute limit: %v", r)
	}
	if r := h.call(t, "d", desc("a", "x")); reset(r, 0) != 50*time.Second {
		t.Fatalf("charged: %v", r)
	}
}

// TestEmptyDescriptorsMatchNothing: a descriptor without entries, or with an
// entry whose key is empty, is answered as unmatched (OK, no limit), and
// the request's other descriptors are decided as usual.
func TestEmptyDescriptorsMatchNothing(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	for i := 0; i < 4; i++ {
		r := h.call(t, "d", desc("user", "a"), &commonv3.RateLimitDescriptor{}, desc("", "x"), desc("user", "a", "", ""))
		if len(r.Statuses) != 4 {
			t.Fatalf("%d statuses", len(r.Statuses))
		}
		for j := 1; j < 4; j++ {
			if st := r.Statuses[j]; st.Code != rlsv3.RateLimitResponse_OK || st.CurrentLimit != nil {
				t.Fatalf("empty descriptor %d: %v", j, st)
			}
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT // user: 3 per minute
		}
		if r.OverallCode != want {
			t.Fatalf("call %d: %v, want %v", i, r.OverallCode, want)
		}
	}
}
