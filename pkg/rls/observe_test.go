package rls_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/tracing"
	"github.com/envoyrls/envoy-rls/internal/tracing/otlptest"
	"github.com/envoyrls/envoy-rls/pkg/backend/memory"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

const observeYAML = `
domain: obs
tiers:
  gold:
    - {name: gold-hourly, unit: hour, requests_per_unit: 1000}
    - {name: gold-daily, unit: day, requests_per_unit: 5000}
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 5}
  - key: api
    rate_limits:
      - {name: api-minute, unit: minute, requests_per_unit: 100}
      - {name: api-second, unit: second, requests_per_unit: 2}
  - key: bare
    rate_limits:
      - {unit: minute, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 20}
  - key: plan
    value: gold
    tier: gold
  - key: slow
    rate_limit: {window: 90s, requests_per_unit: 7}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
`

func headerMap(r *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, hv := range r.ResponseHeadersToAdd {
		if _, dup := m[hv.Key]; dup {
			m[hv.Key] += "\x00dup"
		}
		m[hv.Key] = hv.Value
	}
	return m
}

type sfPolicy struct {
	name string
	q, w int64
	pk   []byte
}

// parseFields parses RateLimit-Policy and RateLimit with a Structured Field
// parser, checking the draft's grammar: Lists of String Items with only the
// draft's parameters, typed as the draft says.
func parseFields(t *testing.T, h map[string]string) (pols []sfPolicy, name string, r, reset int64, pk []byte) {
	t.Helper()
	list, err := httpsfv.UnmarshalList([]string{h["RateLimit-Policy"]})
	if err != nil || len(list) == 0 {
		t.Fatalf("RateLimit-Policy %q: %v", h["RateLimit-Policy"], err)
	}
	for _, m := range list {
		it := m.(httpsfv.Item)
		p := sfPolicy{name: it.Value.(string)}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			switch k {
			case "q":
				p.q = v.(int64)
			case "w":
				p.w = v.(int64)
			case "pk":
				p.pk = v.([]byte)
			default:
				t.Fatalf("unexpected parameter %q", k)
			}
		}
		pols = append(pols, p)
	}
	rl, err := httpsfv.UnmarshalList([]string{h["RateLimit"]})
	if err != nil || len(rl) != 1 {
		t.Fatalf("RateLimit %q: %v", h["RateLimit"], err)
	}
	it := rl[0].(httpsfv.Item)
	name = it.Value.(string)
	r, reset = -1, -1
	for _, k := range it.Params.Names() {
		v, _ := it.Params.Get(k)
		switch k {
		case "r":
			r = v.(int64)
		case "t":
			reset = v.(int64)
		case "pk":
			pk = v.([]byte)
		default:
			t.Fatalf("unexpected parameter %q", k)
		}
	}
	return pols, name, r, reset, pk
}

func TestIETFHeadersSingleLimit(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF})
	got := headerMap(h.call(t, "obs", desc("user", "alice")))
	pols, name, r, reset, pk := parseFields(t, got)
	if len(pols) != 1 || pols[0].name != "per-user" || pols[0].q != 5 || pols[0].w != 60 {
		t.Errorf("policy %+v", pols)
	}
	// A key-only descriptor: one counter per user, so a partition key.
	if len(pols[0].pk) != 8 || string(pk) != string(pols[0].pk) {
		t.Errorf("pk %x / %x, want the counter's 8-byte tag in both", pols[0].pk, pk)
	}
	if name != "per-user" || r != 4 || reset != 50 {
		t.Errorf("RateLimit %q r=%d t=%d, want per-user r=4 t=50", name, r, reset)
	}
	// Another user is another partition.
	other := headerMap(h.call(t, "obs", desc("user", "bob")))
	if _, _, _, _, pk2 := parseFields(t, other); string(pk2) == string(pk) {
		t.Errorf("two users share pk %x", pk)
	}
	if _, ok := got["RateLimit-Limit"]; ok {
		t.Errorf("ietf mode added legacy fields: %v", got)
	}
	if _, ok := got["Retry-After"]; ok {
		t.Errorf("Retry-After on an allowed answer")
	}
}

