package integration

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// exactYAML has one limit per algorithm, each allowing exactly 40 hits in
// the test's lifetime (an hour-long window, no meaningful refill).
const exactYAML = `
domain: exact
descriptors:
  - key: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 40}
  - key: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 40, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: hour, requests_per_unit: 40, algorithm: gcra}
  - key: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 40, algorithm: sliding_window_log}
  - key: sliding_window_counter
    rate_limit: {unit: hour, requests_per_unit: 40, algorithm: sliding_window_counter}
`

// hammer sends, from clients concurrent callers spread over procs, perClient
// requests each for descriptor (key, value), and returns how many were
// allowed.
func hammer(t *testing.T, procs []*proc, clients, perClient int, key, value string) int64 {
	t.Helper()
	ctx := ctxT(t)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := procs[c%len(procs)].client()
			for i := 0; i < perClient; i++ {
				r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor(key, value)},
				})
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				if r.OverallCode == rlsv3.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		}(c)
	}
	wg.Wait()
	return ok.Load()
}

// startInstances starts n envoy-rls processes on the Redis backend.
func startInstances(t *testing.T, n int, cfg string, redisArgs ...string) []*proc {
	t.Helper()
	procs := make([]*proc, n)
	for i := range procs {
		args := append([]string{"--config", cfg, "--backend", "redis", "--backend-timeout", "2s"}, redisArgs...)
		procs[i] = startServe(t, nil, args...)
	}
	return procs
}

// TestRedisExactAcrossInstances: three envoy-rls processes share one Redis;
// 120 concurrent clients send 360 requests for one key with limit 40:
// exactly 40 are allowed, for every algorithm.
func TestRedisExactAcrossInstances(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	procs := startInstances(t, 3, cfg, "--redis-url", srv.URL())
	for _, alg := range []string{"fixed_window", "token_bucket", "gcra", "sliding_window_log", "sliding_window_counter"} {
		if got := hammer(t, procs, 120, 3, alg, "shared"); got != 40 {
			t.Errorf("%s: %d allowed across 3 instances, want exactly 40", alg, got)
		}
	}
}

// TestRedisClusterExactAcrossInstances: the same on a three-master Redis
// Cluster created by the test.
func TestRedisClusterExactAcrossInstances(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	procs := startInstances(t, 3, cfg, "--redis-cluster", strings.Join(cl.Addrs(), ","))
	// Values chosen to spread the keys over the masters.
	for i, alg := range []string{"fixed_window", "token_bucket", "gcra", "sliding_window_log", "sliding_window_counter"} {
		if got := hammer(t, procs, 120, 3, alg, "v"+strconv.Itoa(i)); got != 40 {
			t.Errorf("%s: %d allowed across 3 instances on a cluster, want exactly 40", alg, got)
		}
	}
}

// TestRedisSentinel: envoy-rls finds the master through Sentinel.
func TestRedisSentinel(t *testing.T) {
	master := redistest.StartStandalone(t)
	sentinel := redistest.StartSentinel(t, master, "rls")
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	procs := startInstances(t, 2, cfg, "--redis-sentinel", sentinel.Addr(), "--redis-sentinel-master", "rls")
	if got := hammer(t, procs, 20, 3, "gcra", "s"); got != 40 {
		t.Fatalf("through sentinel: %d allowed, want 40", got)
	}
	// The counters live on the master.
	keys, err := master.Client().Keys(context.Background(), "*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("no keys on the master: %v %v", keys, err)
	}
}

func goroutines(t *testing.T, p *proc) int {
	t.Helper()
	return int(metricValue(t, p, "go_goroutines"))
}

