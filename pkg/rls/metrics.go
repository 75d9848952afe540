package rls

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/envoyrls/envoy-rls/internal/cardinality"
	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// MaxRuleSeries bounds the distinct rule labels that request values can
// create (rules with detailed_metric or value_to_metric): past it, their
// hits are counted under the rule "__overflow__".
const MaxRuleSeries = 10_000

// Metrics records what the service decides, for Prometheus. A nil *Metrics
// records nothing.
type Metrics struct {
	requests      *prometheus.CounterVec
	latency       prometheus.Histogram
	decisions     *prometheus.CounterVec
	backendErrors *prometheus.CounterVec
	configLoads   *prometheus.CounterVec
	unknown       prometheus.Counter
	unmatched     *prometheus.CounterVec
	ref           *referenceMetrics // nil unless EnableReference

	ruleHits, ruleWithin, ruleOver, ruleNear, ruleShadow *prometheus.CounterVec
	ruleCap                                              *cardinality.Cap
	decisionCap                                          *cardinality.Cap // descriptor labels holding request values
	backendLatency                                       prometheus.Histogram
	inFlight                                             prometheus.Gauge
	configOK, configTime                                 prometheus.Gauge
	configWarnings                                       prometheus.Gauge
	observerDropped                                      prometheus.Counter
	invalidUTF8                                          prometheus.Counter
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
		backendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "envoy_rls_backend_errors_total",
			Help: "Backend failures, by kind (timeout, canceled, error) and the failure mode that answered (mode: local, allow, deny): every store call that failed or timed out, also those the local fallback of failure mode local then decided. The series of the configured mode exist from the start, at 0.",
		}, []string{"kind", "mode"}),
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
	rule := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"domain", "rule"})
	}
	m.ruleHits = rule("envoy_rls_rule_hits_total", "Hits asked of each limit, by domain and rule (the limit's name, else its descriptor path; #i numbers the limits of an unnamed composite).")
	m.ruleWithin = rule("envoy_rls_rule_within_limit_total", "Hits a limit allowed.")
	m.ruleOver = rule("envoy_rls_rule_over_limit_total", "Hits an enforced limit denied.")
	m.ruleNear = rule("envoy_rls_rule_near_limit_total", "Allowed hits that took a limit past the near-limit ratio of its capacity.")
	m.ruleShadow = rule("envoy_rls_rule_shadow_over_limit_total", "Hits a shadow limit (or any limit under global shadow mode) would have denied.")
	m.ruleCap = cardinality.New(MaxRuleSeries, cardinality.Overflow)
	m.decisionCap = cardinality.New(MaxRuleSeries, cardinality.Overflow)
	m.backendLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "envoy_rls_backend_duration_seconds",
		Help:    "Time of one store call (one batch for the whole request).",
		Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
	})
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "envoy_rls_requests_in_flight",
		Help: "ShouldRateLimit calls being decided now.",
	})
	m.configOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "envoy_rls_config_last_load_success",
		Help: "1 when the last config load or reload succeeded, 0 while the config on disk is broken (the previous one keeps serving).",
	})
	m.configTime = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "envoy_rls_config_last_success_timestamp_seconds",
		Help: "Unix time of the last successful config load.",
	})
	m.configWarnings = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "envoy_rls_config_warnings",
		Help: "Things the config in use was accepted with as the reference server accepts them (--config-lenient, on under its environment): fields given twice or where they mean nothing, a missing count, skipped documents; each is logged with its file:line at load. 0 when the config is as the native format wants it.",
	})
	m.observerDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "envoy_rls_observer_events_dropped_total",
		Help: "Decision events dropped because an observer's queue was full.",
	})
	m.invalidUTF8 = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "envoy_rls_requests_invalid_utf8_total",
		Help: "gRPC requests whose domain or descriptor keys or values hold bytes that are not valid UTF-8 (a header Envoy copied as it came). They are decided on their bytes like any other; labels, logs, traces and dynamic metadata show such bytes as \\xNN.",
	})
	overflow := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "envoy_rls_metric_label_overflow_total",
		Help:        "Observations counted under the __overflow__ label value because the metric's series cap was reached.",
		ConstLabels: prometheus.Labels{"metric": "envoy_rls_rule"},
	}, func() float64 { return float64(m.ruleCap.Overflowed()) })
	decisionOverflow := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "envoy_rls_metric_label_overflow_total",
		Help:        "Observations counted under the __overflow__ label value because the metric's series cap was reached.",
		ConstLabels: prometheus.Labels{"metric": "envoy_rls_limit_decisions"},
	}, func() float64 { return float64(m.decisionCap.Overflowed()) })
	reg.MustRegister(decisionOverflow)
	reg.MustRegister(m.requests, m.latency, m.decisions, m.backendErrors, m.configLoads,
		m.ruleHits, m.ruleWithin, m.ruleOver, m.ruleNear, m.ruleShadow, m.backendLatency,
		m.inFlight, m.configOK, m.configTime, m.configWarnings, m.observerDropped, overflow, m.unknown, m.unmatched,
		m.invalidUTF8)
	return m
}

