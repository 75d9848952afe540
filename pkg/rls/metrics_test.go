package rls_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

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

// scrape fetches /metrics over HTTP, so the families are read as a
// scraper reads them.
func scrape(t *testing.T, reg *prometheus.Registry) testutil.Metrics {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	return testutil.Scrape(t, srv.URL)
}

func TestMetricsAfterAScriptedSequence(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics := rls.NewMetrics(reg)
	// The sequence gives hits on the descriptor as admissions (never usage
	// accounting), so a denied call charges nothing.
	h := start(t, observeYAML, rls.Options{Metrics: metrics, UsageAccounting: descriptors.UsageNever})
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
		if got := fams.Value(c.name, "domain=obs", "rule="+c.rule); got != c.want {
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
		if got := fams.Value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	metrics.ConfigLoad(nil)
	before := time.Now()
	metrics.ConfigLoad(nil)
	fams = scrape(t, reg)
	if ok, ts := fams.Value("envoy_rls_config_last_load_success"), fams.Value("envoy_rls_config_last_success_timestamp_seconds"); ok != 1 || ts < float64(before.Unix()) {
		t.Errorf("after success: ok %v, time %v", ok, ts)
	}
	metrics.ConfigWarnings(3)
	if got := scrape(t, reg).Value("envoy_rls_config_warnings"); got != 3 {
		t.Errorf("envoy_rls_config_warnings %v, want 3", got)
	}
	metrics.ConfigLoad(io.EOF)
	fams = scrape(t, reg)
	if ok, ts := fams.Value("envoy_rls_config_last_load_success"), fams.Value("envoy_rls_config_last_success_timestamp_seconds"); ok != 0 || ts < float64(before.Unix()) {
		t.Errorf("after error: ok %v, time %v (the last good time stays)", ok, ts)
	}
}

func TestBackendErrorsByKind(t *testing.T) {
	for _, mode := range []rls.FailureMode{rls.FailOpen, rls.FailClosed, rls.FailLocal} {
		t.Run(mode.String(), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			h := start(t, observeYAML, rls.Options{Metrics: rls.NewMetrics(reg), FailureMode: mode})
			// Made at 0 for the configured mode, so that an alert on
			// their rate evaluates before the first failure.
			before := scrape(t, reg)
			for _, kind := range []string{"timeout", "canceled", "error"} {
				if v := before.Value("envoy_rls_backend_errors_total", "kind="+kind, "mode="+mode.String()); v != 0 {
					t.Errorf("kind %s mode %s before a failure: %v, want a series at 0 (-1: none)", kind, mode, v)
				}
			}
			if all := before.ByLabelValues("envoy_rls_backend_errors_total"); len(all) != 3 {
				t.Errorf("series before a failure: %v, want the 3 kinds of mode %s", all, mode)
			}
			h.store.Close()
			_, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "obs", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "u")}})
			if (err == nil) != (mode == rls.FailOpen) {
				t.Errorf("closed store: error %v", err)
			}
			if got := scrape(t, reg).Value("envoy_rls_backend_errors_total", "kind=error", "mode="+mode.String()); got != 1 {
				t.Errorf("backend errors = %v, want 1", got)
			}
		})
	}
}

// A request the store's local fallback decided (it returns no error) is
// a backend failure all the same, counted under mode local.
func TestBackendFallbackIsCountedAsABackendError(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := start(t, observeYAML, rls.Options{Metrics: rls.NewMetrics(reg), FailureMode: rls.FailLocal})
	h.svc.BackendFallback(context.DeadlineExceeded)
	h.svc.BackendFallback(errors.New("dial tcp: connection refused"))
	m := scrape(t, reg)
	if got := m.Value("envoy_rls_backend_errors_total", "kind=timeout", "mode=local"); got != 1 {
		t.Errorf("timeouts = %v, want 1", got)
	}
	if got := m.Value("envoy_rls_backend_errors_total", "kind=error", "mode=local"); got != 1 {
		t.Errorf("errors = %v, want 1", got)
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
	if got := fams.Value("envoy_rls_rule_hits_total", "domain=obs", "rule=__overflow__"); got != n-rls.MaxRuleSeries {
		t.Errorf("overflow series = %v, want %d", got, n-rls.MaxRuleSeries)
	}
	if got := fams.Value("envoy_rls_metric_label_overflow_total", "metric=envoy_rls_rule"); got != n-rls.MaxRuleSeries {
		t.Errorf("overflow counter = %v", got)
	}
	// The decisions' descriptor label holds the values too: capped alike.
	if d := fams["envoy_rls_limit_decisions_total"]; d == nil || len(d.Metric) != rls.MaxRuleSeries+1 {
		t.Errorf("decision series = %d, want %d (the cap) + 1 overflow", len(d.GetMetric()), rls.MaxRuleSeries)
	}
	if got := fams.Value("envoy_rls_metric_label_overflow_total", "metric=envoy_rls_limit_decisions"); got != n-rls.MaxRuleSeries {
		t.Errorf("decision overflow counter = %v", got)
	}
	if got := fams.Value("envoy_rls_rule_hits_total", "domain=obs", "rule=client_c7"); got != 1 {
		t.Errorf("an admitted value's series = %v", got)
	}
}

// The request and decision series are made at their first use and kept
// per config: counts continue in the same series after a reload, and a
// code or result that never happened has no series.
func TestMetricSeriesAcrossAReload(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := start(t, basicYAML, rls.Options{Metrics: rls.NewMetrics(reg)})
	for range 2 {
		h.call(t, "d", desc("user", "a"))
	}
	cfg, err := descriptors.Parse("again.yaml", []byte(basicYAML))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.SetConfig(cfg)
	for range 2 { // the limit is 3 a minute: the fourth call is denied
		h.call(t, "d", desc("user", "a"))
	}
	fams := scrape(t, reg)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"envoy_rls_requests_total", []string{"domain=d", "code=ok"}, 3},
		{"envoy_rls_requests_total", []string{"domain=d", "code=over_limit"}, 1},
		{"envoy_rls_requests_total", []string{"domain=d", "code=failed_open"}, -1},
		{"envoy_rls_limit_decisions_total", []string{"domain=d", "descriptor=d.user", "result=within_limit"}, 3},
		{"envoy_rls_limit_decisions_total", []string{"domain=d", "descriptor=d.user", "result=over_limit"}, 1},
		{"envoy_rls_limit_decisions_total", []string{"domain=d", "descriptor=d.user", "result=shadow_over_limit"}, -1},
	} {
		if got := fams.Value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v (-1: no series)", c.name, c.labels, got, c.want)
		}
	}
}
