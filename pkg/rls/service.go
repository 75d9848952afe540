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
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// FailureMode is what the service answers when the store fails or is slower
// than the backend timeout.
type FailureMode uint8

const (
	// FailOpen answers OK for every descriptor (fail open).
	FailOpen FailureMode = iota
	// FailClosed answers gRPC UNAVAILABLE, so Envoy's own
	// failure_mode_deny decides.
	FailClosed
)

// ParseFailureMode parses "allow" or "deny".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "allow":
		return FailOpen, nil
	case "deny":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("failure mode %q: want allow or deny", s)
}

func (m FailureMode) String() string {
	if m == FailClosed {
		return "deny"
	}
	return "allow"
}

// Request size limits. A request beyond them is InvalidArgument: Envoy never
// sends anything close, and a bound keeps one request from holding the
// store's locks for long.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxFieldBytes  = 4096
)

// Options configures a Service. The zero value is usable.
type Options struct {
	// FailureMode applies when the store returns an error.
	FailureMode FailureMode
	// BackendTimeout caps each store call. A call's budget is the caller's
	// deadline minus a margin for answering (see AnswerMargin), capped by
	// BackendTimeout; BackendTimeout alone applies when the caller sends no
	// deadline. Zero means no cap beyond the caller's.
	BackendTimeout time.Duration
	// Logger receives warnings (backend failures, at most one line per
	// LogInterval) and is slog.Default() when nil.
	Logger *slog.Logger
	// Metrics, when set, records requests and decisions.
	Metrics *Metrics
	// LogInterval is the least time between two log lines about backend
	// failures; the lines count what they summarise. Default 10s.
	LogInterval time.Duration
	// ShadowMode answers OK overall whatever the limits decide (like the
	// reference server's SHADOW_MODE): descriptor statuses still say
	// OVER_LIMIT, metrics count the decisions, and nothing of a request
	// that the limits deny is charged. For trying a config in production.
	ShadowMode bool
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (whole seconds, rounded up) to the response for the
	// most restrictive descriptor, like the reference server's
	// LIMIT_RESPONSE_HEADERS_ENABLED.
	ResponseHeaders bool
}

