package integration

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// compositeYAML has two composite limits ("A AND B" on one descriptor):
// the README's "100/min AND 5/s" (a token bucket of 5 per second), and one
// of long windows whose tighter limit, 40 a day, refills nothing during a
// test.
const compositeYAML = `
domain: composite
descriptors:
  - key: minute_and_second
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}
  - key: day_and_hour
    rate_limits:
      - {unit: day, requests_per_unit: 40}
      - {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
`

// TestOverloadCompositeWithEnvoyDeadlines: composite limits under 120
// clients with Envoy's default 20 ms deadlines, three instances with
// default flags (failure mode local) on one redis-server. Calls that miss
// their budget are decided on each instance's embedded store, on every
// limit of the composite, so the OK answers stay within the README's bound
// for local: what Redis admits plus what each instance admits on its own,
// (1 + N) times what the composite admits over the run. (Under the old
// default, allow, an attacker saw 2 to 95 over the limit.) Redis counts
// every OK of the day-long limit, and at most the bound.
func TestOverloadCompositeWithEnvoyDeadlines(t *testing.T) {
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "composite.yaml")
	writeFile(t, cfg, compositeYAML)
	const n = 3
	procs := make([]*proc, n)
	for i := range procs {
		procs[i] = startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL())
	}
	run := func(key string, calls int) (ok, errs int, start, end time.Time) {
		start = time.Now()
		ld := startLoad(120, 20*time.Millisecond, func(c int) rlsv3.RateLimitServiceClient { return procs[c%n].client() },
			func(c, i int) *rlsv3.RateLimitRequest {
				return &rlsv3.RateLimitRequest{Domain: "composite", Descriptors: []*commonv3.RateLimitDescriptor{descriptor(key, "attacker")}}
			})
		testutil.WaitEvery(t, procPoll, 60*time.Second, fmt.Sprintf("%d calls", calls), func() bool {
			return ld.count(time.Time{}, func(sample) bool { return true }) >= calls
		})
		ld.stop()
		end = time.Now()
		for _, s := range ld.all() {
			switch {
			case s.err != nil:
				errs++
			case s.code == rlsv3.RateLimitResponse_OK:
				ok++
			}
		}
		return ok, errs, start, end
	}
	e := &fmEnv{t: t, mode: "local", srv: srv, procs: procs}

	// 100/min AND 5/s: over [start, end], the composite admits at most
	// 5 + 5 per second elapsed (the bucket) and 100 per minute window
	// touched; failure mode local admits that once in Redis and once on
	// each instance.
	ok, errs, start, end := run("minute_and_second", 1500)
	windows := end.Unix()/60 - start.Unix()/60 + 1
	admits := min(100*windows, 5+int64(5*end.Sub(start).Seconds()+1))
	// The instances' OK answers, also those the clients no longer waited
	// for (every call of this domain so far is this run's).
	served := int64(0)
	for _, p := range procs {
		served += int64(metricCount(t, p, "envoy_rls_requests_total", "code=ok", "domain=composite"))
	}
	t.Logf("100/min AND 5/s: %d OK received, %d answered OK, %d failed at the client over %v; the composite admits %d, the bound is %d", ok, served, errs, end.Sub(start).Round(time.Millisecond), admits, (1+n)*admits)
	if served > (1+n)*admits || int64(ok) > served {
		t.Errorf("100/min AND 5/s: %d answered OK (%d received), more than the bound %d", served, ok, (1+n)*admits)
	}

	// 40/day AND 100/hour: at most 40 in Redis and 40 on each instance.
	// Redis's count of the day is every OK answer (also those the clients
	// no longer waited for), the refused calls it ran late, and at most
	// the hits that may be counted twice.
	base := e.stats()
	ok, errs, _, _ = run("day_and_hour", 1000)
	d := e.settle().minus(base)
	got := fixedCount(t, srv.Client(), "*12:day_and_hour*fixed_window*")
	served = got - int64(d.late+d.retried+d.unsure)
	t.Logf("40/day AND 100/hour: %d OK, %d failed at the client; Redis counted %d (late %v, maybe twice %v)", ok, errs, got, d.late, d.retried+d.unsure)
	if bound := 40 * (1 + n); ok > bound || served > int64(bound) {
		t.Errorf("40/day AND 100/hour: %d allowed and at least %d answered OK (Redis counted %d), more than the bound %d", ok, served, got, bound)
	}
	if got < int64(ok)+int64(d.late) {
		t.Errorf("40/day AND 100/hour: Redis counted %d, fewer than the %d OK and %v charged late", got, ok, d.late)
	}
	for i, p := range procs {
		if v := metricCount(t, p, "envoy_rls_requests_total", "code=failed_open", "domain=composite"); v != 0 {
			t.Errorf("instance %d failed open %v times", i, v)
		}
	}
}
