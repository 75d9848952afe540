package tracing

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/envoyrls/envoy-rls/internal/tracing/otlptest"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestFromEnv(t *testing.T) {
	c, err := FromEnv(env(nil))
	if err != nil || c.Enabled || c.Protocol != "grpc" || c.SamplingRate != 1 || c.ServiceName != "envoy-rls" {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	c, err = FromEnv(env(map[string]string{
		"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "rl", "TRACING_SERVICE_NAMESPACE": "ns",
		"TRACING_SERVICE_INSTANCE_ID": "i1", "TRACING_SAMPLING_RATE": "0.25", "TRACING_EXPORTER_PROTOCOL": "http",
	}))
	if err != nil || !c.Enabled || c.Protocol != "http/protobuf" || c.SamplingRate != 0.25 || c.ServiceName != "rl" || c.ServiceNamespace != "ns" || c.InstanceID != "i1" {
		t.Errorf("reference variables: %+v, %v", c, err)
	}
	c, _ = FromEnv(env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "TRACING_EXPORTER_PROTOCOL": "http"}))
	if !c.Enabled || c.Protocol != "grpc" {
		t.Errorf("OTEL_ variables win: %+v", c)
	}
	_, err = FromEnv(env(map[string]string{"TRACING_ENABLED": "yes please", "TRACING_SAMPLING_RATE": "2", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}))
	for _, want := range []string{"TRACING_ENABLED", "TRACING_SAMPLING_RATE", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

func TestDisabledMakesNoTracer(t *testing.T) {
	tr, err := Setup(context.Background(), Config{}, "v")
	if err != nil || tr.Tracer != nil || tr.Propagator == nil {
		t.Fatalf("Setup = %+v, %v", tr, err)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A span made under an incoming traceparent reaches a real OTLP/gRPC
// receiver with that parent and trace id.
func TestSpansReachTheReceiverWithTheIncomingParent(t *testing.T) {
	r := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.Endpoint())
	c, err := FromEnv(func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return r.Endpoint()
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Setup(context.Background(), c, "test")
	if err != nil {
		t.Fatal(err)
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	ctx := tr.Propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": "00-" + traceID + "-" + parentID + "-01"})
	_, span := tr.Tracer.Start(ctx, "ShouldRateLimit")
	span.End()
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := r.WaitSpans(t, 1, 10*time.Second)
	if got := hex.EncodeToString(spans[0].TraceId); got != traceID {
		t.Errorf("trace id %s, want %s", got, traceID)
	}
	if got := hex.EncodeToString(spans[0].ParentSpanId); got != parentID {
		t.Errorf("parent %s, want %s", got, parentID)
	}
}