// Service implements rlsv3.RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer

	store  backend.Store
	config atomic.Pointer[descriptors.Config]
	opts   Options
	log    *slog.Logger
	errLog throttle
	pool   sync.Pool
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New returns a Service deciding with store under config cfg (which may be
// nil: every descriptor is then allowed until SetConfig).
func New(store backend.Store, cfg *descriptors.Config, opts Options) *Service {
	s := &Service{store: store, opts: opts, log: opts.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.opts.LogInterval <= 0 {
		s.opts.LogInterval = 10 * time.Second
	}
	s.errLog.interval = s.opts.LogInterval
	s.config.Store(cfg)
	s.pool.New = func() any { return new(scratch) }
	return s
}

// SetConfig atomically replaces the descriptor config. Requests in flight
// finish with the config they started with.
func (s *Service) SetConfig(cfg *descriptors.Config) { s.config.Store(cfg) }

// Config returns the config in use.
func (s *Service) Config() *descriptors.Config { return s.config.Load() }

// scratch is the per-request working memory, pooled.
type scratch struct {
	entries   []descriptors.Entry
	path      []*descriptors.Node
	paths     []*descriptors.Node // the matched paths of all plans
	plans     []plan
	items     []backend.Item
	owners    []owner
	decisions []algorithms.Decision
	kb        keyBuilder
}

// plan is what one request descriptor turned into.
type plan struct {
	node      *descriptors.Node
	limits    []*descriptors.RateLimit
	override  *descriptors.RateLimit
	pathOff   int // this plan's matched path is paths[pathOff:pathOff+pathLen]
	pathLen   int
	statKey   string // the descriptor's stats key, for metrics
	unlimited bool   // an unlimited limit applies (and nothing else counts)
}

// owner ties an item back to its descriptor and limit.
type owner struct {
	desc  int
	limit *descriptors.RateLimit
}

// ShouldRateLimit decides one request.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	if err := validate(req); err != nil {
		// Not the request's domain: it may be anything, of any length.
		s.opts.Metrics.request("", "invalid", start)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	sc := s.pool.Get().(*scratch)
	defer s.pool.Put(sc)

	cfg := s.config.Load()
	var dom *descriptors.Domain
	if cfg != nil {
		dom = cfg.Domain(req.Domain)
	}
	// Metrics are labelled with configured domains only, so that clients
	// cannot create series at will; unknown domains share the label "".
	label := ""
	if dom != nil {
		label = req.Domain
	}
	s.plan(sc, dom, req)
	s.batch(sc, req)

	allowed := true
	if len(sc.items) > 0 {
		var err error
		allowed, err = s.apply(ctx, sc)
		if err != nil {
			s.opts.Metrics.backendError()
			if n := s.errLog.allow(); n > 0 {
				s.log.Warn("rate limit backend failed", "error", err, "failure_mode", s.opts.FailureMode.String(), "failures_since_last_log", n)
			}
			if s.opts.FailureMode == FailClosed {
				s.opts.Metrics.request(label, "unavailable", start)
				return nil, status.Error(codes.Unavailable, "rate limit backend unavailable: "+err.Error())
			}
			s.opts.Metrics.request(label, "failed_open", start)
			return failOpenResponse(sc), nil
		}
	}
	resp := s.respond(sc, req.Domain, allowed)
	code := "ok"
	if !allowed {
		code = "over_limit"
		if s.opts.ShadowMode {
			code = "shadow_over_limit"
			resp.OverallCode = rlsv3.RateLimitResponse_OK
		}
	}
	s.opts.Metrics.request(label, code, start)
	return resp, nil
}

func (s *Service) apply(ctx context.Context, sc *scratch) (bool, error) {
	ctx, cancel := s.budget(ctx)
	defer cancel()
	if cap(sc.decisions) < len(sc.items) {
		sc.decisions = make([]algorithms.Decision, len(sc.items))
	}
	sc.decisions = sc.decisions[:len(sc.items)]
	clear(sc.decisions)
	return s.store.Apply(ctx, sc.items, sc.decisions)
}

// validate checks what the proto cannot: the request must name a domain and
// carry at least one descriptor, each with at least one entry with a key.
func validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.GetDomain() == "":
		return errors.New("domain must not be empty")
	case len(req.Domain) > MaxFieldBytes:
		return fmt.Errorf("domain is longer than %d bytes", MaxFieldBytes)
	case len(req.Descriptors) == 0:
		return errors.New("request has no descriptors")
	case len(req.Descriptors) > MaxDescriptors:
		return fmt.Errorf("request has %d descriptors, more than %d", len(req.Descriptors), MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return fmt.Errorf("descriptor %d has no entries", i)
		}
		if len(d.Entries) > MaxEntries {
			return fmt.Errorf("descriptor %d has %d entries, more than %d", i, len(d.Entries), MaxEntries)
		}
		for j, e := range d.Entries {
			switch {
			case e == nil || e.Key == "":
				return fmt.Errorf("descriptor %d entry %d has an empty key", i, j)
			case len(e.Key) > MaxFieldBytes || len(e.Value) > MaxFieldBytes:
				return fmt.Errorf("descriptor %d entry %d is longer than %d bytes", i, j, MaxFieldBytes)
			}
		}
		if o := d.Limit; o != nil {
			if _, err := overrideWindow(o); err != nil {
				return fmt.Errorf("descriptor %d limit override: %v", i, err)
			}
		}
	}
	return nil
}

var unitWindows = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// overrideWindow returns the window of a request-supplied limit override:
// its unit times its unit_multiplier (default 1). A window longer than a
// time.Duration holds (about 292 years) is an error rather than a
// wrapped-around product.
func overrideWindow(o *commonv3.RateLimitDescriptor_RateLimitOverride) (time.Duration, error) {
	w, ok := unitWindows[o.Unit]
	if !ok {
		return 0, fmt.Errorf("unit %v is not a known unit", o.Unit)
	}
	if m := o.GetUnitMultiplier(); m != nil {
		if m.Value == 0 {
			return 0, errors.New("unit_multiplier must be at least 1")
		}
		if time.Duration(m.Value) > math.MaxInt64/w {
			return 0, fmt.Errorf("window of %d x %v is too long", m.Value, o.Unit)
		}
		w *= time.Duration(m.Value)
	}
	return w, nil
}

