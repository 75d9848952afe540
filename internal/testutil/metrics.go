package testutil

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one reading of a registry or of a /metrics page: every metric
// family by name.
type Metrics map[string]*dto.MetricFamily

// Gather reads g's metrics, failing the test when it cannot.
func Gather(tb testing.TB, g prometheus.Gatherer) Metrics {
	tb.Helper()
	fams, err := g.Gather()
	if err != nil {
		tb.Fatalf("testutil: gather: %v", err)
	}
	m := Metrics{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return m
}

// parseMetrics reads a page in Prometheus's text format, failing the test
// when it is not one.
func parseMetrics(tb testing.TB, text string) Metrics {
	tb.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		tb.Fatalf("testutil: parsing metrics: %v", err)
	}
	return Metrics(fams)
}

// Scrape fetches url (a /metrics page) and parses it. It sets no timeout:
// a large page under -race on a loaded machine takes a minute, and the
// test binary's -timeout bounds a hung server.
func Scrape(tb testing.TB, url string) Metrics {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("testutil: scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("testutil: scrape %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("testutil: scrape %s: %s", url, resp.Status)
	}
	return parseMetrics(tb, string(b))
}

// Value returns the sample of family name whose labels are exactly labels
// ("name=value" pairs, in any order): a counter's or gauge's value, a
// histogram's count of observations. It returns -1 when there is no such
// series, which no count equals.
func (m Metrics) Value(name string, labels ...string) float64 {
	f := m[name]
	if f == nil {
		return -1
	}
	for _, s := range f.GetMetric() {
		if len(s.GetLabel()) != len(labels) {
			continue
		}
		got := map[string]string{}
		for _, l := range s.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		ok := true
		for _, kv := range labels {
			k, v, _ := strings.Cut(kv, "=")
			if g, has := got[k]; !has || g != v {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		switch {
		case s.Counter != nil:
			return s.GetCounter().GetValue()
		case s.Gauge != nil:
			return s.GetGauge().GetValue()
		case s.Histogram != nil:
			return float64(s.GetHistogram().GetSampleCount())
		case s.Untyped != nil:
			return s.GetUntyped().GetValue()
		}
	}
	return -1
}

// Count is Value with a missing series read as 0, as a counter that was
// never incremented.
func (m Metrics) Count(name string, labels ...string) float64 {
	return max(m.Value(name, labels...), 0)
}

// ByLabelValues returns the samples of family name by their label values
// joined with "," (in the family's label order).
func (m Metrics) ByLabelValues(name string) map[string]float64 {
	out := map[string]float64{}
	f := m[name]
	if f == nil {
		return out
	}
	for _, s := range f.GetMetric() {
		var vals []string
		for _, l := range s.GetLabel() {
			vals = append(vals, l.GetValue())
		}
		v := s.GetCounter().GetValue()
		if s.Gauge != nil {
			v = s.GetGauge().GetValue()
		}
		out[strings.Join(vals, ",")] = v
	}
	return out
}
