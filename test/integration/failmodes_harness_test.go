package integration

import (
	"context"
	binenc "encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/envoyrls/envoy-rls/internal/redistest"
	"github.com/envoyrls/envoy-rls/internal/testutil"
)

// The failure-mode matrix: N instances with one failure mode share one
// redis-server, and a load runs on one descriptor (a fixed window of fmL
// per day, so nothing refills during a test) while Redis is overloaded,
// slow, frozen or killed. Each scenario uses a fresh descriptor value, so
// it starts from zero in Redis and in every instance's embedded store.

const (
	fmL = 60 // the limit
	fmN = 3  // instances
	// The defaults of --redis-pipelines, --redis-batch-size and
	// --redis-read-timeout, which bound the calls charged late.
	fmPipelines   = 2
	fmBatch       = 64
	fmReadTimeout = time.Second
)

var fmYAML = fmt.Sprintf(`
domain: fm
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: %d}
`, fmL)

// fmEnv is one failure mode's instances and their Redis.
type fmEnv struct {
	t     *testing.T
	mode  string
	srv   *redistest.Server
	procs []*proc
}

func startFailMode(t *testing.T, mode string) *fmEnv {
	t.Helper()
	srv := redistest.StartStandalone(t)
	cfg := filepath.Join(t.TempDir(), "fm.yaml")
	if err := os.WriteFile(cfg, []byte(fmYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	e := &fmEnv{t: t, mode: mode, srv: srv}
	for i := 0; i < fmN; i++ {
		e.procs = append(e.procs, startServe(t, nil, "--config", cfg, "--backend", "redis", "--redis-url", srv.URL(), "--failure-mode", mode))
	}
	return e
}

// fmStats are the instances' counters, summed.
type fmStats struct {
	redis, degraded                                 float64 // decided by Redis; by the fallback or the failure mode
	late, retried, unsure, written, overLimit, pend float64
	lateUnsure                                      float64 // refused calls Redis may have charged
	perRedis, perDegraded                           []float64
}

func (e *fmEnv) stats() fmStats {
	var s fmStats
	for _, p := range e.procs {
		r := metricCount(e.t, p, "envoy_rls_redis_decisions_total", "path=redis")
		d := metricCount(e.t, p, "envoy_rls_redis_decisions_total", "path=local_fallback") +
			metricCount(e.t, p, "envoy_rls_redis_decisions_total", "path=failed")
		s.redis += r
		s.degraded += d
		s.perRedis = append(s.perRedis, r)
		s.perDegraded = append(s.perDegraded, d)
		s.late += metricCount(e.t, p, "envoy_rls_redis_late_charged_total")
		s.lateUnsure += metricCount(e.t, p, "envoy_rls_redis_late_unsure_total")
		s.retried += metricCount(e.t, p, "envoy_rls_redis_write_back_retried_total")
		s.unsure += metricCount(e.t, p, "envoy_rls_redis_write_back_unsure_total")
		s.written += metricCount(e.t, p, "envoy_rls_redis_write_back_hits_total")
		s.overLimit += metricCount(e.t, p, "envoy_rls_redis_write_back_over_limit_total")
		s.pend += metricCount(e.t, p, "envoy_rls_redis_write_back_pending")
	}
	return s
}

// load starts clients callers on value, spread over the instances.
func (e *fmEnv) load(value string, clients int, deadline time.Duration) *load {
	return startLoad(clients, deadline, func(c int) rlsv3.RateLimitServiceClient { return e.procs[c%len(e.procs)].client() },
		func(c, i int) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "fm", Descriptors: []*commonv3.RateLimitDescriptor{descriptor("k", value)}}
		})
}

