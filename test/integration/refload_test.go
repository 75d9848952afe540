package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
	"github.com/envoyrls/envoy-rls/internal/xdstest"
)

// callErr makes one call and returns its error (nil when answered).
func (p *proc) callErr(t *testing.T, domain string, kv ...string) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	return p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*commonv3.RateLimitDescriptor{descriptor(kv...)}})
}

// grpcHealth returns the gRPC health of the service name "ratelimit".
func (p *proc) grpcHealth(t *testing.T) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	hr, err := healthpb.NewHealthClient(p.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		t.Fatal(err)
	}
	return hr.Status
}

// noConfig reports whether err is the reference's answer without a config.
func noConfig(err error) bool {
	return status.Code(err) == codes.Unknown && strings.Contains(err.Error(), "no rate limit configuration loaded")
}

// TestReferenceFileLayout: under the reference's environment the config
// directory is read as its runtime loader reads it: every file whatever its
// name (a ConfigMap key without .yaml), subdirectories, several documents
// per file (an Envoy Gateway dump), MERGE_DOMAIN_CONFIG putting one domain's
// files together, and LIMIT_*_HEADER naming the quota headers.
func TestReferenceFileLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	root := filepath.Join(t.TempDir(), "data")
	cm := &configMapDir{dir: filepath.Join(root, "ratelimit", "config")}
	cm.publish(t, map[string]string{
		"ratelimit-config": "domain: shop\ndescriptors:\n  - key: path\n    value: /cart\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
		"more.yaml":        "domain: shop\ndescriptors:\n  - key: path\n    value: /pay\n    rate_limit: {unit: hour, requests_per_unit: 2}\n---\nname: gw/shared\ndomain: gw/shared\ndescriptors:\n  - key: generic_key\n    value: all\n    rate_limit: {unit: HOUR, requests_per_unit: 1, unlimited: false, name: '', replaces: []}\n    descriptors: []\n    shadow_mode: false\n    quota_mode: false\n    detailed_metric: false\n    value_to_metric: false\n    share_threshold: false\n",
	})
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config", "team-b"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "ratelimit", "config", "team-b", "b.conf"), "domain: team-b\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	rdb := redistest.StartStandalone(t)
	p, debugURL := startReference(t, []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rdb.Addr(), "USE_STATSD=false",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"MERGE_DOMAIN_CONFIG=true",
		"LIMIT_RESPONSE_HEADERS_ENABLED=true", "LIMIT_LIMIT_HEADER=X-Quota-Limit", "LIMIT_REMAINING_HEADER=X-Quota-Remaining", "LIMIT_RESET_HEADER=X-Quota-Reset",
	})
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	p.expectCodes(t, "shop", []string{"path", "/cart"}, ok, over)
	p.expectCodes(t, "shop", []string{"path", "/pay"}, ok, ok, over)
	p.expectCodes(t, "gw/shared", []string{"generic_key", "all"}, ok, over)
	p.expectCodes(t, "team-b", []string{"k", "v"}, ok, over)

	resp, err := p.callErr(t, "shop", "path", "/cart")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		got[h.Key] = h.Value
	}
	if got["X-Quota-Limit"] != "1" || got["X-Quota-Remaining"] != "0" || got["X-Quota-Reset"] == "" || got["RateLimit-Limit"] != "" {
		t.Errorf("headers %v, want X-Quota-Limit 1, X-Quota-Remaining 0 and X-Quota-Reset", got)
	}

	// A change inside a subdirectory reloads (the reference sees changes
	// of its directory only).
	sub := filepath.Join(root, "ratelimit", "config", "team-b")
	writeFile(t, filepath.Join(sub, "b.conf.tmp"), "domain: team-b\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
	if err := os.Rename(filepath.Join(sub, "b.conf.tmp"), filepath.Join(sub, "b.conf")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the subdirectory's change in /rlconfig", func() bool {
		_, body := httpGetCode(debugURL + "/rlconfig")
		return strings.Contains(body, "team-b.k: unit=HOUR requests_per_unit=5")
	})
}

