package rls

import (
	"math"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
)

// respond builds the response from the decisions.
func (s *Service) respond(sc *scratch, req *rlsv3.RateLimitRequest, allowed bool) *rlsv3.RateLimitResponse {
	domain := req.Domain
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
			s.opts.Metrics.decision(domain, p, sc.items[it].Mode, d, sc.items[it].Hits, s.decisionSeries(p))
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
		if l := &sc.items[best].Limit; l.Algorithm == algorithms.FixedWindow {
			// As the reference: the time to the end of the window, in every
			// status (checked, uncharged, or never passing).
			wait = s.windowEnd(d, bestDenied, l.Window)
		}
		st.DurationUntilReset = a.durations[i]
		st.DurationUntilReset.Seconds = int64(wait / time.Second)
		st.DurationUntilReset.Nanos = int32(wait % time.Second)
	}
	if s.opts.ResponseHeaders&HeadersLegacy != 0 {
		resp.ResponseHeadersToAdd = rateLimitHeaders(resp.Statuses, s.legacyNames)
	}
	if s.opts.ResponseDynamicMetadata {
		for i := range sc.plans {
			p := &sc.plans[i]
			// Passed: not over the limit, and not unlimited (as the reference).
			if !p.unlimited && resp.Statuses[i].Code == rlsv3.RateLimitResponse_OK && p.node != nil && p.node.Metadata != nil {
				meta = mergeMetadata(meta, p.node.Metadata)
			}
		}
		resp.DynamicMetadata = requestMetadata(req, meta)
	}
	return resp
}

// windowEnd is the time to the end of a fixed window of length w, for the
// decision d: from the decision when it says (a denial that can pass later
// waits exactly that long; a window with hits resets then), else from the
// service's clock (epoch-aligned, as the algorithm counts).
func (s *Service) windowEnd(d *algorithms.Decision, denied bool, w time.Duration) time.Duration {
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
	now := s.opts.Clock.Now().UnixMicro()
	return time.Duration(us-now%us) * time.Microsecond
}

// requestMetadata is the reference's dynamic metadata: the domain, the
// descriptors, the request's hits_addend when set, and the merged metadata
// of the passed descriptors when there is any.
func requestMetadata(req *rlsv3.RateLimitRequest, meta *structpb.Struct) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		if d == nil {
			continue
		}
		entries := make([]*structpb.Value, len(d.Entries))
		for i, e := range d.Entries {
			entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.Limit != nil {
			f["limit"] = structpb.NewStringValue(d.Limit.String())
		}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	if len(meta.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(meta)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeMetadata merges src into dst, as the reference server does: keys
// already in dst win, except that two mappings under one key merge the same
// way. dst is a fresh copy where it changes, never the config's own value.
func mergeMetadata(dst, src *structpb.Struct) *structpb.Struct {
	if dst == nil {
		dst = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	for k, v := range src.Fields {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = v
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			merged := mergeMetadata(nil, hs) // copy: hs may be the config's
			dst.Fields[k] = structpb.NewStructValue(mergeMetadata(merged, vs))
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