func TestIETFHeadersComposite(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF})
	got := headerMap(h.call(t, "obs", desc("api", "k")))
	pols, name, r, reset, _ := parseFields(t, got)
	if len(pols) != 2 || pols[0].name != "api-minute" || pols[0].q != 100 || pols[0].w != 60 ||
		pols[1].name != "api-second" || pols[1].q != 2 || pols[1].w != 1 {
		t.Fatalf("policy %+v", pols)
	}
	if name != "api-second" || r != 1 || reset != 1 {
		t.Errorf("RateLimit %q r=%d t=%d, want api-second r=1 t=1", name, r, reset)
	}
	// Unnamed composite limits get distinct names.
	pols, _, _, _, _ = parseFields(t, headerMap(h.call(t, "obs", desc("bare", "x"))))
	if len(pols) != 2 || pols[0].name != "bare#0" || pols[1].name != "bare#1" {
		t.Errorf("unnamed composite %+v", pols)
	}
}

func TestIETFHeadersTier(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF})
	got := headerMap(h.call(t, "obs", desc("plan", "gold")))
	pols, name, r, _, pk := parseFields(t, got)
	if len(pols) != 2 || pols[0].name != "gold-hourly" || pols[0].w != 3600 || pols[1].name != "gold-daily" || pols[1].w != 86400 || pols[1].q != 5000 {
		t.Fatalf("policy %+v", pols)
	}
	// A fixed value: one shared counter, no partition key.
	if pols[0].pk != nil || pk != nil {
		t.Errorf("pk on a shared counter")
	}
	if name != "gold-hourly" || r != 999 {
		t.Errorf("RateLimit %q r=%d", name, r)
	}
}

func TestIETFHeadersWindow90s(t *testing.T) {
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersIETF | rls.HeadersDraft03})
	got := headerMap(h.call(t, "obs", desc("slow", "x")))
	pols, name, r, reset, _ := parseFields(t, got)
	if len(pols) != 1 || pols[0].name != "slow" || pols[0].q != 7 || pols[0].w != 90 {
		t.Fatalf("policy %+v", pols)
	}
	// base is 10 s into a minute; 90 s windows are epoch-aligned.
	wantReset := int64(90 - base.Unix()%90)
	if name != "slow" || r != 6 || reset != wantReset {
		t.Errorf("RateLimit %q r=%d t=%d, want slow r=6 t=%d", name, r, reset, wantReset)
	}
	if got["X-RateLimit-Limit"] != `7, 7;w=90;name="slow"` || got["X-RateLimit-Remaining"] != "6" || got["X-RateLimit-Reset"] != strconv.FormatInt(wantReset, 10) {
		t.Errorf("draft03 %q %q %q", got["X-RateLimit-Limit"], got["X-RateLimit-Remaining"], got["X-RateLimit-Reset"])
	}
	if l, err := httpsfv.UnmarshalList([]string{got["X-RateLimit-Limit"]}); err != nil || len(l) != 2 {
		t.Errorf("X-RateLimit-Limit does not parse as a list: %v", err)
	}
}

func TestOverLimitTellsTheClientAndEnvoy(t *testing.T) {
	body, err := rls.ParseBodyTemplate(`{"error":"rate_limited","rule":"{{rule}}","retry_after":{{retry_after}}}`)
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, observeYAML, rls.Options{ResponseHeaders: rls.HeadersAll, OverLimitBody: body})
	for i := 0; i < 2; i++ {
		h.call(t, "obs", desc("user", "carol"), desc("api", "k"))
	}
	r := h.call(t, "obs", desc("user", "carol"), desc("api", "k"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("3rd call within 1 s: %v", r)
	}
	got := headerMap(h.call(t, "obs", desc("user", "carol"), desc("api", "k")))
	pols, name, rem, reset, _ := parseFields(t, got)
	if len(pols) != 3 {
		t.Errorf("policies %+v", pols)
	}
	if name != "api-second" || rem != 0 || reset != 1 {
		t.Errorf("RateLimit %q r=%d t=%d, want api-second r=0 t=1", name, rem, reset)
	}
	if got["Retry-After"] != "1" {
		t.Errorf("Retry-After %q, want 1", got["Retry-After"])
	}
	if !strings.HasPrefix(got["X-RateLimit-Limit"], "2, 5;w=60;name=\"per-user\", 100;w=60;name=\"api-minute\", 2;w=1;name=\"api-second\"") || got["X-RateLimit-Remaining"] != "0" {
		t.Errorf("draft03 %q / %q", got["X-RateLimit-Limit"], got["X-RateLimit-Remaining"])
	}
	if got["RateLimit-Limit"] != "2" || got["RateLimit-Remaining"] != "0" || got["RateLimit-Reset"] != "1" {
		t.Errorf("legacy %v", got)
	}
	for k, v := range got {
		if strings.Contains(v, "\x00dup") {
			t.Errorf("header %s added twice", k)
		}
	}
	r = h.call(t, "obs", desc("user", "carol"), desc("api", "k"))
	meta := r.DynamicMetadata.GetFields()[rls.MetadataKey].GetStructValue().GetFields()
	if meta["rule"].GetStringValue() != "api-second" || meta["domain"].GetStringValue() != "obs" || meta["descriptor_index"].GetNumberValue() != 1 {
		t.Errorf("dynamic metadata %v", r.DynamicMetadata)
	}
	if want := `{"error":"rate_limited","rule":"api-second","retry_after":1}`; string(r.RawBody) != want {
		t.Errorf("raw_body %s, want %s", r.RawBody, want)
	}
	// Retry-After comes whatever the header mode, and unnamed rules are
	// named by their path.
	h2 := start(t, observeYAML, rls.Options{})
	h2.call(t, "obs", desc("shadowed", "x"))
	for i := 0; i < 5; i++ {
		h2.call(t, "obs", desc("user", "dave"))
	}
	r = h2.call(t, "obs", desc("shadowed", "x"), desc("user", "dave"))
	g := headerMap(r)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || g["Retry-After"] != "50" || len(g) != 1 || r.RawBody != nil {
		t.Errorf("headers off: %v, body %q", g, r.RawBody)
	}
	if rule := r.DynamicMetadata.GetFields()[rls.MetadataKey].GetStructValue().GetFields()["rule"].GetStringValue(); rule != "per-user" {
		t.Errorf("denying rule %q, want per-user (the shadow limit denies nothing)", rule)
	}
}