// RegisterBuildInfo registers envoy_rls_build_info{version, goversion} = 1.
func RegisterBuildInfo(reg prometheus.Registerer, version string) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "envoy_rls_build_info",
		Help:        "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	g.Set(1)
	reg.MustRegister(g)
}

// ruleCounters are one rule's series.
type ruleCounters struct{ hits, within, over, near, shadow prometheus.Counter }

// counters returns the series of rule label in domain, creating them (at 0)
// when new. detailed labels hold request values: they are made valid
// UTF-8 and shortened to cardinality.MaxValueBytes (cardinality.Label) and
// go through the series cap first.
func (m *Metrics) counters(domain, label string, detailed bool) *ruleCounters {
	if detailed {
		label = m.ruleCap.Value(domain + "\x00" + cardinality.Label(label, cardinality.MaxValueBytes))
		if label != cardinality.Overflow {
			label = label[len(domain)+len("\x00"):]
		}
	}
	return &ruleCounters{
		hits:   m.ruleHits.WithLabelValues(domain, label),
		within: m.ruleWithin.WithLabelValues(domain, label),
		over:   m.ruleOver.WithLabelValues(domain, label),
		near:   m.ruleNear.WithLabelValues(domain, label),
		shadow: m.ruleShadow.WithLabelValues(domain, label),
	}
}

// limit records one limit's decision in its rule's series, in hits. Under
// global shadow mode an enforced denial counts as a shadow one.
func (c *ruleCounters) limit(it *backend.Item, d *algorithms.Decision, nearRatio float64, globalShadow bool) {
	hits := float64(it.Hits)
	c.hits.Add(hits)
	switch {
	case d.Allowed:
		c.within.Add(hits)
		capacity := d.Limit
		threshold := uint64(float64(capacity) * nearRatio)
		if used := capacity - min(d.Remaining, capacity); used > threshold && it.Hits > 0 {
			c.near.Add(float64(min(it.Hits, used-threshold)))
		}
	case it.Mode == backend.Shadow || globalShadow:
		c.shadow.Add(hits)
	default:
		c.over.Add(hits)
	}
}

// DefaultNearLimitRatio is the share of a limit's capacity past which
// allowed hits also count as near_limit.
const DefaultNearLimitRatio = 0.8

// configSeries caches the metric series of one config's rules, domains
// and descriptors, so that a request finds them without hashing label
// values. SetConfig starts a new one, so it holds at most the config's.
type configSeries struct {
	rules     sync.Map // *descriptors.RateLimit -> *ruleCounters (rules without request values)
	requests  sync.Map // *descriptors.Domain -> *series (envoy_rls_requests_total)
	decisions sync.Map // *descriptors.Node -> *series (envoy_rls_limit_decisions_total)
}

