package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// overloadL is the limit of every algorithm in overloadYAML: per day, so
// that nothing refills during a test.
const overloadL = 250

var overloadYAML = fmt.Sprintf(`
domain: exact
descriptors:
  - key: fixed_window
    rate_limit: {unit: day, requests_per_unit: %[1]d}
  - key: token_bucket
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: token_bucket}
  - key: gcra
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: gcra}
  - key: sliding_window_log
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: sliding_window_log}
  - key: sliding_window_counter
    rate_limit: {unit: day, requests_per_unit: %[1]d, algorithm: sliding_window_counter}
`, overloadL)

var algorithmKeys = []string{"fixed_window", "token_bucket", "gcra", "sliding_window_log", "sliding_window_counter"}

// overloadRun is the outcome of one burst.
type overloadRun struct {
	ok, overLimit, failed int64
}

// overloadBurst sends total calls for descriptor (key, value) from clients
// concurrent callers spread over procs, each call with deadline d.
func overloadBurst(procs []*proc, clients, total int, d time.Duration, key, value string) overloadRun {
	var ok, over, failed atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := procs[c%len(procs)].client()
			for next.Add(1) <= int64(total) {
				ctx, cancel := context.WithTimeout(context.Background(), d)
				r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{descriptor(key, value)},
				})
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					ok.Add(1)
				default:
					over.Add(1)
				}
			}
		}(c)
	}
	wg.Wait()
	return overloadRun{ok.Load(), over.Load(), failed.Load()}
}

// counted returns what the shared store counted for (key, value): the
// limit less what a check (hits_addend 0) reports remaining.
func counted(t *testing.T, p *proc, key, value string) int64 {
	t.Helper()
	d := descriptor(key, value)
	d.HitsAddend = wrapperspb.UInt64(0)
	r, err := p.client().ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "exact", Descriptors: []*commonv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatalf("check %s=%s: %v", key, value, err)
	}
	return overloadL - int64(r.Statuses[0].LimitRemaining)
}

func connectionsReceived(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	s, err := srv.Client().Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(regexp.MustCompile(`total_connections_received:(\d+)`).FindStringSubmatch(s)[1])
	return n
}

func overloadConfig(t *testing.T) string {
	cfg := filepath.Join(t.TempDir(), "exact.yaml")
	if err := os.WriteFile(cfg, []byte(overloadYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestOverloadWithCallerDeadlines: three instances with default flags on
// one redis-server, 20, 60 and 120 concurrent clients whose calls carry 2 s
// deadlines, each sending twice the limit: exactly the limit is allowed
// for every algorithm, nothing is decided by a fallback or fails open, and
// Redis counted exactly the calls answered OK. (With the old fixed 10 ms
// budget this allowed 306 / 620 / 1,110 of 250.)
func TestOverloadWithCallerDeadlines(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := overloadConfig(t)
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL())
	}
	levels := []int{20, 60, 120}
	if testing.Short() {
		levels = []int{20}
	}
	for _, clients := range levels {
		for _, key := range algorithmKeys {
			value := fmt.Sprintf("c%d", clients)
			r := overloadBurst(procs, clients, 2*overloadL, 2*time.Second, key, value)
			got := counted(t, procs[0], key, value)
			t.Logf("%3d clients %-22s ok %d over %d failed %d; Redis counted %d", clients, key, r.ok, r.overLimit, r.failed, got)
			if r.ok != overloadL || r.failed != 0 {
				t.Errorf("%d clients, %s: %d allowed and %d failed of %d, want exactly %d allowed", clients, key, r.ok, r.failed, 2*overloadL, overloadL)
			}
			if got != r.ok {
				t.Errorf("%d clients, %s: Redis counted %d, the calls allowed %d", clients, key, got, r.ok)
			}
		}
	}
	for i, p := range procs {
		if v := metricCount(t, p, "envoy_rls_requests_total", "code=failed_open", "domain=exact"); v != 0 {
			t.Errorf("instance %d failed open %v times", i, v)
		}
		if v := metricCount(t, p, "envoy_rls_redis_decisions_total", "path=local_fallback"); v != 0 {
			t.Errorf("instance %d decided %v calls on its fallback", i, v)
		}
	}
}

// TestOverloadWithEnvoyDeadlines: the same with Envoy's default 20 ms
// deadlines on a busy machine, where calls do miss their budget. The
// default failure mode (local) decides those on each instance's embedded
// store, so the allowed total stays within the documented bound (the limit
// in Redis plus one limit per instance), every call answered OK is counted
// in Redis (read here as the limit less what remains, which stops at the
// limit; TestFailureModes reads the count itself), and timed-out calls do
// not close connections: Redis sees no more than the pools' size.
func TestOverloadWithEnvoyDeadlines(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := overloadConfig(t)
	const pool = 4
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL(), "--redis-pool-size", strconv.Itoa(pool))
	}
	before := connectionsReceived(t, srv)
	var fallbacks float64
	for _, key := range algorithmKeys {
		r := overloadBurst(procs, 120, 4*overloadL, 20*time.Millisecond, key, "envoy")
		// Wait for the write-backs, then read the count.
		testutil.WaitEvery(t, procPoll, 20*time.Second, "write-backs sent", func() bool {
			for _, p := range procs {
				if metricCount(t, p, "envoy_rls_redis_write_back_pending") != 0 {
					return false
				}
			}
			return true
		})
		got := counted(t, procs[0], key, "envoy")
		t.Logf("120 clients, 20ms, %-22s ok %d over %d failed %d; Redis counted %d", key, r.ok, r.overLimit, r.failed, got)
		if bound := int64(overloadL * (1 + len(procs))); r.ok > bound {
			t.Errorf("%s: %d allowed, more than the bound %d", key, r.ok, bound)
		}
		if want := min(r.ok, overloadL); got < want {
			t.Errorf("%s: Redis counted %d, want at least %d (the calls allowed, up to the limit)", key, got, want)
		}
	}
	for _, p := range procs {
		fallbacks += metricCount(t, p, "envoy_rls_redis_decisions_total", "path=local_fallback")
		if v := metricCount(t, p, "envoy_rls_requests_total", "code=failed_open", "domain=exact"); v != 0 {
			t.Errorf("failed open %v times", v)
		}
	}
	made := connectionsReceived(t, srv) - before - 1 // less the INFO client's own
	t.Logf("local fallback decisions: %v; connections made: %d", fallbacks, made)
	if made > len(procs)*pool {
		list, _ := srv.Client().ClientList(context.Background()).Result()
		t.Logf("client list:\n%s", list)
		t.Errorf("%d connections for 3 pools of %d: timeouts closed connections", made, pool)
	}
}

// TestRedisEvictionPolicyWarning: started against a Redis whose
// maxmemory-policy can evict counters, the service says so in its log and
// in envoy_rls_redis_evicting_servers.
func TestRedisEvictionPolicyWarning(t *testing.T) {
	srv := redistest.StartStandalone(t)
	admin := srv.Client()
	for _, kv := range [][2]string{{"maxmemory", "64mb"}, {"maxmemory-policy", "allkeys-lru"}} {
		if err := admin.ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	p := startServe(t, nil, "--config", overloadConfig(t), "--backend", "redis", "--redis-url", srv.URL())
	counted(t, p, "fixed_window", "x") // connects
	testutil.WaitEvery(t, procPoll, 10*time.Second, "the eviction warning", func() bool {
		return strings.Contains(p.Logs(), "redis evicts rate limit counters") &&
			metricCount(t, p, "envoy_rls_redis_evicting_servers") == 1
	})
}
