package integration

import (
	"context"
	bin "encoding/binary"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/internal/redistest"
)

// leaseYAML: one limit of 300 an hour, consistency lease.
const leaseYAML = `
domain: lease
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 300, consistency: lease}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 300, algorithm: token_bucket, consistency: lease}
`

// leaseHammer sends, from clients callers spread over procs, requests of
// deadline each for user=value until stop is closed or each sent perClient,
// and counts the allowed ones and the errors.
func leaseHammer(procs []*proc, clients, perClient int, deadline time.Duration, value string, stop <-chan struct{}) (ok, errs int64) {
	return leaseHammerKey(procs, clients, perClient, deadline, "user", value, stop)
}

func leaseHammerKey(procs []*proc, clients, perClient int, deadline time.Duration, key, value string, stop <-chan struct{}) (ok, errs int64) {
	var allowed, failed atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			client := procs[c%len(procs)].client()
			for range perClient {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: "lease", Descriptors: []*commonv3.RateLimitDescriptor{descriptor(key, value)},
				})
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					allowed.Add(1)
				}
			}
		}(c)
	}
	wg.Wait()
	return allowed.Load(), failed.Load()
}

// redisCount returns the count of the one fixed-window state in srv
// (0 when there is none).
func redisCount(t *testing.T, srv *redistest.Server) float64 {
	t.Helper()
	ctx := ctxT(t)
	c := srv.Client()
	keys, err := c.Keys(ctx, "*user*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, k := range keys {
		v, err := c.Get(ctx, k).Result()
		if err != nil || len(v) != 17 {
			continue
		}
		n += math.Float64frombits(bin.LittleEndian.Uint64([]byte(v[9:17])))
	}
	return n
}

// TestLeaseAcrossInstances: three instances on one Redis, 60 clients with
// 2 s deadlines, a limit of 300 an hour with consistency lease: at most 300
// allowed (chunks never grant more than remains), at least 270 (the last
// hits are strict and chunks go back); after SIGTERM, Redis counts exactly
// the hits allowed.
func TestLeaseAcrossInstances(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "lease.yaml")
	writeFile(t, cfg, leaseYAML)
	procs := startInstances(t, 3, cfg, "--redis-url", srv.URL())
	ok, errs := leaseHammer(procs, 60, 10, 2*time.Second, "shared", nil)
	if errs > 0 {
		t.Fatalf("%d calls failed", errs)
	}
	if ok > 300 || ok < 270 {
		t.Fatalf("%d allowed across 3 instances, want 270 to 300", ok)
	}
	// A token bucket of 300 an hour: its chunks' tokens held, not refilling
	// (in the test's seconds the bucket refills less than one token).
	bok, berrs := leaseHammerKey(procs, 60, 10, 2*time.Second, "bucket", "shared", nil)
	if berrs > 0 || bok > 300 || bok < 270 {
		t.Fatalf("token bucket: %d allowed (%d calls failed) across 3 instances, want 270 to 300", bok, berrs)
	}
	for _, p := range procs {
		if code := p.stop(t); code != 0 {
			t.Fatalf("exit code %d", code)
		}
	}
	if n := redisCount(t, srv); n != float64(ok) {
		t.Fatalf("after SIGTERM Redis counts %v hits, want the %d allowed", n, ok)
	}
	t.Logf("%d allowed, token bucket %d", ok, bok)
}

// TestLeaseRedisFrozen: Redis frozen (SIGSTOP) while three instances decide
// under load, then thawed: no more than the limit is allowed, the calls
// answer within their deadlines (chunks decide, the failure mode answers
// once they run out), and once Redis is back the counts reconcile: after
// SIGTERM Redis counts at least every hit allowed.
func TestLeaseRedisFrozen(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "lease.yaml")
	writeFile(t, cfg, leaseYAML)
	procs := startInstances(t, 3, cfg, "--redis-url", srv.URL(), "--failure-mode", "deny", "--backend-timeout", "200ms")
	stop := make(chan struct{})
	var ok, errs int64
	done := make(chan struct{})
	go func() {
		ok, errs = leaseHammer(procs, 30, 1_000_000, 2*time.Second, "frozen", stop)
		close(done)
	}()
	// Freeze once chunks are out (a third of the limit used), for a second.
	waitFor(t, 20*time.Second, "a third of the limit used", func() bool { return redisCount(t, srv) >= 100 })
	srv.Pause()
	time.Sleep(time.Second) // the outage itself, not a wait for a condition
	srv.Resume()
	waitFor(t, 30*time.Second, "the limit used up", func() bool { return redisCount(t, srv) >= 300 })
	close(stop)
	<-done
	if ok > 300 {
		t.Fatalf("%d allowed with Redis frozen a while, want at most 300", ok)
	}
	for _, p := range procs {
		p.stop(t)
	}
	if n := redisCount(t, srv); n < float64(ok) || n > 300 {
		t.Fatalf("after the outage and SIGTERM Redis counts %v hits, want between the %d allowed and 300", n, ok)
	}
	if errs > 0 {
		// The failure mode answers UNAVAILABLE for calls that reached
		// Redis while it was frozen: expected, and never an allow.
		t.Logf("%d calls answered by the failure mode", errs)
	}
	t.Logf("%d allowed", ok)
}