// requestSeries returns the envoy_rls_requests_total series of dom, nil
// for a domain the config does not define.
func (s *Service) requestSeries(dom *descriptors.Domain) *series {
	if dom == nil || s.opts.Metrics == nil {
		return nil
	}
	return cachedSeries(&s.series.Load().requests, dom)
}

// decisionSeries returns the envoy_rls_limit_decisions_total series of the
// descriptor of p, nil when it has no configured node.
func (s *Service) decisionSeries(p *plan) *series {
	if p.node == nil || p.override != nil || s.opts.Metrics == nil {
		return nil
	}
	return cachedSeries(&s.series.Load().decisions, p.node)
}

func cachedSeries(m *sync.Map, key any) *series {
	if v, ok := m.Load(key); ok {
		return v.(*series)
	}
	v, _ := m.LoadOrStore(key, new(series))
	return v.(*series)
}

// ruleCounters returns the metric series of limit l of plan p, whose rule
// name is rule.
func (s *Service) ruleCounters(m *Metrics, domain string, p *plan, l *descriptors.RateLimit, rule string) *ruleCounters {
	label, detailed := s.metricRule(domain, p, l, rule)
	if detailed || p.override != nil {
		return m.counters(domain, label, detailed)
	}
	cache := s.series.Load()
	if c, ok := cache.rules.Load(l); ok {
		return c.(*ruleCounters)
	}
	c := m.counters(domain, label, false)
	cache.rules.Store(l, c)
	return c
}

// metricRule is the rule label of a limit: the rule name, with the request
// values in place of the path where detailed_metric or value_to_metric ask
// for them (bounded by the metrics' series cap).
func (s *Service) metricRule(domain string, p *plan, l *descriptors.RateLimit, rule string) (string, bool) {
	if p.node == nil || p.override != nil || l.Name != "" {
		return rule, false
	}
	static := p.node.StatsKey(nil)
	if p.statKey == "" || p.statKey == static {
		return rule, false
	}
	name := strings.TrimPrefix(p.statKey, domain+".")
	if suffix := strings.IndexByte(rule, '#'); suffix >= 0 {
		name += rule[suffix:]
	}
	return name, true
}

// backendErrorKind classifies a store error for the metrics.
func backendErrorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

func (m *Metrics) backendCall(start time.Time) {
	if m == nil {
		return
	}
	m.backendLatency.Observe(time.Since(start).Seconds())
}

func (m *Metrics) inflight(delta float64) {
	if m == nil {
		return
	}
	m.inFlight.Add(delta)
}

func (m *Metrics) observerDrop() {
	if m == nil {
		return
	}
	m.observerDropped.Inc()
}

// series are the counters of one label set that differ only by their last
// label (a request's code, a decision's result), each made at its first use
// and kept: one atomic load per request instead of a vector's hash of the
// label values and read lock. Made at first use, so that /metrics shows the
// same series as without it. The service keeps them per configured domain
// and descriptor (see configSeries), so they hold no request values.
type series [8]atomic.Pointer[seriesCounter]

type seriesCounter struct{ prometheus.Counter }

// counter returns the counter of slot i, made by vec with values the first
// time (a vector returns the same child to concurrent callers).
func (c *series) counter(i int, vec *prometheus.CounterVec, values ...string) prometheus.Counter {
	if sc := c[i].Load(); sc != nil {
		return sc.Counter
	}
	sc := &seriesCounter{vec.WithLabelValues(values...)}
	c[i].Store(sc)
	return sc.Counter
}

// requestCode is the slot of a request's code among the series of its
// domain, or -1.
func requestCode(code string) int {
	switch code {
	case "ok":
		return 0
	case "over_limit":
		return 1
	case "shadow_over_limit":
		return 2
	case "unavailable":
		return 3
	case "failed_open":
		return 4
	}
	return -1
}

