// Package tracing sets up OpenTelemetry tracing for the binary from the
// environment: the standard OTEL_EXPORTER_OTLP_* variables and the
// reference server's TRACING_* variables. When neither asks for tracing,
// Setup returns a nil tracer and the service makes no span at all.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is what the environment asks for.
type Config struct {
	// Enabled is true when OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, or TRACING_ENABLED is true.
	Enabled bool
	// Protocol is "grpc" (default) or "http/protobuf", from
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL or
	// TRACING_EXPORTER_PROTOCOL ("http" means http/protobuf).
	Protocol string
	// ServiceName (TRACING_SERVICE_NAME, else OTEL_SERVICE_NAME, else
	// "envoy-rls"), ServiceNamespace (TRACING_SERVICE_NAMESPACE) and
	// InstanceID (TRACING_SERVICE_INSTANCE_ID) describe the resource.
	ServiceName      string
	ServiceNamespace string
	InstanceID       string
	// SamplingRate is the fraction of root traces sampled
	// (TRACING_SAMPLING_RATE, default 1). A sampled incoming parent is
	// always followed.
	SamplingRate float64
}

// FromEnv reads the configuration through getenv (os.Getenv in the binary).
// Every bad value is an error that names its variable.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{Protocol: "grpc", ServiceName: "envoy-rls", SamplingRate: 1}
	var errs []error
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
		c.Enabled = true
	}
	if v := getenv("TRACING_ENABLED"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("TRACING_ENABLED=%q: want true or false", v))
		}
		c.Enabled = c.Enabled || b
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL", "TRACING_EXPORTER_PROTOCOL"} {
		v := getenv(name)
		if v == "" {
			continue
		}
		switch strings.ToLower(v) {
		case "grpc":
			c.Protocol = "grpc"
		case "http", "http/protobuf":
			c.Protocol = "http/protobuf"
		default:
			errs = append(errs, fmt.Errorf("%s=%q: want grpc or http/protobuf", name, v))
		}
		break
	}
	if v := getenv("OTEL_SERVICE_NAME"); v != "" {
		c.ServiceName = v
	}
	if v := getenv("TRACING_SERVICE_NAME"); v != "" {
		c.ServiceName = v
	}
	c.ServiceNamespace = getenv("TRACING_SERVICE_NAMESPACE")
	c.InstanceID = getenv("TRACING_SERVICE_INSTANCE_ID")
	if v := getenv("TRACING_SAMPLING_RATE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			errs = append(errs, fmt.Errorf("TRACING_SAMPLING_RATE=%q: want a number from 0 to 1", v))
		} else {
			c.SamplingRate = f
		}
	}
	return c, errors.Join(errs...)
}

// Tracing is what Setup built.
type Tracing struct {
	// Tracer makes the spans; nil when tracing is off.
	Tracer trace.Tracer
	// Propagator reads the incoming trace context: W3C traceparent and
	// baggage.
	Propagator propagation.TextMapPropagator
	provider   *sdktrace.TracerProvider
}

// Shutdown flushes the spans not yet exported and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Setup builds the tracer c asks for; with tracing disabled it returns a
// Tracing whose Tracer is nil. The exporter reads the remaining
// OTEL_EXPORTER_OTLP_* variables (endpoint, headers, TLS, timeout) itself.
func Setup(ctx context.Context, c Config, version string) (*Tracing, error) {
	t := &Tracing{Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	if !c.Enabled {
		return t, nil
	}
	var exp sdktrace.SpanExporter
	var err error
	if c.Protocol == "http/protobuf" {
		exp, err = otlptracehttp.New(ctx)
	} else {
		exp, err = otlptracegrpc.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	attrs := []attribute.KeyValue{
		attribute.String("service.name", c.ServiceName),
		attribute.String("service.version", version),
	}
	if c.ServiceNamespace != "" {
		attrs = append(attrs, attribute.String("service.namespace", c.ServiceNamespace))
	}
	if c.InstanceID != "" {
		attrs = append(attrs, attribute.String("service.instance.id", c.InstanceID))
	}
	t.provider = sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SamplingRate))),
	)
	t.Tracer = t.provider.Tracer("github.com/envoyrls/envoy-rls")
	return t, nil
}
