package rls_test

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
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
	// Per-descriptor hits_addend wins over the request's.
	two := desc("user", "a")
	two.HitsAddend = wrapperspb.UInt64(2)
	r, err = h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "d", HitsAddend: 1, Descriptors: []*commonv3.RateLimitDescriptor{two},
	})
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("2 hits with 1 left: %v %v", r, err)
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

func TestHealthAndReflection(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	hc := healthpb.NewHealthClient(h.conn)
	for _, name := range append([]string{""}, rls.HealthServiceNames...) {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, r, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range resp.GetListServicesResponse().GetService() {
		found = found || s.Name == "envoy.service.ratelimit.v3.RateLimitService"
	}
	if !found {
		t.Fatalf("reflection does not list the service: %v", resp)
	}
}

func TestJSONEndpoint(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	srv := httptest.NewServer(h.svc.JSONHandler())
	defer srv.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req := `{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`
	for i := 0; i < 3; i++ {
		code, body := post(req)
		if code != 200 {
			t.Fatalf("call %d: %d %s", i, code, body)
		}
		var r rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &r); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("body %s: %v", body, err)
		}
		// Stable, compact output (protojson alone varies its spacing).
		if !strings.HasPrefix(body, `{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},`) {
			t.Fatalf("body not compact: %s", body)
		}
	}
	if code, body := post(req); code != http.StatusTooManyRequests || !strings.Contains(body, "OVER_LIMIT") {
		t.Fatalf("4th: %d %s", code, body)
	}
	if code, body := post(`{"domain":"","descriptors":[]}`); code != http.StatusBadRequest || !strings.Contains(body, "domain") {
		t.Fatalf("invalid: %d %s", code, body)
	}
	if code, _ := post(`not json`); code != http.StatusBadRequest {
		t.Fatalf("garbage: %d", code)
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

func TestResponseHeaders(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{ResponseHeaders: rls.HeadersLegacy})
	headers := func(r *rlsv3.RateLimitResponse) map[string]string {
		m := map[string]string{}
		for _, hv := range r.ResponseHeadersToAdd {
			m[hv.Key] = hv.Value
		}
		return m
	}
	// small (1/min) and big (10/min): small binds, 0 left, 50 s to reset.
	r := h.call(t, "f", desc("big", "h"), desc("small", "h"))
	got := headers(r)
	if got["RateLimit-Limit"] != "1" || got["RateLimit-Remaining"] != "0" || got["RateLimit-Reset"] != "50" {
		t.Fatalf("headers %v", got)
	}
	// Denied: the denying descriptor is described.
	r = h.call(t, "f", desc("big", "h"), desc("small", "h"))
	got = headers(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || got["RateLimit-Limit"] != "1" || got["RateLimit-Reset"] != "50" {
		t.Fatalf("denied headers %v", got)
	}
	// No limit applies: no headers.
	if r := h.call(t, "f", desc("nothing", "x")); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers without a limit: %v", r.ResponseHeadersToAdd)
	}
	// Off by default.
	h2 := start(t, featuresYAML, rls.Options{})
	if r := h2.call(t, "f", desc("big", "h")); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers while off: %v", r.ResponseHeadersToAdd)
	}
}

// TestResponseHeaderNames: the reference's LIMIT_*_HEADER names the three
// fields; a name left empty keeps its default.
func TestResponseHeaderNames(t *testing.T) {
	h := start(t, featuresYAML, rls.Options{ResponseHeaders: rls.HeadersLegacy,
		LegacyHeaderNames: rlheaders.LegacyNames{Limit: "X-Quota-Limit", Reset: "X-Quota-Reset"}})
	r := h.call(t, "f", desc("big", "h"), desc("small", "h"))
	var got []string
	for _, hv := range r.ResponseHeadersToAdd {
		got = append(got, hv.Key+": "+hv.Value)
	}
	if want := "X-Quota-Limit: 1|RateLimit-Remaining: 0|X-Quota-Reset: 50"; strings.Join(got, "|") != want {
		t.Fatalf("headers %q, want %q", strings.Join(got, "|"), want)
	}
}
