package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// failoverYAML allows 5 hits per key and hour.
const failoverYAML = `
domain: failover
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// TestRedisSentinelFailover kills the master behind a Sentinel while one
// envoy-rls (--failure-mode deny) is under load, and lets Sentinel promote
// the replica. The process stays up; while no master answers, calls are
// UNAVAILABLE within --backend-timeout plus slack, never held to their
// deadline; once the replica is promoted, the same process answers
// normally again, and a fresh key's limit is exact on the new master.
// Counts written just before the failure may be lost (replication is
// asynchronous), so the test asserts nothing about them.
func TestRedisSentinelFailover(t *testing.T) {
	master := redistest.StartStandalone(t)
	replica := redistest.StartReplica(t, master)
	sentinel := redistest.StartFailoverSentinel(t, master, "rls", replica)

	cfg := filepath.Join(t.TempDir(), "failover.yaml")
	writeFile(t, cfg, failoverYAML)
	const backendTimeout = 200 * time.Millisecond
	p := startServe(t, nil, "--config", cfg, "--backend", "redis",
		"--redis-sentinel", sentinel.Addr(), "--redis-sentinel-master", "rls",
		"--failure-mode", "deny", "--backend-timeout", backendTimeout.String())
	client := p.client()
	req := func(value string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "failover", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", value)}}
	}

	// The limit works through the first master.
	for i := 0; i < 7; i++ {
		r, err := client.ShouldRateLimit(ctxT(t), req("before"))
		if err != nil {
			t.Fatalf("call %d before the failover: %v", i, err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i >= 5 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r.OverallCode != want {
			t.Fatalf("call %d before the failover: %v, want %v", i, r.OverallCode, want)
		}
	}

	// Load for the whole failover: each call a fresh key (never over its
	// limit), so every answer is OK or, without a master, UNAVAILABLE.
	const callDeadline = 2 * time.Second
	ld := startLoad(4, callDeadline, func(int) rlsv3.RateLimitServiceClient { return client },
		func(c, i int) *rlsv3.RateLimitRequest { return req(fmt.Sprintf("load-%d-%d", c, i)) })
	count := ld.count
	ok := func(s sample) bool { return s.err == nil && s.code == rlsv3.RateLimitResponse_OK }
	unavailable := func(s sample) bool { return status.Code(s.err) == codes.Unavailable }
	testutil.WaitEvery(t, procPoll, 10*time.Second, "answers before the failure", func() bool {
		return count(time.Time{}, ok) >= 20
	})

	master.Stop() // SIGKILL
	down := time.Now()
	testutil.WaitEvery(t, procPoll, 10*time.Second, "UNAVAILABLE while there is no master", func() bool {
		return count(down, unavailable) >= 4
	})
	redistest.WaitPromoted(t, sentinel, "rls", replica, 20*time.Second)
	promoted := time.Now()
	testutil.WaitEvery(t, procPoll, 10*time.Second, "OK answers through the promoted replica", func() bool {
		return count(promoted, ok) >= 20
	})
	ld.stop()

	select {
	case <-p.exited:
		t.Fatalf("envoy-rls exited during the failover:\n%s", p.Logs())
	default:
	}

	// Every answer was OK or UNAVAILABLE, and none was held to its
	// deadline: a call without a master is bounded by --backend-timeout
	// plus scheduling slack on a busy machine.
	samples := ld.all()
	var worst time.Duration
	for _, s := range samples {
		worst = max(worst, s.latency)
		if !ok(s) && !unavailable(s) {
			t.Errorf("unexpected answer during the failover: code %v, error %v (latency %v)", s.code, s.err, s.latency)
		}
	}
	total := len(samples)
	var back time.Time // the first OK call sent after the kill
	for _, s := range samples {
		if s.at.After(down) && ok(s) && (back.IsZero() || s.at.Before(back)) {
			back = s.at
		}
	}
	if limit := backendTimeout + 800*time.Millisecond; worst > limit {
		t.Errorf("slowest call took %v, more than --backend-timeout %v plus slack", worst, backendTimeout)
	}
	t.Logf("%d calls; %d UNAVAILABLE; slowest %v; promotion seen %v and first OK call %v after the kill",
		total, count(time.Time{}, unavailable), worst, promoted.Sub(down).Round(time.Millisecond), back.Sub(down).Round(time.Millisecond))

	// A fresh key's limit is exact on the new master: 5 of 20.
	allowed := 0
	for i := 0; i < 20; i++ {
		r, err := client.ShouldRateLimit(ctxT(t), req("after-failover"))
		if err != nil {
			t.Fatalf("call %d after the failover: %v", i, err)
		}
		if r.OverallCode == rlsv3.RateLimitResponse_OK {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("after the failover: %d of 20 allowed, want exactly 5", allowed)
	}
	// The counter lives on the promoted replica.
	keys, err := replica.Client().Keys(ctxT(t), "*after-failover*").Result()
	if err != nil || len(keys) != 1 {
		t.Errorf("counter on the promoted replica: keys %q, error %v; want one", keys, err)
	}
}
