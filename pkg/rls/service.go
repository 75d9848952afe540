// Package rls is the gRPC face of envoy-rls: it implements Envoy's
// envoy.service.ratelimit.v3.RateLimitService. A request is validated, each
// descriptor is matched against the loaded descriptor config, the limits of
// the whole request go to the Store as one batch (one decision, all or
// nothing), and the decisions become Envoy's response: an overall code and,
// per descriptor, the most restrictive limit with what remains of it and how
// long until it resets.
package rls

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// FailureMode is what the service answers when the store fails or cannot
// answer within the call's budget.
type FailureMode uint8

const (
	// FailOpen answers OK for every descriptor (fail open).
	FailOpen FailureMode = iota
	// FailClosed answers gRPC UNAVAILABLE, so Envoy's own
	// failure_mode_deny decides.
	FailClosed
	// FailLocal is for a store that decides on its own when its shared
	// backend cannot (the Redis store with a fallback store): such a store
	// answers without an error, so an error means it could not decide at
	// all, and the call is answered UNAVAILABLE as with FailClosed.
	FailLocal
)

// ParseFailureMode parses "allow", "deny" or "local".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "allow":
		return FailOpen, nil
	case "deny":
		return FailClosed, nil
	case "local":
		return FailLocal, nil
	}
	return 0, fmt.Errorf("failure mode %q: want local, allow or deny", s)
}

func (m FailureMode) String() string {
	switch m {
	case FailClosed:
		return "deny"
	case FailLocal:
		return "local"
	}
	return "allow"
}