// plan matches every descriptor and resolves replaces.
func (s *Service) plan(sc *scratch, dom *descriptors.Domain, req *rlsv3.RateLimitRequest) {
	sc.plans = sc.plans[:0]
	sc.paths = sc.paths[:0]
	var replaced map[string]bool
	for _, d := range req.Descriptors {
		p := plan{}
		if dom == nil {
			sc.plans = append(sc.plans, p)
			continue
		}
		if d.Limit != nil {
			p.override = overrideLimit(dom, d.Limit)
			p.limits = []*descriptors.RateLimit{p.override}
			if s.opts.Metrics != nil {
				p.statKey = req.Domain + ".override"
			}
			sc.plans = append(sc.plans, p)
			continue
		}
		sc.entries = sc.entries[:0]
		for _, e := range d.Entries {
			sc.entries = append(sc.entries, descriptors.Entry{Key: e.Key, Value: e.Value})
		}
		sc.path = dom.Match(sc.entries, sc.path[:0])
		if len(sc.path) == 0 {
			sc.plans = append(sc.plans, p)
			continue
		}
		p.node = sc.path[len(sc.path)-1]
		p.pathOff, p.pathLen = len(sc.paths), len(sc.path)
		sc.paths = append(sc.paths, sc.path...)
		if s.opts.Metrics != nil {
			p.statKey = p.node.StatsKey(sc.entries)
		}
		p.limits = p.node.Limits
		for _, l := range p.limits {
			if l.Unlimited {
				p.unlimited = true
			}
			for _, name := range l.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
		}
		sc.plans = append(sc.plans, p)
	}
	if replaced == nil {
		return
	}
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.node == nil {
			continue
		}
		var kept []*descriptors.RateLimit
		dropped := false
		for _, l := range p.limits {
			if l.Name != "" && replaced[l.Name] {
				dropped = true
				continue
			}
			kept = append(kept, l)
		}
		if dropped {
			p.limits = kept
			p.unlimited = false
			for _, l := range kept {
				p.unlimited = p.unlimited || l.Unlimited
			}
		}
	}
}

// overrideLimit builds the limit of a request-supplied override. Like the
// reference it is never in shadow mode; it uses the domain's default
// algorithm.
func overrideLimit(dom *descriptors.Domain, o *commonv3.RateLimitDescriptor_RateLimitOverride) *descriptors.RateLimit {
	w, _ := overrideWindow(o) // validated
	l := algorithms.Limit{Algorithm: dom.DefaultAlgorithm, Requests: uint64(o.RequestsPerUnit), Window: w}
	if l.Algorithm == algorithms.SlidingWindowLog && l.Requests > descriptors.MaxSlidingLogRequests {
		// The log keeps one entry per request: past the config's bound, an
		// override counts with the sliding window counter instead, so a
		// request cannot make one key's state grow without bound.
		l.Algorithm = algorithms.SlidingWindowCounter
	}
	return &descriptors.RateLimit{
		Unit:            unitName(o.Unit),
		RequestsPerUnit: o.RequestsPerUnit,
		Limit:           l,
		ID:              fmt.Sprintf("override/%s/%d/%d", l.Algorithm, l.Requests, w.Microseconds()),
	}
}

func unitName(u typev3.RateLimitUnit) string {
	return typev3.RateLimitUnit_name[int32(u)]
}

// batch turns the plans into store items with unambiguous keys.
func (s *Service) batch(sc *scratch, req *rlsv3.RateLimitRequest) {
	sc.items = sc.items[:0]
	sc.owners = sc.owners[:0]
	for i := range sc.plans {
		p := &sc.plans[i]
		if p.unlimited || len(p.limits) == 0 {
			continue
		}
		d := req.Descriptors[i]
		hits := uint64(1)
		if req.HitsAddend > 0 {
			hits = uint64(req.HitsAddend)
		}
		if h := d.GetHitsAddend(); h != nil {
			hits = h.Value
		}
		if d.IsNegativeHits {
			// Refunds are not supported: a negative-hits descriptor is
			// checked without charging.
			hits = 0
		}
		sc.kb.reset(req.Domain)
		path := sc.paths[p.pathOff : p.pathOff+p.pathLen]
		for j, e := range d.Entries {
			v := e.Value
			if j < len(path) && path[j].ShareThreshold {
				// All values matching this wildcard share one counter.
				v = path[j].Value
			}
			sc.kb.entry(e.Key, v)
		}
		sc.kb.seal()
		mode, group := backend.Enforced, 0
		if p.node != nil && p.node.QuotaMode {
			mode, group = backend.Quota, i
		}
		for _, l := range p.limits {
			m := mode
			if l.Shadow || (p.node != nil && p.node.ShadowMode) {
				m = backend.Shadow
			}
			sc.items = append(sc.items, backend.Item{Key: sc.kb.key(l.ID), Limit: l.Limit, Hits: hits, Mode: m, Group: group, Partition: sc.kb.partition})
			sc.owners = append(sc.owners, owner{desc: i, limit: l})
		}
	}
}