// settle waits until nothing waits to be written back and the late
// replies and write-backs have stopped changing over a few flush intervals.
func (e *fmEnv) settle() fmStats {
	e.t.Helper()
	var last fmStats
	first := true
	testutil.WaitEvery(e.t, procPoll, 60*time.Second, "write-backs and late replies settle", func() bool {
		s := e.stats()
		same := !first && s.pend == 0 && s.late == last.late && s.lateUnsure == last.lateUnsure && s.written == last.written && s.retried == last.retried && s.unsure == last.unsure
		last, first = s, false
		if !same {
			time.Sleep(200 * time.Millisecond) // a few write-back intervals
		}
		return same
	})
	return last
}

// raw returns the count Redis holds for value's fixed window (which
// usage accounting may take past the limit), 0 when there is no key.
func (e *fmEnv) raw(value string) int64 {
	e.t.Helper()
	return fixedCount(e.t, e.srv.Client(), fmt.Sprintf("*%d:%s*", len(value), value))
}

// fixedCount returns the count of the one fixed window key matching
// pattern, 0 when there is none. The state is the script's binary one (see
// pkg/backend/redis/script.go): a magic byte, then at and count as
// little-endian float64s.
func fixedCount(t *testing.T, c *goredis.Client, pattern string) int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	if len(keys) > 1 {
		t.Fatalf("several keys match %s: %q", pattern, keys)
	}
	if len(keys) == 0 {
		return 0
	}
	v, err := c.Get(ctx, keys[0]).Result()
	if err != nil {
		t.Fatalf("GET %s: %v", keys[0], err)
	}
	if len(v) != 17 {
		t.Fatalf("%s: not a fixed window state: %x", keys[0], v)
	}
	return int64(math.Float64frombits(binenc.LittleEndian.Uint64([]byte(v[9:17]))))
}

// fmCell is the outcome of one scenario.
type fmCell struct {
	mode, scenario string
	calls, ok      int   // calls made, answered OK
	errs, timeouts int   // failed at the client; of which past the client's deadline
	okAfter        int   // killed: OK answers of calls that ended after the kill
	okStarted      int   // killed: OK answers of calls sent after the kill
	raw            int64 // Redis's count at the end
	d              fmStats
	outage         time.Duration // how long Redis was frozen or down
}

// bound returns the documented bound on the OK answers of a cell (-1: none),
// and the answers it applies to.
func (c fmCell) bound() (int, int) {
	ok := c.ok
	if c.scenario == "killed" {
		// Redis forgets its count: the bound starts again with the calls
		// sent once it was dead (those in flight at the kill may have been
		// answered by the old one).
		ok = c.okStarted
	}
	switch c.mode {
	case "local":
		return fmL + fmN*fmL, ok
	case "deny":
		return fmL, ok
	}
	return -1, ok
}