// request records a request of domain with its outcome code, which took
// took; cached, when not nil, holds the domain's series.
func (m *Metrics) request(domain, code string, took time.Duration, cached *series) {
	if m == nil {
		return
	}
	secs := took.Seconds()
	if i := requestCode(code); cached != nil && i >= 0 {
		cached.counter(i, m.requests, domain, code).Inc()
	} else {
		m.requests.WithLabelValues(domain, code).Inc()
	}
	m.latency.Observe(secs)
	if r := m.ref; r != nil {
		r.requestsShould.Inc()
		r.timeShould.Observe(secs)
		switch code {
		case "invalid", "no_config":
			r.errors.WithLabelValues("service_error").Inc()
		case "unavailable", "failed_open":
			r.errors.WithLabelValues("redis_error").Inc()
		}
	}
}

// decision records one limit's decision; cached, when not nil, holds the
// series of the plan's descriptor (its stats key without request values).
func (m *Metrics) decision(domain string, p *plan, mode backend.Mode, d *algorithms.Decision, hits uint64, cached *series) {
	if m == nil {
		return
	}
	allowed := d.Allowed
	if m.ref != nil {
		m.ref.limit(p.statKey, d, hits, mode == backend.Shadow)
	}
	result, slot := "within_limit", 0
	if !allowed {
		switch mode {
		case backend.Shadow:
			result, slot = "shadow_over_limit", 1
		case backend.Quota:
			result, slot = "quota_over_limit", 2
		default:
			result, slot = "over_limit", 3
		}
	}
	key := p.statKey
	if p.node != nil && key != p.node.StatsKey(nil) {
		// The stats key holds request values (detailed_metric,
		// value_to_metric): made valid and bounded as the rule labels are.
		key = m.decisionCap.Value(cardinality.Label(key, cardinality.MaxValueBytes))
		cached = nil
	}
	if cached != nil {
		cached.counter(slot, m.decisions, domain, key, result).Inc()
		return
	}
	m.decisions.WithLabelValues(domain, key, result).Inc()
}

// backendError counts a backend failure answered by failure mode mode.
func (m *Metrics) backendError(err error, mode FailureMode) {
	if m == nil {
		return
	}
	m.backendErrors.WithLabelValues(backendErrorKind(err), mode.String()).Inc()
}

// backendErrorKinds are the kind label's values (backendErrorKind).
var backendErrorKinds = [...]string{"timeout", "canceled", "error"}

// failureMode makes the envoy_rls_backend_errors_total series of mode, at
// 0, so that an alert on their rate has something to evaluate before the
// first failure.
func (m *Metrics) failureMode(mode FailureMode) {
	if m == nil {
		return
	}
	for _, kind := range backendErrorKinds {
		m.backendErrors.WithLabelValues(kind, mode.String())
	}
}

// ConfigLoad records a config load or reload.
func (m *Metrics) ConfigLoad(err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.configLoads.WithLabelValues("error").Inc()
		if m.ref != nil {
			m.ref.loadError.Inc()
		}
		m.configOK.Set(0)
		return
	}
	m.configLoads.WithLabelValues("success").Inc()
	m.configOK.Set(1)
	m.configTime.Set(float64(time.Now().UnixNano()) / 1e9)
	if m.ref != nil {
		m.ref.loadSuccess.Inc()
	}
}

// ConfigWarnings records the number of warnings of the config in use
// (descriptors.Config.Warnings).
func (m *Metrics) ConfigWarnings(n int) {
	if m == nil {
		return
	}
	m.configWarnings.Set(float64(n))
}