// scrape fetches /metrics over HTTP and parses it.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}

// value returns the sample of family name whose labels are exactly labels
// ("k=v" pairs), or -1 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(labels) {
			continue
		}
		ok := true
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			ok = ok && got[k] == v
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

func TestMetricsAfterAScriptedSequence(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics := rls.NewMetrics(reg)
	h := start(t, observeYAML, rls.Options{Metrics: metrics})
	call := func(hits uint64, ds ...string) *rlsv3.RateLimitResponse {
		d := desc(ds...)
		d.HitsAddend = wrapperspb.UInt64(hits)
		return h.call(t, "obs", d)
	}
	call(3, "user", "u")     // per-user 3/5: within 3, near (3 > 4? no)
	call(2, "user", "u")     // 5/5: within 2, near: used 5 > threshold 4 -> 1
	call(4, "user", "u")     // denied: over 4
	call(10, "api", "k")     // api-second denies 10 > 2: over 10; api-minute allows: within 10
	call(1, "api", "k")      // both allow
	call(1, "shadowed", "s") // within 1
	call(1, "shadowed", "s") // shadow over 1
	h.call(t, "obs", desc("nothing", "x"))
	h.call(t, "nope", desc("user", "u"))
	fams := scrape(t, reg)
	for _, c := range []struct {
		name, rule string
		want       float64
	}{
		{"envoy_rls_rule_hits_total", "per-user", 9},
		{"envoy_rls_rule_within_limit_total", "per-user", 5},
		{"envoy_rls_rule_near_limit_total", "per-user", 1},
		{"envoy_rls_rule_over_limit_total", "per-user", 4},
		{"envoy_rls_rule_hits_total", "api-second", 11},
		{"envoy_rls_rule_over_limit_total", "api-second", 10},
		{"envoy_rls_rule_within_limit_total", "api-second", 1},
		{"envoy_rls_rule_hits_total", "api-minute", 11},
		{"envoy_rls_rule_within_limit_total", "api-minute", 11},
		{"envoy_rls_rule_over_limit_total", "api-minute", 0},
		{"envoy_rls_rule_within_limit_total", "shadowed", 1},
		{"envoy_rls_rule_shadow_over_limit_total", "shadowed", 1},
		{"envoy_rls_rule_over_limit_total", "shadowed", 0},
	} {
		if got := value(fams, c.name, "domain=obs", "rule="+c.rule); got != c.want {
			t.Errorf("%s{rule=%q} = %v, want %v", c.name, c.rule, got, c.want)
		}
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"envoy_rls_requests_total", []string{"domain=obs", "code=ok"}, 6},
		{"envoy_rls_requests_total", []string{"domain=obs", "code=over_limit"}, 2},
		{"envoy_rls_requests_total", []string{"domain=", "code=ok"}, 1},
		{"envoy_rls_request_duration_seconds", nil, 9},
		{"envoy_rls_backend_duration_seconds", nil, 7},
		{"envoy_rls_requests_in_flight", nil, 0},
	} {
		if got := value(fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	metrics.ConfigLoad(nil)
	before := time.Now()
	metrics.ConfigLoad(nil)
	fams = scrape(t, reg)
	if ok, ts := value(fams, "envoy_rls_config_last_load_success"), value(fams, "envoy_rls_config_last_success_timestamp_seconds"); ok != 1 || ts < float64(before.Unix()) {
		t.Errorf("after success: ok %v, time %v", ok, ts)
	}
	metrics.ConfigWarnings(3)
	if got := value(scrape(t, reg), "envoy_rls_config_warnings"); got != 3 {
		t.Errorf("envoy_rls_config_warnings %v, want 3", got)
	}
	metrics.ConfigLoad(io.EOF)
	fams = scrape(t, reg)
	if ok, ts := value(fams, "envoy_rls_config_last_load_success"), value(fams, "envoy_rls_config_last_success_timestamp_seconds"); ok != 0 || ts < float64(before.Unix()) {
		t.Errorf("after error: ok %v, time %v (the last good time stays)", ok, ts)
	}
}

func TestBackendErrorsByKind(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := start(t, observeYAML, rls.Options{Metrics: rls.NewMetrics(reg)})
	h.store.Close()
	h.call(t, "obs", desc("user", "u"))
	if got := value(scrape(t, reg), "envoy_rls_backend_errors_total", "kind=error"); got != 1 {
		t.Errorf("backend errors = %v, want 1", got)
	}
}

func TestDetailedMetricSeriesStayUnderTheCap(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := start(t, observeYAML, rls.Options{Metrics: rls.NewMetrics(reg)})
	const n = 100_000
	var wg sync.WaitGroup
	const workers = 8
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				_, err := h.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "obs", Descriptors: []*commonv3.RateLimitDescriptor{desc("client", "c"+strconv.Itoa(i))}})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	fams := scrape(t, reg)
	f := fams["envoy_rls_rule_hits_total"]
	if f == nil || len(f.Metric) != rls.MaxRuleSeries+1 {
		t.Fatalf("hits series = %d, want %d (the cap) + 1 overflow", len(f.GetMetric()), rls.MaxRuleSeries)
	}
	var total float64
	for _, m := range f.Metric {
		total += m.Counter.GetValue()
	}
	if total != n {
		t.Errorf("hits counted %v, want %d: the overflow series must keep the count", total, n)
	}
	if got := value(fams, "envoy_rls_rule_hits_total", "domain=obs", "rule=__overflow__"); got != n-rls.MaxRuleSeries {
		t.Errorf("overflow series = %v, want %d", got, n-rls.MaxRuleSeries)
	}
	if got := value(fams, "envoy_rls_metric_label_overflow_total", "metric=envoy_rls_rule"); got != n-rls.MaxRuleSeries {
		t.Errorf("overflow counter = %v", got)
	}
	// The decisions' descriptor label holds the values too: capped alike.
	if d := fams["envoy_rls_limit_decisions_total"]; d == nil || len(d.Metric) != rls.MaxRuleSeries+1 {
		t.Errorf("decision series = %d, want %d (the cap) + 1 overflow", len(d.GetMetric()), rls.MaxRuleSeries)
	}
	if got := value(fams, "envoy_rls_metric_label_overflow_total", "metric=envoy_rls_limit_decisions"); got != n-rls.MaxRuleSeries {
		t.Errorf("decision overflow counter = %v", got)
	}
	if got := value(fams, "envoy_rls_rule_hits_total", "domain=obs", "rule=client_c7"); got != 1 {
		t.Errorf("an admitted value's series = %v", got)
	}
}

