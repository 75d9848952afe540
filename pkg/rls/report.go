package rls

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/envoyrls/envoy-rls/pkg/algorithms"
	"github.com/envoyrls/envoy-rls/pkg/backend"
	"github.com/envoyrls/envoy-rls/pkg/descriptors"
	"github.com/envoyrls/envoy-rls/pkg/rlheaders"
)

// MetadataKey is the key of dynamic_metadata under which an OVER_LIMIT
// answer names the denying rule: {"rule": ..., "domain": ...,
// "descriptor_index": ...}. Envoy stores the struct under the rate limit
// filter's namespace, so an access log prints the rule with
// %DYNAMIC_METADATA(envoy.filters.http.ratelimit:envoy_rls:rule)%.
const MetadataKey = "envoy_rls"

// DefaultNearLimitRatio is the share of a limit's capacity past which
// allowed hits also count as near_limit.
const DefaultNearLimitRatio = 0.8

// ruleNames caches each configured limit's rule name (its name, else its
// descriptor path, with "#i" for the i-th limit of an unnamed composite).
// It belongs to one config: SetConfig starts a new one, so it holds at most
// the config's limits.
type ruleNames struct {
	m        sync.Map // *descriptors.RateLimit -> string
	counters sync.Map // *descriptors.RateLimit -> *ruleCounters (rules without request values)
	// The series of envoy_rls_requests_total per domain and of
	// envoy_rls_limit_decisions_total per descriptor.
	requests  sync.Map // *descriptors.Domain -> *series
	decisions sync.Map // *descriptors.Node -> *series
}

// requestSeries returns the envoy_rls_requests_total series of dom, nil
// for a domain the config does not define.
func (s *Service) requestSeries(dom *descriptors.Domain) *series {
	if dom == nil || s.opts.Metrics == nil {
		return nil
	}
	return cachedSeries(&s.rules.Load().requests, dom)
}

// decisionSeries returns the envoy_rls_limit_decisions_total series of the
// descriptor of p, nil when it has no configured node.
func (s *Service) decisionSeries(p *plan) *series {
	if p.node == nil || p.override != nil || s.opts.Metrics == nil {
		return nil
	}
	return cachedSeries(&s.rules.Load().decisions, p.node)
}

func cachedSeries(m *sync.Map, key any) *series {
	if v, ok := m.Load(key); ok {
		return v.(*series)
	}
	v, _ := m.LoadOrStore(key, new(series))
	return v.(*series)
}

// ruleCounters returns the metric series of limit l of plan p.
func (s *Service) ruleCounters(m *Metrics, domain string, p *plan, l *descriptors.RateLimit) *ruleCounters {
	rule := s.ruleName(domain, p, l)
	label, detailed := s.metricRule(domain, p, l, rule)
	if detailed || p.override != nil {
		return m.counters(domain, label, detailed)
	}
	names := s.rules.Load()
	if c, ok := names.counters.Load(l); ok {
		return c.(*ruleCounters)
	}
	c := m.counters(domain, label, false)
	names.counters.Store(l, c)
	return c
}