// InvalidUTF8 counts a request holding bytes that are not valid UTF-8
// (the gRPC codec calls it; see internal/grpccodec).
func (m *Metrics) InvalidUTF8() {
	if m == nil {
		return
	}
	m.invalidUTF8.Inc()
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

// StoreMetric is a metric read from another part's counter at each scrape:
// a store's (named here beside the service's own metrics although this
// package links no store) or a listener's. The program that built the part
// (cmd/envoy-rls) registers it with a function that reads the counter.
// Every metric cmd/envoy-rls exports is defined in this file.
type StoreMetric struct {
	Name, Help string
	// Gauge makes it a gauge; it is a counter otherwise.
	Gauge bool
	// Labels are constant labels of the series (see With).
	Labels prometheus.Labels
}

// Collector returns the metric reading value at each scrape.
func (m StoreMetric) Collector(value func() float64) prometheus.Collector {
	if m.Gauge {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: m.Name, Help: m.Help, ConstLabels: m.Labels}, value)
	}
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.Name, Help: m.Help, ConstLabels: m.Labels}, value)
}

// With returns the series of m whose label name has value.
func (m StoreMetric) With(name, value string) StoreMetric {
	labels := prometheus.Labels{name: value}
	for k, v := range m.Labels {
		labels[k] = v
	}
	m.Labels = labels
	return m
}

// The memory store's metrics (memory.Stats).
var (
	MemoryKeys = StoreMetric{Name: "envoy_rls_memory_keys", Help: "Counter keys held by the memory store.", Gauge: true}
	// MemoryEvictions has a kind label: fresh (the state was fresh: costs
	// nothing), remembered (kept in the remembered table), penalty (kept in
	// the penalty set) or lost (the key starts again from a full limit).
	MemoryEvictions   = StoreMetric{Name: "envoy_rls_memory_evictions_total", Help: "Keys evicted because the memory store was full (--max-keys or --max-memory), by what became of their state: fresh (nothing to keep), remembered (--remembered-keys), penalty (--penalty-keys) or lost (the key starts again from a full limit)."}
	MemoryEvictedLive = StoreMetric{Name: "envoy_rls_memory_evictions_live_total", Help: "Evicted keys whose state was not yet fresh (kind remembered, penalty and lost of envoy_rls_memory_evictions_total). Raise --max-keys or --max-memory if this grows."}
	MemorySwept       = StoreMetric{Name: "envoy_rls_memory_swept_total", Help: "Keys dropped because their state was back to fresh (costs nothing)."}
	MemoryBytes       = StoreMetric{Name: "envoy_rls_memory_bytes", Help: "Estimated bytes of the keys held by the memory store (bounded by --max-memory; each key counts at least --max-memory / --max-keys).", Gauge: true}
	// The remembered table (--remembered-keys).
	MemoryRememberedKeys     = StoreMetric{Name: "envoy_rls_memory_remembered_keys", Help: "Evicted keys whose state the remembered table holds (--remembered-keys).", Gauge: true}
	MemoryRememberedRestored = StoreMetric{Name: "envoy_rls_memory_remembered_restored_total", Help: "Evicted keys used again and given back their state from the remembered table."}
	// MemoryRememberedDropped has a kind label: part_used or exhausted.
	MemoryRememberedDropped = StoreMetric{Name: "envoy_rls_memory_remembered_dropped_total", Help: "Remembered records dropped because the table was full, by the state of their key: part_used (the key gets back what it had used) or exhausted (moved to the penalty set, when enabled). Raise --remembered-keys if this grows."}
	// The penalty set (--penalty-keys).
	MemoryPenaltyKeys     = StoreMetric{Name: "envoy_rls_memory_penalty_keys", Help: "Evicted exhausted keys whose state the penalty set holds (--penalty-keys).", Gauge: true}
	MemoryPenaltyRestored = StoreMetric{Name: "envoy_rls_memory_penalty_restored_total", Help: "Evicted exhausted keys used again and given back their state from the penalty set."}
	MemoryPenaltyDropped  = StoreMetric{Name: "envoy_rls_memory_penalty_dropped_total", Help: "Penalty records dropped because the penalty set was full: those keys start again from a full limit. Raise --penalty-keys if this grows."}
)