// check asserts the documented bounds of a cell.
func (c fmCell) check(t *testing.T) {
	t.Helper()
	b, ok := c.bound()
	if b >= 0 && ok > b {
		t.Errorf("%s, %s: %d answered OK, more than the bound %d", c.mode, c.scenario, ok, b)
	}
	// The instances' OK answers, also those the clients no longer waited
	// for: Redis's count less what it may hold beyond them.
	if served := c.raw - int64(c.d.late+c.d.lateUnsure+c.d.retried+c.d.unsure); b >= 0 && c.scenario != "killed" && served > int64(b) {
		t.Errorf("%s, %s: Redis counted %d (at least %d answered OK), more than the bound %d", c.mode, c.scenario, c.raw, served, b)
	}
	if (c.scenario == "frozen" || c.scenario == "killed") && c.d.degraded == 0 {
		t.Errorf("%s, %s: no call was decided without Redis: the scenario tested nothing", c.mode, c.scenario)
	}
	// Redis counts every OK (past the limit if need be: write-backs are
	// usage accounting) and the refused calls it ran late; at most the
	// hits that may be counted twice more.
	// A call past the client's deadline may have been answered OK (and
	// counted) by an instance after the client left. A refused call whose
	// pipeline timed out (Redis frozen) may have run when Redis resumed,
	// its reply lost (lateUnsure).
	lo := int64(c.ok) + int64(c.d.late)
	hi := lo + int64(c.d.lateUnsure+c.d.retried+c.d.unsure) + int64(c.timeouts)
	if c.scenario == "killed" {
		// What Redis counted before the kill is lost; calls in flight at
		// the kill may have been answered by Redis before it died.
		lo, hi = int64(c.okStarted), int64(c.okAfter)+int64(c.d.late+c.d.lateUnsure+c.d.retried+c.d.unsure)+int64(c.timeouts)
	}
	if c.raw < lo || c.raw > hi {
		t.Errorf("%s, %s: Redis counted %d, want %d to %d (OK %d, charged late %d, maybe charged late %v, maybe twice %v)", c.mode, c.scenario, c.raw, lo, hi, c.ok, int64(c.d.late), c.d.lateUnsure, c.d.retried+c.d.unsure)
	}
	if c.mode == "deny" {
		if c.raw > fmL {
			t.Errorf("deny, %s: Redis counted %d, more than the limit %d", c.scenario, c.raw, fmL)
		}
		// Calls charged late: at most the pipelines in flight times the
		// batch size, once per read timeout of the outage, per instance.
		rounds := 1 + int(c.outage/fmReadTimeout) + 1
		if b := fmN * fmPipelines * fmBatch * rounds; c.d.late > float64(b) {
			t.Errorf("deny, %s: %v refused calls charged late, more than %d", c.scenario, c.d.late, b)
		}
	}
	if twice := c.d.retried + c.d.unsure; twice > float64(c.ok+c.timeouts) {
		t.Errorf("%s, %s: %v hits may be counted twice, more than the %d OK and %d past the client's deadline", c.mode, c.scenario, twice, c.ok, c.timeouts)
	}
}

// row formats a cell for the README's table.
func (c fmCell) row() string {
	bound := "none (fail open)"
	if b, _ := c.bound(); b >= 0 {
		bound = fmt.Sprint(b)
	}
	allowed := fmt.Sprint(c.ok)
	if c.scenario == "killed" {
		allowed = fmt.Sprintf("%d (%d sent after the kill)", c.ok, c.okStarted)
	}
	return fmt.Sprintf("| `%s` | %s | %d | %d | %d | %s | %s | %d | %d | %d | %d |",
		c.mode, c.scenario, fmN, fmL, c.calls, allowed, bound, c.errs, c.raw, int64(c.d.late), int64(c.d.retried+c.d.unsure))
}

func fmTable(cells []fmCell) string {
	var b strings.Builder
	b.WriteString("| mode | Redis | instances | limit | calls | allowed (OK) | bound on allowed | errors at the client | Redis's final count | refused but charged late | may be counted twice |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cells {
		b.WriteString(c.row() + "\n")
	}
	return b.String()
}

// count fills the cell's answers from a stopped load.
func (c *fmCell) count(ld *load, kill time.Time) {
	for _, s := range ld.all() {
		c.calls++
		if s.err != nil {
			c.errs++
			if status.Code(s.err) == codes.DeadlineExceeded {
				c.timeouts++
			}
			continue
		}
		if s.code != rlsv3.RateLimitResponse_OK {
			continue
		}
		c.ok++
		if !kill.IsZero() {
			if !s.at.Add(s.latency).Before(kill) {
				c.okAfter++
			}
			if !s.at.Before(kill) {
				c.okStarted++
			}
		}
	}
}

func (d fmStats) minus(b fmStats) fmStats {
	return fmStats{redis: d.redis - b.redis, degraded: d.degraded - b.degraded, late: d.late - b.late,
		lateUnsure: d.lateUnsure - b.lateUnsure, retried: d.retried - b.retried, unsure: d.unsure - b.unsure, written: d.written - b.written, overLimit: d.overLimit - b.overLimit}
}