// MarshalText returns the mode's name, "local", "allow" or "deny".
func (m FailureMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText parses "local", "allow" or "deny", so that a FailureMode can be a
// flag (flag.TextVar) or a config field.
func (m *FailureMode) UnmarshalText(b []byte) error {
	v, err := ParseFailureMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Options configures a Service. The zero value is usable.
type Options struct {
	// FailureMode applies when the store returns an error.
	FailureMode FailureMode
	// BackendTimeout caps each store call. A call's budget is the caller's
	// deadline minus a margin for answering (see AnswerMargin), capped by
	// BackendTimeout from the start of ShouldRateLimit; BackendTimeout alone
	// applies when the caller sends no deadline. Zero means no cap beyond
	// the caller's.
	BackendTimeout time.Duration
	// Logger receives warnings (backend failures: the first at once, then
	// a summary per LogInterval while they continue, and a line when the
	// backend recovers), debug lines about requests for unknown domains and
	// descriptors that match no rule (at most one line a second each), and
	// is slog.Default() when nil.
	Logger *slog.Logger
	// Metrics, when set, records requests and decisions.
	Metrics *Metrics
	// LogInterval is the interval of the backend failure summaries: while
	// failures continue, one line per interval counts them and names their
	// causes. Zero means DefaultLogInterval.
	LogInterval time.Duration
	// ShadowMode answers OK overall whatever the limits decide (like the
	// reference server's SHADOW_MODE): descriptor statuses still say
	// OVER_LIMIT, metrics count the decisions, and nothing of a request
	// that the limits deny is charged. For trying a config in production.
	ShadowMode bool
	// ResponseDynamicMetadata returns dynamic_metadata as the reference
	// server does with RESPONSE_DYNAMIC_METADATA=true: the domain, every
	// descriptor (its entries as "key=value", its limit override and
	// hits_addend when set), the request's hits_addend when set, and the
	// config metadata of the descriptors that passed, merged (the first
	// descriptor wins on conflicts, nested mappings merge). Off: no dynamic
	// metadata.
	ResponseDynamicMetadata bool
	// Clock, when set, tells the time to the end of a fixed window when no
	// decision says it (a check of an empty window, a limit of 0, a request
	// that can never pass), read when such a window is answered. By default
	// that time is the call's own instant, on the wall clock as of New
	// advanced by the monotonic clock (as the memory store's clock is);
	// with Redis the windows follow Redis's TIME, which may differ from it
	// by the clocks' skew.
	Clock backend.Clock
	// ResponseHeaders selects the quota fields added to every response
	// with a limit (see HeaderMode). Retry-After is added to every
	// OVER_LIMIT answer whatever it says.
	ResponseHeaders HeaderMode
	// QuotaMode treats every descriptor as quota_mode (the reference's
	// QUOTA_MODE): a request is over the limit only when a descriptor that
	// is not quota_mode is, or every quota_mode descriptor is.
	QuotaMode bool
	// UsageAccounting is the default of which charges are usage
	// accounting (counted even when they do not fit) for descriptors and
	// files that set none, including every config that arrives over xDS,
	// whose format cannot say it. The zero value is descriptors.UsageAuto:
	// hits given on the descriptor itself (its hits_addend) are accounted,
	// ordinary admission charges nothing when denied. quota_mode
	// descriptors account every charge whatever it says.
	UsageAccounting descriptors.UsageAccounting
	// Consistency is the default consistency of limits whose file sets
	// none, including every config that arrives over xDS, whose format
	// cannot say it: it then applies to every limit, usage budgets included
	// (their checks and usage charges are decided in the shared store
	// whatever the mode: see pkg/backend/consistency). The zero value is
	// strict. The store decides what it means: on the memory store every
	// mode is strict.
	Consistency descriptors.Consistency
	// LegacyHeaderNames names the fields of HeadersLegacy (the reference's
	// LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); empty
	// names are the defaults, RateLimit-Limit, -Remaining and -Reset.
	LegacyHeaderNames rlheaders.LegacyNames
	// OverLimitBody, when set, is rendered as raw_body of OVER_LIMIT
	// answers (with a Content-Type: application/json header).
	OverLimitBody *BodyTemplate
	// NearLimitRatio is the share of a limit's capacity past which allowed
	// hits also count as near_limit; 0 means DefaultNearLimitRatio.
	NearLimitRatio float64
	// Tracer, when set, makes a span per ShouldRateLimit call and one per
	// backend call, parented on the caller's trace context as read by
	// Propagator (W3C traceparent when nil). Nil costs nothing.
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator
	// Observers receive every decision off the decision path, each through
	// its own queue of ObserverQueue events (when 0, the package's
	// ObserverQueue); a full queue drops the event and counts it. Close
	// stops them.
	Observers     []Observer
	ObserverQueue int
}

// Service implements rlsv3.RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	store  backend.TakesDeadline // takes the call's budget beside its context
	config atomic.Pointer[descriptors.Config]
	opts   Options
	log    *slog.Logger

	legacyNames rlheaders.LegacyNames // opts.LegacyHeaderNames, defaults filled in
	fails       *failureLog
	unknown     *sampleLog // requests for unknown domains
	unmatched   *sampleLog // descriptors that match no rule
	pool        sync.Pool

	rules     atomic.Pointer[ruleNames]
	series    atomic.Pointer[configSeries]
	nearRatio float64
	prop      propagation.TextMapPropagator
	obs       *observers
	started   time.Time // when New ran: the frame of windowTime
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// DefaultLogInterval is the interval of the backend failure summaries
// when Options.LogInterval is zero.
const DefaultLogInterval = 10 * time.Second

// New returns a Service deciding with store under config cfg (which may be
// nil: every descriptor is then allowed until SetConfig).
func New(store backend.Store, cfg *descriptors.Config, opts Options) *Service {
	s := &Service{store: backend.ByDeadline(store), opts: opts, log: opts.Logger, started: time.Now()}
	s.legacyNames = opts.LegacyHeaderNames.OrDefault()
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.LogInterval <= 0 {
		s.opts.LogInterval = DefaultLogInterval
	}
	var ping func(context.Context) error
	if p, ok := store.(interface{ Ping(context.Context) error }); ok {
		ping = p.Ping
	}
	s.fails = newFailureLog(s.log, s.opts.LogInterval, s.opts.FailureMode, s.opts.BackendTimeout, ping)
	s.unknown = newSampleLog(s.log, "unknown domain: allowed without limits", time.Second)
	s.unmatched = newSampleLog(s.log, "descriptor matches no rule: allowed without limit", time.Second)
	s.config.Store(cfg)
	s.rules.Store(new(ruleNames))
	s.series.Store(new(configSeries))
	s.pool.New = func() any { return new(scratch) }
	s.nearRatio = s.opts.NearLimitRatio
	if s.nearRatio <= 0 || s.nearRatio > 1 {
		s.nearRatio = DefaultNearLimitRatio
	}
	s.prop = s.opts.Propagator
	if s.prop == nil {
		s.prop = propagation.TraceContext{}
	}
	s.obs = newObservers(s.opts.Observers, s.opts.ObserverQueue, s.opts.Metrics.observerDrop)
	s.opts.Metrics.failureMode(s.opts.FailureMode)
	return s
}

// Close stops the observers after they have taken every queued event, and
// the backend failure log's probe. Call it after the last ShouldRateLimit
// call; later decisions are not observed.
func (s *Service) Close() {
	s.fails.stop()
	if s.obs != nil {
		s.obs.close()
	}
}

// ObserverDropped returns how many events observers have missed because
// their queue was full.
func (s *Service) ObserverDropped() uint64 {
	if s.obs == nil {
		return 0
	}
	return s.obs.dropped.Load()
}

// SetConfig atomically replaces the descriptor config. Requests in flight
// finish with the config they started with.
func (s *Service) SetConfig(cfg *descriptors.Config) {
	s.config.Store(cfg)
	s.rules.Store(new(ruleNames))
	s.series.Store(new(configSeries))
}

// Config returns the config in use.
func (s *Service) Config() *descriptors.Config { return s.config.Load() }

// ShouldRateLimit decides one request. It reads the clock once, at the
// start: everything it computes takes that instant (the store's budget, the
// time to a window's end, the observers' event); only the metrics and the
// observers measure how long the call and its store call took.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (resp *rlsv3.RateLimitResponse, err error) {
	now := time.Now()
	if s.opts.Metrics != nil {
		s.opts.Metrics.inflight(1)
		defer s.opts.Metrics.inflight(-1)
	}
	if s.opts.Tracer != nil {
		var span trace.Span
		ctx, span = s.startSpan(ctx, req)
		defer func() { endSpan(span, resp, err) }()
	}
	if err := validate(req); err != nil {
		// Not the request's domain: it may be anything, of any length.
		s.done("", "invalid", now, nil, nil)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)

	cfg := s.config.Load()
	if cfg == nil {
		// Started without a config (config over xDS with
		// --force-start-without-initial-config): answer as the reference
		// server does until the first one arrives.
		s.done("", "no_config", now, nil, nil)
		return nil, status.Error(codes.Unknown, "no rate limit configuration loaded")
	}
	dom := cfg.Domain(req.Domain)
	// Metrics are labelled with configured domains only, so that clients
	// cannot create series at will; unknown domains share the label "".
	label := ""
	if dom != nil {
		label = req.Domain
	} else {
		// A typo in Envoy's domain turns limiting off: make it visible.
		s.opts.Metrics.unknownDomain()
		s.unknown.event(ctx, func() []any { return []any{"domain", clip(req.Domain, 2*logFieldBytes)} })
	}
	s.plan(sc, dom, req)
	unmatched := 0 // for the observers; counted and logged in configured domains
	for i := range sc.plans {
		if p := &sc.plans[i]; p.node == nil && p.override == nil {
			unmatched++
			if dom != nil {
				s.opts.Metrics.unmatchedDescriptor(label)
				s.unmatched.event(ctx, func() []any {
					return []any{"domain", label, "descriptor", describeDescriptor(req.Descriptors[i])}
				})
			}
		}
	}
	s.batch(sc, dom, req)

	allowed := true
	if len(sc.items) > 0 {
		var err error
		allowed, err = s.apply(ctx, sc, now)
		if err != nil {
			s.opts.Metrics.backendError(err, s.opts.FailureMode)
			s.fails.failure(ctx, err, sc.budgetEnd)
			code := "failed_open"
			if s.opts.FailureMode != FailOpen {
				code = "unavailable"
			}
			e := s.newEvent(req, dom != nil, code, err, now, unmatched, len(sc.items))
			if e != nil {
				for k := range sc.items {
					o := &sc.owners[k]
					e.Limits[k] = limitEvent(&sc.items[k], o, s.ruleName(req.Domain, &sc.plans[o.desc], o.limit), nil)
				}
			}
			s.done(label, code, now, s.requestSeries(dom), e)
			if s.opts.FailureMode != FailOpen {
				return nil, status.Error(codes.Unavailable, "rate limit backend unavailable: "+err.Error())
			}
			return failOpenResponse(sc), nil
		}
		s.fails.success()
	}
	code := "ok"
	if !allowed {
		code = "over_limit"
		if s.opts.ShadowMode {
			code = "shadow_over_limit"
		}
	}
	e := s.newEvent(req, dom != nil, code, nil, now, unmatched, len(sc.items))
	resp = s.answer(ctx, sc, req, allowed, now, e)
	s.done(label, code, now, s.requestSeries(dom), e)
	return resp, nil
}

// done records the end of a call that started at now: its outcome code in
// the metrics (domain's series cached in cached, when not nil), and the
// observers' event e when not nil.
func (s *Service) done(label, code string, now time.Time, cached *series, e *DecisionEvent) {
	if s.opts.Metrics == nil && e == nil {
		return
	}
	took := time.Since(now)
	s.opts.Metrics.request(label, code, took, cached)
	if e != nil {
		e.Duration = took
		s.obs.publish(e)
	}
}

// apply decides sc.items on the store, within the call's budget.
func (s *Service) apply(ctx context.Context, sc *scratch, now time.Time) (allowed bool, err error) {
	if s.opts.Tracer != nil {
		var span trace.Span
		ctx, span = s.opts.Tracer.Start(ctx, "backend.Apply", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.Int("ratelimit.backend.keys", len(sc.items))))
		defer func() {
			if err != nil {
				span.RecordError(err)
				span.SetStatus(otelcodes.Error, err.Error())
			}
			span.End()
		}()
	}
	if s.opts.Metrics != nil {
		defer s.opts.Metrics.backendCall(time.Now())
	}
	until := s.budget(ctx, now)
	sc.prepareDecisions()
	allowed, err = s.store.ApplyBy(ctx, until, sc.items, sc.decisions)
	if err != nil {
		sc.budgetEnd = budgetEnded(ctx, until, err)
	}
	return allowed, err
}

// prepareDecisions makes sc.decisions one zero Decision per item.
func (sc *scratch) prepareDecisions() {
	if cap(sc.decisions) < len(sc.items) {
		sc.decisions = make([]algorithms.Decision, len(sc.items))
	}
	sc.decisions = sc.decisions[:len(sc.items)]
	clear(sc.decisions)
}