// The Redis store's metrics (redis.Stats).
var (
	RedisRequests     = StoreMetric{Name: "envoy_rls_redis_requests_total", Help: "Store calls that needed Redis state."}
	RedisRoundTrips   = StoreMetric{Name: "envoy_rls_redis_round_trips_total", Help: "Pipelines sent to Redis (one round trip each)."}
	RedisScriptCalls  = StoreMetric{Name: "envoy_rls_redis_script_calls_total", Help: "Script calls (FCALL, or EVALSHA/EVAL without functions): one per pipeline of requests, or per slot of it on a Cluster."}
	RedisLocalDenials = StoreMetric{Name: "envoy_rls_redis_local_denials_total", Help: "Requests denied by the local deny cache without a Redis call."}
	// RedisErrors is deprecated: envoy_rls_backend_errors_total counts
	// the same failures with their kind and failure mode.
	RedisErrors        = StoreMetric{Name: "envoy_rls_redis_errors_total", Help: "Deprecated: use envoy_rls_backend_errors_total. Store calls Redis failed or did not answer in time, whatever then answered them (the local fallback, or the failure mode)."}
	RedisScriptReloads = StoreMetric{Name: "envoy_rls_redis_script_reloads_total", Help: "Pipelines re-sent because Redis lacked the function library or script (the first one, and after a restart or flush)."}
	RedisNotSent       = StoreMetric{Name: "envoy_rls_redis_not_sent_total", Help: "Calls not sent because their deadline had passed or was nearer than a round trip (nothing charged)."}
	RedisOOMErrors     = StoreMetric{Name: "envoy_rls_redis_oom_errors_total", Help: "Script calls refused by Redis at maxmemory (OOM), also counted as errors."}
	RedisLateCharged   = StoreMetric{Name: "envoy_rls_redis_late_charged_total", Help: "Requests answered without Redis's decision (failure mode, or denied by the local fallback) that Redis ran and charged after the caller left."}
	RedisLateUnsure    = StoreMetric{Name: "envoy_rls_redis_late_unsure_total", Help: "Requests answered without Redis's decision and not written back whose pipeline failed in a way that may have let Redis run and charge them (a timeout, a lost connection)."}
	// RedisDecisions has a path label: redis, chunk, approximate,
	// deny_cache, local_fallback or failed.
	RedisDecisions       = StoreMetric{Name: "envoy_rls_redis_decisions_total", Help: "Requests by who decided them: redis, chunk (lease chunks held in memory alone), approximate (local counters of consistency approximate), deny_cache (the local deny cache), local_fallback (the embedded store, failure mode local), failed (Redis failed and no store decided: answered by failure mode allow or deny, or UNAVAILABLE when the local fallback could not decide; see envoy_rls_requests_total's failed_open and unavailable)."}
	RedisNodeTrips       = StoreMetric{Name: "envoy_rls_redis_node_down_total", Help: "Times a Redis server (a Cluster master) was found not answering: no reply byte for --redis-stall-timeout while calls waited, or a failed connection, and then a failed PING. Its calls then answer by the failure mode at once (path=failed or local_fallback)."}
	RedisNodeReturns     = StoreMetric{Name: "envoy_rls_redis_node_up_total", Help: "Times a Redis server found not answering answered a PING again: its calls go to Redis again."}
	RedisNodesDown       = StoreMetric{Name: "envoy_rls_redis_nodes_down", Help: "Redis servers (Cluster masters) found not answering now: calls for their keys answer by the failure mode without being sent.", Gauge: true}
	RedisStallProbes     = StoreMetric{Name: "envoy_rls_redis_stall_probes_total", Help: "PINGs that checked a Redis server that sent no reply for --redis-stall-timeout, failed a connection, or was down."}
	RedisNodeDownCalls   = StoreMetric{Name: "envoy_rls_redis_node_down_calls_total", Help: "Calls answered by the failure mode without being sent because the Redis server of one of their keys was down."}
	RedisEvictingServers = StoreMetric{Name: "envoy_rls_redis_evicting_servers", Help: "Redis servers whose maxmemory-policy can evict live counters (maxmemory set, policy not noeviction), as they said on the last connection.", Gauge: true}
)

