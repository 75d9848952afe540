package rls_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

const egMetricsYAML = `
domain: default/eg
descriptors:
  - key: rule
    value: r0
    descriptors:
      - key: masked_remote_address
        value: 0.0.0.0/0
        descriptors:
          - key: remote_address
            rate_limit: {unit: hour, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: ip
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
`

// The reference's series count hits as the reference does, with labels
// from the config path split as Envoy Gateway's statsd mapping splits it.
func TestReferenceMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := rls.NewMetrics(reg)
	m.EnableReference(reg, 0.8)
	h := start(t, egMetricsYAML, rls.Options{Metrics: m})
	for i := 0; i < 5; i++ {
		h.call(t, "default/eg", desc("rule", "r0", "masked_remote_address", "0.0.0.0/0", "remote_address", "10.0.0.1"))
	}
	for i := 0; i < 3; i++ {
		h.call(t, "default/eg", desc("shadow", "x"))
	}
	h.call(t, "default/eg", desc("ip", "192.168.1.2"))
	// An invalid request is a service error.
	h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "", Descriptors: []*commonv3.RateLimitDescriptor{desc("a", "b")}})
	m.ConfigLoad(nil)

	chain := []string{"default/eg", "rule_r0", "masked_remote_address_0_0_0_0/0"}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"ratelimit_service_rate_limit_total_hits", chain, 5},
		{"ratelimit_service_rate_limit_within_limit", chain, 3},
		{"ratelimit_service_rate_limit_over_limit", chain, 2},
		{"ratelimit_service_rate_limit_near_limit", chain, 1}, // the 3rd hit passes floor(3*0.8)=2
		{"ratelimit_service_rate_limit_shadow_mode", chain, 0},
		{"ratelimit_service_rate_limit_total_hits", []string{"default/eg", "shadow", ""}, 3},
		{"ratelimit_service_rate_limit_over_limit", []string{"default/eg", "shadow", ""}, 2},
		{"ratelimit_service_rate_limit_shadow_mode", []string{"default/eg", "shadow", ""}, 2},
		{"ratelimit_service_rate_limit_within_limit", []string{"default/eg", "ip_192_168_1_2", ""}, 1},
	} {
		if got := refCount(t, reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := testutil.Gather(t, reg).Count("ratelimit_service_config_load_success"); got != 1 {
		t.Errorf("config_load_success = %v", got)
	}
	text, err := promtest.GatherAndCount(reg, "ratelimit_service_total_requests", "ratelimit_service_response_time_seconds", "ratelimit_service_should_rate_limit_error")
	if err != nil || text != 3 {
		t.Errorf("request series: %d, %v", text, err)
	}
	if got := testutil.Gather(t, reg).Count("ratelimit_service_total_requests", "grpc_method=ShouldRateLimit"); got != 10 {
		t.Errorf("total_requests = %v, want 10", got)
	}
	if got := testutil.Gather(t, reg).Count("ratelimit_service_should_rate_limit_error", "err_type=service_error"); got != 1 {
		t.Errorf("service_error = %v, want 1", got)
	}
}

// A detailed_metric key takes request values; the distinct keys are capped.
func TestReferenceMetricsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := rls.NewMetrics(reg)
	m.EnableReference(reg, 0.8)
	h := start(t, egMetricsYAML, rls.Options{Metrics: m})
	for i := 0; i < rls.MaxReferenceKeys+50; i++ {
		h.call(t, "default/eg", desc("ip", strings.Repeat("v", 1+i%7)+string(rune('a'+i%26))+strconv.Itoa(i)))
	}
	n, err := promtest.GatherAndCount(reg, "ratelimit_service_rate_limit_total_hits")
	if err != nil {
		t.Fatal(err)
	}
	if n > rls.MaxReferenceKeys+1 {
		t.Fatalf("%d total_hits series, want at most %d", n, rls.MaxReferenceKeys+1)
	}
	if got := refCount(t, reg, "ratelimit_service_rate_limit_total_hits", []string{"default/eg", "__overflow__", ""}); got < 50 {
		t.Fatalf("overflow series counted %v hits, want at least 50", got)
	}
}

// refCount reads a reference counter by its domain, key1 and key2 (0 when
// the series was never made).
func refCount(t *testing.T, reg *prometheus.Registry, name string, keys []string) float64 {
	t.Helper()
	return testutil.Gather(t, reg).Count(name, "domain="+keys[0], "key1="+keys[1], "key2="+keys[2])
}
