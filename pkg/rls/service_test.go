package rls_test

import (
	"context"
	"net"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// base is 10 s into a minute, so minute windows end 50 s later.
var base = testutil.Base.Add(10 * time.Second)

type harness struct {
	svc    *rls.Service
	store  *memory.Store
	clock  *testutil.Clock
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
}

// start serves yaml on a real gRPC server on a loopback port with the
// embedded store and a fake clock, and returns a client through Envoy's
// generated stubs.
func start(t *testing.T, yaml string, opts rls.Options) *harness {
	t.Helper()
	cfg, err := descriptors.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	clock := testutil.NewClock(base)
	store := memory.New(memory.WithClock(clock))
	t.Cleanup(func() { store.Close() })
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
	return &harness{svc: svc, store: store, clock: clock, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn}
}

func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (h *harness) call(t *testing.T, domain string, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

const basicYAML = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: b_c
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func TestFixedWindowThroughGRPC(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	for i := 0; i < 3; i++ {
		r := h.call(t, "d", desc("user", "alice"))
		if r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i, r.OverallCode)
		}
		st := r.Statuses[0]
		if st.LimitRemaining != uint32(2-i) {
			t.Fatalf("call %d: remaining %d, want %d", i, st.LimitRemaining, 2-i)
		}
		if st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current limit %v", st.CurrentLimit)
		}
		if got := st.DurationUntilReset.AsDuration(); got != 50*time.Second {
			t.Fatalf("reset %v, want 50s", got)
		}
	}
	r := h.call(t, "d", desc("user", "alice"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th call: %v", r)
	}
	if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 50*time.Second {
		t.Fatalf("retry after %v, want 50s", got)
	}
	// Another user has their own counter.
	if r := h.call(t, "d", desc("user", "bob")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("bob: %v", r.OverallCode)
	}
	// The next window allows again.
	h.clock.Advance(50 * time.Second)
	if r := h.call(t, "d", desc("user", "alice")); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("next window: %v", r)
	}
}

func TestUnknownDomainAndNoMatchAreAllowed(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	for _, tc := range []struct {
		domain string
		d      *commonv3.RateLimitDescriptor
	}{
		{"nope", desc("user", "alice")},
		{"d", desc("other", "x")},
		{"d", desc("user", "alice", "extra", "x")}, // deeper than the config
	} {
		for i := 0; i < 5; i++ {
			r := h.call(t, tc.domain, tc.d)
			if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
				t.Fatalf("%s %v: %v", tc.domain, tc.d, r)
			}
		}
	}
}

func TestKeysAreUnambiguous(t *testing.T) {
	// The reference joins with "_": (b_c, d) and (b, c_d) share a counter
	// there. Here each has its own.
	h := start(t, basicYAML, rls.Options{})
	if r := h.call(t, "d", desc("b_c", "d")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatal(r)
	}
	if r := h.call(t, "d", desc("b", "c_d")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("(b, c_d) shares a counter with (b_c, d): %v", r)
	}
	if r := h.call(t, "d", desc("b", "c_d")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("limit 1 allowed twice: %v", r)
	}
}

func TestInvalidRequests(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"empty domain":   {Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "a")}},
		"no descriptors": {Domain: "d"},
		"unknown unit": {Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: desc("user", "a").Entries,
			Limit:   &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_UNKNOWN},
		}}},
	} {
		_, err := h.client.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
			t.Errorf("%s: got %v, want InvalidArgument with a reason", name, err)
		}
	}
}

func TestHitsAddend(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	r, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "d", HitsAddend: 2, Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "a")},
	})
	if err != nil || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("hits_addend 2: %v %v", r, err)
	}
	// Per-descriptor hits_addend 0 checks without charging.
	check := desc("user", "a")
	check.HitsAddend = wrapperspb.UInt64(0)
	for i := 0; i < 3; i++ {
		if r := h.call(t, "d", check); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("check %d: %v", i, r)
		}
	}
	// Per-descriptor hits_addend wins over the request's. Given on the
	// descriptor, the hits are usage accounting (by default): counted
	// although they do not fit, so nothing is left.
	two := desc("user", "a")
	two.HitsAddend = wrapperspb.UInt64(2)
	r, err = h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "d", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{two},
	})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("2 hits with 1 left: %v %v", r, err)
	}
	if r := h.call(t, "d", check); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("check after 4 of 3 used: %v", r)
	}
}

const featuresYAML = `
domain: f
descriptors:
  - key: api
    rate_limits:
      - {unit: minute, requests_per_unit: 5, name: per_minute}
      - {unit: second, requests_per_unit: 2, name: per_second}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unit: hour, requests_per_unit: 1000, unlimited: false}
  - key: vip
    rate_limit: {unlimited: true}
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 1, name: login}
  - key: trusted
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [{name: login}]
  - key: bucket
    value: "img-*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tagged
    metadata: {plan: gold}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: internal
    value: "yes"
`