// Refunds of denied requests split across Redis Cluster slots
// (redis.Stats.Refunds, RefundsFailed), by result.
var RedisClusterRefunds = StoreMetric{Name: "envoy_rls_redis_cluster_refunds_total", Help: "Denied requests split across Redis Cluster slots whose slots' admission charges were refunded (result done: one more round trip each), or could not be (result failed: the charges stay)."}

// Consistency lease on the Redis store (redis.LeaseStats).
var (
	RedisLeaseChunks   = StoreMetric{Name: "envoy_rls_redis_lease_chunks_total", Help: "Lease chunks reserved in Redis (granted or refused); envoy_rls_redis_lease_granted_hits_total divided by it is the mean chunk size."}
	RedisLeaseGranted  = StoreMetric{Name: "envoy_rls_redis_lease_granted_hits_total", Help: "Hits granted in lease chunks (charged in Redis when granted)."}
	RedisLeaseReturned = StoreMetric{Name: "envoy_rls_redis_lease_returned_hits_total", Help: "Unused hits of lease chunks given back to Redis (key idle, count change, window end of a sliding counter, shutdown)."}
	RedisLeaseStranded = StoreMetric{Name: "envoy_rls_redis_lease_stranded_hits_total", Help: "Unused hits of lease chunks not given back before their window ended (its end freed them), or whose return failed."}
	RedisLeaseErrors   = StoreMetric{Name: "envoy_rls_redis_lease_errors_total", Help: "Lease chunk reservations (op reserve) and returns (op return) that failed: a key without a chunk is decided strict."}
)

// Consistency approximate on the Redis store (redis.ApproximateStats).
var (
	RedisApproximateSyncs        = StoreMetric{Name: "envoy_rls_redis_approximate_syncs_total", Help: "Sync calls of consistency approximate (one per sync, or per slot of it on a Cluster), each sending the hits admitted locally on many keys."}
	RedisApproximateSyncErrors   = StoreMetric{Name: "envoy_rls_redis_approximate_sync_errors_total", Help: "Sync calls of consistency approximate that failed: their hits are sent again, counted once."}
	RedisApproximateSyncedHits   = StoreMetric{Name: "envoy_rls_redis_approximate_synced_hits_total", Help: "Hits admitted on local counters (consistency approximate) and counted in Redis by a sync."}
	RedisApproximateLostHits     = StoreMetric{Name: "envoy_rls_redis_approximate_lost_hits_total", Help: "Hits admitted on local counters never counted in Redis: too many syncs unanswered while Redis was away, or Redis away at shutdown."}
	RedisApproximateOverAdmitted = StoreMetric{Name: "envoy_rls_redis_approximate_over_admitted_hits_total", Help: "Hits over a limit that a sync of consistency approximate found in Redis after counting the hits admitted locally (each counted once, whichever instance saw them)."}
	RedisApproximateStrict       = StoreMetric{Name: "envoy_rls_redis_approximate_strict_total", Help: "Items of consistency approximate decided strict, in Redis: a key's first decisions on an instance (per window) until its sync answers or its lease chunk arrives."}
	RedisApproximateChunked      = StoreMetric{Name: "envoy_rls_redis_approximate_chunked_total", Help: "Items of consistency approximate decided from lease chunks, while plenty remained on their limit (the chunks count in envoy_rls_redis_lease_*)."}
)

