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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
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
	testutil.WaitEvery(t, procPoll, 20*time.Second, "a third of the limit used", func() bool { return redisCount(t, srv) >= 100 })
	srv.Pause()
	time.Sleep(time.Second) // the outage itself, not a wait for a condition
	srv.Resume()
	testutil.WaitEvery(t, procPoll, 30*time.Second, "the limit used up", func() bool { return redisCount(t, srv) >= 300 })
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

// TestLeaseRedisKilled: Redis killed while three instances decide under
// load, then started again (empty, no persistence): calls keep being
// answered, by chunks and then by the failure mode, never past their
// deadline; once Redis is back, chunks are granted and decide again, and
// after SIGTERM the new Redis counts no more than the hits allowed since the
// kill (every chunk returned; nothing charged twice).
func TestLeaseRedisKilled(t *testing.T) {
	const big = `
domain: lease
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000, consistency: lease}
`
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "lease.yaml")
	writeFile(t, cfg, big)
	procs := startInstances(t, 3, cfg, "--redis-url", srv.URL(), "--failure-mode", "deny", "--backend-timeout", "200ms")
	chunks := func() float64 {
		var n float64
		for _, p := range procs {
			n += metricValue(t, p, "envoy_rls_redis_decisions_total", "path=chunk")
		}
		return n
	}
	ld := startPhasedLoad(t, procs, 30, "killed")
	testutil.WaitEvery(t, procPoll, 20*time.Second, "chunk decisions", func() bool { return chunks() > 100 })
	ld.phase.Store(1)
	srv.Stop()
	down := chunks()
	testutil.WaitEvery(t, procPoll, 20*time.Second, "calls answered while Redis is down", func() bool { return ld.ok[1].Load() > 0 || chunks() > down })
	srv.Restart()
	ld.phase.Store(2)
	back := chunks()
	testutil.WaitEvery(t, procPoll, 30*time.Second, "chunks again after the restart", func() bool { return chunks() > back+100 })
	ld.halt()
	if n := ld.late.Load(); n > 0 {
		t.Errorf("%d calls were not answered within their 2 s deadline", n)
	}
	for _, p := range procs {
		p.stop(t)
	}
	// The new Redis may have decided calls answered before phase 2 began
	// (after Restart returned): the bound counts every call answered since
	// the kill.
	since := ld.ok[1].Load() + ld.ok[2].Load()
	if n := redisCount(t, srv); n == 0 || n > float64(since) {
		t.Fatalf("after the restart and SIGTERM Redis counts %v hits, want some and no more than the %d allowed since the kill", n, since)
	}
	t.Logf("allowed %d before, %d while down, %d after", ld.ok[0].Load(), ld.ok[1].Load(), ld.ok[2].Load())
}

// phasedLoad is clients calling user=value on instances with 2 s deadlines
// until halted, counting the OK answers by the phase current when each was
// answered (the test sets phase: e.g. 0 before a kill, 1 while Redis is
// down, 2 after its restart) and the calls past their deadline.
type phasedLoad struct {
	phase atomic.Int32
	ok    [3]atomic.Int64
	late  atomic.Int64
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func startPhasedLoad(t *testing.T, procs []*proc, clients int, value string) *phasedLoad {
	ld := &phasedLoad{stop: make(chan struct{})}
	for c := range clients {
		ld.wg.Add(1)
		go func(c int) {
			defer ld.wg.Done()
			client := procs[c%len(procs)].client()
			for {
				select {
				case <-ld.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				r, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
					Domain: "lease", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("user", value)},
				})
				cancel()
				switch {
				case status.Code(err) == codes.DeadlineExceeded:
					ld.late.Add(1)
				case err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK:
					ld.ok[ld.phase.Load()].Add(1) // by when it was answered
				}
			}
		}(c)
	}
	t.Cleanup(ld.halt)
	return ld
}

// halt stops the clients and waits for them; it may be called again.
func (ld *phasedLoad) halt() {
	ld.once.Do(func() { close(ld.stop) })
	ld.wg.Wait()
}