func TestCompositeLimitReportsTheBindingOne(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	r := h.call(t, "f", desc("api", "k"))
	st := r.Statuses[0]
	// After one hit: per_minute has 4 left, per_second 1: per_second binds.
	if st.CurrentLimit.GetName() != "per_second" || st.LimitRemaining != 1 {
		t.Fatalf("first: %v", st)
	}
	h.call(t, "f", desc("api", "k"))
	r = h.call(t, "f", desc("api", "k"))
	st = r.Statuses[0]
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetName() != "per_second" {
		t.Fatalf("third in one second: %v", r)
	}
	if got := st.DurationUntilReset.AsDuration(); got != time.Second {
		t.Fatalf("retry after %v, want 1s", got)
	}
	// The denial charged nothing: per_minute still has 3 left.
	h.clock.Advance(time.Second)
	h.call(t, "f", desc("api", "k"))
	r = h.call(t, "f", desc("api", "k"))
	st = r.Statuses[0]
	if r.OverallCode != rlsv3.RateLimitResponse_OK || st.CurrentLimit.GetName() != "per_second" || st.LimitRemaining != 0 {
		t.Fatalf("after a second: %v", r)
	}
	h.clock.Advance(time.Second)
	r = h.call(t, "f", desc("api", "k"))
	st = r.Statuses[0]
	if st.CurrentLimit.GetName() != "per_minute" || st.LimitRemaining != 0 || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("fifth allowed hit: %v", r)
	}
	r = h.call(t, "f", desc("api", "k"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].CurrentLimit.GetName() != "per_minute" {
		t.Fatalf("sixth: %v", r)
	}
}

func TestDeniedRequestChargesNothing(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{})
	r := h.call(t, "f", desc("small", "x"), desc("big", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[1].LimitRemaining != 9 {
		t.Fatalf("first: %v", r)
	}
	for i := 0; i < 3; i++ {
		r = h.call(t, "f", desc("small", "x"), desc("big", "x"))
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("denied %d: %v", i, r)
		}
		if r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("statuses %d: %v", i, r.Statuses)
		}
		if r.Statuses[1].LimitRemaining != 9 {
			t.Fatalf("big charged by a denied request: remaining %d", r.Statuses[1].LimitRemaining)
		}
	}
}

func TestMetadataOfPassedDescriptors(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{ResponseDynamicMetadata: true})
	r := h.call(t, "f", desc("tagged", "x"))
	got := r.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["plan"].GetStringValue()
	if got != "gold" {
		t.Fatalf("dynamic metadata %v", r.DynamicMetadata)
	}
	r = h.call(t, "f", desc("tagged", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.DynamicMetadata.GetFields()["metadata"] != nil {
		t.Fatalf("denied descriptor returned metadata: %v", r)
	}
	// Off (the default): no dynamic metadata at all, as the reference.
	h = start(t, featuresYAML, rls.Options{})
	if r := h.call(t, "f", desc("tagged", "x")); r.DynamicMetadata != nil {
		t.Fatalf("metadata without the option: %v", r.DynamicMetadata)
	}
}

func TestConfigSwapKeepsCountersOfUnchangedLimits(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	h.call(t, "d", desc("user", "a"))
	h.call(t, "d", desc("user", "a"))
	// Same limit, renamed domain file content otherwise changed.
	next, err := descriptors.Parse("next.yaml", []byte(basicYAML+`
  - key: new
    rate_limit: {unit: second, requests_per_unit: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.SetConfig(next)
	if r := h.call(t, "d", desc("user", "a")); r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("counter lost across reload: %v", r)
	}
}

func TestCurrentLimitOfCustomWindows(t *testing.T) {
	h := start(t, `
domain: w
descriptors:
  - key: a
    rate_limit: {window: 90s, requests_per_unit: 10}
  - key: b
    rate_limit: {window: 2h, requests_per_unit: 10}
  - key: c
    rate_limit: {window: 1500ms, requests_per_unit: 3}
  - key: d
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: token_bucket, burst: 2}
`, rls.Options{})
	for _, tc := range []struct {
		key        string
		rpu        uint32
		unit       rlsv3.RateLimitResponse_RateLimit_Unit
		multiplier uint32 // 0: unset
	}{
		{"a", 10, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{"b", 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{"c", 2, rlsv3.RateLimitResponse_RateLimit_SECOND, 0}, // 3 per 1.5 s = 2 per second
		{"d", 6, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
	} {
		cl := h.call(t, "w", desc(tc.key, "x")).Statuses[0].CurrentLimit
		if cl.GetRequestsPerUnit() != tc.rpu || cl.GetUnit() != tc.unit || cl.GetUnitMultiplier().GetValue() != tc.multiplier {
			t.Errorf("%s: current_limit %v, want %d per %v x%d", tc.key, cl, tc.rpu, tc.unit, tc.multiplier)
		}
	}
	// Token bucket: remaining counts against the burst, a denial says when
	// the next token arrives (one per 10 s).
	r := h.call(t, "w", desc("d", "y"))
	if r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("burst 2 after one hit: %v", r)
	}
	h.call(t, "w", desc("d", "y"))
	r = h.call(t, "w", desc("d", "y"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].DurationUntilReset.AsDuration() != 10*time.Second {
		t.Fatalf("empty bucket: %v", r)
	}
}

func TestNegativeHitsAreCheckedWithoutCharging(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	d := desc("user", "n")
	d.IsNegativeHits = true
	d.HitsAddend = wrapperspb.UInt64(2)
	for i := 0; i < 5; i++ {
		if r := h.call(t, "d", d); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 3 {
			t.Fatalf("negative hits %d: %v", i, r)
		}
	}
}
