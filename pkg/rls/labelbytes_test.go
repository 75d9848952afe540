package rls_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/internal/cardinality"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// Request values of 4,000 bytes on a detailed_metric rule become labels of
// at most cardinality.MaxValueBytes, in the service's and the reference's
// series alike; the same value keeps one series, distinct values sharing
// a long prefix keep theirs.
func TestLongRequestValuesAreShortenedInLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := rls.NewMetrics(reg)
	m.EnableReference(reg, 0.8)
	h := start(t, egMetricsYAML, rls.Options{Metrics: m})
	const distinct = 20
	prefix := strings.Repeat("p", 4000)
	for i := range distinct {
		v := prefix + strconv.Itoa(i)
		h.call(t, "default/eg", desc("ip", v))
		h.call(t, "default/eg", desc("ip", v)) // the same value again: the same series
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		n := 0
		for _, mt := range mf.GetMetric() {
			long := false
			for _, l := range mt.GetLabel() {
				if len(l.GetValue()) > cardinality.MaxValueBytes {
					t.Errorf("%s: label %s is %d bytes, want at most %d", mf.GetName(), l.GetName(), len(l.GetValue()), cardinality.MaxValueBytes)
				}
				if strings.Contains(l.GetValue(), "ip_pppp") {
					long = true
				}
			}
			if long {
				n++
				if c := mt.GetCounter(); c != nil && mf.GetName() == "envoy_rls_rule_hits_total" && c.GetValue() != 2 {
					t.Errorf("%s: a shortened series counted %v hits, want 2", mf.GetName(), c.GetValue())
				}
			}
		}
		if n > 0 {
			seen[mf.GetName()] = true
		}
		switch mf.GetName() {
		case "envoy_rls_rule_hits_total", "ratelimit_service_rate_limit_total_hits":
			if n != distinct {
				t.Errorf("%s: %d series of the long values, want %d", mf.GetName(), n, distinct)
			}
		}
	}
	for _, name := range []string{"envoy_rls_rule_hits_total", "envoy_rls_limit_decisions_total", "ratelimit_service_rate_limit_total_hits"} {
		if !seen[name] {
			t.Errorf("%s has no series of the long values", name)
		}
	}
}