// TestReferenceStartsWithInvalidConfig: as the reference, a config that
// does not load at start does not stop the server: calls fail with "no rate
// limit configuration loaded", /healthcheck follows
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, and the first valid config is
// picked up when the files change (here a ConfigMap update).
func TestReferenceStartsWithInvalidConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	for _, healthy := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"}[healthy], func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "data")
			cm := &configMapDir{dir: filepath.Join(root, "ratelimit", "config")}
			cm.publish(t, map[string]string{"config.yaml": "domain: shop\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
			rdb := redistest.StartStandalone(t)
			env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rdb.Addr(), "USE_STATSD=false",
				"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true"}
			health := 200
			if healthy {
				env = append(env, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true")
				health = 500
			}
			p, _ := startReferenceHealth(t, health, env)
			if got, want := p.grpcHealth(t), map[bool]healthpb.HealthCheckResponse_ServingStatus{false: healthpb.HealthCheckResponse_SERVING, true: healthpb.HealthCheckResponse_NOT_SERVING}[healthy]; got != want {
				t.Errorf("gRPC health %v without a config, want %v", got, want)
			}
			if _, err := p.callErr(t, "shop", "path", "/cart"); !noConfig(err) {
				t.Fatalf("call without a config: %v, want Unknown: no rate limit configuration loaded", err)
			}
			if logs := p.Logs(); !strings.Contains(logs, "config.yaml:4") || !strings.Contains(logs, "fortnight") {
				t.Errorf("the load error is not logged with file:line and reason:\n%s", logs)
			}
			cm.publish(t, map[string]string{"config.yaml": "domain: shop\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"})
			testutil.WaitEvery(t, procPoll, 30*time.Second, "the valid config", func() bool {
				_, err := p.callErr(t, "shop", "path", "/cart")
				return err == nil
			})
			p.expectCodes(t, "shop", []string{"path", "/cart"}, rlsv3.RateLimitResponse_OVER_LIMIT)
			if code, _ := httpGetCode(p.httpURL + "/healthcheck"); code != 200 {
				t.Errorf("/healthcheck %d with a config loaded", code)
			}
			if got := p.grpcHealth(t); got != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health %v with a config loaded", got)
			}
		})
	}
}

// TestServeInvalidConfigAtStart: `serve --config` fails fast by default
// (exit 1, every error as file:line: reason); with
// --force-start-without-initial-config it serves without a config, reports
// unhealthy under --health-requires-config, and loads the file once it is
// fixed.
func TestServeInvalidConfigAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "ratelimit.yaml")
	writeFile(t, file, "domain: shop\ndescriptors:\n  - key: path\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")

	_, stderr, code := runBinary(t, nil, "serve", "--config", file, "--grpc-addr", "127.0.0.1:0", "--http-addr", "")
	if code != 1 || !strings.Contains(stderr, file+":4: invalid unit \"fortnight\"") {
		t.Fatalf("fail fast: exit %d, stderr:\n%s", code, stderr)
	}

	// Not ready without a config: /healthz says why, /healthcheck 500,
	// gRPC health NOT_SERVING.
	p := startServeHealth(t, 503, nil, "--config", file, "--force-start-without-initial-config", "--health-requires-config")
	if code, body := httpGetCode(p.httpURL + "/healthz"); code != 503 || !strings.Contains(body, "no config with a domain loaded yet") {
		t.Errorf("/healthz %d %q without a config", code, body)
	}
	if code, _ := httpGetCode(p.httpURL + "/healthcheck"); code != 500 {
		t.Errorf("/healthcheck %d without a config, want 500", code)
	}
	if got := p.grpcHealth(t); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health %v without a config", got)
	}
	if _, err := p.callErr(t, "shop", "path", "/cart"); !noConfig(err) {
		t.Fatalf("call without a config: %v", err)
	}
	_, metrics := httpGetCode(p.httpURL + "/metrics")
	if !strings.Contains(metrics, `envoy_rls_config_loads_total{result="error"} 1`) {
		t.Errorf("the failed load is not counted:\n%s", grepLines(metrics, "config_load"))
	}
	tmp := file + ".tmp"
	writeFile(t, tmp, "domain: shop\ndescriptors:\n  - key: path\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the fixed config", func() bool {
		_, err := p.callErr(t, "shop", "path", "/cart")
		return err == nil
	})
	if code, _ := httpGetCode(p.httpURL + "/healthcheck"); code != 200 {
		t.Errorf("/healthcheck %d with a config loaded", code)
	}
	if code, _ := httpGetCode(p.httpURL + "/healthz"); code != 200 {
		t.Errorf("/healthz %d with a config loaded", code)
	}
	if got := p.grpcHealth(t); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health %v with a config loaded", got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCheckConfigAsReference: check-config takes the reference checker's
