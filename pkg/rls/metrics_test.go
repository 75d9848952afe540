package rls_test

import (
	"context"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

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
