package rls_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/internal/tracing"
	"github.com/envoyrls/envoy-rls/internal/tracing/otlptest"
	"github.com/envoyrls/envoy-rls/pkg/rls"
)

// rawCodec sends and receives messages as the bytes they are, so that a
// test can send what protobuf-go would refuse to marshal.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// rawRequest hand-encodes a RateLimitRequest: domain, then one descriptor
// per list of key, value pairs.
func rawRequest(domain string, descs ...[]string) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, kv := range descs {
		var d []byte
		for i := 0; i+1 < len(kv); i += 2 {
			var e []byte
			e = protowire.AppendTag(e, 1, protowire.BytesType)
			e = protowire.AppendString(e, kv[i])
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendString(e, kv[i+1])
			d = protowire.AppendTag(d, 1, protowire.BytesType)
			d = protowire.AppendBytes(d, e)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

// callRaw sends req's bytes to ShouldRateLimit and decodes the answer with
// protobuf-go, which refuses a response that is not valid UTF-8.
func callRaw(t *testing.T, conn *grpc.ClientConn, req []byte) *rlsv3.RateLimitResponse {
	t.Helper()
	var out []byte
	if err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &req, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		t.Fatalf("the response does not decode: %v", err)
	}
	return &resp
}

const utf8YAML = `
domain: d
descriptors:
  - key: ip
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user
    value_to_metric: true
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}
`

// Raw gRPC requests whose domain, keys and values are not valid UTF-8 (as
// Envoy sends a header holding such bytes) are decided on their bytes, each
// value its own counter, on detailed_metric and value_to_metric rules with
// every output on: metrics (ours and the reference's), dynamic metadata,
// JSON debug logs and spans exported over OTLP. Nothing panics, every
// response decodes, every output is valid UTF-8 and shows the bytes.
func TestInvalidUTF8IsDecidedOnItsBytes(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := rls.NewMetrics(reg)
	m.EnableReference(reg, 0.8)
	logs := &testutil.SyncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := otlptest.Start(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.Endpoint())
	cfg, err := tracing.FromEnv(func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return r.Endpoint()
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracing.Setup(context.Background(), cfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	h := start(t, utf8YAML, rls.Options{
		Metrics: m, Logger: log, ResponseDynamicMetadata: true,
		Tracer: tr.Tracer, Propagator: tr.Propagator,
	})

	// Three values that differ only in bytes that are not UTF-8, and the
	// valid "ÿ" (U+00FF, which a YAML "\xff" would mean): four counters of
	// 2 per minute.
	values := []string{"\xff", "\xfe", "a\x80", "ÿ"}
	invalid := 0
	for _, v := range values {
		if !utf8.ValidString(v) {
			invalid += 3
		}
		for i := range 3 {
			resp := callRaw(t, h.conn, rawRequest("d", []string{"ip", v}))
			want := rlsv3.RateLimitResponse_OK
			if i == 2 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if resp.OverallCode != want {
				t.Fatalf("value %q, call %d: %v, want %v", v, i+1, resp.OverallCode, want)
			}
			if i == 0 {
				entries := resp.DynamicMetadata.GetFields()["descriptors"].GetListValue().GetValues()[0].GetStructValue().GetFields()["entries"].GetListValue().GetValues()
				if got, want := entries[0].GetStringValue(), "ip="+escape(v); got != want {
					t.Errorf("dynamic metadata entry %q, want %q", got, want)
				}
			}
		}
	}
	// value_to_metric with an invalid user; a key that is not UTF-8
	// matches no rule and is logged; a domain that is not UTF-8 is an
	// unknown domain.
	callRaw(t, h.conn, rawRequest("d", []string{"user", "u\xc3", "path", "/p\xe2\x82"}))
	callRaw(t, h.conn, rawRequest("d", []string{"k\xf0", "v"}))
	invalid += 2
	if resp := callRaw(t, h.conn, rawRequest("d\xff", []string{"ip", "1"})); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("unknown invalid domain: %v", resp.OverallCode)
	}
	invalid++

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	series := map[string]int{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if !utf8.ValidString(l.GetValue()) {
					t.Errorf("%s: label %s=%q is not valid UTF-8", mf.GetName(), l.GetName(), l.GetValue())
				}
				if strings.Contains(l.GetValue(), `\x`) {
					series[mf.GetName()]++
				}
			}
			if mf.GetName() == "envoy_rls_requests_invalid_utf8_total" && mt.GetCounter().GetValue() != float64(invalid) {
				t.Errorf("envoy_rls_requests_invalid_utf8_total = %v, want %d", mt.GetCounter().GetValue(), invalid)
			}
		}
	}
	// The three invalid ip values and the user keep their own series.
	if series["envoy_rls_rule_hits_total"] != 4 {
		t.Errorf("envoy_rls_rule_hits_total has %d series of invalid values, want 4", series["envoy_rls_rule_hits_total"])
	}
	if series["ratelimit_service_rate_limit_total_hits"] < 4 {
		t.Errorf("the reference's hits have %d series of invalid values, want at least 4", series["ratelimit_service_rate_limit_total_hits"])
	}

	out := logs.String()
	if !strings.Contains(out, `k\\xf0=v`) {
		t.Errorf("the unmatched descriptor's log line does not show its bytes:\n%s", out)
	}

	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatalf("exporting spans: %v", err)
	}
	// A span per call, and a backend span for each but the two that
	// match nothing.
	calls := 3*len(values) + 3
	spans := r.WaitSpans(t, calls+calls-2, 10*time.Second)
	domains := map[string]bool{}
	for _, s := range spans {
		for _, a := range s.Attributes {
			if a.Key == "ratelimit.domain" {
				domains[a.Value.GetStringValue()] = true
			}
		}
	}
	if !domains[`d\xff`] || !domains["d"] {
		t.Errorf("span domains %v, want d and d\\xff", domains)
	}
}

// escape is textsafe.Escape for the test's short values, written out.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n <= 1 {
			b.WriteString(`\x` + "0123456789abcdef"[s[i]>>4:s[i]>>4+1] + "0123456789abcdef"[s[i]&15:s[i]&15+1])
			i++
			continue
		}
		b.WriteString(s[i : i+n])
		i += n
	}
	return b.String()
}
