package rls_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/envoyrls/envoy-rls/pkg/rls"
)

func TestHealthAndReflection(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	hc := healthpb.NewHealthClient(h.conn)
	for _, name := range append([]string{""}, rls.HealthServiceNames...) {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", name, r, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(h.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range resp.GetListServicesResponse().GetService() {
		found = found || s.Name == "envoy.service.ratelimit.v3.RateLimitService"
	}
	if !found {
		t.Fatalf("reflection does not list the service: %v", resp)
	}
}

func TestJSONEndpoint(t *testing.T) {
	h := start(t, basicYAML, rls.Options{})
	srv := httptest.NewServer(h.svc.JSONHandler())
	defer srv.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req := `{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}`
	for i := 0; i < 3; i++ {
		code, body := post(req)
		if code != 200 {
			t.Fatalf("call %d: %d %s", i, code, body)
		}
		var r rlsv3.RateLimitResponse
		if err := protojson.Unmarshal([]byte(body), &r); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("body %s: %v", body, err)
		}
		// Stable, compact output (protojson alone varies its spacing).
		if !strings.HasPrefix(body, `{"overallCode":"OK","statuses":[{"code":"OK","currentLimit":{"requestsPerUnit":3,"unit":"MINUTE"},`) {
			t.Fatalf("body not compact: %s", body)
		}
	}
	if code, body := post(req); code != http.StatusTooManyRequests || !strings.Contains(body, "OVER_LIMIT") {
		t.Fatalf("4th: %d %s", code, body)
	}
	if code, body := post(`{"domain":"","descriptors":[]}`); code != http.StatusBadRequest || !strings.Contains(body, "domain") {
		t.Fatalf("invalid: %d %s", code, body)
	}
	if code, _ := post(`not json`); code != http.StatusBadRequest {
		t.Fatalf("garbage: %d", code)
	}
}