// The Redis store's write-backs: hits allowed without Redis (local
// fallback, or failed open), charged to it later.
var (
	RedisWriteBackHits      = StoreMetric{Name: "envoy_rls_redis_write_back_hits_total", Help: "Hits allowed without Redis (local fallback, or failed open) later charged to Redis."}
	RedisWriteBackOverLimit = StoreMetric{Name: "envoy_rls_redis_write_back_over_limit_total", Help: "Written-back hits in write-backs that did not fit whole in their limit: charged anyway, past the limit or as bucket debt (a full sliding window log keeps no more than its limit)."}
	RedisWriteBackRetried   = StoreMetric{Name: "envoy_rls_redis_write_back_retried_total", Help: "Written-back hits sent again after a failure that may have let the first send run (a timeout, a lost connection): they may be counted twice."}
	RedisWriteBackUnsure    = StoreMetric{Name: "envoy_rls_redis_write_back_unsure_total", Help: "Hits written back of calls whose pipeline failed in a way that may have let Redis run it (a timeout, a lost connection): they may be counted twice."}
	// RedisWriteBackDropped has a reason label: buffer_full or shutdown.
	RedisWriteBackDropped = StoreMetric{Name: "envoy_rls_redis_write_back_dropped_total", Help: "Hits allowed without Redis that were not written back: the write-back buffer was full (reason buffer_full), or Redis did not take them within --shutdown-grace after shutdown (reason shutdown)."}
	RedisWriteBackPending = StoreMetric{Name: "envoy_rls_redis_write_back_pending", Help: "Keys whose hits wait to be written back to Redis, or are being written.", Gauge: true}
)

// The split store's metrics (split.Stats), with a per-second Redis.
var (
	PerSecondMixed       = StoreMetric{Name: "envoy_rls_redis_persecond_mixed_requests_total", Help: "Requests with limits on both Redis deployments (per-second and main), decided in up to three calls."}
	PerSecondOverCharged = StoreMetric{Name: "envoy_rls_redis_persecond_overcharged_total", Help: "Mixed requests whose per-second limits were charged before the main Redis denied them (a concurrent request took the main limit's last room); the extra hits lapse with the per-second window."}
)

// The listeners' connections (cmd/envoy-rls).
var (
	GRPCConnections          = StoreMetric{Name: "envoy_rls_grpc_connections", Help: "Connections open now on the grpc listener (at most --grpc-max-connections, plus evicted ones still closing).", Gauge: true}
	GRPCConnectionsRefused   = StoreMetric{Name: "envoy_rls_grpc_connections_refused_total", Help: "Connections of the grpc listener closed as soon as they were accepted because --grpc-max-connections were open and none could be evicted."}
	GRPCConnectionsEvicted   = StoreMetric{Name: "envoy_rls_grpc_connections_evicted_total", Help: "Connections of the grpc listener closed gracefully (GOAWAY) to admit a new one at --grpc-max-connections: the oldest without a call, or the least recently active idle one."}
	GRPCFirstRequestTimeouts = StoreMetric{Name: "envoy_rls_grpc_first_request_timeouts_total", Help: "Connections of the grpc listener closed gracefully (GOAWAY) because they started no call within --first-request-timeout."}
	HTTPConnections          = StoreMetric{Name: "envoy_rls_http_connections", Help: "Connections open now on the http listener (at most --http-max-connections plus --http-reserved-connections).", Gauge: true}
	HTTPConnectionsRefused   = StoreMetric{Name: "envoy_rls_http_connections_refused_total", Help: "Connections of the http listener closed as soon as they were accepted because --http-max-connections and --http-reserved-connections were open and none could be evicted."}
	HTTPConnectionsEvicted   = StoreMetric{Name: "envoy_rls_http_connections_evicted_total", Help: "Connections of the http listener closed to admit a new one at the limit: the oldest that had not completed its request headers, or the least recently active idle keep-alive one."}
	HTTPConnectionsReserved  = StoreMetric{Name: "envoy_rls_http_connections_reserved_total", Help: "Connections of the http listener admitted beyond --http-max-connections on --http-reserved-connections: they are served /healthz, /healthcheck and /metrics only."}
)
