package integration

import (
	"io"
	"path/filepath"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
)

// tlsYAML allows 5 hits an hour.
const tlsYAML = `
domain: exact
descriptors:
  - key: tls
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// TestRedisMutualTLS: two envoy-rls processes reach a TLS-only Redis that
// requires client certificates, one with the private CA from flags, the
// other from the environment and without verifying the server; together
// they allow exactly 5 of 20 requests, and the counters are in that Redis.
func TestRedisMutualTLS(t *testing.T) {
	srv, files := redistest.StartTLS(t)
	cfg := filepath.Join(t.TempDir(), "tls.yaml")
	writeFile(t, cfg, tlsYAML)
	common := []string{"--config", cfg, "--backend", "redis", "--backend-timeout", "2s", "--failure-mode", "deny"}
	verified := startServe(t, nil, append(common,
		"--redis-url", srv.URL(),
		"--redis-tls-ca-file", files.CA,
		"--redis-tls-cert-file", files.ClientCert,
		"--redis-tls-key-file", files.ClientKey)...)
	unverified := startServe(t, []string{
		"ENVOY_RLS_REDIS_URL=" + srv.URL(),
		"ENVOY_RLS_REDIS_TLS_INSECURE_SKIP_VERIFY=true",
		"ENVOY_RLS_REDIS_TLS_CERT_FILE=" + files.ClientCert,
		"ENVOY_RLS_REDIS_TLS_KEY_FILE=" + files.ClientKey,
	}, common...)

	if got := hammer(t, []*proc{verified, unverified}, 4, 5, "tls", "shared"); got != 5 {
		t.Fatalf("%d of 20 allowed over TLS, want exactly 5", got)
	}
	keys, err := srv.Client().Keys(ctxT(t), "*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys on the TLS Redis: %v, %v; want the one counter", keys, err)
	}
	if !strings.Contains(verified.Logs(), "tls=mutual") {
		t.Errorf("the verified instance does not log tls=mutual:\n%s", verified.Logs())
	}
	if !strings.Contains(unverified.Logs(), "tls=unverified") || !strings.Contains(unverified.Logs(), "for testing only") {
		t.Errorf("the unverified instance does not warn:\n%s", unverified.Logs())
	}
}

// TestRedisTLSWithoutClientCertificate: Redis refuses a client without a
// certificate; envoy-rls keeps running and answers by its failure mode.
func TestRedisTLSWithoutClientCertificate(t *testing.T) {
	srv, files := redistest.StartTLS(t)
	cfg := filepath.Join(t.TempDir(), "tls.yaml")
	writeFile(t, cfg, tlsYAML)
	p := startServeUnready(t, nil, "--config", cfg, "--backend", "redis", "--backend-timeout", "500ms", "--failure-mode", "deny",
		"--redis-url", srv.URL(), "--redis-tls-ca-file", files.CA)
	for i := 0; i < 3; i++ {
		_, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{
			Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("tls", "nocert")},
		})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("call %d without a client certificate: %v, want UNAVAILABLE (--failure-mode deny)", i, err)
		}
	}
	if n := metricValue(t, p, "envoy_rls_redis_errors_total"); n < 3 {
		t.Errorf("envoy_rls_redis_errors_total %v, want at least 3", n)
	}
	// Redis has never answered: not healthy, and /healthz says why (the
	// process still serves by its failure mode).
	body, code := "", 0
	if resp, err := httpClient.Get(p.httpURL + "/healthz"); err == nil {
		var b strings.Builder
		io.Copy(&b, resp.Body)
		resp.Body.Close()
		body, code = b.String(), resp.StatusCode
	}
	if code != 503 || !strings.HasPrefix(body, "redis not reachable yet: ") {
		t.Errorf("/healthz %d %q while Redis refuses the client, want 503 with the reason", code, body)
	}
	select {
	case <-p.exited:
		t.Fatalf("envoy-rls exited:\n%s", p.Logs())
	default:
	}
}
