package integration

import (
	"bytes"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

func descriptor(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestReadmeCurlSession runs the README's curl session against the example
// config: five requests per second per remote address, the sixth is 429.
func TestReadmeCurlSession(t *testing.T) {
	p := startServe(t, nil, "--config", repoFile("examples", "ratelimit.yaml"))
	body := `{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	// Fixed windows are epoch-aligned seconds: start the burst as a second
	// begins, and retry it if it straddles a boundary all the same (then the
	// 6th may legitimately pass).
	for attempt := 0; ; attempt++ {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		start := time.Now()
		codes := []int{}
		for i := 0; i < 6; i++ {
			code, _ := p.postJSON(t, body)
			codes = append(codes, code)
		}
		if time.Now().Truncate(time.Second) != start.Truncate(time.Second) {
			if attempt < 5 {
				body = strings.Replace(body, "10.0.0.", "10.0.1.", 1)
				continue
			}
			t.Fatal("could not fit 6 requests into one second")
		}
		for i, c := range codes[:5] {
			if c != 200 {
				t.Fatalf("request %d: HTTP %d, want 200 (codes %v)", i+1, c, codes)
			}
		}
		if codes[5] != 429 {
			t.Fatalf("6th request: HTTP %d, want 429", codes[5])
		}
		break
	}
	// The response body is protojson with the per-descriptor status.
	code, out := p.postJSON(t, `{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}`)
	var resp rlsv3.RateLimitResponse
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil || code != 200 {
		t.Fatalf("HTTP %d %q: %v", code, out, err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit == nil || resp.Statuses[0].DurationUntilReset == nil {
		t.Fatalf("status lacks its limit: %s", out)
	}
	// A bad request is a 400 with the reason.
	code, out = p.postJSON(t, `{"domain":"","descriptors":[{"entries":[{"key":"path","value":"/x"}]}]}`)
	if code != 400 || !strings.Contains(out, "domain must not be empty") {
		t.Fatalf("invalid request: HTTP %d %q", code, out)
	}
	// GET /metrics serves Prometheus text with our counters.
	resp2, err := httpGet(p.httpURL + "/metrics")
	if err != nil || !strings.Contains(resp2, "envoy_rls_requests_total") {
		t.Fatalf("/metrics: %v %.200s", err, resp2)
	}
}

// TestGRPCScenarios drives the example config through Envoy's generated
// client: tiers, composite limits, gcra with burst, unlimited, shadow mode,
// InvalidArgument, health.
func TestGRPCScenarios(t *testing.T) {
	// The reference's RESPONSE_DYNAMIC_METADATA, through its environment
	// variable.
	p := startServe(t, []string{"ENVOY_RLS_RESPONSE_DYNAMIC_METADATA=true"}, "--config", repoFile("examples", "ratelimit.yaml"))
	c := p.client()
	ctx := ctxT(t)
	call := func(ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "example", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// gcra login: burst 2, then denied with a retry hint under 12 s
	// (5 per minute = one per 12 s).
	for i := 0; i < 2; i++ {
		if r := call(descriptor("path", "/login")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("login %d: %v", i, r)
		}
	}
	r := call(descriptor("path", "/login"))
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("3rd login: %v", r)
	}
	if d := r.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > 12*time.Second {
		t.Fatalf("login retry after %v", d)
	}
	if n := r.Statuses[0].CurrentLimit.GetName(); n != "login" {
		t.Fatalf("current limit name %q", n)
	}
	// trusted_client replaces login: allowed although login is exhausted.
	r = call(descriptor("path", "/login"), descriptor("trusted_client", "c1"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("replaces: %v", r)
	}
	// unlimited.
	r = call(descriptor("health_check", "x"))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4294967295 {
		t.Fatalf("unlimited: %v", r)
	}
	// shadow: never denies.
	for i := 0; i < 4; i++ {
		if r := call(descriptor("experiment", "e")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow %d: %v", i, r)
		}
	}
	// blocked_user: requests_per_unit 0 denies everything.
	if r := call(descriptor("blocked_user", "b")); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("blocked: %v", r)
	}
	// Paid tier, token bucket with burst 200: 200 at once pass, paid metadata
	// comes back in dynamic_metadata.
	var allowed int
	start := time.Now()
	for i := 0; i < 250; i++ {
		r := call(descriptor("plan", "paid", "user", "u1"))
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			allowed++
			if r.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["plan"].GetStringValue() != "paid" {
				t.Fatalf("paid metadata missing: %v", r.DynamicMetadata)
			}
		} else if i < 200 {
			t.Fatalf("paid tier denied call %d within its burst of 200: %v", i, r)
		}
	}
	// The bucket refills at 100/s while the calls run.
	if most := 200 + int(time.Since(start).Seconds()*100) + 1; allowed > most {
		t.Fatalf("paid tier allowed %d of 250, more than the burst of 200 plus refill (%d)", allowed, most)
	}
	// Invalid request.
	_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "example"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no descriptors: %v", err)
	}
	// Health.
	h, err := healthpb.NewHealthClient(p.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
}

// TestExactUnderConcurrency: 100 concurrent clients on one key of the
// composite api_key limit allow exactly the binding limit.
func TestExactUnderConcurrency(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeFile(t, cfg, `
domain: exact
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 37, algorithm: token_bucket}
`)
	p := startServe(t, nil, "--config", cfg)
	c := p.client()
	ctx := ctxT(t)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 100; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", "v")}})
				if err != nil {
					t.Error(err)
					return
				}
				if r.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 37 {
		t.Fatalf("allowed %d of 500 concurrent requests, want exactly 37", ok.Load())
	}
}

// TestEnvironmentVariables starts the service from ENVOY_RLS_* variables only.
func TestEnvironmentVariables(t *testing.T) {
	p := startServe(t, []string{
		"ENVOY_RLS_CONFIG=" + repoFile("examples", "ratelimit.yaml"),
		"ENVOY_RLS_LOG_FORMAT=json",
		"ENVOY_RLS_MAX_KEYS=1000",
	})
	// /healthz answers before the line is logged and read from the pipe.
	testutil.WaitEvery(t, procPoll, 10*time.Second, "JSON log line", func() bool {
		return strings.Contains(p.Logs(), `"msg":"envoy-rls serving"`)
	})
	code, _ := p.postJSON(t, `{"domain":"example","descriptors":[{"entries":[{"key":"path","value":"/x"}]}]}`)
	if code != 200 {
		t.Fatalf("HTTP %d", code)
	}
	// A bad value in the environment is an error naming the variable.
	// Without --config the reference server's environment is read; its
	// default config directory does not exist here.
	out, err := exec.Command(binary, "serve").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no --config given") || !strings.Contains(string(out), "/srv/runtime_data/current/config") {
		t.Fatalf("serve without config: %v %s", err, out)
	}
	cmd := exec.Command(binary, "serve", "--config", repoFile("examples", "ratelimit.yaml"))
	cmd.Env = append(os.Environ(), "ENVOY_RLS_BACKEND_TIMEOUT=soon")
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ENVOY_RLS_BACKEND_TIMEOUT") {
		t.Fatalf("bad env value: %v %s", err, out)
	}
}

// TestCheckConfig runs `envoy-rls check-config` on the example and on a file
// with several errors: every error is reported as file:line: reason.
func TestCheckConfig(t *testing.T) {
	out, err := exec.Command(binary, "check-config", "--config", repoFile("examples", "ratelimit.yaml")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "valid") {
		t.Fatalf("example: %v %s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	writeFile(t, bad, `domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: magic}
  - key: c
    colour: red
`)
	cmd := exec.Command(binary, "check-config", "--config", bad)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if err == nil {
		t.Fatal("check-config accepted an invalid file")
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 errors, got:\n%s", stderr.String())
	}
	for i, want := range []string{bad + ":4:", bad + ":6:", bad + ":8:"} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("error %d = %q, want prefix %q", i, lines[i], want)
		}
	}
}

// TestConfigReload: a valid change is picked up by the watcher; an invalid
// one is logged with file:line and the previous config keeps serving.
func TestConfigReload(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "limits.yaml")
	writeFile(t, cfg, `
domain: r
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
`)
	p := startServe(t, nil, "--config", dir)
	body := `{"domain":"r","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	if code, _ := p.postJSON(t, body); code != 200 {
		t.Fatal(code)
	}
	if code, _ := p.postJSON(t, body); code != 429 {
		t.Fatalf("limit 1 allowed twice: %d", code)
	}
	// Invalid: logged, old config keeps serving.
	writeFile(t, cfg, `
domain: r
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: -5}
`)
	testutil.WaitEvery(t, procPoll, 10*time.Second, "reload error in the log", func() bool {
		return strings.Contains(p.Logs(), "config reload failed") && strings.Contains(p.Logs(), "limits.yaml:5")
	})
	if code, _ := p.postJSON(t, body); code != 429 {
		t.Fatalf("after invalid reload: %d, want the old limit to keep denying", code)
	}
	// Valid: a new limit for a new key; the old counter survives since its
	// limit did not change.
	writeFile(t, cfg, `
domain: r
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: n
    rate_limit: {unit: hour, requests_per_unit: 2}
`)
	testutil.WaitEvery(t, procPoll, 10*time.Second, "new config", func() bool {
		code, out := p.postJSON(t, `{"domain":"r","descriptors":[{"entries":[{"key":"n","value":"v"}],"hits_addend":0}]}`)
		return code == 200 && strings.Contains(out, "currentLimit")
	})
	if code, _ := p.postJSON(t, body); code != 429 {
		t.Fatalf("counter lost across reload: %d", code)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func httpGet(url string) (string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return b.String(), err
}
