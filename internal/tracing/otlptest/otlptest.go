// Package otlptest runs an OTLP/gRPC trace receiver in the test process, so
// tests can check the spans a real exporter sends.
package otlptest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
)

// Receiver collects the spans exported to it.
type Receiver struct {
	collectorpb.UnimplementedTraceServiceServer
	addr    string
	mu      sync.Mutex
	spans   []*tracepb.Span
	arrived chan struct{}
}

// Start serves a receiver on a free loopback port until the test ends.
func Start(t testing.TB) *Receiver {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{addr: lis.Addr().String(), arrived: make(chan struct{}, 1)}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, r)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return r
}

// Endpoint is the value for OTEL_EXPORTER_OTLP_ENDPOINT (plain text).
func (r *Receiver) Endpoint() string { return "http://" + r.addr }

// Export implements the OTLP trace service.
func (r *Receiver) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	select {
	case r.arrived <- struct{}{}:
	default:
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

// WaitSpans waits until at least n spans arrived, or fails the test after
// timeout.
func (r *Receiver) WaitSpans(t testing.TB, n int, timeout time.Duration) []*tracepb.Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if s := r.Spans(); len(s) >= n {
			return s
		}
		select {
		case <-r.arrived:
		case <-deadline.C:
			t.Fatalf("received %d spans, want at least %d", len(r.Spans()), n)
		}
	}
}