// respond builds the response from the decisions.
func (s *Service) respond(sc *scratch, domain string, allowed bool) *rlsv3.RateLimitResponse {
	a := newResponse(len(sc.plans))
	resp := a.resp
	if !allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	var meta *structpb.Struct
	it := 0
	for i := range sc.plans {
		p := &sc.plans[i]
		st := resp.Statuses[i]
		if p.unlimited {
			// As the reference: no current_limit, the most a uint32 holds.
			st.LimitRemaining = math.MaxUint32
			continue
		}
		best, bestDenied := -1, false
		for ; it < len(sc.items) && sc.owners[it].desc == i; it++ {
			d := &sc.decisions[it]
			enforcedDenial := !d.Allowed && sc.items[it].Mode != backend.Shadow
			s.opts.Metrics.decision(domain, p, sc.items[it].Mode, d.Allowed)
			if enforcedDenial {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if best < 0 || moreRestrictive(d, enforcedDenial, &sc.decisions[best], bestDenied) {
				best, bestDenied = it, enforcedDenial
			}
		}
		if best < 0 {
			continue // no limit applies: allowed
		}
		d := &sc.decisions[best]
		st.CurrentLimit = a.limits[i]
		fillLimit(st.CurrentLimit, sc.owners[best].limit)
		st.LimitRemaining = clamp32(d.Remaining)
		wait := d.ResetAfter
		if bestDenied {
			wait = d.RetryAfter
			if wait == algorithms.Never {
				// It can never pass as asked; tell the caller to back off
				// for a whole window.
				wait = sc.items[best].Limit.Window
			}
		}
		st.DurationUntilReset = a.durations[i]
		st.DurationUntilReset.Seconds = int64(wait / time.Second)
		st.DurationUntilReset.Nanos = int32(wait % time.Second)
		if st.Code == rlsv3.RateLimitResponse_OK && p.node != nil && p.node.Metadata != nil {
			meta = mergeMetadata(meta, p.node.Metadata)
		}
	}
	if s.opts.ResponseHeaders {
		resp.ResponseHeadersToAdd = rateLimitHeaders(resp.Statuses)
	}
	if meta != nil {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			"metadata": structpb.NewStructValue(meta),
		}}
	}
	return resp
}

// rateLimitHeaders describes the most restrictive status with a limit: an
// OVER_LIMIT one (the longest wait) if any, else the one with the least
// remaining. It returns nil when no status has a limit.
func rateLimitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var best *rlsv3.RateLimitResponse_DescriptorStatus
	for _, st := range sts {
		if st.CurrentLimit == nil {
			continue
		}
		switch {
		case best == nil:
			best = st
		case (st.Code == rlsv3.RateLimitResponse_OVER_LIMIT) != (best.Code == rlsv3.RateLimitResponse_OVER_LIMIT):
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				best = st
			}
		case st.Code == rlsv3.RateLimitResponse_OVER_LIMIT:
			if st.DurationUntilReset.AsDuration() > best.DurationUntilReset.AsDuration() {
				best = st
			}
		case st.LimitRemaining < best.LimitRemaining:
			best = st
		}
	}
	if best == nil {
		return nil
	}
	reset := (best.DurationUntilReset.AsDuration() + time.Second - 1) / time.Second
	return []*corev3.HeaderValue{
		{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(best.CurrentLimit.RequestsPerUnit), 10)},
		{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(best.LimitRemaining), 10)},
		{Key: "RateLimit-Reset", Value: strconv.FormatInt(int64(reset), 10)},
	}
}