// TestRedisFailureAndRecovery kills redis-server under load and starts it
// again on the same port. Neither instance crashes, no call is held past
// its deadline, --failure-mode is observed while Redis is down (allow
// answers OK, deny answers UNAVAILABLE), answers are normal again once
// Redis is back, and the goroutine count returns to its level before.
func TestRedisFailureAndRecovery(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	const backendTimeout = 50 * time.Millisecond
	common := []string{"--config", cfg, "--backend", "redis", "--redis-url", srv.URL(), "--backend-timeout", backendTimeout.String()}
	allow := startServe(t, nil, append(common, "--failure-mode", "allow")...)
	deny := startServe(t, nil, append(common, "--failure-mode", "deny")...)

	// Normal answers first; a limit of 40 in an hour.
	for _, p := range []*proc{allow, deny} {
		r, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("gcra", "f")}})
		if err != nil || r.Statuses[0].CurrentLimit == nil || r.Statuses[0].LimitRemaining == 0 {
			t.Fatalf("before the failure: %v %v", r, err)
		}
	}
	baseAllow, baseDeny := goroutines(t, allow), goroutines(t, deny)

	// Load on both instances for the whole test: even callers on allow,
	// odd ones on deny.
	const callDeadline = 1 * time.Second
	procOf := func(c int) *proc {
		if c%2 == 1 {
			return deny
		}
		return allow
	}
	ld := startLoad(16, callDeadline, func(c int) rlsv3.RateLimitServiceClient { return procOf(c).client() },
		func(c, i int) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{
				descriptor("token_bucket", fmt.Sprintf("c%d-%d", c, i%50)),
			}}
		})
	isDeny := func(s sample) bool { return s.client%2 == 1 }
	countSince := ld.count
	testutil.WaitEvery(t, procPoll, 10*time.Second, "load before the failure", func() bool {
		return countSince(time.Time{}, func(s sample) bool { return s.err == nil }) > 100
	})

	srv.Stop()
	down := time.Now()
	// While Redis is down: deny answers UNAVAILABLE, allow answers OK.
	testutil.WaitEvery(t, procPoll, 10*time.Second, "failure policy while Redis is down", func() bool {
		unavailable := countSince(down, func(s sample) bool { return isDeny(s) && status.Code(s.err) == codes.Unavailable })
		openOK := countSince(down, func(s sample) bool {
			return !isDeny(s) && s.err == nil && s.code == rlsv3.RateLimitResponse_OK
		})
		return unavailable >= 20 && openOK >= 20
	})
	if n := countSince(down, func(s sample) bool { return !isDeny(s) && s.err != nil }); n > 0 {
		t.Errorf("fail-open instance returned %d errors while Redis was down", n)
	}

	srv.Restart()
	up := time.Now()
	testutil.WaitEvery(t, procPoll, 15*time.Second, "normal answers after Redis returns", func() bool {
		ok := countSince(up, func(s sample) bool { return isDeny(s) && s.err == nil && s.code == rlsv3.RateLimitResponse_OK })
		return ok >= 20
	})
	ld.stop()

	// No call was held past its deadline: each is bounded by
	// --backend-timeout plus scheduling slack on a busy machine.
	var worst time.Duration
	for _, s := range ld.all() {
		worst = max(worst, s.latency)
		if status.Code(s.err) == codes.DeadlineExceeded {
			t.Errorf("a call ran into its %v deadline (latency %v)", callDeadline, s.latency)
			break
		}
	}
	if limit := backendTimeout + 700*time.Millisecond; worst > limit {
		t.Errorf("slowest call took %v, more than --backend-timeout %v plus slack", worst, backendTimeout)
	}

	// Both processes are still alive and the limits work again.
	for _, p := range []*proc{allow, deny} {
		select {
		case <-p.exited:
			t.Fatalf("envoy-rls exited:\n%s", p.Logs())
		default:
		}
		r, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("gcra", "after")}})
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 39 && r.Statuses[0].LimitRemaining != 38 {
			t.Fatalf("after recovery: %v %v", r, err)
		}
	}
	// No goroutine leak: back to the level before the failure (small
	// allowance for connection pool churn).
	testutil.WaitEvery(t, procPoll, 10*time.Second, "goroutines back to the level before the failure", func() bool {
		return goroutines(t, allow) <= baseAllow+8 && goroutines(t, deny) <= baseDeny+8
	})
	// The failures were logged, without flooding: at most one line per 10 s.
	for _, p := range []*proc{allow, deny} {
		if n := strings.Count(p.Logs(), "rate limit backend failed"); n < 1 || n > 3 {
			t.Errorf("want 1-3 backend failure log lines, got %d:\n%s", n, p.Logs())
		}
	}
}

// TestRedisDownAtStart: the service starts while Redis is down, answers by
// its failure policy, and works once Redis comes up.
func TestRedisDownAtStart(t *testing.T) {
	srv := redistest.StartStandalone(t)
	srv.Stop()
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	writeFile(t, cfg, exactYAML)
	p := startServeUnready(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL(), "--failure-mode", "deny", "--backend-timeout", "50ms")
	req := &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("fixed_window", "x")}}
	_, err := p.client().ShouldRateLimit(ctxT(t), req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("while Redis is down: %v, want UNAVAILABLE", err)
	}
	// The reference's /healthcheck: unhealthy until Redis first answers.
	if code, _ := httpGetCode(p.httpURL + "/healthcheck"); code != 500 {
		t.Fatalf("/healthcheck while Redis was never reachable: %d, want 500", code)
	}
	srv.Restart()
	testutil.WaitEvery(t, procPoll, 15*time.Second, "answers once Redis is up", func() bool {
		r, err := p.client().ShouldRateLimit(ctxT(t), req)
		return err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK
	})
	testutil.WaitEvery(t, procPoll, 15*time.Second, "/healthcheck 200 once Redis answered", func() bool {
		code, body := httpGetCode(p.httpURL + "/healthcheck")
		return code == 200 && body == "OK"
	})
	// Later outages do not flip it: the failure mode answers calls.
	srv.Stop()
	if code, _ := httpGetCode(p.httpURL + "/healthcheck"); code != 200 {
		t.Fatalf("/healthcheck after Redis went away again: %d, want 200", code)
	}
}