func TestSpansReachAnOTLPReceiverWithTheCallersParent(t *testing.T) {
	r := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.Endpoint())
	cfg, err := tracing.FromEnv(func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return r.Endpoint()
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracing.Setup(context.Background(), cfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, observeYAML, rls.Options{Tracer: tr.Tracer, Propagator: tr.Propagator})
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := h.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "obs", Descriptors: []*commonv3.RateLimitDescriptor{desc("api", "k")}}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := r.WaitSpans(t, 2, 10*time.Second)
	byName := map[string]int{}
	for i, s := range spans {
		byName[s.Name] = i
	}
	root, ok1 := byName["ShouldRateLimit"]
	be, ok2 := byName["backend.Apply"]
	if !ok1 || !ok2 {
		t.Fatalf("spans %v", byName)
	}
	if got := hex.EncodeToString(spans[root].TraceId); got != traceID {
		t.Errorf("trace id %s, want the caller's %s", got, traceID)
	}
	if got := hex.EncodeToString(spans[root].ParentSpanId); got != parentID {
		t.Errorf("ShouldRateLimit parent %s, want the caller's %s", got, parentID)
	}
	if hex.EncodeToString(spans[be].ParentSpanId) != hex.EncodeToString(spans[root].SpanId) {
		t.Errorf("backend span is not a child of ShouldRateLimit")
	}
	keys := int64(-1)
	for _, a := range spans[be].Attributes {
		if a.Key == "ratelimit.backend.keys" {
			keys = a.Value.GetIntValue()
		}
	}
	if keys != 2 {
		t.Errorf("backend span keys = %d, want 2 (a composite of two limits)", keys)
	}
}

