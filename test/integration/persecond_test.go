package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

const perSecondConfig = `domain: persecond
descriptors:
  - key: per_second_api
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: per_hour_user
    rate_limit: {unit: hour, requests_per_unit: 2}
`

// serverKeys lists a redis-server's keys.
func serverKeys(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	ks, err := srv.Client().Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(ks, "\n")
}

// TestReferencePerSecondRedis runs the binary with no arguments and the
// reference's environment with REDIS_PERSECOND=true and two redis-servers:
// it is not ready until both answer; the counters of the SECOND limit land
// in the per-second Redis only, the hour limit's in the main one only; a
// request with both limits is decided as a whole (the hour limit denies the
// third); the Redis metrics say which Redis they count.
func TestReferencePerSecondRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	mainSrv, psSrv := redistest.StartStandalone(t), redistest.StartStandalone(t)
	root := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(root, "ratelimit", "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(root, "ratelimit", "config", "config.yaml"), perSecondConfig)

	// The per-second Redis is down at start-up: not ready, and /healthz
	// says which Redis it waits for.
	psSrv.Stop()
	clearOfHourEnd(t)
	grpcPort, httpPort := testutil.FreePort(t), testutil.FreePort(t)
	p := &proc{grpcAddr: fmt.Sprintf("127.0.0.1:%d", grpcPort), httpURL: fmt.Sprintf("http://127.0.0.1:%d", httpPort), exited: make(chan struct{})}
	p.cmd = exec.Command(binary)
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", fmt.Sprintf("PORT=%d", httpPort), "GRPC_HOST=127.0.0.1", fmt.Sprintf("GRPC_PORT=%d", grpcPort),
		"DEBUG_HOST=127.0.0.1", fmt.Sprintf("DEBUG_PORT=%d", testutil.FreePort(t)),
		"USE_STATSD=false", "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + mainSrv.Addr(),
		"REDIS_PERSECOND=true", "REDIS_PERSECOND_SOCKET_TYPE=tcp", "REDIS_PERSECOND_URL=" + psSrv.Addr(),
		"REDIS_PERSECOND_POOL_SIZE=4", "REDIS_PERSECOND_TIMEOUT=2s",
	}
	startProc(t, p)
	testutil.WaitEvery(t, procPoll, 30*time.Second, "/healthz 503 naming the per-second Redis", func() bool {
		select {
		case <-p.exited:
			t.Fatalf("envoy-rls exited:\n%s", p.Logs())
		default:
		}
		code, body := httpGetCode(p.httpURL + "/healthz")
		return code == 503 && strings.Contains(body, "per-second")
	})
	if code, _ := httpGetCode(p.httpURL + "/healthcheck"); code != 500 {
		t.Fatalf("/healthcheck %d with the per-second Redis down, want 500", code)
	}
	psSrv.Restart()
	testutil.WaitEvery(t, procPoll, 30*time.Second, "/healthcheck 200 once both Redis answer", func() bool {
		code, _ := httpGetCode(p.httpURL + "/healthcheck")
		return code == 200
	})
	var err error
	if p.conn, err = grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })

	call := func(ds ...*commonv3.RateLimitDescriptor) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "persecond", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	api, user := descriptor("per_second_api", "a"), descriptor("per_hour_user", "u")
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call(api, user); got != want {
			t.Fatalf("mixed request %d: %v, want %v", i+1, got, want)
		}
	}
	if k := serverKeys(t, mainSrv); !strings.Contains(k, "per_hour_user") || strings.Contains(k, "per_second_api") {
		t.Errorf("main Redis keys:\n%s\nwant the hour limit's counter only", k)
	}
	if k := serverKeys(t, psSrv); strings.Contains(k, "per_hour_user") {
		t.Errorf("per-second Redis keys:\n%s\nhold the hour limit's counter", k)
	}
	// A second-long counter lives until its window ends: charge it and
	// read it back until both happen in one window.
	testutil.WaitEvery(t, procPoll, 10*time.Second, "the per-second counter in the per-second Redis", func() bool {
		if got := call(api); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("per-second request: %v", got)
		}
		return strings.Contains(serverKeys(t, psSrv), "per_second_api")
	})
	if k := serverKeys(t, mainSrv); strings.Contains(k, "per_second_api") {
		t.Errorf("main Redis keys:\n%s\nhold the per-second counter", k)
	}

	if v := metricCount(t, p, "envoy_rls_redis_requests_total", "redis=persecond"); v < 1 {
		t.Errorf("envoy_rls_redis_requests_total{redis=\"persecond\"} = %v", v)
	}
	if v := metricCount(t, p, "envoy_rls_redis_requests_total", "redis=main"); v < 1 {
		t.Errorf("envoy_rls_redis_requests_total{redis=\"main\"} = %v", v)
	}
	if v := metricCount(t, p, "envoy_rls_redis_persecond_mixed_requests_total"); v != 3 {
		t.Errorf("envoy_rls_redis_persecond_mixed_requests_total = %v, want 3", v)
	}
	if v := metricCount(t, p, "envoy_rls_redis_persecond_overcharged_total"); v != 0 {
		t.Errorf("envoy_rls_redis_persecond_overcharged_total = %v, want 0 (no concurrency)", v)
	}
}

// exactPerSecondYAML gives one descriptor a per-second and an hour limit
// (a composite: both must allow), which land on different Redis servers.
const exactPerSecondYAML = `
domain: exact
descriptors:
  - key: composite
    rate_limits:
      - {unit: hour, requests_per_unit: 40}
      - {unit: second, requests_per_unit: 1000000}
`

// Two instances sharing a main and a per-second Redis, hammered with a
// descriptor whose limits live on both: the hour limit holds exactly, and
// the per-second counters are over-charged only for calls that raced the
// hour limit filling up (at most one per concurrent caller).
func TestPerSecondRedisExactAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("process-heavy")
	}
	mainSrv, psSrv := redistest.StartStandalone(t), redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactPerSecondYAML)
	procs := startInstances(t, 2, cfg, "--redis-url", mainSrv.URL(), "--redis-persecond-url", psSrv.URL())
	const clients = 8
	if ok := hammer(t, procs, clients, 15, "composite", "x"); ok != 40 {
		t.Fatalf("%d allowed, want exactly 40", ok)
	}
	var mixed, over float64
	for _, p := range procs {
		mixed += metricCount(t, p, "envoy_rls_redis_persecond_mixed_requests_total")
		over += metricCount(t, p, "envoy_rls_redis_persecond_overcharged_total")
	}
	if mixed != clients*15 {
		t.Errorf("%v mixed requests, want %d", mixed, clients*15)
	}
	if over > clients {
		t.Errorf("%v requests over-charged the per-second counter, more than one per caller (%d)", over, clients)
	}
	t.Logf("over-charged: %v of %v mixed requests", over, mixed)
}