// ruleName returns the rule name of limit l of plan p in domain.
func (s *Service) ruleName(domain string, p *plan, l *descriptors.RateLimit) string {
	if p.override != nil {
		return "override"
	}
	if l.Name != "" {
		return l.Name
	}
	names := s.rules.Load()
	if v, ok := names.m.Load(l); ok {
		return v.(string)
	}
	// StatsKey with no entries is the node's static path, with its
	// configured values only.
	name := strings.TrimPrefix(p.node.StatsKey(nil), domain+".")
	if len(p.node.Limits) > 1 {
		for i, x := range p.node.Limits {
			if x == l {
				name += "#" + strconv.Itoa(i)
			}
		}
	}
	names.m.Store(l, name)
	return name
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

// tell reports a decision: response fields for the client (quota headers,
// Retry-After, the over-limit body, the denying rule in dynamic_metadata),
// metrics per rule, a debug line, and an event for the observers. It runs
// once per decided request.
func (s *Service) tell(ctx context.Context, sc *scratch, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse, allowed bool) {
	m := s.opts.Metrics
	wantPolicies := s.opts.ResponseHeaders&(HeadersIETF|HeadersDraft03) != 0
	overLimit := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
	if m == nil && !wantPolicies && !overLimit && s.obs == nil {
		return
	}
	domain := req.Domain
	deny := -1 // the item that binds the denial
	var retry time.Duration
	sc.policies = sc.policies[:0]
	for k := range sc.items {
		it := &sc.items[k]
		o := &sc.owners[k]
		d := &sc.decisions[k]
		p := &sc.plans[o.desc]
		enforcedDenial := !d.Allowed && it.Mode != backend.Shadow
		wait := d.ResetAfter
		if !d.Allowed {
			wait = d.RetryAfter
			if wait == algorithms.Never {
				wait = it.Limit.Window
			}
		}
		if enforcedDenial && (deny < 0 || wait > retry) {
			deny, retry = k, wait
		}
		if m != nil {
			s.ruleCounters(m, domain, p, o.limit).limit(it, d, s.nearRatio, s.opts.ShadowMode)
		}
		if wantPolicies && it.Mode != backend.Shadow {
			sc.policies = append(sc.policies, rlheaders.Policy{
				Name:         s.ruleName(domain, p, o.limit),
				Quota:        it.Limit.Requests,
				Window:       it.Limit.Window,
				PartitionKey: partitionKey(sc, p, it.Partition),
				Remaining:    d.Remaining,
				Reset:        wait,
				Denied:       enforcedDenial,
			})
		}
	}
	if len(sc.policies) > 0 {
		if s.opts.ResponseHeaders&HeadersIETF != 0 {
			policy, rl := rlheaders.IETF(sc.policies)
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: rlheaders.RateLimitPolicy, Value: policy},
				&corev3.HeaderValue{Key: rlheaders.RateLimit, Value: rl})
		}
		if s.opts.ResponseHeaders&HeadersDraft03 != 0 {
			limit, remaining, reset := rlheaders.Draft03(sc.policies)
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: rlheaders.XRateLimitLimit, Value: limit},
				&corev3.HeaderValue{Key: rlheaders.XRateLimitRemain, Value: remaining},
				&corev3.HeaderValue{Key: rlheaders.XRateLimitReset, Value: reset})
		}
	}
	if overLimit && deny >= 0 {
		o := &sc.owners[deny]
		rule := s.ruleName(domain, &sc.plans[o.desc], o.limit)
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			&corev3.HeaderValue{Key: rlheaders.RetryAfterField, Value: rlheaders.RetryAfter(retry)})
		if resp.DynamicMetadata == nil {
			resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		resp.DynamicMetadata.Fields[MetadataKey] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"rule":             structpb.NewStringValue(rule),
			"domain":           structpb.NewStringValue(domain),
			"descriptor_index": structpb.NewNumberValue(float64(o.desc)),
		}})
		if s.opts.OverLimitBody != nil {
			resp.RawBody = s.opts.OverLimitBody.Render(BodyValues{Rule: rule, Domain: domain, DescriptorIndex: o.desc, RetryAfter: max(rlheaders.Seconds(retry), 1)})
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "Content-Type", Value: "application/json"})
		}
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.DebugContext(ctx, "over limit", "domain", domain, "rule", rule, "descriptor_index", o.desc, "retry_after", retry)
		}
	}
}

// partitionKey returns the pk of a policy when its counter is one of many
// (some level of the descriptor takes each request value apart): the
// descriptor's 8-byte partition hash, so that a client can tell partitions
// apart without the service echoing request values. Shared counters have
// none.
func partitionKey(sc *scratch, p *plan, partition uint64) []byte {
	perValue := p.override != nil
	for _, n := range sc.paths[p.pathOff : p.pathOff+p.pathLen] {
		if n.Value == "" || (n.Wildcard && !n.ShareThreshold) {
			perValue = true
		}
	}
	if !perValue {
		return nil
	}
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), partition)
}

// event builds the observers' event for a decided or failed request.
func (s *Service) event(sc *scratch, req *rlsv3.RateLimitRequest, known bool, code string, err error, start time.Time) *DecisionEvent {
	e := &DecisionEvent{Time: start, Duration: time.Since(start), Domain: req.Domain, Known: known, Code: code, Err: err}
	if len(sc.items) > 0 {
		e.Limits = make([]LimitEvent, len(sc.items))
	}
	for k := range sc.items {
		it, o := &sc.items[k], &sc.owners[k]
		le := LimitEvent{
			Descriptor: o.desc,
			Rule:       s.ruleName(req.Domain, &sc.plans[o.desc], o.limit),
			Hits:       it.Hits,
			Shadow:     it.Mode == backend.Shadow,
			Quota:      it.Mode == backend.Quota,
		}
		if err == nil {
			d := &sc.decisions[k]
			le.Allowed, le.Remaining, le.RetryAfter = d.Allowed, d.Remaining, d.RetryAfter
		}
		e.Limits[k] = le
	}
	for i := range sc.plans {
		if sc.plans[i].node == nil && sc.plans[i].override == nil {
			e.Unmatched++
		}
	}
	return e
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

// startSpan starts the ShouldRateLimit span, parented on the trace context
// the caller sent (gRPC metadata, or what the HTTP handler extracted).
func (s *Service) startSpan(ctx context.Context, req *rlsv3.RateLimitRequest) (context.Context, trace.Span) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = s.prop.Extract(ctx, mdCarrier(md))
	}
	ctx, span := s.opts.Tracer.Start(ctx, "ShouldRateLimit", trace.WithSpanKind(trace.SpanKindServer))
	span.SetAttributes(attribute.String("ratelimit.domain", req.Domain), attribute.Int("ratelimit.descriptors", len(req.Descriptors)))
	return ctx, span
}

// endSpan records the outcome on the request's span.
func endSpan(span trace.Span, resp *rlsv3.RateLimitResponse, err error) {
	if resp != nil {
		span.SetAttributes(attribute.String("ratelimit.overall_code", resp.OverallCode.String()))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// mdCarrier reads gRPC metadata for a propagator.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c mdCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