// -merge_domain_configs (as --merge-domain-config) and the file selection
// flags.
func TestCheckConfigAsReference(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "1.yaml"), "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	writeFile(t, filepath.Join(dir, "2"), "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	stdout, stderr, code := runBinary(t, nil, "check-config", "--config", dir)
	if code != 0 || !strings.Contains(stdout, "valid (1 domains)") {
		t.Errorf("yaml only: exit %d\n%s%s", code, stdout, stderr)
	}
	_, stderr, code = runBinary(t, nil, "check-config", "--config", dir, "--config-all-files")
	if code != 1 || !strings.Contains(stderr, filepath.Join(dir, "2")+`:1: duplicate domain "d"`) {
		t.Errorf("all files: exit %d\n%s", code, stderr)
	}
	stdout, stderr, code = runBinary(t, nil, "check-config", "--config", dir, "--config-all-files", "--merge-domain-config")
	if code != 0 || !strings.Contains(stdout, "valid (1 domains)") {
		t.Errorf("merged: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestXDSHealthAndMerge: over xDS with FORCE_START_WITHOUT_INITIAL_CONFIG
// and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, /healthcheck and gRPC health
// say not serving until the first config arrives; with MERGE_DOMAIN_CONFIG
// two resources of one domain are merged.
func TestXDSHealthAndMerge(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	cp := xdstest.Start(t, nil)
	rdb := redistest.StartStandalone(t)
	p, _ := startReferenceHealth(t, 500, []string{
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rdb.Addr(), "USE_STATSD=false",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + cp.Addr, "CONFIG_GRPC_XDS_NODE_ID=" + xdstest.NodeID,
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true", "MERGE_DOMAIN_CONFIG=true",
	})
	if got := p.grpcHealth(t); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health %v before the first config", got)
	}
	if _, err := p.client().ShouldRateLimit(ctxT(t), egRequest("gw/http", "rule-a", "alice", "10.0.0.1")); !noConfig(err) {
		t.Fatalf("call before the first config: %v", err)
	}
	a, b := egRateLimitConfig("gw/http", "rule-a", 1), egRateLimitConfig("gw/http", "rule-b", 2)
	b.Name = "gw/http-part-2"
	v := cp.Set(t, a, b)
	cp.WaitRequest(t, "ACK of version "+v, xdstest.ACKed(v))
	testutil.WaitEvery(t, procPoll, 10*time.Second, "/healthcheck 200", func() bool {
		code, _ := httpGetCode(p.httpURL + "/healthcheck")
		return code == 200
	})
	if got := p.grpcHealth(t); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health %v with a config", got)
	}
	for rule, want := range map[string][]rlsv3.RateLimitResponse_Code{
		"rule-a": {rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT},
		"rule-b": {rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		for i, w := range want {
			resp, err := p.client().ShouldRateLimit(ctxT(t), egRequest("gw/http", rule, "alice", "10.0.0.1"))
			if err != nil || resp.OverallCode != w {
				t.Fatalf("%s call %d: %v %v, want %v", rule, i+1, resp.GetOverallCode(), err, w)
			}
		}
	}
}
