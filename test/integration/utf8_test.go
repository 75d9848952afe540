package integration

import (
	"context"
	"fmt"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends a request as the bytes it is: what protobuf-go would
// refuse to marshal, as Envoy's C++ protobuf sends it.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// rawCall sends a hand-encoded RateLimitRequest of one descriptor with the
// entry key=value and decodes the answer with protobuf-go (which refuses a
// response that is not valid UTF-8).
func rawCall(t *testing.T, conn *grpc.ClientConn, domain, key, value string) *rlsv3.RateLimitResponse {
	t.Helper()
	var e, d, req []byte
	e = protowire.AppendString(protowire.AppendTag(e, 1, protowire.BytesType), key)
	e = protowire.AppendString(protowire.AppendTag(e, 2, protowire.BytesType), value)
	d = protowire.AppendBytes(protowire.AppendTag(d, 1, protowire.BytesType), e)
	req = protowire.AppendString(protowire.AppendTag(req, 1, protowire.BytesType), domain)
	req = protowire.AppendBytes(protowire.AppendTag(req, 2, protowire.BytesType), d)
	var out []byte
	if err := conn.Invoke(ctxT(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &req, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatalf("ShouldRateLimit(%q=%q): %v", key, value, err)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(out, &resp); err != nil {
		t.Fatalf("the response to %q=%q does not decode: %v", key, value, err)
	}
	return &resp
}

const utf8ConfigYAML = `
domain: edge
descriptors:
  - key: remote_address
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// A header holding bytes that are not UTF-8, copied by Envoy into a
// descriptor value, is limited like any other value, on its own counter,
// by the built binary with detailed metrics, the reference's series,
// dynamic metadata and JSON debug logs on; it is counted, and /metrics and
// /rlconfig keep answering.
func TestInvalidUTF8DescriptorsAreLimited(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "edge.yaml")
	writeFile(t, cfg, utf8ConfigYAML)
	debug := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	p := startServe(t, nil, "--config", cfg, "--reference-metrics", "--response-dynamic-metadata",
		"--log-level", "debug", "--log-format", "json", "--debug-addr", debug)
	values := []string{"\xff", "\xfe", "10.0.0.1\x80", "ÿ"}
	for _, v := range values {
		for i := range 3 {
			resp := rawCall(t, p.conn, "edge", "remote_address", v)
			want := rlsv3.RateLimitResponse_OK
			if i == 2 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if resp.OverallCode != want {
				t.Fatalf("%q call %d: %v, want %v", v, i+1, resp.OverallCode, want)
			}
		}
	}
	rawCall(t, p.conn, "edge", "unknown\xc3", "x") // matches nothing: a debug line

	body, err := httpGet(p.httpURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "envoy_rls_requests_invalid_utf8_total 10\n") {
		t.Errorf("/metrics has no envoy_rls_requests_invalid_utf8_total 10:\n%s", linesWith(body, "invalid_utf8"))
	}
	if !utf8.ValidString(body) {
		t.Error("/metrics is not valid UTF-8")
	}
	// One series per value, each within its limit of 2 and over it once.
	for _, esc := range []string{`\\xff~`, `\\xfe~`, `10.0.0.1\\x80~`} {
		if got := linesWith(body, "envoy_rls_rule_over_limit_total", esc); !strings.HasSuffix(strings.TrimSpace(got), " 1") || strings.Count(got, "\n") != 1 {
			t.Errorf("over-limit series of %s: %q, want one of 1", esc, got)
		}
	}
	if !strings.Contains(p.Logs(), `unknown\\xc3=x`) {
		t.Errorf("the debug line of the unmatched descriptor does not show its bytes")
	}
	resp, err := httpClient.Get("http://" + debug + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "remote_address") {
		t.Errorf("/rlconfig: %d %s", resp.StatusCode, b)
	}
	// Still serving, through Envoy's generated stubs too.
	if _, err := p.client().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: nil}); err == nil {
		t.Error("a request without descriptors was accepted")
	}
}

// linesWith returns the lines of s holding every one of subs.
func linesWith(s string, subs ...string) string {
	var out strings.Builder
	for _, line := range strings.Split(s, "\n") {
		ok := true
		for _, sub := range subs {
			ok = ok && strings.Contains(line, sub)
		}
		if ok {
			out.WriteString(line + "\n")
		}
	}
	return out.String()
}
