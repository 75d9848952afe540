package rls

import (
	"math"
	"regexp"
	"strings"
	"sync"

	"github.com/envoyrls/envoy-rls/internal/cardinality"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/prometheus/client_golang/prometheus"
)

// referenceMetrics are the reference server's series under the names
// Envoy Gateway's statsd_exporter mapping gives them (its dashboards and
// tests query these), exported when the reference's USE_PROMETHEUS is on.
type referenceMetrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec
	errors                                                   *prometheus.CounterVec
	totalRequests                                            *prometheus.CounterVec
	responseTime                                             *prometheus.HistogramVec
	loadSuccess, loadError                                   prometheus.Counter
	requestsShould                                           prometheus.Counter
	timeShould                                               prometheus.Observer

	nearRatio float64
	keys      *cardinality.Cap // bounds the distinct stats keys (request values can enter them)
	labels    sync.Map         // stats key -> *refSeries
	overflow  sync.Map         // domain label -> its overflow *refSeries
}

// MaxReferenceKeys bounds the distinct stats keys of the reference series;
// further keys share one series whose key1 is cardinality.Overflow.
const MaxReferenceKeys = 10000

// EnableReference registers the reference server's series with reg and
// feeds them from now on. nearRatio is NEAR_LIMIT_RATIO (0.8 by default):
// hits past that share of a limit also count as near_limit.
func (m *Metrics) EnableReference(reg prometheus.Registerer, nearRatio float64) {
	if m == nil {
		return
	}
	keyLabels := []string{"domain", "key1", "key2"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, keyLabels)
	}
	r := &referenceMetrics{
		totalHits:   counter("ratelimit_service_rate_limit_total_hits", "Hits per limit (the reference's ratelimit.service.rate_limit.DOMAIN.KEY...total_hits); key1 and key2 are the first two parts of its stats key."),
		overLimit:   counter("ratelimit_service_rate_limit_over_limit", "Hits over the limit, per limit."),
		nearLimit:   counter("ratelimit_service_rate_limit_near_limit", "Hits past the near-limit ratio of a limit, per limit."),
		withinLimit: counter("ratelimit_service_rate_limit_within_limit", "Hits within the limit, per limit."),
		shadowMode:  counter("ratelimit_service_rate_limit_shadow_mode", "Hits over a shadow-mode limit (allowed), per limit."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_should_rate_limit_error",
			Help: "Failed ShouldRateLimit calls: err_type redis_error (the backend failed) or service_error (an invalid request, or no config yet)."}, []string{"err_type"}),
		totalRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_total_requests",
			Help: "gRPC calls by method."}, []string{"grpc_method"}),
		responseTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ratelimit_service_response_time_seconds",
			Help: "gRPC call duration by method.", Buckets: prometheus.DefBuckets}, []string{"grpc_method"}),
		loadSuccess: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success", Help: "Config loads that were applied."}),
		loadError:   prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error", Help: "Config loads that were refused (the previous config kept serving)."}),
		nearRatio:   nearRatio,
		keys:        cardinality.New(MaxReferenceKeys, cardinality.Overflow),
	}
	r.requestsShould = r.totalRequests.WithLabelValues("ShouldRateLimit")
	r.timeShould = r.responseTime.WithLabelValues("ShouldRateLimit")
	reg.MustRegister(r.totalHits, r.overLimit, r.nearLimit, r.withinLimit, r.shadowMode, r.errors,
		r.totalRequests, r.responseTime, r.loadSuccess, r.loadError)
	m.ref = r
}

var ipv4Dots = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// referenceLabels splits a stats key as the reference's statsd names are
// mapped by Envoy Gateway: ':' and '|' become '_', so do the dots of IPv4
// addresses, then the first three dot-separated parts are domain, key1 and
// key2.
func referenceLabels(statsKey string) [3]string {
	s := strings.NewReplacer(":", "_", "|", "_").Replace(statsKey)
	s = ipv4Dots.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
	parts := strings.SplitN(s, ".", 4)
	var l [3]string
	copy(l[:], parts)
	return l
}

// refSeries are the five per-limit counters of one stats key.
type refSeries struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode prometheus.Counter
}

func (r *referenceMetrics) newSeries(l [3]string) *refSeries {
	lv := []string{l[0], l[1], l[2]}
	return &refSeries{
		totalHits: r.totalHits.WithLabelValues(lv...), overLimit: r.overLimit.WithLabelValues(lv...),
		nearLimit: r.nearLimit.WithLabelValues(lv...), withinLimit: r.withinLimit.WithLabelValues(lv...),
		shadowMode: r.shadowMode.WithLabelValues(lv...),
	}
}

// seriesOf returns the counters of a stats key, made once per key. Keys past
// MaxReferenceKeys share their domain's overflow series. Request values
// enter stats keys, so the key is held shortened to
// cardinality.MaxValueBytes, and each label exported made valid UTF-8 and
// shortened (cardinality.Label).
func (r *referenceMetrics) seriesOf(statsKey string) *refSeries {
	key := cardinality.Shorten(statsKey, cardinality.MaxValueBytes)
	if v, ok := r.labels.Load(key); ok {
		return v.(*refSeries)
	}
	l := referenceLabels(statsKey)
	for i := range l {
		l[i] = cardinality.Label(l[i], cardinality.MaxValueBytes)
	}
	if r.keys.Value(key) == cardinality.Overflow {
		// Made once per domain: past the cap every new key of a flood
		// lands here, and must not cost five label lookups each time.
		if v, ok := r.overflow.Load(l[0]); ok {
			return v.(*refSeries)
		}
		v, _ := r.overflow.LoadOrStore(strings.Clone(l[0]), r.newSeries([3]string{l[0], cardinality.Overflow, ""}))
		return v.(*refSeries)
	}
	v, _ := r.labels.LoadOrStore(strings.Clone(key), r.newSeries(l))
	return v.(*refSeries)
}

// limit records one limit's decision the way the reference counts it: the
// hits before and after this request against the limit and its near-limit
// threshold (floor(limit * ratio)).
func (r *referenceMetrics) limit(statsKey string, d *algorithms.Decision, hits uint64, shadow bool) {
	c := r.seriesOf(statsKey)
	limit := d.Limit
	near := uint64(math.Floor(float64(limit) * r.nearRatio))
	c.totalHits.Add(float64(hits))
	used := limit - min(d.Remaining, limit) // before the hits when denied, after them when allowed
	if d.Allowed {
		before := used - min(hits, used)
		if used > near {
			c.nearLimit.Add(float64(used - max(near, before)))
		}
		c.withinLimit.Add(float64(hits))
		return
	}
	before, after := used, used+hits
	over := hits
	if before < limit {
		over = after - limit
		c.nearLimit.Add(float64(limit - max(near, before)))
	}
	c.overLimit.Add(float64(over))
	if shadow {
		c.shadowMode.Add(float64(over))
	}
}
