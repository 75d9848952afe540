package rls

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/pkg/backend"
)

// Metrics records what the service decides, for Prometheus. A nil *Metrics
// records nothing.
type Metrics struct {
	requests      *prometheus.CounterVec
	latency       prometheus.Histogram
	decisions     *prometheus.CounterVec
	backendErrors prometheus.Counter
	configLoads   *prometheus.CounterVec
	unknown       prometheus.Counter
	unmatched     *prometheus.CounterVec
}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_rls_requests_total",
			Help: "ShouldRateLimit calls by domain and outcome (ok, over_limit, shadow_over_limit, invalid, unavailable, failed_open). The domain is empty for invalid requests and domains the config does not define.",
		}, []string{"domain", "code"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "envoy_rls_request_duration_seconds",
			Help:    "Time to decide one ShouldRateLimit call, including the backend.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_rls_limit_decisions_total",
			Help: "Decisions per limit by domain, descriptor stats key and result (within_limit, over_limit, shadow_over_limit, quota_over_limit).",
		}, []string{"domain", "descriptor", "result"}),
		backendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "envoy_rls_backend_errors_total",
			Help: "Store calls that failed or timed out; the failure mode decided the answer.",
		}),
		configLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_rls_config_loads_total",
			Help: "Descriptor config loads by result (success, error). On error the previous config keeps serving.",
		}, []string{"result"}),
		unknown: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "envoy_rls_unknown_domain_requests_total",
			Help: "Requests for a domain the config does not define; they are allowed without limits (the names are logged at debug level, one line a second at most).",
		}),
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_rls_unmatched_descriptors_total",
			Help: "Request descriptors of a configured domain that match no rule; they are allowed without limit (logged at debug level, one line a second at most).",
		}, []string{"domain"}),
	}
	reg.MustRegister(m.requests, m.latency, m.decisions, m.backendErrors, m.configLoads, m.unknown, m.unmatched)
	return m
}

func (m *Metrics) request(domain, code string, start time.Time) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(domain, code).Inc()
	m.latency.Observe(time.Since(start).Seconds())
}

func (m *Metrics) decision(domain string, p *plan, mode backend.Mode, allowed bool) {
	if m == nil {
		return
	}
	result := "within_limit"
	if !allowed {
		switch mode {
		case backend.Shadow:
			result = "shadow_over_limit"
		case backend.Quota:
			result = "quota_over_limit"
		default:
			result = "over_limit"
		}
	}
	m.decisions.WithLabelValues(domain, p.statKey, result).Inc()
}

func (m *Metrics) backendError() {
	if m == nil {
		return
	}
	m.backendErrors.Inc()
}

// ConfigLoad records a config load or reload.
func (m *Metrics) ConfigLoad(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.configLoads.WithLabelValues("error").Inc()
		return
	}
	m.configLoads.WithLabelValues("success").Inc()
}

func (m *Metrics) unknownDomain() {
	if m == nil {
		return
	}
	m.unknown.Inc()
}

func (m *Metrics) unmatchedDescriptor(domain string) {
	if m == nil {
		return
	}
	m.unmatched.WithLabelValues(domain).Inc()
}
