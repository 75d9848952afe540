package rls

import (
	"context"
	"log/slog"
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// answer builds the response of a decided request in one walk over its
// items: each descriptor's status (its binding limit), the request's
// binding limit (what the quota fields describe, and for a denial the rule
// that fired and how long to wait), the fields and dynamic metadata they
// make, the metrics of every limit and, when e is not nil, the observers'
// view of every limit. allowed is the store's verdict; now is the call's
// instant.
func (s *Service) answer(ctx context.Context, sc *scratch, req *rlsv3.RateLimitRequest, allowed bool, now time.Time, e *DecisionEvent) *rlsv3.RateLimitResponse {
	m := s.opts.Metrics
	domain := req.Domain
	overLimit := !allowed && !s.opts.ShadowMode
	policies := s.opts.ResponseHeaders&(HeadersIETF|HeadersDraft03) != 0
	legacy := s.opts.ResponseHeaders&HeadersLegacy != 0
	a := newResponse(len(sc.plans), s.maxHeaders(overLimit))
	resp := a.resp
	if overLimit {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	sc.policies = sc.policies[:0]
	sc.pk = sc.pk[:0]
	if policies && cap(sc.pk) < 8*len(sc.items) {
		sc.pk = make([]byte, 0, 8*len(sc.items)) // room for every partition key
	}
	bind, bindPolicy := -1, -1 // the request's binding item (enforced and quota items), its index in sc.policies
	var bindP rlheaders.Policy
	bindDesc := -1 // the descriptor whose status binds (the legacy fields)
	var bindDescP rlheaders.Policy
	var meta *structpb.Struct
	k := 0
	for i := range sc.plans {
		p := &sc.plans[i]
		st := resp.Statuses[i]
		if p.unlimited {
			// As the reference: no current_limit, the most a uint32 holds.
			st.LimitRemaining = math.MaxUint32
			continue
		}
		var series *series
		if m != nil {
			series = s.decisionSeries(p)
		}
		best := -1
		var bestP rlheaders.Policy
		for ; k < len(sc.items) && sc.owners[k].desc == i; k++ {
			it, o, d := &sc.items[k], &sc.owners[k], &sc.decisions[k]
			pol := rlheaders.Policy{
				Quota:     it.Limit.Requests,
				Window:    it.Limit.Window,
				Remaining: d.Remaining,
				Denied:    !d.Allowed && it.Mode != backend.Shadow, // an enforced denial
			}
			pol.Reset = s.wait(it, d, pol.Denied, now)
			var rule string
			if m != nil || e != nil || (policies && it.Mode != backend.Shadow) {
				rule = s.ruleName(domain, p, o.limit)
			}
			if m != nil {
				m.decision(domain, p, it.Mode, d, it.Hits, series)
				s.ruleCounters(m, domain, p, o.limit, rule).limit(it, d, s.nearRatio, s.opts.ShadowMode)
			}
			if e != nil {
				e.Limits[k] = limitEvent(it, o, rule, d)
			}
			if pol.Denied {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if best < 0 || rlheaders.Binds(&pol, &bestP) {
				best, bestP = k, pol
			}
			if it.Mode == backend.Shadow {
				continue // never binds the request, never told to the client
			}
			if bind < 0 || rlheaders.Binds(&pol, &bindP) {
				bind, bindP, bindPolicy = k, pol, len(sc.policies)
			}
			if policies {
				pol.Name = rule
				pol.PartitionKey = sc.partitionKey(p, it.Partition)
				sc.policies = append(sc.policies, pol)
			}
		}
		if best >= 0 {
			st.CurrentLimit = a.limits[i]
			fillLimit(st.CurrentLimit, sc.owners[best].limit)
			st.LimitRemaining = clamp32(bestP.Remaining)
			st.DurationUntilReset = a.durations[i]
			st.DurationUntilReset.Seconds = int64(bestP.Reset / time.Second)
			st.DurationUntilReset.Nanos = int32(bestP.Reset % time.Second)
			if legacy && (bindDesc < 0 || rlheaders.Binds(&bestP, &bindDescP)) {
				bindDesc, bindDescP = i, bestP
			}
		}
		// Passed: not over the limit, and not unlimited (as the reference).
		if s.opts.ResponseDynamicMetadata && st.Code == rlsv3.RateLimitResponse_OK && p.node != nil && p.node.Metadata != nil {
			meta = mergeMetadata(meta, p.node.Metadata)
		}
	}

	if bindDesc >= 0 {
		s.legacyFields(&a, sc, resp.Statuses[bindDesc])
	}
	if len(sc.policies) > 0 {
		s.quotaFields(&a, sc, bindPolicy)
	}
	if s.opts.ResponseDynamicMetadata {
		resp.DynamicMetadata = requestMetadata(req, meta)
	}
	if overLimit && bind >= 0 && bindP.Denied {
		o := &sc.owners[bind]
		rule := s.ruleName(domain, &sc.plans[o.desc], o.limit)
		a.header(sc, rlheaders.RetryAfterField, rlheaders.AppendRetryAfter(sc.hdr, bindP.Reset))
		resp.DynamicMetadata = denialMetadata(resp.DynamicMetadata, rule, domain, o.desc)
		if s.opts.OverLimitBody != nil {
			resp.RawBody = s.opts.OverLimitBody.Render(BodyValues{Rule: rule, Domain: domain, DescriptorIndex: o.desc, RetryAfter: rlheaders.RetryAfterSeconds(bindP.Reset)})
			a.header(sc, "Content-Type", append(sc.hdr, "application/json"...))
		}
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.DebugContext(ctx, "over limit", "domain", domain, "rule", rule, "descriptor_index", o.desc, "retry_after", bindP.Reset)
		}
	}
	a.attachHeaders(sc)
	return resp
}

// wait is how long a limit's decision d tells the caller to wait: for an
// enforced denial (denied), the time until the same request could pass, a
// whole window when it never can; else the time until the limit is fresh
// again. For a fixed window it is, as the reference says, the time to the
// window's end whatever the status.
func (s *Service) wait(it *backend.Item, d *algorithms.Decision, denied bool, now time.Time) time.Duration {
	l := &it.Limit
	if l.Algorithm == algorithms.FixedWindow {
		return s.windowEnd(d, denied, l.Window, now)
	}
	if !denied {
		return d.ResetAfter
	}
	if d.RetryAfter == algorithms.Never {
		return l.Window
	}
	return d.RetryAfter
}

// windowEnd is the time to the end of a fixed window of length w, for the
// decision d: from the decision when it says (a denial that can pass later
// waits exactly that long; a window with hits resets then), else from the
// call's instant now (epoch-aligned, as the algorithm counts; see
// windowTime).
func (s *Service) windowEnd(d *algorithms.Decision, denied bool, w time.Duration, now time.Time) time.Duration {
	switch {
	case denied && d.RetryAfter > 0 && d.RetryAfter != algorithms.Never:
		return d.RetryAfter
	case d.ResetAfter > 0 && d.ResetAfter != algorithms.Never:
		return d.ResetAfter
	}
	us := w.Microseconds()
	if us < 1 {
		return w
	}
	t := s.windowTime(now).UnixMicro()
	return time.Duration(us-t%us) * time.Microsecond
}

// windowTime is the instant that places now in the fixed windows: now in
// the frame of the service's start (the wall clock then, advanced by the
// monotonic clock since, as the memory store's clock is), so that a step of
// the wall clock does not move it; or the time of Options.Clock when one is
// set.
func (s *Service) windowTime(now time.Time) time.Time {
	if s.opts.Clock != nil {
		return s.opts.Clock.Now()
	}
	return s.started.Add(now.Sub(s.started))
}

// failOpenResponse answers OK for every descriptor when the store failed and
// the failure mode is allow: the limits are named, nothing else is known.
func failOpenResponse(sc *scratch) *rlsv3.RateLimitResponse {
	a := newResponse(len(sc.plans), 0)
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

// maxHeaders is the most header fields a response adds: three legacy
// ones, two IETF ones, three of draft 03, Retry-After and Content-Type.
const maxHeaders = 10

// maxHeaders is the most header fields the options let a response add,
// over the limit or not.
func (s *Service) maxHeaders(overLimit bool) int {
	n := 0
	if s.opts.ResponseHeaders&HeadersLegacy != 0 {
		n += 3
	}
	if s.opts.ResponseHeaders&HeadersIETF != 0 {
		n += 2
	}
	if s.opts.ResponseHeaders&HeadersDraft03 != 0 {
		n += 3
	}
	if overLimit {
		n += 2
	}
	return n
}

// response is a response with room for its statuses, their current limits
// and their durations, and for the header fields it may add: allocated
// together, one allocation instead of several per descriptor and per field.
// Parts a response does not use stay unreferenced.
type response struct {
	resp      *rlsv3.RateLimitResponse
	limits    []*rlsv3.RateLimitResponse_RateLimit
	durations []*durationpb.Duration
	headerPtr []*corev3.HeaderValue // len: the fields added
	fields    []corev3.HeaderValue  // room for them
	values    [maxHeaders][2]int    // each field's value, as offsets in the scratch's hdr
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

// deniedArena is a responseArena with room for the fields of a denial
// without quota fields (Retry-After, Content-Type), toldArena for any.
type deniedArena struct {
	responseArena
	ptr    [2]*corev3.HeaderValue
	fields [2]corev3.HeaderValue
}

type toldArena struct {
	responseArena
	ptr    [maxHeaders]*corev3.HeaderValue
	fields [maxHeaders]corev3.HeaderValue
}

// newResponse returns an OK response with n OK statuses, and n current
// limits and durations ready to be filled and attached, with room for
// headers header fields.
func newResponse(n, headers int) response {
	var r response
	if n <= inlineStatuses {
		var a *responseArena
		switch {
		case headers == 0:
			a = new(responseArena)
		case headers <= 2:
			t := new(deniedArena)
			a, r.headerPtr, r.fields = &t.responseArena, t.ptr[:0], t.fields[:]
		default:
			t := new(toldArena)
			a, r.headerPtr, r.fields = &t.responseArena, t.ptr[:0], t.fields[:]
		}
		for i := 0; i < n; i++ {
			a.statuses[i].Code = rlsv3.RateLimitResponse_OK
			a.statusPtr[i] = &a.statuses[i]
			a.limitPtr[i] = &a.limits[i]
			a.durPtr[i] = &a.durations[i]
		}
		a.resp.OverallCode = rlsv3.RateLimitResponse_OK
		a.resp.Statuses = a.statusPtr[:n:n]
		r.resp, r.limits, r.durations = &a.resp, a.limitPtr[:n], a.durPtr[:n]
		return r
	}
	statuses := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	limits := make([]rlsv3.RateLimitResponse_RateLimit, n)
	durations := make([]durationpb.Duration, n)
	r.resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	r.limits = make([]*rlsv3.RateLimitResponse_RateLimit, n)
	r.durations = make([]*durationpb.Duration, n)
	if headers > 0 {
		r.headerPtr, r.fields = make([]*corev3.HeaderValue, 0, headers), make([]corev3.HeaderValue, headers)
	}
	for i := 0; i < n; i++ {
		statuses[i].Code = rlsv3.RateLimitResponse_OK
		r.resp.Statuses[i] = &statuses[i]
		r.limits[i] = &limits[i]
		r.durations[i] = &durations[i]
	}
	return r
}

// header adds a field named key whose value is what value appended to
// sc.hdr (value is sc.hdr with the value appended: see attachHeaders).
func (r *response) header(sc *scratch, key string, value []byte) {
	i := len(r.headerPtr)
	r.values[i] = [2]int{len(sc.hdr), len(value)}
	r.fields[i].Key = key
	r.headerPtr = append(r.headerPtr, &r.fields[i])
	sc.hdr = value
}

// attachHeaders sets the fields' values, all in one string made of sc.hdr,
// and attaches the fields to the response in the order they were added.
func (r *response) attachHeaders(sc *scratch) {
	n := len(r.headerPtr)
	if n == 0 {
		return
	}
	all := string(sc.hdr)
	for i := 0; i < n; i++ {
		r.fields[i].Value = all[r.values[i][0]:r.values[i][1]]
	}
	r.resp.ResponseHeadersToAdd = r.headerPtr[:n:n]
	sc.hdr = sc.hdr[:0]
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