func TestNoAllocationsAddedWhenTracingIsOff(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under -race (sync.Pool drops items)")
	}
	cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	defer store.Close()
	svc := rls.New(store, cfg, rls.Options{})
	req := benchRequests("user", 1)[0]
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	})
	// Before tracing, headers and observers existed, one descriptor cost
	// two allocations: the response arena and the store key.
	if allocs > 2 {
		t.Errorf("ShouldRateLimit allocates %v times per call, want at most 2", allocs)
	}
}

type slowObserver struct {
	release chan struct{}
	seen    atomic.Int64
}

func (o *slowObserver) ObserveDecision(*rls.DecisionEvent) {
	<-o.release
	o.seen.Add(1)
}

func TestObserversRunOffTheDecisionPath(t *testing.T) {
	var mu sync.Mutex
	var events []*rls.DecisionEvent
	fast := rls.ObserverFunc(func(e *rls.DecisionEvent) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	slow := &slowObserver{release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	h := start(t, observeYAML, rls.Options{Observers: []rls.Observer{fast, slow}, ObserverQueue: 4, Metrics: rls.NewMetrics(reg)})
	const calls = 20
	for i := 0; i < calls; i++ {
		h.call(t, "obs", desc("api", "k")) // the slow observer blocks; calls must not
	}
	close(slow.release)
	h.svc.Close()
	// The slow observer holds one event and queues 4; the rest are dropped.
	if got := slow.seen.Load(); got != 5 {
		t.Errorf("slow observer saw %d events, want 5 (1 in hand + a queue of 4)", got)
	}
	if got := h.svc.ObserverDropped(); got != calls-5 {
		t.Errorf("dropped %d, want %d", got, calls-5)
	}
	if got := value(scrape(t, reg), "envoy_rls_observer_events_dropped_total"); got != calls-5 {
		t.Errorf("dropped metric %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// The fast observer's queue may also have filled; what it got is
	// complete and in order.
	if len(events) == 0 {
		t.Fatal("fast observer got nothing")
	}
	e := events[0]
	if e.Domain != "obs" || !e.Known || e.Code != "ok" || len(e.Limits) != 2 || e.Limits[1].Rule != "api-second" || !e.Limits[1].Allowed || e.Limits[1].Hits != 1 {
		t.Errorf("first event %+v", e)
	}
	last := events[len(events)-1]
	if last.Code != "over_limit" || last.Limits[1].Allowed || last.Limits[1].RetryAfter <= 0 {
		t.Errorf("last event %+v", last)
	}
}

// BenchmarkShouldRateLimitTold is BenchmarkShouldRateLimit's hot key and
// composite with what the service tells switched on: metrics (per rule, in
// hits) and every header mode. Compare it with BenchmarkShouldRateLimit in
// the same run.
func BenchmarkShouldRateLimitTold(b *testing.B) {
	cfg, err := descriptors.Parse("bench.yaml", []byte(benchYAML))
	if err != nil {
		b.Fatal(err)
	}
	store := memory.New()
	b.Cleanup(func() { store.Close() })
	svc := rls.New(store, cfg, rls.Options{Metrics: rls.NewMetrics(prometheus.NewRegistry()), ResponseHeaders: rls.HeadersAll})
	for _, bc := range []struct{ name, key string }{{"hot_key", "user"}, {"composite_3_limits", "api"}} {
		b.Run(bc.name, func(b *testing.B) {
			req := benchRequests(bc.key, 1)[0]
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
