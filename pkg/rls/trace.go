package rls

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/envoyrls/envoy-rls/internal/textsafe"
)

// startSpan starts the ShouldRateLimit span, parented on the trace context
// the caller sent (gRPC metadata, or what the HTTP handler extracted).
func (s *Service) startSpan(ctx context.Context, req *rlsv3.RateLimitRequest) (context.Context, trace.Span) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = s.prop.Extract(ctx, mdCarrier(md))
	}
	ctx, span := s.opts.Tracer.Start(ctx, "ShouldRateLimit", trace.WithSpanKind(trace.SpanKindServer))
	// The domain is request bytes; OTLP carries only valid UTF-8.
	span.SetAttributes(attribute.String("ratelimit.domain", textsafe.Escape(req.Domain)), attribute.Int("ratelimit.descriptors", len(req.Descriptors)))
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
