package rlqs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/internal/cardinality"
)

// MaxBucketSeries bounds the distinct bucket labels of the per-bucket
// gauges, as the rule metrics are bounded: past it, buckets are summed
// under "__overflow__".
const MaxBucketSeries = 10_000

// maxBucketSeries is MaxBucketSeries, lowered by tests.
var maxBucketSeries = MaxBucketSeries

// metrics are the service's Prometheus metrics; a nil *metrics (no
// Registerer) records nothing.
type metrics struct {
	s                                     *Service
	reports, unmatchedB, sharesE, ledgerE prometheus.Counter
	refusedV, closedV, invalidV           *prometheus.CounterVec
	abandonsV, changesV                   *prometheus.CounterVec
	opened                                prometheus.Counter
	bucketCap                             *cardinality.Cap
	rateDesc, demandDesc                  *prometheus.Desc
}

func newMetrics(s *Service, reg prometheus.Registerer) *metrics {
	if reg == nil {
		return nil
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	vec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	}
	m := &metrics{
		s:          s,
		reports:    counter("envoy_rls_rlqs_reports_total", "RLQS usage reports received."),
		unmatchedB: counter("envoy_rls_rlqs_unmatched_buckets_total", "RLQS buckets that matched no descriptor (answered with --rlqs-unmatched)."),
		sharesE:    counter("envoy_rls_rlqs_shares_errors_total", "Reads or writes of the RLQS shares (Redis with several instances) that failed; no assignment was made for the buckets of that report."),
		ledgerE:    counter("envoy_rls_rlqs_ledger_errors_total", "Charges of RLQS usage or assigned rates to the counters RLS decides on that failed."),
		opened:     counter("envoy_rls_rlqs_streams_opened_total", "RLQS streams opened."),
		refusedV:   vec("envoy_rls_rlqs_streams_refused_total", "RLQS streams refused, by reason (max_streams, shutting_down).", "reason"),
		closedV:    vec("envoy_rls_rlqs_streams_closed_total", "RLQS streams the service closed, by reason (idle: no report for the idle timeout; shutdown).", "reason"),
		invalidV:   vec("envoy_rls_rlqs_invalid_buckets_total", "RLQS bucket ids refused, by reason (empty: ignored; too_large: answered with the unmatched default).", "reason"),
		abandonsV:  vec("envoy_rls_rlqs_abandons_total", "RLQS buckets abandoned, by reason (idle, max_buckets_per_stream, max_buckets).", "reason"),
		changesV:   vec("envoy_rls_rlqs_assignment_changes_total", "RLQS assignments whose rate changed, by direction (raise, lower).", "direction"),
		bucketCap:  cardinality.New(maxBucketSeries, cardinality.Overflow),
		rateDesc: prometheus.NewDesc("envoy_rls_rlqs_bucket_assigned_rate",
			"Requests per second this instance assigned to the Envoys of a bucket (with the rates of ended streams until their TTL), by domain and bucket (the descriptor's stats key, with request values where detailed_metric or value_to_metric says).",
			[]string{"domain", "bucket"}, nil),
		demandDesc: prometheus.NewDesc("envoy_rls_rlqs_bucket_demand",
			"Requests per second the Envoys of a bucket on this instance reported (allowed and denied), by domain and bucket.",
			[]string{"domain", "bucket"}, nil),
	}
	reg.MustRegister(m.reports, m.unmatchedB, m.sharesE, m.ledgerE, m.opened, m.refusedV, m.closedV, m.invalidV, m.abandonsV, m.changesV,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "envoy_rls_rlqs_streams", Help: "RLQS streams open."},
			func() float64 { return float64(s.Streams()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "envoy_rls_rlqs_buckets", Help: "RLQS buckets subscribed on all open streams."},
			func() float64 { return float64(s.Buckets()) }),
		bucketCollector{m},
	)
	return m
}

// bucketCollector reports the per-bucket gauges from the service's
// aggregates at each scrape.
type bucketCollector struct{ m *metrics }

func (c bucketCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.rateDesc
	ch <- c.m.demandDesc
}

func (c bucketCollector) Collect(ch chan<- prometheus.Metric) {
	type labels struct{ domain, bucket string }
	rates, demand := map[labels]float64{}, map[labels]float64{}
	s := c.m.s
	now := s.now()
	s.aggMu.Lock()
	for _, a := range s.aggs {
		l := labels{cardinality.Label(a.pol.domain, cardinality.MaxValueBytes), a.label}
		rates[l] += a.total(now)
		for _, d := range a.demand {
			demand[l] += d
		}
	}
	s.aggMu.Unlock()
	for l, v := range rates {
		ch <- prometheus.MustNewConstMetric(c.m.rateDesc, prometheus.GaugeValue, v, l.domain, l.bucket)
		ch <- prometheus.MustNewConstMetric(c.m.demandDesc, prometheus.GaugeValue, demand[l], l.domain, l.bucket)
	}
}

// bucketLabel returns the bucket label of a policy's metrics: its stats
// key, while the cap admits it, else the overflow value. The first buckets
// assigned keep their series.
func (m *metrics) bucketLabel(p policy) string {
	if m == nil {
		return ""
	}
	// Bucket ids may hold any bytes (a header's); Label makes a valid,
	// distinct label of them.
	l := cardinality.Label(p.statsKey, cardinality.MaxValueBytes)
	if !m.bucketCap.Admit(p.domain + "\x00" + l) {
		return cardinality.Overflow
	}
	return l
}

func (m *metrics) report() {
	if m != nil {
		m.reports.Inc()
	}
}

func (m *metrics) unmatched() {
	if m != nil {
		m.unmatchedB.Inc()
	}
}

func (m *metrics) sharesError() {
	if m != nil {
		m.sharesE.Inc()
	}
}

func (m *metrics) ledgerError() {
	if m != nil {
		m.ledgerE.Inc()
	}
}

func (m *metrics) streamOpened() {
	if m != nil {
		m.opened.Inc()
	}
}

func (m *metrics) streamClosed() {}

func (m *metrics) refused(reason string) {
	if m != nil {
		m.refusedV.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) closed(reason string) {
	if m != nil {
		m.closedV.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) invalid(reason string) {
	if m != nil {
		m.invalidV.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) abandoned(reason string) {
	if m != nil {
		m.abandonsV.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) change(direction string) {
	if m != nil {
		m.changesV.WithLabelValues(direction).Inc()
	}
}