// moreRestrictive reports whether decision a (denied when aDenied) binds
// harder than b: any denial beats an allowance, a longer wait beats a shorter
// one among denials, and less remaining beats more among allowances.
func moreRestrictive(a *algorithms.Decision, aDenied bool, b *algorithms.Decision, bDenied bool) bool {
	if aDenied != bDenied {
		return aDenied
	}
	if aDenied {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// mergeMetadata merges src into dst; keys already in dst win, as in the
// reference server.
func mergeMetadata(dst, src *structpb.Struct) *structpb.Struct {
	if dst == nil {
		dst = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for k, v := range src.Fields {
		if _, ok := dst.Fields[k]; !ok {
			dst.Fields[k] = v
		}
	}
	return dst
}

// failOpenResponse answers OK for every descriptor when the store failed and
// the failure mode is allow: the limits are named, nothing else is known.
func failOpenResponse(sc *scratch) *rlsv3.RateLimitResponse {
	a := newResponse(len(sc.plans))
	for i := range sc.plans {
		if sc.plans[i].unlimited {
			a.resp.Statuses[i].LimitRemaining = math.MaxUint32 // as when the store answers
		}
	}
	for _, o := range sc.owners {
		if st := a.resp.Statuses[o.desc]; st.CurrentLimit == nil {
			st.CurrentLimit = a.limits[o.desc]
			fillLimit(st.CurrentLimit, o.limit)
		}
	}
	return a.resp
}

// inlineStatuses is how many descriptor statuses a response holds in the
// one allocation of its arena. One is the common case; a larger arena
// costs more to zero and scan than the allocations it saves.
const inlineStatuses = 1

// response is a response with room for its statuses, their current limits
// and their durations, allocated together: one allocation instead of four
// per descriptor. Parts a response does not use stay unreferenced.
type response struct {
	resp      *rlsv3.RateLimitResponse
	limits    []*rlsv3.RateLimitResponse_RateLimit
	durations []*durationpb.Duration
}

type responseArena struct {
	resp      rlsv3.RateLimitResponse
	statusPtr [inlineStatuses]*rlsv3.RateLimitResponse_DescriptorStatus
	statuses  [inlineStatuses]rlsv3.RateLimitResponse_DescriptorStatus
	limitPtr  [inlineStatuses]*rlsv3.RateLimitResponse_RateLimit
	limits    [inlineStatuses]rlsv3.RateLimitResponse_RateLimit
	durPtr    [inlineStatuses]*durationpb.Duration
	durations [inlineStatuses]durationpb.Duration
}

// newResponse returns an OK response with n OK statuses, and n current
// limits and durations ready to be filled and attached.
func newResponse(n int) response {
	if n <= inlineStatuses {
		a := new(responseArena)
		for i := 0; i < n; i++ {
			a.statuses[i].Code = rlsv3.RateLimitResponse_OK
			a.statusPtr[i] = &a.statuses[i]
			a.limitPtr[i] = &a.limits[i]
			a.durPtr[i] = &a.durations[i]
		}
		a.resp.OverallCode = rlsv3.RateLimitResponse_OK
		a.resp.Statuses = a.statusPtr[:n:n]
		return response{resp: &a.resp, limits: a.limitPtr[:n], durations: a.durPtr[:n]}
	}
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	limits := make([]rlsv3.RateLimitResponse_RateLimit, n)
	durations := make([]durationpb.Duration, n)
	r := response{
		resp:      &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)},
		limits:    make([]*rlsv3.RateLimitResponse_RateLimit, n),
		durations: make([]*durationpb.Duration, n),
	}
	for i := 0; i < n; i++ {
		statuses[i].Code = rlsv3.RateLimitResponse_OK
		r.resp.Statuses[i] = &statuses[i]
		r.limits[i] = &limits[i]
		r.durations[i] = &durations[i]
	}
	return r
}

var protoUnits = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
	{30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// fillLimit describes a limit in Envoy's terms. A window equal to a unit
// is that unit; a window that is a whole multiple of a unit is the largest
// such unit with unit_multiplier set (90s is 90 x SECOND, 2h is 2 x HOUR); a
// window that is no whole number of seconds is reported as the equivalent
// rate per SECOND, rounded down (at least 1 for a non-zero limit). For
// token_bucket and gcra requests_per_unit is the refill rate.
func fillLimit(cl *rlsv3.RateLimitResponse_RateLimit, l *descriptors.RateLimit) {
	cl.Name, cl.RequestsPerUnit = l.Name, l.RequestsPerUnit
	w := l.Limit.Window
	for _, u := range protoUnits {
		if w%u.d == 0 {
			cl.Unit = u.unit
			if m := w / u.d; m != 1 {
				cl.UnitMultiplier = wrapperspb.UInt32(uint32(min(m, math.MaxUint32)))
			}
			return
		}
	}
	cl.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND
	perSecond := float64(l.Limit.Requests) * float64(time.Second) / float64(w)
	cl.RequestsPerUnit = uint32(min(perSecond, math.MaxUint32))
	if cl.RequestsPerUnit == 0 && l.Limit.Requests > 0 {
		cl.RequestsPerUnit = 1
	}
}

func clamp32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

// throttle lets one event through per interval and counts the rest.
type throttle struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	pending  int
}

// allow records an event and returns how many events the caller should
// report (this one and those suppressed since the last report), or 0 to stay
// quiet.
func (t *throttle) allow() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending++
	now := time.Now()
	if !t.last.IsZero() && now.Sub(t.last) < t.interval {
		return 0
	}
	n := t.pending
	t.pending, t.last = 0, now
	return n
}
